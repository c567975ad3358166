"""What every ALU op, CAST and BITCAST must compute, in numpy, written apart from `tgcore.ops.exec_alu`.

The rules (the contract of `tgcore.ops`): floats are IEEE (every op rounds to the dtype; NaN propagates through
MAX; comparisons with NaN are false), integers wrap, integer division truncates toward zero and x/0 == x%0 == 0,
the remainder takes the sign of the dividend, shifts by a negative amount or by the width or more give 0 (a right
shift of a negative signed value gives -1). Integer results are computed on Python ints, so the reference does not
share a line of code with the core. bfloat16 values are carried as float32 holding bfloat16-representable values.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64)
EVERY_DTYPE = (dtypes.bool, *INTS, *FLOATS)

UNARY = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.NEG)
BINARY = (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.DIV, BinaryOps.MAX, BinaryOps.MOD,
          BinaryOps.CMPLT, BinaryOps.CMPEQ, BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL,
          BinaryOps.SHR)
TERNARY = (TernaryOps.WHERE, TernaryOps.MULACC)
ALU_OPS = UNARY + BINARY + TERNARY
# results compared within the device's declared tolerance; every other op must match bit for bit
TRANSCENDENTAL = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT)

_DEFINED_ON: dict[object, tuple[DType, ...]] = {
    **{op: FLOATS for op in TRANSCENDENTAL},
    UnaryOps.NEG: EVERY_DTYPE,
    BinaryOps.ADD: EVERY_DTYPE, BinaryOps.MUL: EVERY_DTYPE, BinaryOps.MAX: EVERY_DTYPE,
    BinaryOps.SUB: INTS + FLOATS, BinaryOps.DIV: INTS + FLOATS, BinaryOps.MOD: INTS + FLOATS,
    BinaryOps.CMPLT: EVERY_DTYPE, BinaryOps.CMPEQ: EVERY_DTYPE,
    BinaryOps.XOR: (dtypes.bool, *INTS), BinaryOps.AND: (dtypes.bool, *INTS), BinaryOps.OR: (dtypes.bool, *INTS),
    BinaryOps.SHL: INTS, BinaryOps.SHR: INTS,
    TernaryOps.WHERE: EVERY_DTYPE, TernaryOps.MULACC: INTS + FLOATS,
}


def defined_on(op: object) -> tuple[DType, ...]:
    """The dtypes ALU `op` is defined on (bool: NEG is not, ADD is or, MUL is and, MAX is or)."""
    return _DEFINED_ON[op]


def op_name(op: object) -> str:
    return getattr(op, "name", str(op))


def arity(op: object) -> int:
    return 1 if op in UNARY else 2 if op in BINARY else 3


def result_dtype(op: object, dt: DType) -> DType:
    return dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPEQ) else dt


def operand_dtypes(op: object, dt: DType) -> tuple[DType, ...]:
    if op is TernaryOps.WHERE:
        return (dtypes.bool, dt, dt)
    return (dt,) * arity(op)


# ***** dtypes as numpy arrays *****

def carrier(dt: DType) -> np.dtype:
    """The numpy dtype that holds values of `dt` (float32 for bfloat16)."""
    if dt == dtypes.bfloat16:
        return np.dtype(np.float32)
    if dt == dtypes.bool:
        return np.dtype(np.bool_)
    return np.dtype(dt.np)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to nearest-even bfloat16, as float32 (NaN stays NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(np.shape(x))
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), rounded).astype(np.float32)


def round_to(x: np.ndarray, dt: DType) -> np.ndarray:
    """Float values rounded to float dtype `dt`, in its carrier."""
    with np.errstate(all="ignore"):
        if dt == dtypes.bfloat16:
            return bf16_round(np.asarray(x).astype(np.float32))
        return np.asarray(x).astype(carrier(dt))


def to_bytes(values: np.ndarray, dt: DType) -> bytes:
    """The bytes of `values` stored as `dt` (bfloat16: the top half of each float32)."""
    arr = np.ascontiguousarray(values, dtype=carrier(dt))
    if dt == dtypes.bfloat16:
        return (arr.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return arr.tobytes()


def from_bytes(raw: bytes, dt: DType) -> np.ndarray:
    """Values of `dt` from their bytes, in the carrier dtype."""
    if dt == dtypes.bfloat16:
        return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype=carrier(dt)).copy()


def bits_of(values: np.ndarray, dt: DType) -> np.ndarray:
    """The raw bit patterns of `values` as `dt`, as unsigned integers of the same width."""
    raw = to_bytes(values, dt)
    return np.frombuffer(raw, dtype={1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])


def int_range(dt: DType) -> tuple[int, int]:
    bits = dt.itemsize * 8
    return (0, 2**bits - 1) if dtypes.is_unsigned(dt) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def wrap(v: int, dt: DType) -> int:
    """Python int `v` wrapped into integer dtype `dt`."""
    bits = dt.itemsize * 8
    v &= (1 << bits) - 1
    return v - (1 << bits) if not dtypes.is_unsigned(dt) and v >= 1 << (bits - 1) else v


def float_max(dt: DType) -> float:
    if dt == dtypes.bfloat16:
        return float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])
    return float(np.finfo(carrier(dt)).max)


def float_tiny(dt: DType) -> float:
    """The smallest positive normal value."""
    return float(np.finfo(np.float32).tiny) if dt == dtypes.bfloat16 else float(np.finfo(carrier(dt)).tiny)


def make_array(values: Iterable[object], dt: DType) -> np.ndarray:
    """Python values as an array of `dt`: ints wrapped, floats rounded, anything to bool by truth."""
    vals = list(values)
    if dt == dtypes.bool:
        return np.array([bool(v) for v in vals], dtype=np.bool_)
    if dtypes.is_int(dt):
        return np.array([wrap(int(v), dt) for v in vals], dtype=carrier(dt))  # type: ignore[call-overload]
    return round_to(np.array(vals, dtype=np.float64), dt)


# ***** crafted inputs *****

def edge_values(dt: DType) -> np.ndarray:
    """The values every op is tried on: zeros of both signs, ones, extremes, inf, NaN, integer min and max."""
    if dt == dtypes.bool:
        return np.array([False, True])
    if dtypes.is_int(dt):
        lo, hi = int_range(dt)
        vals = [0, 1, 2, 3, 7, 100, hi, hi - 1, hi // 2, hi // 2 + 1, 0x55]
        if lo < 0:
            vals += [-1, -2, -7, -100, lo, lo + 1]
        return make_array(dict.fromkeys(vals), dt)
    fmax, tiny = float_max(dt), float_tiny(dt)
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 7.25, -100.5, 1000.0, fmax, -fmax, tiny, -tiny,
            math.inf, -math.inf, math.nan]
    return make_array(vals, dt)


def random_values(dt: DType, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` random values spread over the dtype (ints over the whole range, floats over many magnitudes)."""
    if dt == dtypes.bool:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtypes.is_int(dt):
        lo, hi = int_range(dt)
        return make_array([int(v) for v in rng.integers(lo, hi, n, dtype=np.int64 if lo < 0 else np.uint64,
                                                              endpoint=True)], dt)
    top = {dtypes.float16: 4.0, dtypes.bfloat16: 30.0, dtypes.float32: 30.0, dtypes.float64: 200.0}[dt]
    mags = 10.0 ** rng.uniform(-3.0, top, n)
    return make_array(np.where(rng.random(n) < 0.5, -mags, mags), dt)


def shift_amounts(dt: DType) -> np.ndarray:
    """Shift amounts: 0, 1, width-1, width and beyond (and a negative one for signed dtypes)."""
    bits = dt.itemsize * 8
    _, hi = int_range(dt)
    vals = [0, 1, 2, bits // 2, bits - 1, bits, bits + 1, 2 * bits, 100]
    if not dtypes.is_unsigned(dt):
        vals.append(-1)
    return make_array(dict.fromkeys(v for v in vals if v <= hi), dt)


def _transcendental_values(op: object, dt: DType, rng: np.random.Generator) -> list[np.ndarray]:
    fmax, tiny, inf, nan = float_max(dt), float_tiny(dt), math.inf, math.nan
    if op is UnaryOps.EXP2:
        hi = {dtypes.float16: 14.0, dtypes.float64: 500.0}.get(dt, 100.0)
        special = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 10.0, -10.0, 3.25, 2 * hi, -2 * hi, inf, -inf, nan]
        rand = rng.uniform(-hi, hi, 100)
    elif op is UnaryOps.LOG2:
        special = [1.0, 2.0, 0.5, 8.0, 3.0, 10.0, 0.001, 0.0, -0.0, -1.0, fmax, tiny, inf, -inf, nan]
        rand = np.concatenate([rng.uniform(0.0, 1.0, 50), rng.uniform(1.0, 1000.0, 50)])
    elif op is UnaryOps.SIN:
        special = [0.0, -0.0, 1.0, -1.0, 0.5, 3.140625, -3.140625, 1.5703125, 100.0, -1000.0, inf, -inf, nan]
        rand = rng.uniform(-10.0, 10.0, 100)
    else:
        special = [0.0, -0.0, 1.0, 4.0, 2.0, 0.25, 1000.0, -1.0, fmax, tiny, inf, -inf, nan]
        rand = rng.uniform(0.0, 1000.0, 100)
    return [make_array(special + list(rand), dt)]


def alu_inputs(op: object, dt: DType, rng: np.random.Generator) -> list[np.ndarray]:
    """The operand columns an ALU kernel of `op` on `dt` is run on: edge cases crossed with each other, plus random."""
    if op in TRANSCENDENTAL:
        return _transcendental_values(op, dt, rng)
    edges = edge_values(dt)
    if op in UNARY:
        return [np.concatenate([edges, random_values(dt, 64, rng)])]
    if op in (BinaryOps.SHL, BinaryOps.SHR):
        amounts = shift_amounts(dt)
        pairs = list(itertools.product(range(len(edges)), range(len(amounts))))
        a = np.concatenate([edges[[i for i, _ in pairs]], random_values(dt, 32, rng)])
        b = np.concatenate([amounts[[j for _, j in pairs]], amounts[rng.integers(0, len(amounts), 32)]])
        return [a, b]
    idx = list(itertools.product(range(len(edges)), repeat=2))
    a = np.concatenate([edges[[i for i, _ in idx]], random_values(dt, 64, rng)])
    b = np.concatenate([edges[[j for _, j in idx]], random_values(dt, 64, rng)])
    if op in BINARY:
        return [a, b]
    if op is TernaryOps.WHERE:
        cond = np.concatenate([np.zeros(len(a), np.bool_), np.ones(len(a), np.bool_)])
        return [cond, np.concatenate([a, a]), np.concatenate([b, b])]
    c = np.concatenate([edges[np.arange(len(idx)) % len(edges)], random_values(dt, 64, rng)])
    return [a, b, c]


# ***** reference results *****

def _int_alu(op: object, dt: DType, cols: Sequence[np.ndarray]) -> np.ndarray:
    bits = dt.itemsize * 8
    out_dt = result_dtype(op, dt)

    def div(a: int, b: int) -> int:
        if b == 0:
            return 0
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q

    def shr(a: int, b: int) -> int:
        return a >> b if 0 <= b < bits else (-1 if a < 0 else 0)

    fns: dict[object, Callable[..., object]] = {
        UnaryOps.NEG: lambda a: -a,
        BinaryOps.ADD: lambda a, b: a + b, BinaryOps.SUB: lambda a, b: a - b, BinaryOps.MUL: lambda a, b: a * b,
        BinaryOps.DIV: div, BinaryOps.MOD: lambda a, b: 0 if b == 0 else a - div(a, b) * b,
        BinaryOps.MAX: max, BinaryOps.CMPLT: lambda a, b: a < b, BinaryOps.CMPEQ: lambda a, b: a == b,
        BinaryOps.XOR: lambda a, b: a ^ b, BinaryOps.AND: lambda a, b: a & b, BinaryOps.OR: lambda a, b: a | b,
        BinaryOps.SHL: lambda a, b: a << b if 0 <= b < bits else 0, BinaryOps.SHR: shr,
        TernaryOps.MULACC: lambda a, b, c: wrap(a * b, dt) + c,
    }
    lanes = zip(*[[int(v) for v in col] for col in cols])
    return make_array([fns[op](*lane) for lane in lanes], out_dt)


def _bool_alu(op: object, cols: Sequence[np.ndarray]) -> np.ndarray:
    fns: dict[object, Callable[..., object]] = {
        UnaryOps.NEG: lambda a: not a, BinaryOps.ADD: lambda a, b: a or b, BinaryOps.MUL: lambda a, b: a and b,
        BinaryOps.MAX: lambda a, b: a or b, BinaryOps.CMPLT: lambda a, b: a < b, BinaryOps.CMPEQ: lambda a, b: a == b,
        BinaryOps.XOR: lambda a, b: a != b, BinaryOps.AND: lambda a, b: a and b, BinaryOps.OR: lambda a, b: a or b,
    }
    return make_array([fns[op](*lane) for lane in zip(*[[bool(v) for v in col] for col in cols])], dtypes.bool)


def _float_alu(op: object, dt: DType, cols: Sequence[np.ndarray], fused: bool = False) -> np.ndarray:
    # f16 and bf16 compute in float32 then round once: float32 is wide enough that this double rounding is harmless
    # for + - * / (24 >= 2p + 2 bits); transcendental results are float64 rounded to the dtype
    compute = np.float64 if dt == dtypes.float64 else np.float32
    a = cols[0].astype(compute)

    def rnd(x: np.ndarray) -> np.ndarray:
        return round_to(x, dt)

    if op in TRANSCENDENTAL:
        fn = {UnaryOps.EXP2: np.exp2, UnaryOps.LOG2: np.log2, UnaryOps.SIN: np.sin, UnaryOps.SQRT: np.sqrt}[op]
        return rnd(fn(cols[0].astype(np.float64)))
    if op is UnaryOps.NEG:
        return rnd(-a)
    b = cols[1].astype(compute)
    simple: dict[object, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
        BinaryOps.ADD: np.add, BinaryOps.SUB: np.subtract, BinaryOps.MUL: np.multiply, BinaryOps.DIV: np.divide,
        BinaryOps.MAX: np.maximum, BinaryOps.MOD: np.fmod,
    }
    if op in simple:
        return rnd(simple[op](a, b))
    if op is BinaryOps.CMPLT:
        return a < b
    if op is BinaryOps.CMPEQ:
        return a == b
    if op is TernaryOps.MULACC:
        if fused and dt in (dtypes.float32, dtypes.float64):
            return make_array([fused_multiply_add(*lane, dt) for lane in zip(*cols)], dt)
        return rnd(rnd(a * b).astype(compute) + cols[2].astype(compute))  # a*b rounds, then the sum rounds again
    raise NotImplementedError(f"no float reference for {op}")


def fused_multiply_add(a: float, b: float, c: float, dt: DType) -> float:
    """a*b+c rounded once to float32 or float64 (C's fmaf / fma), from the exact rational result."""
    a, b, c = float(a), float(b), float(c)
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c  # inf or NaN already: IEEE's product and sum give fma's result
    if not math.isfinite(c):
        return c  # the exact product is finite
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # an exact zero: IEEE's sign rules, unless a nonzero product cancelled c (+0)
        return a * b + c if a == 0 or b == 0 else 0.0
    try:
        d = float(exact)  # correctly rounded to float64
    except OverflowError:
        return math.inf if exact > 0 else -math.inf
    if dt == dtypes.float32 and Fraction(d) != exact and int(np.float64(d).view(np.int64)) % 2 == 0:
        d = math.nextafter(d, math.inf if exact > Fraction(d) else -math.inf)  # round to odd: float32(d) is exact RN
    return d


def alu_reference(op: object, dt: DType, cols: Sequence[np.ndarray], fused: bool = False) -> np.ndarray:
    """The expected result of ALU `op` with operand dtype `dt` on operand arrays `cols` (broadcast together);
    `fused`: MULACC on float32 / float64 rounds once (a Renderer with fused_mulacc)."""
    shape = np.broadcast_shapes(*[np.shape(c) for c in cols])
    flat = [np.broadcast_to(c, shape).reshape(-1) for c in cols]
    with np.errstate(all="ignore"):
        if op is TernaryOps.WHERE:
            out = np.where(flat[0].astype(np.bool_), flat[1], flat[2]).astype(carrier(dt))
        elif dt == dtypes.bool:
            out = _bool_alu(op, flat)
        elif dtypes.is_int(dt):
            out = _int_alu(op, dt, flat)
        else:
            out = _float_alu(op, dt, flat, fused)
    return out.reshape(shape)


def cast_inputs(src: DType, dst: DType, rng: np.random.Generator) -> np.ndarray:
    """Values of `src` whose conversion to `dst` is defined: float to int only in range (truncated toward zero)."""
    vals = np.concatenate([edge_values(src), random_values(src, 48, rng)])
    if dtypes.is_float(src) and dtypes.is_int(dst):
        lo, hi = int_range(dst)
        extra = make_array([lo, hi, lo / 2, hi / 2, 1.5, -1.5, 2.75, -2.75, 0.999, -0.999, 127.5, -128.5, 255.5,
                            hi - 0.5, lo + 0.5], src)
        vals = np.concatenate([vals, extra])
        keep = [math.isfinite(float(v)) and lo <= math.trunc(float(v)) <= hi for v in vals]  # exact, on Python ints
        vals = vals[np.array(keep, dtype=np.bool_)]
    elif dtypes.is_int(src) and dst in (dtypes.float16, dtypes.bfloat16):
        # keep integer -> half within the finite range, and integer -> bfloat16 exact in float32 (one rounding)
        limit = 65504 if dst == dtypes.float16 else 2**24
        vals = np.array([v for v in vals if -limit <= int(v) <= limit], dtype=vals.dtype)
    elif src == dtypes.float64 and dst == dtypes.bfloat16:  # one rounding: values exact in float32 or out of range
        with np.errstate(all="ignore"):
            keep = (vals.astype(np.float32).astype(np.float64) == vals) | ~np.isfinite(vals) | \
                (np.abs(vals) > float_max(dtypes.float32))
        vals = vals[keep]
    return vals


def cast_reference(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """The value conversion of `x` (values of `src`) to `dst`."""
    with np.errstate(all="ignore"):
        if dst == dtypes.bool:
            return x != 0
        if dtypes.is_int(dst):
            if dtypes.is_int(src) or src == dtypes.bool:
                return make_array([int(v) for v in x], dst)
            return make_array([int(math.trunc(float(v))) for v in x], dst)
        if dtypes.is_int(src) and dst == dtypes.bfloat16:
            return bf16_round(x.astype(np.float32))
        return round_to(x if src != dtypes.bool else x.astype(np.float32), dst)


def bitcast_reference(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    return from_bytes(to_bytes(x, src), dst)


# ***** comparing *****

def mismatches(got: np.ndarray, exp: np.ndarray, dt: DType, tolerance: Optional[tuple[float, float]] = None,
               zero_sign_free: Optional[np.ndarray] = None) -> np.ndarray:
    """A mask of the lanes where `got` is not `exp`: bit for bit (NaN equals any NaN), or within (atol, rtol).

    `zero_sign_free` marks lanes where 0.0 and -0.0 are both accepted."""
    if dt == dtypes.bool or dtypes.is_int(dt):
        return got != exp
    with np.errstate(all="ignore"):
        g, e = got.astype(np.float64), exp.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(e)
    if tolerance is None:
        bad = bits_of(got, dt) != bits_of(exp, dt)
        if zero_sign_free is not None:
            bad &= ~(zero_sign_free & (g == 0) & (e == 0))
    else:
        atol, rtol = tolerance
        with np.errstate(all="ignore"):
            close = np.abs(g - e) <= atol + rtol * np.abs(e)
        exact_inf = np.isinf(e) | np.isinf(g)
        bad = np.where(exact_inf, g != e, ~close)
    return bad & ~both_nan


def fmt(v: object, dt: DType) -> str:
    """A value as a reader (and Python) would write it."""
    if dt == dtypes.bool:
        return str(bool(v))
    if dtypes.is_int(dt):
        return str(int(v))  # type: ignore[call-overload]
    f = float(v)  # type: ignore[arg-type]
    return repr(f) if math.isfinite(f) else f"float('{f}')"
