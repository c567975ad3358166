"""The C-family renderer base as it is: a CStyleLanguage subclass that overrides nothing renders C that the system's
C compilers build (-std=c11) and that computes what numpy does; and the launch hooks GPU dialects override get the
kernel's launch (work-item indices, local size)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from typing import Any, Optional

import numpy as np
import pytest

from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import DType, PtrDType, dtypes
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps
from tgcore.renderer.cstyle import CStyleLanguage, KernelLaunch

COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c) is not None]
pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler (gcc, clang) on PATH")


class PlainC(CStyleLanguage):
    """The base, nothing overridden."""


class HalfC(CStyleLanguage):
    """The base with _Float16 as float16 (GCC 12+ on x86-64 and AArch64; clang 14 on x86 has no such type)."""

    type_map = {**CStyleLanguage.type_map, dtypes.float16: "_Float16"}


class Builder:
    """Uops in program order, the way the linearizer writes a CPU-style kernel (global indices are loops)."""

    def __init__(self) -> None:
        self.uops: list[UOp] = []
        self.n_buf = 0
        self.ranges: list[UOp] = []

    def add(self, op: UOps, dtype: Optional[DType] = None, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        self.uops.append(u := UOp(op, dtype, src, arg))
        return u

    def buf(self, dt: DType, writable: bool = False) -> UOp:
        self.n_buf += 1
        return self.add(UOps.DEFINE_GLOBAL, PtrDType.of(dt), (), (self.n_buf - 1, f"data{self.n_buf - 1}", writable))

    def const(self, v: Any, dt: DType) -> UOp:
        return self.add(UOps.CONST, dt, (), v)

    def loop(self, n: int, reduce: bool = False) -> UOp:
        r = self.add(UOps.RANGE, dtypes.int32, (self.const(0, dtypes.int32), self.const(n, dtypes.int32)),
                     (len(self.ranges), reduce))
        self.ranges.append(r)
        return r

    def end(self) -> None:
        self.add(UOps.ENDRANGE, None, (self.ranges.pop(),))

    def load(self, b: UOp, i: UOp) -> UOp:
        assert isinstance(b.dtype, PtrDType)
        return self.add(UOps.LOAD, b.dtype.base, (b, i))

    def store(self, b: UOp, i: UOp, v: UOp) -> None:
        self.add(UOps.STORE, None, (b, i, v))

    def alu(self, op: Any, dt: DType, *src: UOp) -> UOp:
        return self.add(UOps.ALU, dt, src, op)

    def finish(self) -> list[UOp]:
        while self.ranges:
            self.end()
        return self.uops


def build(src: str, name: str, tmp_path: Any, cc: str) -> Any:
    """The kernel `name` of C source `src`, built as a shared library by `cc` and loaded (ctypes)."""
    c, so = tmp_path / f"{name}.c", tmp_path / f"{name}_{cc}.so"
    c.write_text(src)
    proc = subprocess.run([cc, "-std=c11", "-O2", "-shared", "-fPIC", "-Werror=implicit-function-declaration",
                           "-o", str(so), str(c), "-lm"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{cc} failed:\n{proc.stderr}\n{src}")
    return getattr(ctypes.CDLL(str(so)), name)


def run(renderer: CStyleLanguage, uops: list[UOp], arrays: list[np.ndarray], tmp_path: Any, cc: str) -> None:
    """Render, build and call the kernel on `arrays` (its buffers, in DEFINE_GLOBAL order; written in place)."""
    fn = build(renderer.render("kern", uops), "kern", tmp_path, cc)
    fn(*[a.ctypes.data_as(ctypes.c_void_p) for a in arrays])


def elementwise(in_dts: list[DType], out_dt: DType, n: int, body: Any) -> list[UOp]:
    """out[i] = body(builder, loaded inputs) for i < n."""
    b = Builder()
    out = b.buf(out_dt, writable=True)
    ins = [b.buf(dt) for dt in in_dts]
    i = b.loop(n)
    b.store(out, i, body(b, [b.load(x, i) for x in ins]))
    return b.finish()


@pytest.mark.parametrize("cc", COMPILERS)
def test_int8_is_signed(tmp_path: Any, cc: str) -> None:
    """int8 is a signed byte whatever plain char is: -128..127 widen and compare as signed."""
    x = np.arange(-128, 128, dtype=np.int8)
    out = np.zeros(256, np.int32)
    uops = elementwise([dtypes.int8], dtypes.int32, 256, lambda b, v: b.alu(
        TernaryOps.WHERE, dtypes.int32, b.alu(BinaryOps.CMPLT, dtypes.bool, v[0], b.const(0, dtypes.int8)),
        b.add(UOps.CAST, dtypes.int32, (v[0],)), b.const(1000, dtypes.int32)))
    run(PlainC(), uops, [out, x], tmp_path, cc)
    np.testing.assert_array_equal(out, np.where(x < 0, x.astype(np.int32), 1000))


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_infinity_and_nan_constants(tmp_path: Any, cc: str, dt: DType) -> None:
    """INFINITY, -INFINITY and NAN constants (math.h from the prelude): max(x, -inf) + inf, and x * nan."""
    np_dt = np.dtype(dt.np)
    x = np.array([-3.5, 0.0, 2.0, np.inf, -np.inf, np.nan], np_dt)
    a, c = np.zeros_like(x), np.zeros_like(x)
    b = Builder()
    out_a, out_c, src = b.buf(dt, True), b.buf(dt, True), b.buf(dt)
    i = b.loop(len(x))
    v = b.load(src, i)
    b.store(out_a, i, b.alu(BinaryOps.ADD, dt, b.alu(BinaryOps.MAX, dt, v, b.const(-np.inf, dt)), b.const(np.inf, dt)))
    b.store(out_c, i, b.alu(BinaryOps.MUL, dt, v, b.const(np.nan, dt)))
    run(PlainC(), b.finish(), [a, c, x], tmp_path, cc)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(a, np.maximum(x, -np.inf) + np.inf)
    assert np.isnan(c).all()


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("op,ref", [(UnaryOps.EXP2, np.exp2), (UnaryOps.LOG2, np.log2), (UnaryOps.SQRT, np.sqrt),
                                    (UnaryOps.SIN, np.sin)], ids=["exp2", "log2", "sqrt", "sin"])
def test_math(tmp_path: Any, cc: str, dt: DType, op: Any, ref: Any) -> None:
    """exp2 / log2 / sqrt / sin through libm (the f variants for float32) agree with numpy to the dtype's ulps."""
    np_dt = np.dtype(dt.np)
    x = np.concatenate([np.linspace(0.01, 30.0, 61), [0.0, 1.0, np.inf]]).astype(np_dt)
    out = np.zeros_like(x)
    run(PlainC(), elementwise([dt], dt, len(x), lambda b, v: b.alu(op, dt, v[0])), [out, x], tmp_path, cc)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_allclose(out, ref(x), rtol=4 * np.finfo(np_dt).eps, atol=0)


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64], ids=lambda d: d.short_name)
def test_signed_arithmetic_wraps(tmp_path: Any, cc: str, dt: DType) -> None:
    """Signed + * and x / -1 wrap as numpy's do (no -fwrapv: the base spells them on the unsigned type); x / 0 is 0."""
    info = np.iinfo(dt.np)
    a = np.array([info.max, info.min, info.min, 7, -7, info.max // 3], dt.np)
    c = np.array([1, -1, -1, 0, 2, info.max], dt.np)
    outs = [np.zeros_like(a) for _ in range(3)]
    b = Builder()
    bufs = [b.buf(dt, True) for _ in range(3)] + [b.buf(dt), b.buf(dt)]
    i = b.loop(len(a))
    va, vc = b.load(bufs[3], i), b.load(bufs[4], i)
    b.store(bufs[0], i, b.alu(BinaryOps.ADD, dt, va, vc))
    b.store(bufs[1], i, b.alu(BinaryOps.MUL, dt, va, vc))
    b.store(bufs[2], i, b.alu(BinaryOps.DIV, dt, va, vc))
    run(PlainC(), b.finish(), [*outs, a, c], tmp_path, cc)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(outs[0], a + c)
        np.testing.assert_array_equal(outs[1], a * c)
    # C's quotient truncates toward 0; -INT_MIN wraps to INT_MIN
    sign = [-1 if (x < 0) != (y < 0) else 1 for x, y in zip(a.tolist(), c.tolist())]
    quotient = [0 if y == 0 else s * (abs(x) // abs(y)) for s, x, y in zip(sign, a.tolist(), c.tolist())]
    bits = 8 * dt.itemsize
    wrapped = [(q + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1) for q in quotient]
    np.testing.assert_array_equal(outs[2], np.array(wrapped, dt.np))


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce(tmp_path: Any, cc: str, op: str) -> None:
    """out[i] = reduce over j of x[i*13+j]: DEFINE_ACC, a reduce RANGE and PHI; MAX propagates a NaN."""
    n, r, dt = 5, 13, dtypes.float32
    x = (np.random.default_rng(0).integers(-20, 20, n * r) / 4).astype(np.float32)
    x[17] = np.nan
    out = np.zeros(n, np.float32)
    b = Builder()
    o, src = b.buf(dt, True), b.buf(dt)
    i = b.loop(n)
    acc = b.add(UOps.DEFINE_ACC, dt, (), 0.0 if op == "SUM" else -np.inf)
    j = b.loop(r, reduce=True)
    row = b.alu(BinaryOps.MUL, dtypes.int32, i, b.const(r, dtypes.int32))
    v = b.load(src, b.alu(BinaryOps.ADD, dtypes.int32, row, j))
    b.add(UOps.PHI, dt, (acc, b.alu(BinaryOps.ADD if op == "SUM" else BinaryOps.MAX, dt, acc, v)))
    b.end()
    b.store(o, i, acc)
    run(PlainC(), b.finish(), [out, x], tmp_path, cc)
    ref = x.reshape(n, r).sum(axis=1) if op == "SUM" else x.reshape(n, r).max(axis=1)
    np.testing.assert_array_equal(out, ref)


def test_mulacc_on_half_rounds_the_product(tmp_path: Any) -> None:
    """With a half type in its type_map, the base's MULACC rounds a*b to it before the sum (as numpy's float16
    multiply then add), where one expression would keep the product in float."""
    cc = "gcc" if "gcc" in COMPILERS else COMPILERS[0]
    dt = dtypes.float16
    # a*b = 1 + 2^-11 exactly: it rounds (to even) to 1.0 in float16; + 2^-11 then rounds to 1.0 again, while the
    # unrounded product plus 2^-11 is 1 + 2^-10, a float16
    a = np.array([1 + 2**-10, 3.0, -0.1], np.float16)
    b_ = np.array([(1 + 2**-11) / (1 + 2**-10), 5.0, 7.3], np.float16)
    c = np.array([2**-11, -1.5, 0.2], np.float16)
    out = np.zeros_like(a)
    uops = elementwise([dt, dt, dt], dt, len(a), lambda b, v: b.alu(TernaryOps.MULACC, dt, *v))
    try:
        fn = build(HalfC().render("kern", uops), "kern", tmp_path, cc)
    except AssertionError as e:
        if "_Float16" in str(e) and "not supported" in str(e):
            pytest.skip(f"{cc} has no _Float16 on this target")
        raise
    fn(*[arr.ctypes.data_as(ctypes.c_void_p) for arr in (out, a, b_, c)])
    np.testing.assert_array_equal(out, a * b_ + c)


def test_dtype_without_c_type_is_refused() -> None:
    """bfloat16 has no type in the base's type_map: rendering names it and what the map does spell."""
    uops = elementwise([dtypes.bfloat16], dtypes.bfloat16, 4, lambda b, v: v[0])
    with pytest.raises(NotImplementedError, match=r"PlainC has no C type for bfloat16 \(its type_map has bool, int8,"):
        PlainC().render("kern", uops)


class ToyGPU(CStyleLanguage):
    """A GPU dialect made of the launch hooks only."""

    kernel_prefix = "__kernel "
    code_for_workitem = {"g": lambda d: f"group_id({d})", "l": lambda d: f"local_id({d})"}

    def render_special(self, u: UOp, launch: KernelLaunch) -> str:
        if u.arg[1].startswith("g") and not launch.grouped:
            return f"global_id({u.arg[0]})"
        return super().render_special(u, launch)

    def launch_bounds(self, launch: KernelLaunch) -> str:
        return f"__bounds({','.join(map(str, launch.local_size))}) " if launch.grouped else ""

    def kernel_prologue(self, launch: KernelLaunch) -> list[str]:
        return [f"/* {len(launch.specials)} indices, {launch.threads} threads */"]


@pytest.mark.parametrize("local", [None, 8])
def test_launch_hooks(local: Optional[int]) -> None:
    """render_special, launch_bounds and kernel_prologue see the kernel's launch: grouped with its local size when
    it has a local index, else not."""
    b = Builder()
    out = b.buf(dtypes.float32, True)
    g = b.add(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 16))
    idx = g
    if local is not None:
        lid = b.add(UOps.SPECIAL, dtypes.int32, (), (1, "lidx1", local))
        group = b.alu(BinaryOps.MUL, dtypes.int32, g, b.const(local, dtypes.int32))
        idx = b.alu(BinaryOps.ADD, dtypes.int32, group, lid)
    b.store(out, idx, b.const(1.0, dtypes.float32))
    src = ToyGPU().render("kern", b.finish())
    if local is None:
        assert "__kernel void kern(float* restrict data0)" in src and "= global_id(0);" in src
        assert "/* 1 indices, None threads */" in src
    else:
        assert "__kernel __bounds(1,8,1) void kern(" in src and "= group_id(0);" in src and "= local_id(1);" in src
        assert "/* 2 indices, 8 threads */" in src
        assert "= (gidx0*8);" in src and "= (alu0+lidx1);" in src  # index arithmetic is plain (no wrapping)


def _linearized(t: Any, inputs: dict[int, np.ndarray]) -> tuple[Any, list[np.ndarray]]:
    """The ProgramSpec that the core's optimizer and linearizer make of `t`'s last kernel for PlainC, and the arrays
    of its buffers (output first, then each input by the id of its realized tensor's base in `inputs`)."""
    from tgcore.codegen.kernel import Kernel
    from tgcore.codegen.program import to_program

    si = t.schedule()[-1]
    spec = to_program(Kernel(si.ast, PlainC()))
    out = np.zeros(si.outputs[0].shape, np.dtype(si.outputs[0].dtype.np))
    return spec, [out, *(inputs[id(lb)] for lb in si.inputs)]


@pytest.mark.parametrize("cc", COMPILERS)
def test_kernels_of_the_core_build_and_agree_with_numpy(tmp_path: Any, cc: str) -> None:
    """Kernels the optimizer and linearizer make (loops, a reduce, upcasts) render with the bare base and compute
    numpy's results: a matmul with a max, and exp2 of a sum."""
    from tgcore import Tensor

    rng = np.random.default_rng(1)
    xa, xb = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    a, b = Tensor(xa).realize(), Tensor(xb).realize()
    arrays = {id(a.lazydata.base): xa, id(b.lazydata.base): xb}
    cases = [((a @ b).maximum(0.5), np.maximum(xa @ xb, 0.5)), ((a * 0.5).sum(1).exp2(), np.exp2((xa * 0.5).sum(1)))]
    for t, want in cases:
        spec, bufs = _linearized(t, arrays)
        fn = build(spec.src, spec.name, tmp_path, cc)
        fn(*[x.ctypes.data_as(ctypes.c_void_p) for x in bufs])
        np.testing.assert_allclose(bufs[0], want, rtol=1e-5, atol=1e-5)


class OffsetC(CStyleLanguage):
    """The base spelling `x + c` accesses as pointer offsets."""

    pointer_offsets = True


@pytest.mark.parametrize("cc", COMPILERS)
def test_pointer_offsets_need_no_statement_unless_used_as_a_value(tmp_path: Any, cc: str) -> None:
    # out[i] = a[i + 1] * 2 + (i + 2), over i < 7: i + 1 only addresses (spelled in the access), i + 2 is also a value
    b = Builder()
    out, a = b.buf(dtypes.int32, writable=True), b.buf(dtypes.int32)
    i = b.loop(7)
    at = b.alu(BinaryOps.ADD, dtypes.int32, i, b.const(1, dtypes.int32))
    value = b.alu(BinaryOps.ADD, dtypes.int32, i, b.const(2, dtypes.int32))
    doubled = b.alu(BinaryOps.MUL, dtypes.int32, b.load(a, at), b.const(2, dtypes.int32))
    b.store(out, i, b.alu(BinaryOps.ADD, dtypes.int32, doubled, value))
    uops = b.finish()
    src = OffsetC().render("kern", uops)
    assert "(data1+gidx0)[1]" in src
    statements = [line.strip() for line in src.splitlines() if line.strip().startswith("int32_t alu")]
    assert len(statements) == 3, src  # i + 2, the product and the sum; i + 1 is spelled in the access alone
    x, o = np.arange(8, dtype=np.int32) * 3, np.zeros(7, dtype=np.int32)
    run(OffsetC(), uops, [o, x], tmp_path, cc)
    np.testing.assert_array_equal(o, x[1:] * 2 + np.arange(7) + 2)
