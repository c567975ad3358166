"""The reference semantics of every ALU op: tgcore.ops.exec_alu, which every device must match."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgcore.dtype import DType, dtypes, truncate
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]
SIGNED = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64]


def arr(vals: list, dt: DType) -> np.ndarray:
    return np.array(vals, dtype=np.float32 if dt == dtypes.bfloat16 else dt.np)


def alu(op, dt: DType, *operands: list, out: DType | None = None) -> np.ndarray:
    return exec_alu(op, out or dt, [arr(o, dt) for o in operands])


def c_div(a: int, b: int, dt: DType) -> int:
    """C division (truncating toward zero) with x/0 == 0, wrapped to dt."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return int(truncate(-q if (a < 0) != (b < 0) else q, dt))


def c_mod(a: int, b: int, dt: DType) -> int:
    """C remainder (sign of the dividend) with x%0 == 0."""
    if b == 0:
        return 0
    r = abs(a) % abs(b)
    return int(truncate(-r if a < 0 else r, dt))


def int_values(dt: DType) -> st.SearchStrategy[int]:
    lo, hi = int(dtypes.min(dt)), int(dtypes.max(dt))
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2, lo + 1, hi - 1]))


# ***** integer division and remainder *****

def test_int_div_truncates_toward_zero() -> None:
    out = alu(BinaryOps.DIV, dtypes.int32, [7, -7, 7, -7, 6, 0], [2, 2, -2, -2, 3, 5])
    np.testing.assert_array_equal(out, [3, -3, -3, 3, 2, 0])
    assert out.dtype == np.int32


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_int_div_by_zero_is_zero(dt: DType) -> None:
    vals = [0, 1, 5, int(dtypes.max(dt)), int(dtypes.min(dt))]
    np.testing.assert_array_equal(alu(BinaryOps.DIV, dt, vals, [0] * len(vals)), [0] * len(vals))
    np.testing.assert_array_equal(alu(BinaryOps.MOD, dt, vals, [0] * len(vals)), [0] * len(vals))


@pytest.mark.parametrize("dt", SIGNED, ids=str)
def test_int_min_div_minus_one_wraps(dt: DType) -> None:
    lo = int(dtypes.min(dt))
    np.testing.assert_array_equal(alu(BinaryOps.DIV, dt, [lo, lo, lo], [-1, 1, 2]), [lo, lo, lo // 2])
    np.testing.assert_array_equal(alu(BinaryOps.MOD, dt, [lo, lo], [-1, 3]), [0, c_mod(lo, 3, dt)])


def test_mod_sign_follows_dividend() -> None:
    out = alu(BinaryOps.MOD, dtypes.int32, [7, -7, 7, -7, 6, -6], [2, 2, -2, -2, 3, 3])
    np.testing.assert_array_equal(out, [1, -1, 1, -1, 0, 0])


def test_float_mod_is_fmod() -> None:
    out = alu(BinaryOps.MOD, dtypes.float32, [5.5, -5.5, 5.5, 1.0], [2.0, 2.0, -2.0, 0.0])
    np.testing.assert_array_equal(out[:3], np.float32([1.5, -1.5, 1.5]))
    assert math.isnan(out[3])


def test_unsigned_div_large() -> None:
    big = 2**64 - 1
    np.testing.assert_array_equal(alu(BinaryOps.DIV, dtypes.uint64, [big, big], [3, big]), np.uint64([big // 3, 1]))
    np.testing.assert_array_equal(alu(BinaryOps.MOD, dtypes.uint64, [big], [10]), np.uint64([big % 10]))


@pytest.mark.parametrize("dt", INTS, ids=str)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_int_div_mod_match_c(dt: DType, data: st.DataObject) -> None:
    a = data.draw(st.lists(int_values(dt), min_size=1, max_size=8))
    b = data.draw(st.lists(int_values(dt), min_size=len(a), max_size=len(a)))
    np.testing.assert_array_equal(alu(BinaryOps.DIV, dt, a, b), arr([c_div(x, y, dt) for x, y in zip(a, b)], dt))
    np.testing.assert_array_equal(alu(BinaryOps.MOD, dt, a, b), arr([c_mod(x, y, dt) for x, y in zip(a, b)], dt))


# ***** float division *****

def test_float_div_ieee() -> None:
    out = alu(BinaryOps.DIV, dtypes.float32, [1.0, -1.0, 0.0, 6.0], [0.0, 0.0, 0.0, 4.0])
    assert out[0] == math.inf and out[1] == -math.inf and math.isnan(out[2]) and out[3] == 1.5


# ***** wrapping arithmetic *****

@pytest.mark.parametrize("dt", INTS, ids=str)
def test_add_sub_mul_wrap(dt: DType) -> None:
    lo, hi = int(dtypes.min(dt)), int(dtypes.max(dt))
    np.testing.assert_array_equal(alu(BinaryOps.ADD, dt, [hi], [1]), arr([lo], dt))
    np.testing.assert_array_equal(alu(BinaryOps.SUB, dt, [lo], [1]), arr([hi], dt))
    np.testing.assert_array_equal(alu(BinaryOps.MUL, dt, [hi], [2]), arr([truncate(hi * 2, dt)], dt))


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_neg_wraps(dt: DType) -> None:
    lo = int(dtypes.min(dt))
    expect = [truncate(-lo, dt), truncate(-1, dt), 0]
    np.testing.assert_array_equal(alu(UnaryOps.NEG, dt, [lo, 1, 0]), arr(expect, dt))


def test_neg_bool_is_not() -> None:
    np.testing.assert_array_equal(alu(UnaryOps.NEG, dtypes.bool, [True, False]), [False, True])


def test_neg_float_signed_zero() -> None:
    out = alu(UnaryOps.NEG, dtypes.float32, [0.0, 1.5])
    assert math.copysign(1.0, out[0]) == -1.0 and out[1] == -1.5


# ***** shifts *****

@pytest.mark.parametrize("dt", INTS, ids=str)
def test_shift_past_width(dt: DType) -> None:
    bits = dt.itemsize * 8
    np.testing.assert_array_equal(alu(BinaryOps.SHL, dt, [1, 3, 1], [bits, bits + 5, bits - 1]),
                                  arr([0, 0, truncate(1 << (bits - 1), dt)], dt))
    np.testing.assert_array_equal(alu(BinaryOps.SHR, dt, [int(dtypes.max(dt)), 1], [bits, bits * 2]), arr([0, 0], dt))


@pytest.mark.parametrize("dt", SIGNED, ids=str)
def test_shr_negative_is_arithmetic(dt: DType) -> None:
    bits = dt.itemsize * 8
    np.testing.assert_array_equal(alu(BinaryOps.SHR, dt, [-8, -8, -1, -8], [1, 3, 5, bits]), arr([-4, -1, -1, -1], dt))


def test_shl_wraps_in_width() -> None:
    np.testing.assert_array_equal(alu(BinaryOps.SHL, dtypes.uint8, [200, 1], [1, 7]), np.uint8([144, 128]))
    np.testing.assert_array_equal(alu(BinaryOps.SHL, dtypes.int8, [1, 100], [7, 1]), np.int8([-128, -56]))


# ***** MAX, comparisons, NaN *****

def test_max_propagates_nan() -> None:
    nan = math.nan
    out = alu(BinaryOps.MAX, dtypes.float32, [nan, 1.0, nan, -math.inf], [1.0, nan, nan, 2.0])
    assert np.isnan(out[:3]).all() and out[3] == 2.0


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=str)
def test_max_propagates_nan_other_floats(dt: DType) -> None:
    out = alu(BinaryOps.MAX, dt, [math.nan, 1.0], [1.0, math.nan])
    assert np.isnan(out).all()


def test_max_ints() -> None:
    np.testing.assert_array_equal(alu(BinaryOps.MAX, dtypes.int8, [-128, 5, -3], [127, -5, -4]), np.int8([127, 5, -3]))
    np.testing.assert_array_equal(alu(BinaryOps.MAX, dtypes.uint64, [2**64 - 1], [0]), np.uint64([2**64 - 1]))


def test_comparisons_return_bool_and_nan_is_false() -> None:
    a, b = [1.0, 2.0, math.nan, math.nan, -0.0], [2.0, 2.0, 1.0, math.nan, 0.0]
    lt = alu(BinaryOps.CMPLT, dtypes.float32, a, b, out=dtypes.bool)
    eq = alu(BinaryOps.CMPEQ, dtypes.float32, a, b, out=dtypes.bool)
    assert lt.dtype == np.bool_ and eq.dtype == np.bool_
    np.testing.assert_array_equal(lt, [True, False, False, False, False])
    np.testing.assert_array_equal(eq, [False, True, False, False, True])


def test_comparisons_unsigned_large() -> None:
    lt = alu(BinaryOps.CMPLT, dtypes.uint64, [2**63, 0], [1, 2**64 - 1], out=dtypes.bool)
    np.testing.assert_array_equal(lt, [False, True])


# ***** bitwise *****

@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.uint8, dtypes.int32, dtypes.int64], ids=str)
def test_bitwise(dt: DType) -> None:
    a, b = ([True, True, False], [True, False, False]) if dt == dtypes.bool else ([12, 10, 0], [10, 6, 5])
    np.testing.assert_array_equal(alu(BinaryOps.XOR, dt, a, b), np.bitwise_xor(arr(a, dt), arr(b, dt)))
    np.testing.assert_array_equal(alu(BinaryOps.AND, dt, a, b), np.bitwise_and(arr(a, dt), arr(b, dt)))
    np.testing.assert_array_equal(alu(BinaryOps.OR, dt, a, b), np.bitwise_or(arr(a, dt), arr(b, dt)))


# ***** unary transcendental *****

def test_unary_special_values() -> None:
    inf, nan = math.inf, math.nan
    sq = alu(UnaryOps.SQRT, dtypes.float32, [4.0, 0.0, -1.0, inf])
    assert sq[0] == 2.0 and sq[1] == 0.0 and math.isnan(sq[2]) and sq[3] == inf
    lg = alu(UnaryOps.LOG2, dtypes.float32, [8.0, 0.0, -1.0, inf, nan])
    assert lg[0] == 3.0 and lg[1] == -inf and math.isnan(lg[2]) and lg[3] == inf and math.isnan(lg[4])
    ex = alu(UnaryOps.EXP2, dtypes.float32, [3.0, -inf, inf, 200.0, nan])
    assert ex[0] == 8.0 and ex[1] == 0.0 and ex[2] == inf and ex[3] == inf and math.isnan(ex[4])
    sn = alu(UnaryOps.SIN, dtypes.float32, [0.0, math.pi / 2, inf])
    assert sn[0] == 0.0 and abs(sn[1] - 1.0) < 1e-7 and math.isnan(sn[2])


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32, dtypes.float64], ids=str)
def test_unary_dtype_kept(dt: DType) -> None:
    for op in (UnaryOps.SQRT, UnaryOps.LOG2, UnaryOps.EXP2, UnaryOps.SIN):
        out = alu(op, dt, [0.5, 2.0])
        assert out.dtype == dt.np


# ***** ternary *****

def test_where_and_mulacc() -> None:
    out = exec_alu(TernaryOps.WHERE, dtypes.int32, [np.array([True, False]), np.int32([1, 2]), np.int32([3, 4])])
    np.testing.assert_array_equal(out, [1, 4])
    mac = alu(TernaryOps.MULACC, dtypes.float32, [2.0, -1.0], [3.0, 4.0], [1.0, 0.5])
    np.testing.assert_array_equal(mac, np.float32([7.0, -3.5]))
    wrap = alu(TernaryOps.MULACC, dtypes.uint8, [16], [16], [1])
    np.testing.assert_array_equal(wrap, np.uint8([1]))


# ***** bfloat16 and float16 rounding *****

def test_bfloat16_rounds_to_nearest_even() -> None:
    ulp = 2.0**-7  # bfloat16 spacing just above 1.0
    a = [1.0, 1.0, 1.0, 1.0 + ulp, 1.0]
    b = [ulp / 2, 3 * ulp / 2, ulp / 2 + 2.0**-20, ulp / 2, ulp / 4]
    out = alu(BinaryOps.ADD, dtypes.bfloat16, a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.float32([1.0, 1.0 + 2 * ulp, 1.0 + ulp, 1.0 + 2 * ulp, 1.0]))


def test_bfloat16_special_values() -> None:
    out = alu(BinaryOps.ADD, dtypes.bfloat16, [math.nan, math.inf, -math.inf, 3.3e38], [0.0, 0.0, 0.0, 3.3e38])
    assert math.isnan(out[0]) and out[1] == math.inf and out[2] == -math.inf and out[3] == math.inf
    big = alu(BinaryOps.MUL, dtypes.bfloat16, [np.finfo(np.float32).max], [1.0])
    assert big[0] == math.inf  # rounds up past the largest bfloat16


def test_bfloat16_results_are_representable() -> None:
    x = np.linspace(-10, 10, 101, dtype=np.float32)
    out = exec_alu(BinaryOps.MUL, dtypes.bfloat16, [x, np.full_like(x, 1.1)])
    assert (out.view(np.uint32) & 0xFFFF == 0).all()


def test_float16_overflow_and_rounding() -> None:
    out = alu(BinaryOps.ADD, dtypes.float16, [60000.0, 1.0], [10000.0, 2.0**-11])
    assert out.dtype == np.float16 and out[0] == math.inf and out[1] == 1.0
