"""The level-3 cases: each builder makes one hand-written uop kernel, its inputs and the check of its outputs.

Builders are pure functions of (target, rng, parameters), so the suite can build every kernel of a run up front
and compile them on worker threads (see `compile_ahead`) while the tests run one by one.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import numpy as np

from tg_conformance import reference as ref
from tg_conformance.checks import assert_array, assert_lanes
from tg_conformance.kernels import Kernel, KernelBuilder, alu_kernel, compile_pool, convert_kernel, execute, kernel_name
from tg_conformance.target import COMPILE, RUN, Target
from tgcore.codegen.uops import UOps
from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps


@dataclass
class Case:
    """A kernel to run, what to feed it, the dtypes the device must claim, and how to check what comes back."""

    kernel: Kernel
    inputs: dict[int, np.ndarray]
    requires: tuple[DType, ...]
    check: Callable[[list[np.ndarray]], None]
    what: str
    vals: tuple[int, ...] = ()


def run_case(target: Target, case: Case) -> None:
    """Skip unless the device claims the case's dtypes; render (compile, run and check) as the mode allows."""
    target.require(*case.requires)
    out = execute(target, case.kernel, case.inputs, case.vals, what=case.what)
    if out is not None:
        case.check(out)


def alu(target: Target, rng: np.random.Generator, op: Any, dtype: DType) -> Case:
    """out[i] = op(in1[i], ...) over edge cases crossed with each other, plus random lanes."""
    cols = ref.alu_inputs(op, dtype, rng)
    operand_dts = ref.operand_dtypes(op, dtype)

    def check(out: list[np.ndarray]) -> None:
        tolerance = target.tolerance(dtype) if op in ref.TRANSCENDENTAL else None
        fused = bool(getattr(target.renderer, "fused_mulacc", False))
        # MAX of 0.0 and -0.0 may give either zero
        zero_free = (cols[0] == 0) & (cols[1] == 0) if op is BinaryOps.MAX and dtypes.is_float(dtype) else None
        assert_lanes(f"ALU {op.name} on {dtype.short_name}", target.name, op.name, list(zip(cols, operand_dts)),
                     out[0], ref.alu_reference(op, dtype, cols, fused), ref.result_dtype(op, dtype), "repro_alu",
                     (op.name, dtype.short_name), tolerance=tolerance, zero_sign_free=zero_free)

    return Case(alu_kernel(target, op, dtype, len(cols[0])), {i + 1: c for i, c in enumerate(cols)},
                (dtype, *operand_dts), check, f"ALU {op.name} on {dtype.short_name}")


def convert(target: Target, rng: np.random.Generator, uop: UOps, dtype: DType, dst: DType) -> Case:
    """out[i] = CAST or BITCAST of in[i] to `dst`."""
    if uop is UOps.CAST:
        x = ref.cast_inputs(dtype, dst, rng)
    else:
        x = np.concatenate([ref.edge_values(dtype), ref.random_values(dtype, 48, rng)])
    what = f"{uop.name} {dtype.short_name} -> {dst.short_name}"

    def check(out: list[np.ndarray]) -> None:
        exp = ref.cast_reference(x, dtype, dst) if uop is UOps.CAST else ref.bitcast_reference(x, dtype, dst)
        assert_lanes(what, target.name, f"{uop.name}[{dst.short_name}]", [(x, dtype)], out[0], exp, dst,
                     "repro_convert", (uop.name, dtype.short_name, dst.short_name))

    return Case(convert_kernel(target, uop, dtype, dst, len(x)), {1: x}, (dtype, dst), check, what)


def _some_values(dt: DType, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([ref.edge_values(dt), ref.random_values(dt, n, rng)])[:n]


def load_gated(target: Target, rng: np.random.Generator, dtype: DType) -> Case:
    """out[i] = i < m ? in[i] : alt, with `in` only m long: the gate must keep the load in bounds."""
    n, m = 24, 11
    alt = ref.make_array([True if dtype == dtypes.bool else 42], dtype)[0]
    b = KernelBuilder(target.renderer, kernel_name("load_gated", dtype.short_name))
    out, src = b.buffer(dtype, n, writable=True), b.buffer(dtype, m)
    bound, alt_u = b.const(m, dtypes.int32), b.const(alt.item(), dtype)
    i = b.global_index(n)
    b.store(out, i, b.load(src, i, b.alu(BinaryOps.CMPLT, dtypes.bool, i, bound), alt_u))
    x = _some_values(dtype, m, rng)

    def check(res: list[np.ndarray]) -> None:
        exp = np.concatenate([x, np.full(n - m, alt, dtype=x.dtype)])
        assert_array(f"gated LOAD (alt {ref.fmt(alt, dtype)}) of {dtype.short_name}", target.name,
                     ref.bits_of(res[0], dtype), ref.bits_of(exp, dtype), inputs=[("in", x)])

    return Case(b.finish(), {1: x}, (dtype,), check, f"gated LOAD of {dtype.short_name}")


def store_gated(target: Target, rng: np.random.Generator, dtype: DType) -> Case:
    """if (i % 3 == 1) out[i] = in[i]: the other lanes of out keep what they held."""
    n = 31
    b = KernelBuilder(target.renderer, kernel_name("store_gated", dtype.short_name))
    out, src = b.buffer(dtype, n, writable=True), b.buffer(dtype, n)
    three, one = b.const(3, dtypes.int32), b.const(1, dtypes.int32)
    i = b.global_index(n)
    gate = b.alu(BinaryOps.CMPEQ, dtypes.bool, b.alu(BinaryOps.MOD, dtypes.int32, i, three), one)
    b.store(out, i, b.load(src, i), gate)
    x, before = _some_values(dtype, n, rng), ref.make_array([1] * n, dtype)

    def check(res: list[np.ndarray]) -> None:
        exp = np.where(np.arange(n) % 3 == 1, x, before)
        assert_array(f"gated STORE of {dtype.short_name}", target.name, ref.bits_of(res[0], dtype),
                     ref.bits_of(exp, dtype), inputs=[("in", x), ("out before", before)])

    return Case(b.finish(), {0: before, 1: x}, (dtype,), check, f"gated STORE of {dtype.short_name}")


def reduce_loop(target: Target, rng: np.random.Generator, op: str, dtype: DType) -> Case:
    """out[i] = reduce over j < r of in[i*r + j], with DEFINE_ACC, a reduce RANGE and PHI (left to right)."""
    n, r = 9, 13
    alu_op = BinaryOps.ADD if op == "SUM" else BinaryOps.MAX
    init = 0 if op == "SUM" else dtypes.min(dtype)
    b = KernelBuilder(target.renderer, kernel_name("reduce", op, dtype.short_name))
    out, src = b.buffer(dtype, n, writable=True), b.buffer(dtype, n * r)
    zero, rows = b.const(0, dtypes.int32), b.const(r, dtypes.int32)
    i = b.global_index(n)
    acc = b.add(UOps.DEFINE_ACC, dtype, (), dtypes.as_const(init, dtype))
    j = b.loop(zero, rows, axis=1, reduce=True)
    val = b.load(src, b.alu(BinaryOps.ADD, dtypes.int32, b.alu(BinaryOps.MUL, dtypes.int32, i, rows), j))
    b.add(UOps.PHI, dtype, (acc, b.alu(alu_op, dtype, acc, val)))
    b.end_loop()
    b.store(out, i, acc)
    if dtypes.is_float(dtype):  # quarters: exact in every float dtype, whatever the order; one row gets a NaN
        x = ref.make_array(rng.integers(-20, 20, n * r) / 4, dtype)
        x[5] = np.nan
    else:
        x = ref.random_values(dtype, n * r, rng)

    def check(res: list[np.ndarray]) -> None:
        exp = ref.make_array([init] * n, dtype)
        for col in range(r):
            exp = ref.alu_reference(alu_op, dtype, [exp, x.reshape(n, r)[:, col]])
        assert_array(f"{op} reduction loop (DEFINE_ACC/PHI) of {dtype.short_name}", target.name,
                     ref.bits_of(res[0], dtype), ref.bits_of(exp, dtype), inputs=[("in (rows of 13)", x)])

    return Case(b.finish(), {1: x}, (dtype,), check, f"{op} reduce loop of {dtype.short_name}")


def define_var(target: Target, rng: np.random.Generator, count: int) -> Case:
    """Two DEFINE_VARs, passed by value in order: out[i] = scale * sum over j < count of in[i*8 + j]."""
    n, m = 5, 8
    b = KernelBuilder(target.renderer, kernel_name("define_var"))
    out, src = b.buffer(dtypes.int32, n, writable=True), b.buffer(dtypes.int32, n * m)
    scale, cnt = b.var("scale", 0, 100), b.var("count", 0, m)
    zero, width = b.const(0, dtypes.int32), b.const(m, dtypes.int32)
    i = b.global_index(n)
    acc = b.add(UOps.DEFINE_ACC, dtypes.int32, (), 0)
    j = b.loop(zero, cnt, axis=1, reduce=True)
    val = b.load(src, b.alu(BinaryOps.ADD, dtypes.int32, b.alu(BinaryOps.MUL, dtypes.int32, i, width), j))
    b.add(UOps.PHI, dtypes.int32, (acc, b.alu(BinaryOps.ADD, dtypes.int32, acc, val)))
    b.end_loop()
    b.store(out, i, b.alu(BinaryOps.MUL, dtypes.int32, acc, scale))
    x = np.arange(n * m, dtype=np.int32)

    def check(res: list[np.ndarray]) -> None:
        exp = (7 * x.reshape(n, m)[:, :count].sum(axis=1)).astype(np.int32)
        assert_array(f"DEFINE_VAR kernel (scale=7, count={count})", target.name, res[0], exp, inputs=[("in", x)])

    return Case(b.finish(), {1: x}, (dtypes.int32,), check, f"DEFINE_VAR kernel with count={count}", (7, count))


def where_chain(target: Target, rng: np.random.Generator, dtype: DType) -> Case:
    """A chain as the linearizer emits it: out[i] = (a < b) ? a*b+b : MAX(a, b)*2."""
    n = 64
    b = KernelBuilder(target.renderer, kernel_name("where_chain", dtype.short_name))
    out, ua, ub = b.buffer(dtype, n, writable=True), b.buffer(dtype, n), b.buffer(dtype, n)
    two = b.const(dtypes.as_const(2, dtype), dtype)
    i = b.global_index(n)
    a, c = b.load(ua, i), b.load(ub, i)
    mac = b.alu(TernaryOps.MULACC, dtype, a, c, c)
    mx = b.alu(BinaryOps.MUL, dtype, b.alu(BinaryOps.MAX, dtype, a, c), two)
    b.store(out, i, b.alu(TernaryOps.WHERE, dtype, b.alu(BinaryOps.CMPLT, dtypes.bool, a, c), mac, mx))
    xa, xb = ref.make_array(rng.integers(-50, 50, n), dtype), ref.make_array(rng.integers(-50, 50, n), dtype)

    def check(res: list[np.ndarray]) -> None:
        exp = np.where(xa < xb, xa * xb + xb, np.maximum(xa, xb) * 2).astype(xa.dtype)
        assert_array(f"WHERE(CMPLT, MULACC, MAX*2) on {dtype.short_name}", target.name, res[0], exp,
                     inputs=[("a", xa), ("b", xb)])

    return Case(b.finish(), {1: xa, 2: xb}, (dtype,), check, f"WHERE chain on {dtype.short_name}")


def negative_constants(dtype: DType) -> list[float]:
    """The negative constants (and -0.0) a renderer must spell so that they survive `x - c`, `-c` and `x * c`."""
    if dtypes.is_int(dtype):
        lo = ref.int_range(dtype)[0]
        return [-1, -9, lo + 1, lo]
    # -0.1: not a value of any float dtype but float64, so the renderer (or interpreter) must round it to the dtype
    return [-0.0, -1.5, -9.0, -0.1, -ref.float_tiny(dtype), -ref.float_max(dtype), -math.inf]


def const_operand(target: Target, rng: np.random.Generator, dtype: DType, value: float) -> Case:
    """A constant as the right operand, and under NEG: out0 = x - c, out1 = x + c, out2 = x * c, out3 = x - NEG(c),
    out4 = MAX(x, c), out5 = (x == c) (the constant is a CONST uop with the value as given, which the renderer must
    round to the dtype; the first lanes of x hold the rounded constant itself)."""
    n = 24
    b = KernelBuilder(target.renderer, kernel_name("const_operand", dtype.short_name, _value_name(value)))
    outs = [b.buffer(dtype, n, writable=True) for _ in range(5)] + [b.buffer(dtypes.bool, n, writable=True)]
    src = b.buffer(dtype, n)
    c = b.const(dtypes.as_const(value, dtype), dtype)
    i = b.global_index(n)
    x = b.load(src, i)
    negated = b.alu(UnaryOps.NEG, dtype, c)
    ops = [BinaryOps.SUB, BinaryOps.ADD, BinaryOps.MUL, BinaryOps.SUB, BinaryOps.MAX, BinaryOps.CMPEQ]
    for out, op, rhs in zip(outs, ops, [c, c, c, negated, c, c]):
        b.store(out, i, b.alu(op, ref.result_dtype(op, dtype), x, rhs))
    cs = ref.make_array([value] * n, dtype)
    xs = np.concatenate([cs[:2], _some_values(dtype, n - 2, rng)])
    what = f"x OP const {ref.fmt(cs[0], dtype)} on {dtype.short_name}"

    def check(res: list[np.ndarray]) -> None:
        neg = ref.alu_reference(UnaryOps.NEG, dtype, [cs])
        for k, (op, rhs) in enumerate(zip(ops, [cs, cs, cs, neg, cs, cs])):
            exp = ref.alu_reference(op, dtype, [xs, rhs])
            zero_free = (xs == 0) & (rhs == 0) if op is BinaryOps.MAX and dtypes.is_float(dtype) else None
            assert_lanes(f"{what} (output {k})", target.name, op.name, [(xs, dtype), (rhs, dtype)], res[k], exp,
                         ref.result_dtype(op, dtype), "repro_alu", (op.name, dtype.short_name),
                         zero_sign_free=zero_free)

    return Case(b.finish(), {6: xs}, (dtype, dtypes.bool), check, what)


def _value_name(value: float) -> str:
    """A constant as part of a C identifier."""
    return repr(value).replace("-", "m").replace(".", "p").replace("+", "")


def contraction(target: Target, rng: np.random.Generator, dtype: DType) -> Case:
    """out0 = a*b + c, out1 = c + a*b and out2 = a*b - NEG(c), each a MUL and an ADD or SUB uop: each must round twice
    (no fused multiply-add, whatever the compiler's default), on inputs where one rounding gives other bits."""
    n = 64
    b = KernelBuilder(target.renderer, kernel_name("contraction", dtype.short_name))
    outs = [b.buffer(dtype, n, writable=True) for _ in range(3)]
    ua, ub, uc = b.buffer(dtype, n), b.buffer(dtype, n), b.buffer(dtype, n)
    i = b.global_index(n)
    a, bb, c = b.load(ua, i), b.load(ub, i), b.load(uc, i)
    product = b.alu(BinaryOps.MUL, dtype, a, bb)
    b.store(outs[0], i, b.alu(BinaryOps.ADD, dtype, product, c))
    b.store(outs[1], i, b.alu(BinaryOps.ADD, dtype, c, b.alu(BinaryOps.MUL, dtype, a, bb)))
    b.store(outs[2], i, b.alu(BinaryOps.SUB, dtype, b.alu(BinaryOps.MUL, dtype, a, bb), b.alu(UnaryOps.NEG, dtype, c)))
    xa, xb, xc = contraction_inputs(dtype, n, rng)

    def check(res: list[np.ndarray]) -> None:
        prod = ref.alu_reference(BinaryOps.MUL, dtype, [xa, xb])
        expected = [ref.alu_reference(BinaryOps.ADD, dtype, [prod, xc]),
                    ref.alu_reference(BinaryOps.ADD, dtype, [xc, prod]),
                    ref.alu_reference(BinaryOps.SUB, dtype, [prod, ref.alu_reference(UnaryOps.NEG, dtype, [xc])])]
        for k, exp in enumerate(expected):
            assert_array(f"a*b+c rounded twice (output {k}) on {dtype.short_name}", target.name,
                         ref.bits_of(res[k], dtype), ref.bits_of(exp, dtype), inputs=[("a", xa), ("b", xb), ("c", xc)])

    return Case(b.finish(), {3: xa, 4: xb, 5: xc}, (dtype,), check, f"a*b+c contraction on {dtype.short_name}")


def contraction_inputs(dtype: DType, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a, b, c where a*b+c rounded once differs from a*b rounded, then + c rounded, in every lane: c is -(a*b)
    rounded, so the two-rounding sum is 0 and the fused one is the product's rounding error (nonzero)."""
    compute = np.float64 if dtype == dtypes.float64 else np.float32
    a = ref.make_array(1.0 + rng.random(n), dtype).astype(compute)
    bv = ref.make_array(1.0 + rng.random(n), dtype).astype(compute)
    prod = ref.round_to(a * bv, dtype).astype(compute)
    exact = a.astype(np.float64) * bv.astype(np.float64) if dtype != dtypes.float64 else None
    if exact is not None:  # keep the lanes whose product is inexact in the dtype
        keep = exact != prod.astype(np.float64)
    else:
        keep = np.array([ref.fused_multiply_add(x, y, -p, dtype) != 0.0 for x, y, p in zip(a, bv, prod)])
    a, bv, prod = a[keep], bv[keep], prod[keep]
    reps = -(-n // max(len(a), 1))
    a, bv, prod = (np.tile(v, reps)[:n] for v in (a, bv, prod))
    return ref.make_array(a, dtype), ref.make_array(bv, dtype), ref.make_array(-prod, dtype)


def exactness_cases() -> list[tuple[str, Callable[..., Case], dict[str, Any]]]:
    """(name, builder, parameters) of every constant-operand case (each negative constant of each signed integer and
    float dtype) and every contraction case (each float dtype): what a plugin's own tests run on its device."""
    signed = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
    out: list[tuple[str, Callable[..., Case], dict[str, Any]]] = [
        (f"const_operand-{dt.short_name}-{_value_name(v)}", const_operand, {"dtype": dt, "value": v})
        for dt in (*signed, *ref.FLOATS)
        for v in negative_constants(dt)
    ]
    out += [(f"contraction-{dt.short_name}", contraction, {"dtype": dt}) for dt in ref.FLOATS]
    return out


def seeded_rng(test_name: str) -> np.random.Generator:
    """The generator a test named `test_name` gets from the `rng` fixture."""
    return np.random.default_rng(zlib.crc32(test_name.encode()))


def compile_ahead(target: Target, cases: Iterable[tuple[Callable[..., Case], str, dict[str, Any]]]) -> None:
    """Build, render and queue for compilation the kernel of every (builder, test name, parameters) given."""
    if target.mode not in (RUN, COMPILE) or target.compiler is None:
        return
    for builder, name, params in cases:
        try:
            case: Optional[Case] = builder(target, seeded_rng(name), **params)
            assert case is not None
            if all(target.supports(dt) for dt in case.requires):
                compile_pool.submit(target.compiler, target.renderer.render(case.kernel.name, case.kernel.uops))
        except Exception:  # the test itself will meet (and report) the problem
            continue
