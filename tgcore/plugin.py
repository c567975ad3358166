"""The plugin contract: every type a device plugin codes against, and nothing of the engine.

This module is the ground floor of tgcore: it imports only the standard library, numpy, pluggy and the core's leaf
modules (dtype, helpers), so a plugin that imports it pulls in no codegen, no device registry and no runtime. The
plugin manager, discovery and the device registry sit above it, in `tgcore/registry.py` and `tgcore/device.py`.

A plugin is a module with pluggy hook implementations (`hookimpl`). It declares its devices in `tg_register_devices`
and answers the four part hooks (renderer, compiler, allocator, runtime) for the device names it knows; each part hook
is firstresult, so the first plugin that answers wins (use `tryfirst=True` to override another's part). `part_for`
writes the "only for my device" boilerplate of a part hook once.

Versioning: `PLUGIN_API_VERSION` is (major, minor). A DeviceSpec says which version it was built for; a plugin built for
2.x loads on a core serving 2.y when y >= x, and any other (another major, a newer minor, a bare int) is refused with a
message naming the plugin, both versions and the fix. A minor bump adds to the contract without breaking a plugin
built for an older minor: a new optional ability (an attribute or method with a default meaning "not offered"), a new
optional hook, a new UOp a renderer may decline. A major bump changes or removes: a hook's arguments or meaning, a
method's signature, the Program call, the order of a kernel's buffers, a required attribute.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import mmap
import os
import sys
import threading
import types
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, Protocol, TypeVar

import numpy as np
import pluggy

from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.helpers import diskcache_get, diskcache_put, getenv
from tgcore.scratch import compile_folder, process_folder

if TYPE_CHECKING:
    from tgcore.codegen.uops import UOp

__all__ = [
    "PLUGIN_API_VERSION",
    "ENTRY_POINT_GROUP",
    "hookspec",
    "hookimpl",
    "ALL_DTYPES",
    "DEFAULT_TOLERANCES",
    "DeviceSpec",
    "HookSpecs",
    "Registry",
    "Renderer",
    "ProgramSpec",
    "Compiler",
    "CompileError",
    "Allocator",
    "LRUAllocator",
    "MallocAllocator",
    "Collective",
    "HostCollective",
    "Program",
    "version_refusal",
    "part_for",
    "InstanceCache",
    "instance_index",
    "vector_register_bytes",
    "vector_register_count",
    "thread_count",
    "vector_widths",
    "numpy_dtype",
    "compile_folder",
    "process_folder",
    "DType",
    "PtrDType",
    "dtypes",
    "plugin_module",
]

# 2.1: the optional tg_collective hook; 2.2: Compiler.batch; 2.3: Program.run_parts
PLUGIN_API_VERSION: tuple[int, int] = (2, 3)
ENTRY_POINT_GROUP = "tgcore"

hookspec = pluggy.HookspecMarker("tgcore")
hookimpl = pluggy.HookimplMarker("tgcore")

ALL_DTYPES: tuple[DType, ...] = (
    dtypes.bool,
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.uint16,
    dtypes.int32,
    dtypes.uint32,
    dtypes.int64,
    dtypes.uint64,
    dtypes.float16,
    dtypes.bfloat16,
    dtypes.float32,
    dtypes.float64,
)
# (atol, rtol) a device promises for transcendental results; exact ops (add, compare, ...) must match exactly
DEFAULT_TOLERANCES: dict[DType, tuple[float, float]] = {
    dtypes.float16: (1e-3, 1e-2),
    dtypes.bfloat16: (1e-2, 5e-2),
    dtypes.float32: (1e-6, 1e-5),
    dtypes.float64: (1e-12, 1e-10),
}


@dataclass
class DeviceSpec:
    """What a plugin says about one device it provides."""

    name: str  # canonical upper-case name, e.g. "MYDEV"
    api_version: tuple[int, int]  # the PLUGIN_API_VERSION the plugin was built for
    priority: int = 0  # the highest-priority available device is the default
    # None when usable here, else why not; a probe that takes an argument is also asked about each instance
    # ("MYDEV:1"), so a missing second device is reported before its first use
    probe: Callable[..., Optional[str]] = lambda: None
    dtypes: tuple[DType, ...] = ALL_DTYPES
    tolerances: dict[DType, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    description: str = ""  # one line for `python -m tgcore devices`
    # a device that only holds data (reads, writes, views and copies of its buffers) and runs no kernels: it needs
    # only an allocator, it is never the default device nor in Device.available(), and the core refuses to compute
    # on it with an error that says to copy the data to a compute device first (the built-in DISK device)
    storage_only: bool = False
    # instances are named by any text after the colon, kept as written ("DISK:/data/Weights.bin"), instead of by
    # a number ("MYDEV:1"); only the device type before the colon is upper-cased
    path_instances: bool = False


def _version_text(version: Any) -> str:
    if isinstance(version, tuple) and len(version) == 2 and all(isinstance(v, int) for v in version):
        return f"{version[0]}.{version[1]}"
    return repr(version)


def version_refusal(plugin: str, api_version: Any, served: tuple[int, int] = PLUGIN_API_VERSION) -> Optional[str]:
    """None when a plugin built for `api_version` loads on a core serving `served` (same major, minor <= the core's);
    else why not, naming the plugin, both versions and the fix."""
    ok_shape = (
        isinstance(api_version, tuple)
        and len(api_version) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in api_version)
    )
    if ok_shape and api_version[0] == served[0] and api_version[1] <= served[1]:
        return None
    built, core = _version_text(api_version), _version_text(served)
    if not ok_shape:
        why = "which is not a plugin API version of the form (major, minor)"
        fix = f"its DeviceSpec must say api_version={served!r}, and it must be built for that API"
    elif api_version[0] < served[0]:
        why = "an older major version, whose contract this core no longer serves"
        fix = f"install a version of the plugin built for API {served[0]}.x (or a tgcore that serves API {built})"
    elif api_version[0] > served[0]:
        why = "a newer major version than this core serves"
        fix = f"upgrade tgcore to one that serves API {built} (or install a version of the plugin built for {core})"
    else:
        why = "a newer minor version: it may use abilities this core lacks"
        fix = f"upgrade tgcore to one that serves API {built} or later (or install a plugin built for {core} or older)"
    return f"plugin {plugin!r} is built for tgcore plugin API {built}, {why}; this tgcore serves API {core}: {fix}"


# ***** the parts a plugin provides *****


class Renderer:
    """Turns a UOp list into source text. Subclasses set the class attributes the kernel optimizer reads; each
    optional ability has a default meaning "not offered"."""

    device: str = ""
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
    # elements of each dtype that one vector register holds: the optimizer upcasts contiguous axes to this width
    # (plain upcasting, no vector uops: the target compiler vectorizes the repeated scalar code); see vector_widths()
    vector_widths: dict[Any, int] = {}
    # vector registers of the target (CPU-style renderers): with 32 (AVX-512, NEON) a matmul's register tile is two
    # vectors wide, with fewer (16: SSE, AVX2) one, so that its accumulators fit
    vector_registers: int = 32
    # the renderer takes vector UOps (codegen/uops.py: vector dtypes, VECTORIZE, GEP, vector loads and stores); False:
    # it never receives one
    vector_uops: bool = False
    # vector uops only: ALU ops besides VECTOR_ALU that this renderer computes on whole vectors (e.g. EXP2 in a
    # vectorized math routine); the optimizer upcasts elementwise kernels that use them. CMPLT, CMPEQ and WHERE, all
    # three: float32 comparisons give masks (bool vectors) that WHERE selects by; BITCAST: a float vector's bits as a
    # uint vector and back, and SHL of those by a constant (codegen/uops.py, VECTOR_BITS)
    vector_math: tuple[Any, ...] = ()
    # CPU-style kernels (global_max None) only: the outermost global loop may run on several host threads. A kernel
    # that uses it gets ProgramSpec.thread_extent = n, and its last two DEFINE_VARs, "core_start" and "core_end",
    # bound that loop; the core calls the Program once per thread with the vals of its part of range(n), from several
    # threads at once (so the Program's call must release the GIL: see Program)
    threads: bool = False
    # threads only (plugin API 2.3): the least work of a kernel worth splitting across threads, in innermost
    # iterations weighted by its ops (codegen/linearizer.py, _threaded). The default pays for the core's Python
    # threads (a GIL hand-off, 30-60 us a kernel on a 2-core VM); a Program with its own threads (run_parts) hands a
    # part over in about a microsecond and may split far smaller kernels
    thread_min_work: int = 1 << 18
    # CPU-style kernels only: bytes of scratch memory one kernel may declare (a DEFINE_LOCAL without BARRIERs: an
    # array of the running thread's own, e.g. on its stack). The optimizer packs the block of a big matmul's input
    # that its inner loops reuse into it, contiguous in the order they read it (OptOps.PACK); 0: none
    scratch_max: int = 0
    # MULACC on float32 and float64 rounds once (a fused multiply-add, C's fmaf / fma) instead of twice; the linearizer
    # then accumulates each float32 / float64 SUM reduce of a product with MULACC (a matmul's or a conv's inner loop
    # runs on FMA instructions, as BLAS and torch do). Results differ from the two-rounding reference in the last bits
    # of each step, within the declared tolerances, and are the same for every optimization of a kernel
    fused_mulacc: bool = False

    def render(self, name: str, uops: list[UOp]) -> str:
        """The source of kernel `name` (an identifier, as every name in `uops`: codegen/names.py) computing `uops`.
        A UOp it cannot render raises NotImplementedError naming it (the core then takes the device as unavailable
        when a basic op is refused, see tgcore/device.py)."""
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


class CompileError(Exception):
    """A kernel failed to compile; carries the compiler's log and the source.

    Its text is short: the message, the log's first lines and the source lines the log points at, with the path of a
    report that holds the whole log and source (tgcore/renderer/errors.py; written when the text is first asked for,
    so that a caught error costs nothing)."""

    def __init__(self, message: str, log: str = "", src: str = "") -> None:
        super().__init__(message)
        self.message, self.log, self.src = message, log, src
        self._text: Optional[str] = None

    def __reduce__(self) -> tuple[Any, ...]:  # a copy in another process keeps the log and the source
        return (type(self), (self.message, self.log, self.src))

    def __str__(self) -> str:
        if self._text is None:
            from tgcore.renderer.errors import compile_error_text  # (a leaf: the standard library only)

            self._text = compile_error_text(self.message, self.log, self.src)
        return self._text


class Compiler:
    """Turns source text into the bytes its device's Program loads."""

    cachekey: Optional[str] = None  # the disk-cache table for this compiler's output, None to not cache on disk
    # what this compiler is, for people: tool, version and the options that matter (e.g. "gcc 12.2.0 -O2
    # -march=native"); shown by `python -m tgcore devices`. "": not told (the class name is shown)
    identity: str = ""
    # True: compile() may run on several threads at once (the core then compiles a schedule's new kernels on worker
    # threads while it lowers the next, engine/realize.py); False: only ever one compile at a time, on the caller's
    # thread (a library that is not thread-safe)
    concurrent: bool = False
    # at most this many sources go to one compile_many (1: every source compiles on its own). A compiler whose every
    # run costs a fixed start (a C compiler's process: ~30 ms, as much as a small kernel's build) declares more, and
    # the core then builds the new kernels of a schedule in groups (engine/realize.py compile_ahead)
    batch: int = 1

    def compile(self, src: str) -> bytes:
        """The loadable bytes of `src`; a failed compile raises CompileError(message, log, src)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement compile")

    def compile_many(self, srcs: list[str]) -> list[bytes]:
        """The loadable bytes of each of `srcs` (2 to `batch` sources, the kernels' names all different), built in one
        run: the bytes may be one library that holds every kernel, the same for each source (its Program finds its
        kernel by name). A failed build raises CompileError; the core then compiles each source on its own, so that
        the error is the failing kernel's. The default compiles them one by one."""
        return [self.compile(src) for src in srcs]

    def compile_cached(self, src: str) -> bytes:
        """compile(src), remembered in memory and (when cachekey is set) in the sqlite disk cache."""
        if (lib := self._cached(src)) is not None:
            return lib
        try:
            lib = self.compile(src)
        except OSError as e:  # a plugin that let one through: its compiler (or a file it needs) is not there
            raise self._not_runnable(e, src) from e
        self._remember(src, lib)
        return lib

    def compile_cached_many(self, srcs: list[str]) -> list[bytes]:
        """compile_cached of every source, those not cached built together by compile_many (at most `batch` of
        them, their kernels' names all different). A failed build raises CompileError and remembers nothing."""
        libs = [self._cached(src) for src in srcs]
        missing = [i for i, lib in enumerate(libs) if lib is None]
        if missing:
            todo = [srcs[i] for i in missing]
            try:
                built = self.compile_many(todo) if len(todo) > 1 else [self.compile(todo[0])]
            except OSError as e:  # (as in compile_cached)
                raise self._not_runnable(e, todo[0]) from e
            for i, lib in zip(missing, built):
                self._remember(srcs[i], lib)
                libs[i] = lib
        return libs  # type: ignore[return-value]

    def _cached(self, src: str) -> Optional[bytes]:
        """What compile(src) gave before: remembered in this process, or in the disk cache."""
        if (lib := _compiled.get((self._memory_key, src))) is not None:
            return lib
        if self._use_disk:
            if (lib := diskcache_get(self.cachekey, src)) is not None:  # type: ignore[arg-type]
                _compiled[(self._memory_key, src)] = lib
            return lib
        return None

    def _remember(self, src: str, lib: bytes) -> None:
        if self._use_disk:
            diskcache_put(self.cachekey, src, lib)  # type: ignore[arg-type]
        _compiled[(self._memory_key, src)] = lib

    @property
    def _use_disk(self) -> bool:
        return self.cachekey is not None and getenv("DISABLE_COMPILER_CACHE") == 0

    @property
    def _memory_key(self) -> str:
        return self.cachekey or f"{type(self).__module__}.{type(self).__qualname__}"

    def _not_runnable(self, e: OSError, src: str) -> CompileError:
        return CompileError(
            f"{type(self).__name__} could not compile ({type(e).__name__}: {e}): check that its compiler is "
            "installed and runs (`python -m tgcore devices` says what each device needs)",
            src=src,
        )


# compiled programs of this process, by (compiler cachekey, source)
_compiled: dict[tuple[str, str], bytes] = {}


def _declare_abilities(cls: type, flags: dict[str, str]) -> None:
    """Set each flag to True on a class that defines its ability's method and does not set the flag itself (the
    optional abilities of Program and Allocator: the core reads the flags, never hasattr)."""
    for method, flag in flags.items():
        if method in cls.__dict__ and flag not in cls.__dict__:
            setattr(cls, flag, True)


class Program:
    """One compiled kernel of a device, loaded and ready to launch: the class `tg_runtime` returns.

    The core constructs it as `Program(instance, name, lib)`: `instance` is the device instance it runs on ("MYDEV"
    or "MYDEV:1"), `name` the kernel's function name in the source, `lib` what the device's Compiler returned.

    The core calls it as `prog(*bufs, global_size=..., local_size=..., vals=(...), wait=bool)`:

    - `bufs`: the opaque handles (what the device's Allocator returned) of the kernel's buffers, in the order of its
      DEFINE_GLOBALs: the outputs first (ProgramSpec.outputs), then the inputs.
    - `global_size`, `local_size`: the launch dimensions of a GPU-style kernel (Renderer.global_max set), None for a
      CPU-style one (its loops are inside the kernel).
    - `vals`: the values of the kernel's symbolic Variables (ProgramSpec.variables), as ints in the kernel's argument
      order (the order of its DEFINE_VARs).
    - `wait`: True asks the call to return when the kernel is done, with the seconds it ran (a float); False lets
      it return at once (the work may still be queued) with None.

    Threads: a Renderer with `threads = True` has the core call one Program from several threads at once (each with
    the vals of its part of the outer loop), so the call must release the GIL while the kernel runs (cffi and ctypes
    calls do) and must not change the Program's state without a lock.

    Optional (plugin API 2.3): `run_parts(*bufs, vals, bounds, threads)` (`supports_parts`, set by defining it; an
    instance may set it False where its threads are not available) runs a threaded kernel's parts itself: the kernel
    once per part i < len(bounds) - 1 with vals + (bounds[i], bounds[i + 1]), each part exactly once, on up to
    `threads` threads (the calling one included), returning when all are done. The core then hands it every threaded
    launch instead of calling the Program from its own Python threads (a GIL hand-off per thread and kernel).
    """

    supports_parts: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _declare_abilities(cls, {"run_parts": "supports_parts"})

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        self.device, self.name, self.lib = device, name, lib

    def run_parts(self, *bufs: Any, vals: tuple[int, ...], bounds: tuple[int, ...], threads: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not run parts itself (supports_parts is False)")

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")


class Allocator:
    """Device memory: alloc/free/copyin/copyout. `options` is None or a plugin-defined hashable. An allocation that
    finds no memory raises MemoryError (the LRU cache then frees what it holds and tries once more).

    Optional abilities are declared here with a default meaning "not offered"; a subclass offers one by overriding its
    method, which sets the flag beside it to True (`__init_subclass__`; a subclass may also set a flag itself, e.g. to
    False to withdraw an ability it inherits). The core reads the flags, never hasattr:

    - `offset(buf, size, offset)` (`supports_offset`): a view of `size` bytes of `buf` from byte `offset` on, sharing
      its memory: what buffer views (Tensor.shrink of a realized tensor, bitcasts) need.
    - `transfer(dest, src, nbytes, src_dev, dest_dev)` (`supports_transfer`): a copy between two instances of this
      device without going through the host.
    - `as_buffer(buf)` (`supports_as_buffer`): the buffer's bytes as a memoryview without a copy (host memory).
    - `synchronize()` (`supports_synchronize`): wait for every queued operation on the device; without it the
      device's operations are taken as done when their calls return.
    """

    supports_offset: bool = False
    supports_transfer: bool = False
    supports_as_buffer: bool = False
    supports_synchronize: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _declare_abilities(cls, {a: f"supports_{a}" for a in ("offset", "transfer", "as_buffer", "synchronize")})

    def alloc(self, size: int, options: Any = None) -> Any:
        if size < 0:
            raise ValueError(f"cannot allocate {size} bytes: expected a size >= 0")
        if size > MAX_BUFFER_BYTES:
            raise MemoryError(f"cannot allocate {size} bytes: no buffer can be larger than {MAX_BUFFER_BYTES} bytes")
        return self._alloc(size, options)

    def free(self, opaque: Any, size: int, options: Any = None) -> None:
        self._free(opaque, options)

    def _alloc(self, size: int, options: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement _alloc")

    def _free(self, opaque: Any, options: Any) -> None:
        pass

    def copyin(self, dest: Any, src: memoryview) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement copyin")

    def copyout(self, dest: memoryview, src: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement copyout")

    def offset(self, buf: Any, size: int, offset: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} makes no buffer views (supports_offset is False)")

    def transfer(self, dest: Any, src: Any, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no device-to-device copy (supports_transfer is False)")

    def as_buffer(self, src: Any) -> memoryview:
        raise NotImplementedError(f"{type(self).__name__} has no zero-copy view (supports_as_buffer is False)")

    def synchronize(self) -> None:
        """Wait for every queued operation (nothing to wait for unless a subclass queues work)."""


class LRUAllocator(Allocator):
    """An allocator that keeps freed buffers by (size, options) and hands them out again."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, Any], list[Any]] = defaultdict(list)

    def alloc(self, size: int, options: Any = None) -> Any:
        if len(cached := self.cache.get((size, options), [])):
            return cached.pop()
        try:
            return super().alloc(size, options)
        except (MemoryError, RuntimeError):
            pass
        # once more with the memory of the cached buffers, and of the buffers that only a reference cycle keeps (a
        # collection frees them, into the cache), given back
        gc.collect()
        self.free_cache()
        return super().alloc(size, options)

    def free_cache(self) -> None:
        """Really free every cached buffer."""
        for (_, options), opaques in self.cache.items():
            for opaque in opaques:
                self._free(opaque, options)
            opaques.clear()

    def free(self, opaque: Any, size: int, options: Any = None) -> None:
        if getenv("LRU", 1) and (options is None or not getattr(options, "nolru", False)):
            self.cache[(size, options)].append(opaque)
        else:
            self._free(opaque, options)


ALIGNMENT = 64  # bytes: where host buffers start
# the most bytes a buffer can have: what a 64-bit address space (and Python's sizes, ssize_t) can hold at all; a
# device's allocator refuses less than this where it has less
MAX_BUFFER_BYTES = sys.maxsize


HUGE_PAGE = 2 << 20  # bytes: a buffer this big gets memory of its own, in huge pages where the OS offers them
_HUGE_PAGES = hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE") and getenv("TGCORE_HUGE_PAGES", 1) != 0


# successive huge-page buffers start at different offsets past their huge page's boundary (colors): memory of one
# huge page is physically contiguous, so buffers that all started on a boundary had the same physical address bits up
# to 2 MB, and a kernel streaming several of them at one index (a + b -> out) read and wrote the same sets of the L2
# cache, which held too few of their lines (the bench's 16M elementwise chain, three inputs and an output, on one Zen 4
# core: 16.6 -> 30.9 GB/s on CLANG, 11.8 -> 30.5 on LLVM; with plain 4 KB pages the OS scatters them). A step of 4 KB
# and 256 bytes moves both the L2 set and the 4 KB offset, where loads and stores to different buffers at one
# distance alias (steps of 64 B or 1 KB gained little: 27 -> 27 / 30 GB/s, against 38 with 4160 B and more)
_COLORS = 8
_COLOR_STEP = 4096 + 256
_next_color = itertools.count()  # (next() on it is atomic under the GIL: allocations from several threads get colors)


def _huge_page_buffer(size: int) -> Any:
    """`size` zeroed bytes of private anonymous memory in huge pages where the OS offers them (as numpy asks for its
    large arrays): a kernel streaming 64 MB then misses the TLB 512 times less often (a 4096 x 4096 sum on CLANG: 42 ->
    45 GB/s). The buffer starts a color's offset (_COLOR_STEP bytes times one of _COLORS, in turn) past a huge-page
    boundary. Where the memory left has no room for the extra huge page and color, the mapping is `size` bytes where
    the OS puts it (the huge pages inside it are still asked for). The mapping is unmapped when the returned array is
    freed."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    color = next(_next_color) % _COLORS * _COLOR_STEP
    try:
        mapping = mmap.mmap(-1, size + HUGE_PAGE + color, flags=flags)
        start = -ctypes.addressof(ctypes.c_uint8.from_buffer(mapping)) % HUGE_PAGE  # (the huge pages asked for)
    except (OSError, OverflowError):
        try:
            mapping = mmap.mmap(-1, size, flags=flags)
        except (OSError, OverflowError) as e:  # (as MemoryError, so that the LRU allocator frees its cache and retries)
            reason = e.strerror if isinstance(e, OSError) else "too large"
            raise MemoryError(f"could not map {size} bytes of host memory ({reason})") from e
        start = color = 0  # a page boundary: aligned enough for the kernels
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, size + color)
    except OSError:  # a kernel without transparent huge pages: plain pages serve as well
        pass
    return (ctypes.c_uint8 * size).from_buffer(mapping, start + color)  # keeps `mapping` alive


class MallocAllocator(LRUAllocator):
    """Host memory from the C heap (through ctypes): the allocator of every CPU device. Its buffers are ctypes arrays
    (`ctypes.addressof` gives a kernel's pointer); it offers views and zero-copy reads."""

    def _alloc(self, size: int, options: Any) -> Any:
        if size >= HUGE_PAGE and _HUGE_PAGES:
            return _huge_page_buffer(size)
        # aligned to a cache line (and an AVX-512 vector): a kernel's vector loads then never straddle two lines
        # (matmul 1024 on CLANG: about +20% against the heap's 16-byte alignment)
        try:
            raw = (ctypes.c_uint8 * (size + ALIGNMENT))()
        except (MemoryError, OverflowError) as e:  # (ctypes' MemoryError says nothing)
            raise MemoryError(f"could not allocate {size} bytes of host memory from the C heap") from e
        return (ctypes.c_uint8 * size).from_buffer(raw, -ctypes.addressof(raw) % ALIGNMENT)  # keeps `raw` alive

    def as_buffer(self, src: Any) -> memoryview:
        return memoryview(src).cast("B") if len(src) else memoryview(b"")

    def copyin(self, dest: Any, src: memoryview) -> None:
        ctypes.memmove(dest, bytes(src) if src.readonly else (ctypes.c_char * src.nbytes).from_buffer(src), src.nbytes)

    def copyout(self, dest: memoryview, src: Any) -> None:
        ctypes.memmove((ctypes.c_char * dest.nbytes).from_buffer(dest), src, dest.nbytes)

    def offset(self, buf: Any, size: int, offset: int) -> Any:
        return (ctypes.c_uint8 * size).from_buffer(buf, offset)


# ***** collectives (optional, plugin API 2.1) *****


class Collective:
    """How `tgcore.distributed` hands a device's memory to MPI in place, without copying it through a host array.

    Optional: the core asks the `tg_collective` hook once per device instance, and a device no plugin answers for
    takes the host path (copyout to a numpy array, the collective, copyin), which works on every device. A Collective
    is worth offering where MPI can address the device's memory itself: host memory (`HostCollective`), or device
    memory under an MPI built with support for the device.
    """

    def mpi_buffer(self, allocator: Allocator, opaque: Any, nbytes: int) -> Any:
        """The memory of one allocation as a buffer MPI reads and writes in place, or None for "copy it instead".

        :param allocator: the device instance's Allocator, which made `opaque`.
        :param opaque: the allocation (what `allocator.alloc` returned, or an `offset` view of one).
        :param nbytes: its size in bytes.
        :return: an object mpi4py accepts as a writable buffer of exactly `nbytes` bytes over that memory (a writable
            memoryview of host memory; for an MPI with device support, an object with `__cuda_array_interface__`), or
            None. The core synchronizes the device before the collective and reads the memory as the kernel's result
            after it; it never keeps the object past the collective.
        """
        return None


class HostCollective(Collective):
    """The Collective of a device whose allocator's memory is host memory it views without a copy (`as_buffer`): MPI
    reduces the tensor's own bytes, with no copy to or from a host array (`tg_collective = part_for("MYDEV",
    HostCollective)`)."""

    def mpi_buffer(self, allocator: Allocator, opaque: Any, nbytes: int) -> Any:
        if not allocator.supports_as_buffer or nbytes == 0:
            return None
        view = allocator.as_buffer(opaque)
        return view if not view.readonly and view.nbytes == nbytes else None


# ***** the hooks *****


class Registry(Protocol):
    """What `tg_register_devices` is given: the core's device registry (tgcore/registry.py), seen from a plugin."""

    def add(self, spec: DeviceSpec) -> None:
        """Register one device; a version the core does not serve, or a name another plugin claims, is settled there."""


class HookSpecs:
    """The hooks a plugin may implement.

    Each part hook gets `device`, the canonical name without `:N` ("MYDEV"), and may also take `instance`, the device
    instance being opened ("MYDEV" or "MYDEV:1"): pluggy passes only the arguments an implementation names. A part
    hook answers None for a device that is not its plugin's; the first answer that is not None is the device's part.
    """

    @hookspec
    def tg_register_devices(self, registry: Registry) -> None:
        """Declare this plugin's devices.

        :param registry: the core's device registry; call `registry.add(DeviceSpec(...))` once per device.
        :return: nothing. A DeviceSpec built for a plugin API this core does not serve is refused (see the module's
            docstring), and the device is listed as refused with the reason.
        """

    @hookspec(firstresult=True)
    def tg_renderer(self, device: str, instance: str) -> Optional[Renderer]:
        """The code generator of a device.

        :param device: the canonical device name, without `:N` ("MYDEV").
        :param instance: the device instance being opened ("MYDEV" or "MYDEV:1").
        :return: a Renderer instance for `device`, or None if `device` is not this plugin's.
        """

    @hookspec(firstresult=True)
    def tg_compiler(self, device: str, instance: str) -> Optional[Compiler]:
        """The compiler of a device.

        :param device: the canonical device name, without `:N`.
        :param instance: the device instance being opened.
        :return: a Compiler instance (its `compile_cached` is what the core calls), or None if not this plugin's.
        """

    @hookspec(firstresult=True)
    def tg_allocator(self, device: str, instance: str) -> Optional[Allocator]:
        """The memory of one device instance (asked once per instance: "MYDEV:1" gets its own).

        :param device: the canonical device name, without `:N`.
        :param instance: the device instance whose memory this allocator manages.
        :return: an Allocator instance, or None if not this plugin's.
        """

    @hookspec(firstresult=True)
    def tg_collective(self, device: str, instance: str) -> Optional[Collective]:
        """Optional (plugin API 2.1): how `tgcore.distributed` hands this device's memory to MPI in place.

        Not one of the four parts a device needs: a device without it copies through host arrays for collectives.

        :param device: the canonical device name, without `:N`.
        :param instance: the device instance.
        :return: a Collective instance (see Collective; `HostCollective` for host memory), or None if `device` is
            not this plugin's or it offers none.
        """

    @hookspec(firstresult=True)
    def tg_runtime(self, device: str, instance: str) -> Optional[type[Program]]:
        """The class that loads and launches a device's compiled kernels.

        :param device: the canonical device name, without `:N`.
        :param instance: the device instance being opened.
        :return: a Program subclass (the core calls it as `Program(instance, name, lib)`, then calls the object as
            documented on Program), or None if not this plugin's.
        """


Part = TypeVar("Part")


def part_for(
    device: str, make: Callable[..., Part], per_instance: bool = False
) -> Callable[[str, str], Optional[Part]]:
    """A part hook (marked as a hookimpl) that answers only for `device`: `make()`, or `make(instance)` with
    `per_instance`, for it, None for every other device. It becomes the plugin's hook by the name it is given:

        tg_compiler = part_for("MYDEV", MyCompiler)
        tg_allocator = part_for("MYDEV", lambda instance: MyAllocator(instance_index(instance)), per_instance=True)
        tg_runtime = part_for("MYDEV", lambda: MyProgram)
    """
    mine = device

    def hook(device: str, instance: str) -> Optional[Part]:  # (pluggy passes the arguments by these names)
        if device != mine:
            return None
        return make(instance) if per_instance else make()

    return hookimpl(hook)


class InstanceCache(Generic[Part]):
    """One object per numbered device instance, made on first use and shared after (a GPU context, a command queue):
    the thread-safe `dict.setdefault` that GPU plugins need for `tg_allocator`, their compilers and their Programs."""

    def __init__(self, make: Callable[[str], Part]) -> None:
        self._make, self._lock = make, threading.Lock()
        self._made: dict[str, Part] = {}

    def __call__(self, instance: str) -> Part:
        """The object of `instance` ("MYDEV" and "MYDEV:0" are one instance), made by `make(instance)` the first
        time; an exception of `make` is raised to the caller and nothing is kept, so a later call tries again."""
        key = f"{instance.partition(':')[0]}:{instance_index(instance)}"
        if (made := self._made.get(key)) is not None:
            return made
        with self._lock:
            if key not in self._made:
                self._made[key] = self._make(instance)
            return self._made[key]

    def clear(self) -> None:
        with self._lock:
            self._made.clear()


def instance_index(instance: str) -> int:
    """0 for "MYDEV" or "MYDEV:0", N for "MYDEV:N"; ValueError for any other text after the colon."""
    _, _, index = instance.partition(":")
    if index and not index.isdigit():
        raise ValueError(f"bad device instance {instance!r}: expected NAME or NAME:N with N a number")
    return int(index) if index else 0


def vector_register_bytes(features: Collection[str]) -> int:
    """Bytes in one vector register of a CPU with instruction-set `features` (lower-case names as in /proc/cpuinfo:
    "avx512f", "avx"): 64 with AVX-512, 32 with AVX, else 16 (SSE, NEON)."""
    return 64 if "avx512f" in features else 32 if "avx" in features else 16


def thread_count() -> int:
    """Host threads a kernel (or a plugin's pool of compile processes) may use: TGCORE_THREADS, else the cores this
    process may run on (asked once: a system call at every threaded launch cost ~1 us; a forked child asks again)."""
    if (n := os.environ.get("TGCORE_THREADS", "")).isdigit() and int(n) > 0:
        return int(n)
    return _cores()


@functools.lru_cache(maxsize=1)
def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_cores.cache_clear)


def vector_register_count(features: Collection[str], x86: bool) -> int:
    """Vector registers of a CPU: 32 with AVX-512 and off x86 (AArch64's NEON), 16 on x86 without AVX-512."""
    return 32 if "avx512f" in features or not x86 else 16


def vector_widths(vector_bytes: int, of: Iterable[DType]) -> dict[DType, int]:
    """Renderer.vector_widths for a target whose vector registers hold `vector_bytes`: elements of each dtype in `of`
    per register (bool excluded: it is never vectorized)."""
    return {dt: max(1, vector_bytes // dt.itemsize) for dt in of if dt != dtypes.bool}


@functools.lru_cache(maxsize=None)
def numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy type that holds a tgcore dtype's values (a pointer dtype's: its elements'); bfloat16, which numpy
    lacks, in float32 (which holds every bfloat16 value exactly)."""
    if isinstance(dtype, PtrDType):
        dtype = dtype.base
    if dtype == dtypes.bfloat16:
        return np.dtype(np.float32)
    if dtype.np is None:
        raise ValueError(f"dtype {dtype} has no numpy type: expected one of {[str(d) for d in ALL_DTYPES]}")
    return np.dtype(dtype.np)


def plugin_module(name: str, **hooks: Callable[..., Any]) -> types.SimpleNamespace:
    """A plugin object from plain functions, each marked as a hookimpl: handy for tests and small plugins."""
    return types.SimpleNamespace(__name__=name, **{k: v if _is_hookimpl(v) else hookimpl(v) for k, v in hooks.items()})


def _is_hookimpl(function: Any) -> bool:
    return hasattr(function, "tgcore_impl")  # (pluggy's marker attribute: "<project>_impl")


# the plugin manager and the device registry moved above the contract (tgcore/registry.py); their old names here keep
# working, looked up when first asked for (by name: the contract imports nothing of the engine)
_MOVED = ("plugins", "PluginManager", "DeviceRegistry", "PluginRecord", "PluginWarning", "Registration", "Conflict")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module("tgcore.registry"), name)
    raise AttributeError(f"module 'tgcore.plugin' has no attribute {name!r}")
