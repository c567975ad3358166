"""Hand-built UOp kernels: a builder for the IR of `tgcore.codegen.uops`, and running a kernel on the target.

Kernels are written the way the linearizer writes them: DEFINE_GLOBALs first, constants before the loops, then
one global index (a RANGE loop when the renderer's `global_max` is None, else a SPECIAL `gidx0` launched with
global_size=(n, 1, 1), local_size=(1, 1, 1)), LOADs, the op, a STORE, and the ENDRANGEs.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import numpy as np

from tg_conformance import reference as ref
from tg_conformance.target import COMPILE, RUN, Target
from tgcore.codegen.uops import UOp, UOps, print_uops
from tgcore.device import Buffer
from tgcore.dtype import DType, PtrDType, dtypes, to_dtype
from tgcore.helpers import diskcache_get, diskcache_put, getenv
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps


class KernelFailure(AssertionError):
    """A kernel did not render, compile or run; the message names the stage and carries the cause."""


@dataclass
class Kernel:
    """A finished uop list and how to launch it."""

    name: str
    uops: list[UOp]
    buffers: list[tuple[DType, int]]  # element dtype and size of each DEFINE_GLOBAL, by index
    global_size: Optional[tuple[int, int, int]] = None
    local_size: Optional[tuple[int, int, int]] = None


@dataclass
class KernelBuilder:
    """Appends uops in program order."""

    renderer: Any
    name: str
    uops: list[UOp] = field(default_factory=list)
    buffers: list[tuple[DType, int]] = field(default_factory=list)
    open_ranges: list[UOp] = field(default_factory=list)
    global_size: Optional[tuple[int, int, int]] = None

    def add(self, op: UOps, dtype: Optional[DType] = None, src: Sequence[UOp] = (), arg: Any = None) -> UOp:
        u = UOp(op, dtype, tuple(src), arg)
        self.uops.append(u)
        return u

    def buffer(self, dtype: DType, size: int, writable: bool = False) -> UOp:
        index = len(self.buffers)
        self.buffers.append((dtype, size))
        return self.add(UOps.DEFINE_GLOBAL, PtrDType.of(dtype), (), (index, f"data{index}", writable))

    def const(self, value: Any, dtype: DType) -> UOp:
        return self.add(UOps.CONST, dtype, (), value)

    def var(self, name: str, lo: int, hi: int) -> UOp:
        return self.add(UOps.DEFINE_VAR, dtypes.int32, (), (name, lo, hi))

    def global_index(self, n: int) -> UOp:
        """The index of one of `n` work items: a loop on CPU-style renderers, a launched SPECIAL on GPU-style ones."""
        if self.renderer.global_max is None:
            return self.loop(self.const(0, dtypes.int32), self.const(n, dtypes.int32), axis=0, reduce=False)
        self.global_size = (n, 1, 1)
        return self.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", n))

    def loop(self, start: UOp, end: UOp, axis: int, reduce: bool) -> UOp:
        r = self.add(UOps.RANGE, dtypes.int32, (start, end), (axis, reduce))
        self.open_ranges.append(r)
        return r

    def end_loop(self) -> None:
        self.add(UOps.ENDRANGE, None, (self.open_ranges.pop(),))

    def load(self, buf: UOp, idx: UOp, gate: Optional[UOp] = None, alt: Optional[UOp] = None) -> UOp:
        dt = buf.dtype.base if isinstance(buf.dtype, PtrDType) else buf.dtype
        return self.add(UOps.LOAD, dt, (buf, idx) if gate is None else (buf, idx, gate, alt))

    def store(self, buf: UOp, idx: UOp, value: UOp, gate: Optional[UOp] = None) -> UOp:
        return self.add(UOps.STORE, None, (buf, idx, value) if gate is None else (buf, idx, value, gate))

    def alu(self, op: Any, dtype: DType, *src: UOp) -> UOp:
        return self.add(UOps.ALU, dtype, src, op)

    def finish(self) -> Kernel:
        while self.open_ranges:
            self.end_loop()
        launched = self.global_size is not None
        return Kernel(self.name, self.uops, self.buffers, self.global_size, (1, 1, 1) if launched else None)


def kernel_name(*parts: str) -> str:
    """A C-identifier kernel name made of `parts` (the same for the same parts, so sources can be compiled ahead)."""
    return "tgc_" + "_".join(p.replace(" ", "").replace("-", "_") for p in parts)


class CompilePool:
    """Compiles kernel sources ahead of the tests that run them, on worker threads, with the core's disk cache.

    Like `Compiler.compile_cached`, a source found in the sqlite cache (table `compiler.cachekey`) is not compiled
    again (DISABLE_COMPILER_CACHE=1 compiles everything afresh); the cache is only touched from the main thread.
    TG_CONFORMANCE_JOBS sets the number of threads (default: the CPU count, at most 4; 1 turns this off). A source
    whose background compile failed is compiled again by its test, so every error is reported by its own test."""

    def __init__(self) -> None:
        self.results: dict[str, Union[bytes, Future]] = {}
        self.executor: Optional[ThreadPoolExecutor] = None

    @staticmethod
    def jobs() -> int:
        return int(os.environ.get("TG_CONFORMANCE_JOBS", min(4, os.cpu_count() or 1)))

    @staticmethod
    def _uses_disk_cache(compiler: Any) -> bool:
        return getattr(compiler, "cachekey", None) is not None and getenv("DISABLE_COMPILER_CACHE") == 0

    def submit(self, compiler: Any, src: str) -> None:
        if src in self.results:
            return
        if self._uses_disk_cache(compiler) and (lib := diskcache_get(compiler.cachekey, src)) is not None:
            self.results[src] = lib
            return
        if self.jobs() > 1:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(self.jobs(), thread_name_prefix="tg-conformance-compile")
            self.results[src] = self.executor.submit(compiler.compile, src)

    def compile(self, compiler: Any, src: str) -> bytes:
        """The compiled `src`: from the worker that compiled it ahead, else `compiler.compile_cached`."""
        got = self.results.get(src)
        if isinstance(got, Future):
            try:
                got = got.result()
            except Exception:
                got = None
            if isinstance(got, bytes):
                self.results[src] = got
                if getattr(compiler, "cachekey", None) is not None:
                    diskcache_put(compiler.cachekey, src, got)
        return got if isinstance(got, bytes) else compiler.compile_cached(src)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
        self.executor, self.results = None, {}


compile_pool = CompilePool()


def execute(target: Target, kernel: Kernel, inputs: dict[int, np.ndarray], vals: Sequence[int] = (),
            what: str = "") -> Optional[list[np.ndarray]]:
    """Render, compile and run `kernel` with buffer contents `inputs` (by index; others start as 0xA5 bytes).

    Returns every buffer's contents after the run, or None in compile-only / render-only mode (after that stage)."""
    stage = "render"
    try:
        src = target.renderer.render(kernel.name, kernel.uops)
        if not isinstance(src, str):
            raise KernelFailure(f"render returned {type(src).__name__}, expected str")
        if target.mode not in (RUN, COMPILE):
            return None
        stage = "compile"
        assert target.compiler is not None
        lib = compile_pool.compile(target.compiler, src)
        if target.mode != RUN:
            return None
        stage = "load"
        assert target.runtime is not None
        program = target.runtime(target.name, kernel.name, lib)
        bufs = []
        for i, (dt, size) in enumerate(kernel.buffers):
            raw = ref.to_bytes(inputs[i], dt) if i in inputs else b"\xa5" * (size * dt.itemsize)
            if len(raw) != size * dt.itemsize:
                raise ValueError(f"buffer {i}: {len(raw)} bytes of input for {size} x {dt.short_name}")
            bufs.append(Buffer(target.name, size, dt, initial_value=raw))
        stage = "run"
        launch: dict[str, Any] = {"vals": tuple(vals), "wait": True}
        if kernel.global_size is not None:
            launch["global_size"], launch["local_size"] = kernel.global_size, kernel.local_size
        program(*[b._opaque for b in bufs], **launch)
        out = []
        for b, (dt, size) in zip(bufs, kernel.buffers):
            raw_out = bytearray(size * dt.itemsize)
            b.copyout(memoryview(raw_out))
            out.append(ref.from_bytes(bytes(raw_out), dt))
        return out
    except KernelFailure:
        raise
    except Exception as e:
        text = str(e)
        if len(text) > 3000:
            text = text[:3000] + "\n... (truncated)"
        raise KernelFailure(f"{what or kernel.name}: {stage} failed: {type(e).__name__}: {text}") from e


# ***** the kernels of the uop tests *****

def alu_kernel(target: Target, op: Any, dt: DType, n: int) -> Kernel:
    """out[i] = op(in1[i], in2[i], ...) for n lanes."""
    b = KernelBuilder(target.renderer, kernel_name("alu", ref.op_name(op), dt.short_name))
    operand_dts = ref.operand_dtypes(op, dt)
    out = b.buffer(ref.result_dtype(op, dt), n, writable=True)
    ins = [b.buffer(odt, n) for odt in operand_dts]
    i = b.global_index(n)
    b.store(out, i, b.alu(op, ref.result_dtype(op, dt), *[b.load(x, i) for x in ins]))
    return b.finish()


def run_alu(target: Target, op: Any, dt: DType, operands: Sequence[np.ndarray]) -> Optional[np.ndarray]:
    n = len(operands[0])
    k = alu_kernel(target, op, dt, n)
    what = f"ALU {ref.op_name(op)} on {dt.short_name}"
    out = execute(target, k, {i + 1: x for i, x in enumerate(operands)}, what=what)
    return None if out is None else out[0]


def convert_kernel(target: Target, uop: UOps, src: DType, dst: DType, n: int) -> Kernel:
    """out[i] = CAST or BITCAST of in[i] from `src` to `dst`."""
    b = KernelBuilder(target.renderer, kernel_name(uop.name.lower(), src.short_name, dst.short_name))
    out, x = b.buffer(dst, n, writable=True), b.buffer(src, n)
    i = b.global_index(n)
    b.store(out, i, b.add(uop, dst, (b.load(x, i),)))
    return b.finish()


def run_convert(target: Target, uop: UOps, src: DType, dst: DType, x: np.ndarray) -> Optional[np.ndarray]:
    k = convert_kernel(target, uop, src, dst, len(x))
    out = execute(target, k, {1: x}, what=f"{uop.name} {src.short_name} -> {dst.short_name}")
    return None if out is None else out[0]


# ***** reproducing one case from the command line *****

def _op_from_name(name: str) -> Any:
    for enum in (UnaryOps, BinaryOps, TernaryOps):
        if name in enum.__members__:
            return enum[name]
    raise ValueError(f"unknown ALU op {name!r}")


def repro_alu(device: str, op: str, dtype: str, *operands: Sequence[Any]) -> np.ndarray:
    """Run ALU `op` on `dtype` on `device` for the given operand lists; print source, result and expectation."""
    target = Target.resolve(device)
    o, dt = _op_from_name(op), to_dtype(dtype)
    cols = [ref.make_array(col, odt) for col, odt in zip(operands, ref.operand_dtypes(o, dt))]
    k = alu_kernel(target, o, dt, len(cols[0]))
    print(print_uops(k.uops))
    print(target.renderer.render(k.name, k.uops))
    got = execute(target, k, {i + 1: x for i, x in enumerate(cols)})
    assert got is not None
    exp = ref.alu_reference(o, dt, cols)
    rdt = ref.result_dtype(o, dt)
    for lane in range(len(cols[0])):
        args = ", ".join(ref.fmt(c[lane], odt) for c, odt in zip(cols, ref.operand_dtypes(o, dt)))
        print(f"{op}({args}) = {ref.fmt(got[0][lane], rdt)}   expected {ref.fmt(exp[lane], rdt)}")
    return got[0]


def repro_convert(device: str, kind: str, src: str, dst: str, values: Sequence[Any]) -> np.ndarray:
    """Run CAST or BITCAST (`kind`) from `src` to `dst` on `device` for `values`; print the result and expectation."""
    target = Target.resolve(device)
    s, d, uop = to_dtype(src), to_dtype(dst), UOps[kind]
    x = ref.make_array(values, s)
    k = convert_kernel(target, uop, s, d, len(x))
    print(target.renderer.render(k.name, k.uops))
    got = execute(target, k, {1: x})
    assert got is not None
    exp = ref.cast_reference(x, s, d) if uop is UOps.CAST else ref.bitcast_reference(x, s, d)
    for lane in range(len(x)):
        print(f"{kind}({ref.fmt(x[lane], s)} -> {dst}) = {ref.fmt(got[0][lane], d)}   expected {ref.fmt(exp[lane], d)}")
    return got[0]
