"""The Renderer base (what a device's code generator declares and does) and ProgramSpec (one rendered kernel)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from tgcore.codegen.uops import UOp


class Renderer:
    """Turns a UOp list into source text. Subclasses set the class attributes the kernel optimizer reads."""

    device: str = ""
    suffix: str = ""  # kernel name suffix, for debug listings
    # None: the kernel's global dimensions become loops inside it (CPU style); else the maximum launch size per
    # grid dimension (GPU style: one SPECIAL index per dimension, at most len(global_max) of them)
    global_max: Optional[tuple[int, ...]] = None
    local_max: Optional[tuple[int, ...]] = None
    has_local: bool = False  # workgroups with local ids
    has_shared: bool = False  # DEFINE_LOCAL memory and BARRIER
    shared_max: int = 0  # bytes of shared memory per workgroup
    # shared memory is on-chip, faster than device memory: the optimizer's heuristics stage a workgroup's common
    # inputs through it (OptOps.STAGE); where it is ordinary memory (a CPU's OpenCL), staging only adds copies
    shared_is_fast: bool = True
    supports_float4: bool = False  # vector loads and stores of 4 elements
    tensor_cores: list[Any] = []
    # elements of each dtype that one vector register holds: the optimizer upcasts contiguous axes to this width
    # (plain upcasting, no vector uops: the target compiler vectorizes the repeated scalar code)
    vector_widths: dict[Any, int] = {}
    # vector registers of the target (CPU-style renderers): with 32 (AVX-512, NEON) a matmul's register tile is two
    # vectors wide, with fewer (16: SSE, AVX2) one, so that its accumulators fit
    vector_registers: int = 32
    # CPU-style kernels (global_max None) only: the outermost global loop may run on several host threads. A kernel
    # that uses it gets ProgramSpec.thread_extent = n, and its last two DEFINE_VARs, "core_start" and "core_end",
    # bound that loop; the core calls it once per thread with the vals of its part of range(n)
    threads: bool = False
    # CPU-style kernels only: bytes of scratch memory one kernel may declare (a DEFINE_LOCAL without BARRIERs: an
    # array of the running thread's own, e.g. on its stack). The optimizer packs the block of a big matmul's input
    # that its inner loops reuse into it, contiguous in the order they read it (OptOps.PACK); 0: none
    scratch_max: int = 0
    # vector uops only (codegen/uops.py): ALU ops besides VECTOR_ALU that this renderer computes on whole vectors
    # (e.g. EXP2 in a vectorized math routine); the optimizer upcasts elementwise kernels that use them
    vector_math: tuple[Any, ...] = ()
    # MULACC on float32 and float64 rounds once (a fused multiply-add, C's fmaf / fma) instead of twice; the linearizer
    # then accumulates each float32 / float64 SUM reduce of a product with MULACC (a matmul's or a conv's inner loop
    # runs on FMA instructions, as BLAS and torch do). Results differ from the two-rounding reference in the last bits
    # of each step, within the declared tolerances, and are the same for every optimization of a kernel
    fused_mulacc: bool = False

    def render(self, name: str, uops: list[UOp]) -> str:
        """The source of kernel `name` (an identifier, as every name in `uops`: codegen/names.py) computing `uops`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement render")


@dataclass(frozen=True)
class ProgramSpec:
    """A rendered kernel: its source and how to launch it."""

    name: str
    src: str
    device: str
    global_size: Optional[tuple[int, ...]] = None
    local_size: Optional[tuple[int, ...]] = None
    variables: tuple[Any, ...] = ()  # symbolic Variables passed by value, in argument order
    outputs: tuple[int, ...] = (0,)  # indices of the buffers the kernel writes
    op_estimate: int = 0
    mem_estimate: int = 0
    uops: list[UOp] = field(default_factory=list, compare=False, repr=False)
    # set when the outermost loop can be split across threads: its extent; the last two vals bound it
    thread_extent: Optional[int] = None
