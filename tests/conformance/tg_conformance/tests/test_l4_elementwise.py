"""Level 4, elementwise: Tensor unary and binary ops with broadcasting, and casts, on several dtypes, vs numpy."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tg_conformance import reference as ref
from tg_conformance.checks import assert_array
from tg_conformance.target import Target
from tg_conformance.tensors import composite_tolerance, tensor, values
from tgcore import Tensor
from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps

pytestmark = pytest.mark.usefixtures("executing")

F32, F16, BF16, F64 = dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64
I8, U8, I32, I64 = dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64


def _ids(case: Any) -> str:
    return case.short_name if isinstance(case, DType) else str(case)


# ***** binary, with broadcasting: (3, 1, 5) op (4, 5) *****

def _alu(op: BinaryOps) -> Callable[[np.ndarray, np.ndarray, DType], np.ndarray]:
    return lambda a, b, dt: ref.alu_reference(op, dt, [a, b])


def _div_ref(a: np.ndarray, b: np.ndarray, dt: DType) -> np.ndarray:
    if dtypes.is_float(dt):
        return ref.alu_reference(BinaryOps.DIV, dt, [a, b])
    return ref.alu_reference(BinaryOps.DIV, F32, [a.astype(np.float32), b.astype(np.float32)])  # ints divide as float32


# every op on a few dtypes (level 3 covers every dtype); the integer wraparound of add and mul on a few more
COMMON = (F32, F16, BF16, I32, U8)
BINARY: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray, DType], np.ndarray],
                        tuple[DType, ...]]] = {
    "add": (lambda a, b: a + b, _alu(BinaryOps.ADD), (*COMMON, I8, I64, F64, dtypes.bool)),
    "sub": (lambda a, b: a - b, _alu(BinaryOps.SUB), COMMON),
    "mul": (lambda a, b: a * b, _alu(BinaryOps.MUL), (*COMMON, I8, I64, F64, dtypes.bool)),
    "div": (lambda a, b: a / b, _div_ref, COMMON),
    "maximum": (lambda a, b: a.maximum(b), lambda a, b, dt: np.maximum(a, b), COMMON),
    "minimum": (lambda a, b: a.minimum(b), lambda a, b, dt: np.minimum(a, b), COMMON),
    "lt": (lambda a, b: a < b, lambda a, b, dt: np.less(a, b), COMMON),
    "eq": (lambda a, b: a == b, lambda a, b, dt: np.equal(a, b), (*COMMON, dtypes.bool)),
    "where": (lambda a, b: (a > b).where(a, b), lambda a, b, dt: np.where(a > b, a, b), (*COMMON, dtypes.bool)),
}
BINARY_CASES = [pytest.param(op, dt, id=f"{op}-{dt.short_name}") for op, (_, _, dts) in BINARY.items() for dt in dts]


@pytest.mark.parametrize("op,dtype", BINARY_CASES)
def test_binary_broadcast(executing: Target, op: str, dtype: DType, rng: np.random.Generator) -> None:
    executing.require(dtype)
    fn, reference, _ = BINARY[op]
    a = values(dtype, (3, 1, 5), rng)
    b = values(dtype, (4, 5), rng, nonzero=op == "div")
    a.flat[:3] = ref.make_array([0, 1, 0], dtype)  # zero (the edge of unsigned negation) against every b
    got = fn(tensor(executing, a, dtype), tensor(executing, b, dtype))
    exp = reference(*np.broadcast_arrays(a, b), dtype)
    assert_array(f"Tensor {op} on {dtype.short_name}, shapes (3,1,5) and (4,5)", executing.name, got.numpy(), exp,
                 inputs=[("a", a), ("b", b)])


@settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(1, 4), min_size=0, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3),
       st.integers(0, 2**31 - 1))
def _broadcast_property(target: Target, shape: list[int], ones: list[bool], seed: int) -> None:
    rng = np.random.default_rng(seed)
    other = [1 if one else s for s, one in zip(shape, ones)]
    a, b = values(F32, tuple(shape), rng), values(F32, tuple(other), rng)
    got = (tensor(target, a, F32) * 2 - tensor(target, b, F32)).numpy()
    exp = (a * np.float32(2) - b).astype(np.float32)
    assert_array(f"a * 2 - b, shapes {tuple(shape)} and {tuple(other)}", target.name, got, exp,
                 inputs=[("a", a), ("b", b)])


@pytest.mark.tg_op("broadcast (hypothesis)")
def test_broadcast_shapes_property(executing: Target) -> None:
    """Random shapes of rank 0 to 3 against a copy with some axes of size 1 (hypothesis, 8 examples)."""
    executing.require(F32)
    _broadcast_property(executing)


@pytest.mark.tg_op("scalar operands")
def test_scalar_operands(executing: Target) -> None:
    """Python numbers on either side: 2 - t, t / 4, t ** 2, 1 + t (float32 and int32)."""
    x = np.array([[1.0, -2.5, 3.25], [0.0, 7.0, -0.5]], dtype=np.float32)
    t = Tensor(x, device=executing.name)
    assert_array("2 - t", executing.name, (2 - t).numpy(), (np.float32(2) - x))
    assert_array("t / 4", executing.name, (t / 4).numpy(), (x / np.float32(4)))
    assert_array("1 + t * 3", executing.name, (1 + t * 3).numpy(), (np.float32(1) + x * np.float32(3)))
    xi = np.array([1, -2, 3, 100], dtype=np.int32)
    ti = Tensor(xi, device=executing.name)
    assert_array("int32 t * 3 - 1", executing.name, (ti * 3 - 1).numpy(), (xi * 3 - 1).astype(np.int32))
    assert_array("int32 t + 0.5 promotes to float32", executing.name, (ti + 0.5).numpy(),
                 (xi.astype(np.float32) + np.float32(0.5)))


# ***** unary *****

def _f64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: fn(x.astype(np.float64))


ALL_FLOATS, SOME_FLOATS = ref.FLOATS, (F32, F16)
UNARY_FLOAT: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], tuple[float, float],
                             tuple[DType, ...]]] = {
    "exp": (Tensor.exp, _f64(np.exp), (-3, 3), ALL_FLOATS),
    "log": (Tensor.log, _f64(np.log), (0.1, 10), ALL_FLOATS),
    "sqrt": (Tensor.sqrt, _f64(np.sqrt), (0, 10), ALL_FLOATS),
    "sin": (Tensor.sin, _f64(np.sin), (-4, 4), ALL_FLOATS),
    "exp2": (Tensor.exp2, _f64(np.exp2), (-4, 4), SOME_FLOATS),
    "log2": (Tensor.log2, _f64(np.log2), (0.1, 10), SOME_FLOATS),
    "cos": (Tensor.cos, _f64(np.cos), (-4, 4), SOME_FLOATS),
    "sigmoid": (Tensor.sigmoid, _f64(lambda x: 1 / (1 + np.exp(-x))), (-5, 5), SOME_FLOATS),
    "tanh": (Tensor.tanh, _f64(np.tanh), (-3, 3), SOME_FLOATS),
    "reciprocal": (Tensor.reciprocal, _f64(lambda x: 1 / x), (0.5, 4), SOME_FLOATS),
    "rsqrt": (Tensor.rsqrt, _f64(lambda x: 1 / np.sqrt(x)), (0.5, 4), (F32,)),
    "tan": (Tensor.tan, _f64(np.tan), (-1.2, 1.2), (F32,)),
    "sinh": (Tensor.sinh, _f64(np.sinh), (-3, 3), (F32,)),
    "cosh": (Tensor.cosh, _f64(np.cosh), (-3, 3), (F32,)),
    "asinh": (Tensor.asinh, _f64(np.arcsinh), (-5, 5), (F32,)),
    "acosh": (Tensor.acosh, _f64(np.arccosh), (1.1, 6), (F32,)),
    "atanh": (Tensor.atanh, _f64(np.arctanh), (-0.9, 0.9), (F32,)),
    "relu6": (Tensor.relu6, _f64(lambda x: np.clip(x, 0, 6)), (-3, 9), (F32,)),
    "elu": (Tensor.elu, _f64(lambda x: np.where(x > 0, x, np.exp(x) - 1)), (-3, 3), (F32,)),
    "celu": (Tensor.celu, _f64(lambda x: np.maximum(x, 0) + np.minimum(0, np.exp(x) - 1)), (-3, 3), (F32,)),
    "gelu": (Tensor.gelu, _f64(lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))),
             (-3, 3), (F32,)),
    "quick_gelu": (Tensor.quick_gelu, _f64(lambda x: x / (1 + np.exp(-1.702 * x))), (-3, 3), (F32,)),
    "silu": (Tensor.silu, _f64(lambda x: x / (1 + np.exp(-x))), (-3, 3), (F32,)),
    "swish": (Tensor.swish, _f64(lambda x: x / (1 + np.exp(-x))), (-3, 3), (F32,)),
    "mish": (Tensor.mish, _f64(lambda x: x * np.tanh(np.log1p(np.exp(x)))), (-3, 3), (F32,)),
    "softplus": (Tensor.softplus, _f64(lambda x: np.log1p(np.exp(x))), (-5, 5), (F32,)),
    "softsign": (Tensor.softsign, _f64(lambda x: x / (1 + np.abs(x))), (-5, 5), (F32,)),
    "hardswish": (Tensor.hardswish, _f64(lambda x: x * np.clip(x + 3, 0, 6) / 6), (-5, 5), (F32,)),
    "hardtanh": (Tensor.hardtanh, _f64(lambda x: np.clip(x, -1, 1)), (-3, 3), (F32,)),
    "hardsigmoid": (Tensor.hardsigmoid, _f64(lambda x: np.clip(x / 6 + 0.5, 0, 1)), (-5, 5), (F32,)),
}
UNARY_EXACT: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], tuple[DType, ...]]] = {
    "neg": (Tensor.neg, np.negative, (F32, BF16, I32, I8, U8)),
    "relu": (Tensor.relu, lambda x: np.maximum(x, 0).astype(x.dtype), (F32, I8)),
    "abs": (Tensor.abs, np.abs, (F32, I32, U8)),
    "square": (Tensor.square, lambda x: x * x, (F16, I8)),
    "floor": (Tensor.floor, np.floor, (F32, F16)),
    "ceil": (Tensor.ceil, np.ceil, (F32, F16)),
    "trunc": (Tensor.trunc, np.trunc, (F32, F16)),
    "round": (Tensor.round, np.round, (F32,)),
    "sign": (Tensor.sign, np.sign, (F32, I32)),
}
UNARY_FLOAT_CASES = [pytest.param(op, dt, id=f"{op}-{dt.short_name}") for op, case in UNARY_FLOAT.items()
                     for dt in case[3]]
UNARY_EXACT_CASES = [pytest.param(op, dt, id=f"{op}-{dt.short_name}") for op, (_, _, dts) in UNARY_EXACT.items()
                     for dt in dts]


@pytest.mark.parametrize("op,dtype", UNARY_FLOAT_CASES)
def test_unary_float(executing: Target, op: str, dtype: DType, rng: np.random.Generator) -> None:
    """Transcendental and composite float functions, within the device's tolerance widened to 4 ulps."""
    executing.require(dtype)
    fn, reference, (low, high), _ = UNARY_FLOAT[op]
    x = values(dtype, (5, 7), rng, low, high)
    atol, rtol = composite_tolerance(executing, dtype)
    exp = ref.round_to(reference(x), dtype)
    assert_array(f"Tensor.{op} on {dtype.short_name}", executing.name, fn(tensor(executing, x, dtype)).numpy(), exp,
                 atol=atol, rtol=rtol, inputs=[("x", x)])


# where plain compositions of exp2 / log2 / sin lose every digit: values near 0 (and near cos's zeros, exp's
# overflow), each within the device's relative tolerance widened to 4 ulps, with no absolute slack
UNARY_RELATIVE: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray],
                                 tuple[float, float]]] = {
    "tanh": (Tensor.tanh, np.tanh, (-1e-4, 1e-4)),
    "sinh": (Tensor.sinh, np.sinh, (-1e-4, 1e-4)),
    "expm1": (Tensor.expm1, np.expm1, (-1e-5, 1e-5)),
    "log1p": (Tensor.log1p, np.log1p, (-1e-5, 1e-5)),
    "atanh": (Tensor.atanh, np.arctanh, (-1e-4, 1e-4)),
    "asinh": (Tensor.asinh, np.arcsinh, (-1e-4, 1e-4)),
    "softplus": (Tensor.softplus, lambda x: np.logaddexp(0, x), (-80, -20)),
    "sigmoid": (Tensor.sigmoid, lambda x: np.exp(x - np.logaddexp(0, x)), (-85, -20)),
    "cos": (Tensor.cos, np.cos, (1.5707, 1.5709)),
    "cos of large x": (Tensor.cos, np.cos, (-1e6, 1e6)),
    "exp": (Tensor.exp, np.exp, (80, 88.7)),
}


@pytest.mark.parametrize("op", list(UNARY_RELATIVE))
def test_unary_relative(executing: Target, op: str, rng: np.random.Generator) -> None:
    """Float32 functions keep their relative accuracy where the result is small or the argument large."""
    executing.require(F32)
    fn, reference, (low, high) = UNARY_RELATIVE[op]
    x = values(F32, (5, 7), rng, low, high)
    _, rtol = composite_tolerance(executing, F32)
    exp = ref.round_to(reference(x.astype(np.float64)), F32)
    got = fn(tensor(executing, x, F32)).numpy()
    assert_array(f"Tensor.{fn.__name__} on f32 in [{low}, {high}]", executing.name, got, exp, atol=0.0, rtol=rtol,
                 inputs=[("x", x)])


@pytest.mark.parametrize("op,dtype", UNARY_EXACT_CASES)
def test_unary_exact(executing: Target, op: str, dtype: DType, rng: np.random.Generator) -> None:
    """Functions with exact results (integers wrap like numpy's)."""
    executing.require(dtype)
    fn, reference, _ = UNARY_EXACT[op]
    x = values(dtype, (5, 7), rng, -100, 100)
    with np.errstate(all="ignore"):
        exp = reference(x)
    exp = ref.round_to(exp, dtype) if dtypes.is_float(dtype) else exp.astype(x.dtype)
    assert_array(f"Tensor.{op} on {dtype.short_name}", executing.name, fn(tensor(executing, x, dtype)).numpy(), exp,
                 inputs=[("x", x)])


# ***** casts through the Tensor API (every pair is covered at level 3) *****

CASTS = [(F32, I32), (F32, dtypes.bool), (dtypes.bool, F32), (I32, F16), (F16, F32), (U8, F32), (I8, I64),
         (F64, F32), (F32, BF16), (BF16, F32), (I64, I8), (F32, U8)]


@pytest.mark.tg_op("cast")
@pytest.mark.parametrize("dtype,dst", [pytest.param(s, d, id=f"{s.short_name}-{d.short_name}") for s, d in CASTS])
def test_tensor_cast(executing: Target, dtype: DType, dst: DType, rng: np.random.Generator) -> None:
    executing.require(dtype, dst)
    low = 0 if dtypes.is_unsigned(dst) else -100
    x = values(dtype, (4, 6), rng, low, 100)
    got = tensor(executing, x, dtype).cast(dst)
    assert got.dtype == dst, f"cast gave a tensor of {got.dtype}, expected {dst}"
    assert_array(f"Tensor.cast {dtype.short_name} -> {dst.short_name}", executing.name, got.numpy(),
                 ref.cast_reference(x.reshape(-1), dtype, dst).reshape(x.shape), inputs=[("x", x)])


@pytest.mark.tg_op("bitcast")
def test_tensor_bitcast(executing: Target) -> None:
    executing.require(F32, I32)
    x = np.array([1.0, -0.0, np.inf, 3.5, -2.0], dtype=np.float32)
    got = Tensor(x, device=executing.name).bitcast(I32).numpy()
    assert_array("Tensor.bitcast float32 -> int32", executing.name, got, x.view(np.int32), inputs=[("x", x)])
