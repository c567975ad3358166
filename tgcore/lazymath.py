"""Float functions of LazyBuffers that the primitive ops do not have, composed from them to numpy's accuracy.

The devices give EXP2, LOG2, SIN and SQRT. The plain compositions lose accuracy where a rounded intermediate is
magnified: exp(x) as exp2(x * log2(e)) is up to ~60 ulp off near 88 (the product's rounding error becomes a
relative error of the result), cos(x) as sin(pi/2 - x) is wrong near every zero of cos and for large x, and
tanh, sinh, softplus, log(1 + x) lose every digit near 0. These routines keep float32 and float64 results within a
few ulps of the exact value (the tests measure them against float64 / exact references):

- exp: Cody-Waite reduction x = n ln2 + r with ln2 in two parts, e^r a polynomial, and 2^n made from bits (within
  an ulp, in about half the ops of exp2(n + r log2(e)) through the device's EXP2).
- expm1, log1p: Kahan's and Goldberg's corrections, (u - 1) x / log(u) and log(u) x / (u - 1) with u = exp(x) and
  u = 1 + x: the rounding error of u cancels between numerator and denominator.
- cos: sin(2x) / (2 sin(x)), the device's SIN (which reduces any argument exactly) twice.

float16 and bfloat16 arguments are computed in float32 and rounded back. In the lazy graph each of these functions is
one node (ops.py, ComposedOps; LazyBuffer.composed), written out by `compose` when the scheduler builds the kernel
that computes it. Every routine takes and returns LazyBuffers
of one float dtype; inputs outside a function's domain give what numpy gives (inf, NaN).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable

from tgcore.dtype import DType, dtypes
from tgcore.ops import COMPOSITIONS, BinaryOps, ComposedOps, TernaryOps, UnaryOps

if TYPE_CHECKING:  # (lazy.py imports this module: its nodes stand for these compositions)
    from tgcore.lazy import LazyBuffer

# per float dtype: rounding shift (adding and subtracting it rounds to an integer), ln2 in two parts (the first
# with few mantissa bits, so n * part is exact), the clamp of exp's argument (just past overflow and underflow),
# and the magnitude below which tanh(x) and sinh(x) are x
_PARAMS = {
    dtypes.float32: {
        "shift": 12582912.0,  # 1.5 * 2^23
        "ln2": (0.693359375, -2.12194440e-4),
        "clamp": (-110.0, 89.0),
        "tiny": 2.0**-12,  # below this, tanh(x) == sinh(x) == x
        # (e^r - 1 - r) / r^2 on |r| <= ln2 / 2, degree 4, fitted for the least largest relative error of e^r (3e-9)
        "exp_q": (0.4999999403953552, 0.1666652113199234, 0.041668374091386795, 0.0083687175065279,
                  0.001381535897962749),  # fmt: skip
        "bias": 127.0,
        "bits": (dtypes.uint32, 23),
    },
    dtypes.float64: {
        "shift": 6755399441055744.0,  # 1.5 * 2^52
        "ln2": (6.93145751953125e-1, 1.42860682030941723212e-6),
        "clamp": (-760.0, 710.0),
        "tiny": 2.0**-27,
        # Taylor's 1/k!, k = 2..13: the first term left out, r^14 / 14!, is under 5e-18 for |r| <= ln2 / 2
        "exp_q": tuple(1 / math.factorial(k) for k in range(2, 14)),
        "bias": 1023.0,
        "bits": (dtypes.uint64, 52),
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


@_in_float32_for_halves
def log(x: LazyBuffer) -> LazyBuffer:
    return _mul(x.e(UnaryOps.LOG2), _c(x, LN2))


@_in_float32_for_halves
def exp(x: LazyBuffer) -> LazyBuffer:
    """e^x as 2^n e^r: n = round(x log2(e)), r = x - n ln2 (ln2 in two parts, so r is exact but for one rounding),
    e^r = 1 + r + r^2 q(r) for |r| <= ln2 / 2, and 2^n applied as two power-of-two factors whose exponent fields are
    built from the bits of n's rounding (no float -> int conversion), so that a subnormal result rounds once.
    Arithmetic, compares, selects, bit casts and shifts only, each a whole-vector op on a vectorizing renderer: ~32 ops
    a lane, where exp2(n + r log2(e)) (the device's EXP2 with its own reduction and special cases) took ~60. The
    argument is clamped just past overflow and underflow; NaN passes through the selects and the arithmetic."""
    p = _PARAMS[x.dtype]
    lo, hi = p["clamp"]
    xc = _where(_lt(x, _c(x, lo)), _c(x, lo), x)
    xc = _where(_lt(_c(x, hi), xc), _c(x, hi), xc)
    shift = p["shift"]
    n = _sub(_add(_mul(xc, _c(x, LOG2E)), _c(x, shift)), _c(x, shift))  # rounded to an integer
    r = _sub(_sub(xc, _mul(n, _c(x, p["ln2"][0]))), _mul(n, _c(x, p["ln2"][1])))
    coeffs = p["exp_q"]
    q = _c(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        q = _add(_mul(q, r), _c(x, c))
    e = _add(_c(x, 1.0), _add(r, _mul(_mul(r, r), q)))
    # n = n1 + n2, each biased by the exponent's bias and held in the low bits of a float past `shift`: shifted up
    # by the mantissa's width, those bits are the exponent field of 2^n1 (2^n2)
    bias, bits = p["bias"], p["bits"]
    n1 = _add(_mul(n, _c(x, 0.5)), _c(x, shift + bias))  # n1 + bias + shift, n1 = round(n / 2)
    n2 = _sub(_add(n, _c(x, shift + 2 * bias)), _sub(n1, _c(x, shift)))  # n - n1 + bias + shift
    s1, s2 = (_power_of_two(v, bits) for v in (n1, n2))
    return _mul(_mul(e, s1), s2)


def _power_of_two(v: LazyBuffer, bits: tuple[DType, int]) -> LazyBuffer:
    """The float whose exponent field is the low bits of v's mantissa (an integer k + bias, v = k + bias + shift):
    2^k."""
    udt, mantissa = bits
    u = v.cast(udt, bitcast=True)
    return u.e(BinaryOps.SHL, u.const(mantissa)).cast(v.dtype, bitcast=True)


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


# float32 tanh(a) = a + a z P(z), z = a^2, for a in [0, 0.55]: P of degree 4 fitted for the least largest relative error
# of tanh there (4e-9 with these float32 coefficients; the Taylor series needs 9 terms for as little)
_TANH_P = (-0.33333316445350647, 0.13332585990428925, -0.05385234206914902, 0.021071776747703552, -0.006274333689361811)


@_in_float32_for_halves
def tanh(x: LazyBuffer) -> LazyBuffer:
    """tanh(|x|), signed: below 0.55 (tanh 0.5) a polynomial in float32, -e / (e + 2) with e = expm1(-2|x|) in
    float64; else 1 - 2 / (e^(2|x|) + 1), where e's error is divided by e^(2|x|); x itself where |x| is tiny (and for
    +-0)."""
    neg = _lt(x, _c(x, 0.0))
    a = _where(neg, x.e(UnaryOps.NEG), x)
    if x.dtype == dtypes.float32:
        # float32 (and the half floats, computed in it): below 0.55 a + a z P(z) with z = a^2 (_TANH_P): no expm1 (its
        # log has no vector routine), so a GELU stays vector code
        z = _mul(a, a)
        p = _c(x, _TANH_P[-1])
        for c in reversed(_TANH_P[:-1]):
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
    NaN) it is 1. Float32 compares and selects keep the whole of it in a vectorizing renderer's vectors (SiLU after a
    convolution: 8 lanes of one exp, not 8 scalar exps with their branches)."""
    neg = _lt(x, _c(x, 0.0))
    e = exp(_where(neg, x, x.e(UnaryOps.NEG)))  # e^-|x| (NaN stays NaN)
    r = _div(_c(x, 1.0), _add(_c(x, 1.0), e))
    return _mul(_where(neg, e, _c(x, 1.0)), r)  # (from 0 up: exactly r)


# the function each ComposedOps node stands for (ops.py keeps the table)
COMPOSITIONS.update({
    ComposedOps.EXP: exp,
    ComposedOps.EXPM1: expm1,
    ComposedOps.LOG1P: log1p,
    ComposedOps.COS: cos,
    ComposedOps.TANH: tanh,
    ComposedOps.SINH: sinh,
    ComposedOps.COSH: cosh,
    ComposedOps.SOFTPLUS: softplus,
    ComposedOps.SIGMOID: sigmoid,
})


def compose(b: LazyBuffer) -> LazyBuffer:
    """The composition that the ComposedOps node `b` stands for, of b's source: a graph of primitive ops."""
    return COMPOSITIONS[b.op](b.srcs[0])  # type: ignore[index]
