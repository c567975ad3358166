"""Float functions of LazyBuffers that the primitive ops do not have, composed from them to numpy's accuracy.

The devices give EXP2, LOG2, SIN and SQRT. The plain compositions lose accuracy where a rounded intermediate is
magnified: exp(x) as exp2(x * log2(e)) is up to ~60 ulp off near 88 (the product's rounding error becomes a
relative error of the result), cos(x) as sin(pi/2 - x) is wrong near every zero of cos and for large x, and
tanh, sinh, softplus, log(1 + x) lose every digit near 0. These routines keep float32 and float64 results within a
few ulps of the exact value (the tests measure them against float64 / exact references):

- exp: Cody-Waite reduction x = n ln2 + r with ln2 in two parts, then 2^(n + r log2(e)) with the rounding error
  of that sum (exact, by Fast2Sum) put back as a factor 1 + err ln2.
- expm1, log1p: Kahan's and Goldberg's corrections, (u - 1) x / log(u) and log(u) x / (u - 1) with u = exp(x) and
  u = 1 + x: the rounding error of u cancels between numerator and denominator.
- cos: sin(2x) / (2 sin(x)), the device's SIN (which reduces any argument exactly) twice.

float16 and bfloat16 arguments are computed in float32 and rounded back. Every routine takes and returns LazyBuffers
of one float dtype; inputs outside a function's domain give what numpy gives (inf, NaN).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

from tgcore.dtype import dtypes
from tgcore.lazy import LazyBuffer
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps

# per float dtype: rounding shift (adding and subtracting it rounds to an integer), ln2 in two parts (the first
# with few mantissa bits, so n * part is exact), the clamp of exp's argument (just past overflow and underflow),
# and the magnitude below which tanh(x) and sinh(x) are x
_PARAMS = {
    dtypes.float32: {
        "shift": 12582912.0,  # 1.5 * 2^23
        "ln2": (0.693359375, -2.12194440e-4),
        "clamp": (-110.0, 89.0),
        "tiny": 2.0**-12,  # below this, tanh(x) == sinh(x) == x
    },
    dtypes.float64: {
        "shift": 6755399441055744.0,  # 1.5 * 2^52
        "ln2": (6.93145751953125e-1, 1.42860682030941723212e-6),
        "clamp": (-760.0, 710.0),
        "tiny": 2.0**-27,
    },
}
LOG2E, LN2 = 1 / math.log(2), math.log(2)
# cos by doubling up to this magnitude (2x stays finite), per float dtype
_COS_DOUBLING_MAX = {dtypes.float32: 2.0**126, dtypes.float64: 2.0**1022}


def _in_float32_for_halves(fn: Callable[[LazyBuffer], LazyBuffer]) -> Callable[[LazyBuffer], LazyBuffer]:
    """float16 and bfloat16 arguments go through float32 (every device has it) and the result is rounded back."""

    @functools.wraps(fn)
    def wrapper(x: LazyBuffer) -> LazyBuffer:
        if x.dtype in _PARAMS:
            return fn(x)
        return fn(x.cast(dtypes.float32)).cast(x.dtype)

    return wrapper


def _c(x: LazyBuffer, v: float) -> LazyBuffer:
    return x.const(v)


def _binary(op: BinaryOps) -> Callable[[LazyBuffer, LazyBuffer], LazyBuffer]:
    return lambda a, b: a.e(op, b)


# the binary ops as functions, so that formulas read in prefix form
_add, _sub, _mul, _div = (_binary(op) for op in (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.DIV))
_lt, _eq = _binary(BinaryOps.CMPLT), _binary(BinaryOps.CMPEQ)


def _where(cond: LazyBuffer, a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
    return cond.e(TernaryOps.WHERE, a, b)


def _round(x: LazyBuffer) -> LazyBuffer:
    """x rounded to an integer (halves to even), for |x| < 2^22 (float32) / 2^51 (float64)."""
    shift = _c(x, _PARAMS[x.dtype]["shift"])
    return _sub(_add(x, shift), shift)


def _clamp(x: LazyBuffer, lo: float, hi: float) -> LazyBuffer:
    """min(max(x, lo), hi) with MAX alone (min(a, b) = -max(-a, -b)); NaN stays NaN."""
    return x.e(BinaryOps.MAX, _c(x, lo)).e(UnaryOps.NEG).e(BinaryOps.MAX, _c(x, -hi)).e(UnaryOps.NEG)


@_in_float32_for_halves
def log(x: LazyBuffer) -> LazyBuffer:
    return _mul(x.e(UnaryOps.LOG2), _c(x, LN2))


@_in_float32_for_halves
def exp(x: LazyBuffer) -> LazyBuffer:
    """e^x. Only ops a vectorizing renderer takes whole (MAX, arithmetic, EXP2): NaN passes through MAX and EXP2."""
    p = _PARAMS[x.dtype]
    lo, hi = p["clamp"]
    xc = _clamp(x, lo, hi)  # (where exp is already 0 and inf)
    n = _round(_mul(xc, _c(x, LOG2E)))
    r = _sub(_sub(xc, _mul(n, _c(x, p["ln2"][0]))), _mul(n, _c(x, p["ln2"][1])))
    # exp(x) = 2^(n + u), u = r log2(e) in [-1/2, 1/2]: f = n + u rounds away the low bits of u, which Fast2Sum
    # recovers exactly (|n| >= 1 > |u| unless n == 0) and a factor 1 + err ln 2 puts back
    u = _mul(r, _c(x, LOG2E))
    f = _add(n, u)
    err = _add(_sub(n, f), u)
    return _mul(f.e(UnaryOps.EXP2), _add(_c(x, 1.0), _mul(err, _c(x, LN2))))


@_in_float32_for_halves
def expm1(x: LazyBuffer) -> LazyBuffer:
    """e^x - 1, accurate near 0 too."""
    u = exp(x)
    d = _sub(u, _c(x, 1.0))
    inf = _c(x, math.inf)
    kahan = _mul(d, _div(x, log(u)))
    # u == 1: x itself; u - 1 == -1 (underflow) or u == inf: d is the answer
    return _where(_eq(d, _c(x, 0.0)), x, _where(_eq(d, _c(x, -1.0)), d, _where(_eq(u, inf), u, kahan)))


@_in_float32_for_halves
def log1p(x: LazyBuffer) -> LazyBuffer:
    """log(1 + x), accurate near 0 too."""
    u = _add(x, _c(x, 1.0))
    d = _sub(u, _c(x, 1.0))
    goldberg = _mul(log(u), _div(x, d))
    return _where(_eq(d, _c(x, 0.0)), x, _where(_eq(u, _c(x, math.inf)), u, goldberg))


@_in_float32_for_halves
def cos(x: LazyBuffer) -> LazyBuffer:
    """cos(x) = sin(2x) / (2 sin(x)): 2x is exact and the device's SIN keeps its relative accuracy at any argument,
    near its zeros too, so the quotient is within a few ulps everywhere (cos(0) = 1 apart); where 2x would overflow,
    1 - 2 sin(x/2)^2."""
    one, two = _c(x, 1.0), _c(x, 2.0)
    a = _where(_lt(x, _c(x, 0.0)), x.e(UnaryOps.NEG), x)
    big = _lt(_c(x, _COS_DOUBLING_MAX[x.dtype]), a)
    xs = _where(big, one, x)  # (the other branch's argument: no overflow in 2x)
    ratio = _div(_mul(xs, two).e(UnaryOps.SIN), _mul(two, xs.e(UnaryOps.SIN)))
    half_sin = _mul(x, _c(x, 0.5)).e(UnaryOps.SIN)
    far = _sub(one, _mul(two, _mul(half_sin, half_sin)))
    return _where(_eq(x, _c(x, 0.0)), one, _where(big, far, ratio))


# tanh's Taylor coefficients of x^3, x^5, ..., x^19: 2^2n (2^2n - 1) B_2n / (2n)!
_TANH_TAYLOR = (
    -1 / 3,
    2 / 15,
    -17 / 315,
    62 / 2835,
    -1382 / 155925,
    21844 / 6081075,
    -929569 / 638512875,
    6404582 / 10854718875,
    -443861162 / 1856156927625,
)


@_in_float32_for_halves
def tanh(x: LazyBuffer) -> LazyBuffer:
    """tanh(|x|), signed: below 0.55 (tanh 0.5) the Taylor series in float32, -e / (e + 2) with e = expm1(-2|x|) in
    float64; else 1 - 2 / (e^(2|x|) + 1), where e's error is divided by e^(2|x|); x itself where |x| is tiny (and for
    +-0)."""
    neg = _lt(x, _c(x, 0.0))
    a = _where(neg, x.e(UnaryOps.NEG), x)
    if x.dtype == dtypes.float32:
        # float32 (and the half floats, computed in it): below 0.55 the Taylor series, a + a z P(z) with z = a^2, whose
        # 11th term is under 1e-9 of the sum there: no expm1 (its log has no vector routine), so a GELU stays vector
        # code
        z = _mul(a, a)
        p = _c(x, _TANH_TAYLOR[-1])
        for c in reversed(_TANH_TAYLOR[:-1]):
            p = _add(_mul(p, z), _c(x, c))
        near = _add(a, _mul(_mul(a, z), p))
    else:
        e = expm1(_mul(a, _c(x, -2.0)))
        near = _div(e.e(UnaryOps.NEG), _add(e, _c(x, 2.0)))
    far = _sub(_c(x, 1.0), _div(_c(x, 2.0), _add(exp(_mul(a, _c(x, 2.0))), _c(x, 1.0))))
    t = _where(_lt(a, _c(x, 0.55)), near, far)
    ret = _where(neg, t.e(UnaryOps.NEG), t)
    return _where(_lt(a, _c(x, _PARAMS[x.dtype]["tiny"])), x, ret)


@_in_float32_for_halves
def sinh(x: LazyBuffer) -> LazyBuffer:
    """sinh(x) = (e + e / (e + 1)) / 2 with e = expm1(|x|), signed; past exp's overflow h * (h / 2), h = e^(|x|/2)."""
    neg = _lt(x, _c(x, 0.0))
    a = _where(neg, x.e(UnaryOps.NEG), x)
    e = expm1(a)
    near = _mul(_add(e, _div(e, _add(e, _c(x, 1.0)))), _c(x, 0.5))
    h = exp(_mul(a, _c(x, 0.5)))
    far = _mul(h, _mul(h, _c(x, 0.5)))
    ret = _where(_lt(a, _c(x, 32.0)), near, far)
    ret = _where(neg, ret.e(UnaryOps.NEG), ret)
    return _where(_lt(a, _c(x, _PARAMS[x.dtype]["tiny"])), x, ret)


@_in_float32_for_halves
def cosh(x: LazyBuffer) -> LazyBuffer:
    """cosh(x) = (u + 1/u) / 2 with u = e^|x|; past exp's overflow h * (h / 2), h = e^(|x|/2)."""
    a = _where(_lt(x, _c(x, 0.0)), x.e(UnaryOps.NEG), x)
    u = exp(a)
    near = _mul(_add(u, _div(_c(x, 1.0), u)), _c(x, 0.5))
    h = exp(_mul(a, _c(x, 0.5)))
    return _where(_lt(a, _c(x, 32.0)), near, _mul(h, _mul(h, _c(x, 0.5))))


@_in_float32_for_halves
def softplus(x: LazyBuffer) -> LazyBuffer:
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, and e^x itself for very negative x."""
    neg = _lt(x, _c(x, 0.0))
    a = _where(neg, x.e(UnaryOps.NEG), x)
    return _add(_where(neg, _c(x, 0.0), x), log1p(exp(a.e(UnaryOps.NEG))))


@_in_float32_for_halves
def sigmoid(x: LazyBuffer) -> LazyBuffer:
    """1 / (1 + e^-x) as e^min(x, 0) / (1 + e^-|x|), the division as a reciprocal and a product: e^-|x| <= 1, so
    nothing overflows, and below 0 the numerator is e^x itself, so a tiny result (subnormal ones included) keeps its
    digits (sigmoid(-100) is 3.7e-44, not 0). One exp serves both: below 0, e^min(x, 0) is e^-|x|, from 0 up (and for
    NaN) it is 1. MAX and a float32 select keep the whole of it in a vectorizing renderer's vectors (SiLU after a
    convolution: 8 lanes of one exp, not 8 scalar exps with their branches)."""
    neg_abs = x.e(BinaryOps.MAX, x.e(UnaryOps.NEG)).e(UnaryOps.NEG)  # -|x| (NaN stays NaN)
    e = exp(neg_abs)
    r = _div(_c(x, 1.0), _add(_c(x, 1.0), e))
    return _mul(_where(x.e(BinaryOps.CMPLT, _c(x, 0.0)), e, _c(x, 1.0)), r)  # (from 0 up: exactly r)
