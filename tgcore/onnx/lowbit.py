"""ONNX element types that tgcore has no dtype for (float8, float4, int4, int2): their table and their rounding.

Such a value travels through a graph as a LowBitTensor: a tensor of a carrier dtype that devices have (float32 for the
float types, int8 or uint8 for the integer ones) holding exactly the representable values, with its ONNX type beside it.
Values enter as ml_dtypes arrays (registry.to_tensor) and leave as them (registry.to_numpy); Cast, CastLike and
QuantizeLinear round into a type with the functions here, written on Tensor ops, so they run on any device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
from onnx import TensorProto, helper

from tgcore.dtype import DType, dtypes
from tgcore.onnx.errors import OnnxError
from tgcore.tensor import Tensor

if TYPE_CHECKING:
    from tgcore.onnx.registry import Node


@dataclass(frozen=True)
class LowBitType:
    """A low-bit ONNX element type: its numpy (ml_dtypes) dtype, its carrier, and what rounding into it needs."""

    name: str  # TensorProto's name, e.g. FLOAT8E4M3FN
    elem_type: int
    np_dtype: np.dtype
    carrier: DType
    # a float type: mantissa bits, smallest normal exponent, largest finite value, and its special values:
    # "ieee" has inf and NaN (E5M2), "fn" NaN but no inf, "fnuz" one NaN and no -0, "none" neither (E2M1),
    # "e8m0" is powers of two only (no sign, no zero)
    mantissa: int = 0
    min_exponent: int = 0
    max_value: float = 0.0
    special: str = ""
    # an integer type: its range
    lo: int = 0
    hi: int = 0

    @property
    def is_float(self) -> bool:
        return dtypes.is_float(self.carrier)

    @property
    def bits(self) -> int:
        return (self.hi - self.lo + 1).bit_length() - 1


def _float(name: str, mantissa: int, bias: int, max_value: float, special: str) -> LowBitType:
    elem = getattr(TensorProto, name)
    npdt = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    return LowBitType(name, elem, npdt, dtypes.float32, mantissa, 1 - bias, max_value, special)


def _int(name: str, lo: int, hi: int) -> LowBitType:
    elem = getattr(TensorProto, name)
    npdt = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    return LowBitType(name, elem, npdt, dtypes.int8 if lo < 0 else dtypes.uint8, lo=lo, hi=hi)


_TYPES = (
    _float("FLOAT8E4M3FN", 3, 7, 448.0, "fn"),
    _float("FLOAT8E4M3FNUZ", 3, 8, 240.0, "fnuz"),
    _float("FLOAT8E5M2", 2, 15, 57344.0, "ieee"),
    _float("FLOAT8E5M2FNUZ", 2, 16, 57344.0, "fnuz"),
    _float("FLOAT8E8M0", 0, 127, 2.0**127, "e8m0"),
    _float("FLOAT4E2M1", 1, 1, 6.0, "none"),
    _int("INT4", -8, 7),
    _int("UINT4", 0, 15),
    _int("INT2", -2, 1),
    _int("UINT2", 0, 3),
)
LOWBIT: dict[int, LowBitType] = {t.elem_type: t for t in _TYPES}
_BY_NUMPY: dict[np.dtype, LowBitType] = {t.np_dtype: t for t in _TYPES}
E8M0_ROUND_MODES = ("up", "down", "nearest")


def of_numpy(dtype: np.dtype) -> Optional[LowBitType]:
    """The low-bit type of a numpy dtype (an ml_dtypes one), None for any other dtype."""
    return _BY_NUMPY.get(np.dtype(dtype))


class LowBitTensor(Tensor):
    """A carrier tensor holding values of the low-bit ONNX type `kind`; make one with LowBitTensor.of.

    Tensor ops build their results with type(first).__new__, and this class's gives a plain Tensor: a value computed
    from a low-bit one is an ordinary carrier tensor, and only the graph runner (for ops that move values) or the
    rounding below says it holds a low-bit type."""

    __slots__ = ("kind",)

    def __new__(cls, *args: Any, **kwargs: Any) -> Tensor:  # type: ignore[misc]
        if args or kwargs:
            raise TypeError("make a LowBitTensor with LowBitTensor.of(carrier_tensor, kind)")
        return Tensor.__new__(Tensor)

    @classmethod
    def of(cls, carrier: Tensor, kind: LowBitType) -> LowBitTensor:
        if carrier.dtype != kind.carrier:
            raise TypeError(f"a {kind.name} value is carried as {kind.carrier}, got a tensor of {carrier.dtype}")
        t = object.__new__(cls)
        Tensor.__init__(t, carrier.lazydata)
        t.kind = kind
        return t

    def clone(self) -> LowBitTensor:
        """A copy of its own memory holds the same low-bit values (a replayed model's outputs are such copies)."""
        return LowBitTensor.of(Tensor.clone(self), self.kind)

    def __repr__(self) -> str:
        return f"<LowBitTensor {self.kind.name} carried as {self.lazydata!r} on {self.device}>"


def carrier(t: Tensor) -> Tensor:
    """t's values as a plain tensor of its carrier dtype (so that, e.g., a cast to that dtype is no longer low-bit)."""
    return Tensor(t.lazydata) if isinstance(t, LowBitTensor) else t


def from_numpy(arr: np.ndarray, device: str) -> LowBitTensor:
    """An ml_dtypes array of a low-bit type as its carrier tensor (every value is exact in the carrier)."""
    kind = of_numpy(arr.dtype)
    if kind is None:
        raise TypeError(f"numpy dtype {arr.dtype} is not a low-bit ONNX type; expected one of {sorted(_names())}")
    return LowBitTensor.of(Tensor(np.asarray(arr).astype(kind.carrier.np), device=device), kind)


def to_numpy(t: LowBitTensor) -> np.ndarray:
    """A low-bit tensor's values as an array of its ml_dtypes dtype (exact: the carrier holds representable values)."""
    return t.numpy().astype(t.kind.np_dtype)


def _names() -> list[str]:
    return [f"{t.name} ({t.np_dtype})" for t in _TYPES]


# ***** rounding into a low-bit type *****


def cast_to(x: Tensor, kind: LowBitType, saturate: bool = True, round_mode: str = "up") -> LowBitTensor:
    """Cast x to `kind` as ONNX's Cast does: floats round to nearest even (E8M0: round_mode), with the saturate rules of
    each float8 variant; to an integer type, integers wrap and floats truncate toward zero (out of range: 0)."""
    x = carrier(x)
    if kind.is_float:
        if kind.special == "e8m0":
            if round_mode not in E8M0_ROUND_MODES:
                raise ValueError(f"round_mode {round_mode!r}: expected one of {', '.join(E8M0_ROUND_MODES)}")
            out = _to_e8m0(x, saturate, round_mode)
        else:
            out = _to_float(x, kind, saturate or kind.special == "none")
    else:
        out = _to_int(x, kind)
    return LowBitTensor.of(out, kind)


def cast_options(n: Node) -> tuple[bool, str]:
    """Cast's and CastLike's saturate and round_mode attributes, the round mode checked."""
    mode = n.get("round_mode", "up")
    if mode not in E8M0_ROUND_MODES:
        raise n.unsupported(f"round_mode {mode!r}: expected one of {', '.join(E8M0_ROUND_MODES)}")
    return bool(n.get("saturate", 1)), mode


def saturate_int(q: Tensor, kind: LowBitType) -> LowBitTensor:
    """Integer-valued q clamped into an integer type's range (QuantizeLinear's saturation)."""
    if kind.is_float:
        raise TypeError(f"saturate_int is for the integer types, not {kind.name}")
    return LowBitTensor.of(q.clip(kind.lo, kind.hi).cast(kind.carrier), kind)


def _wide(x: Tensor) -> Tensor:
    """x as the float type rounding is computed in: float64 for 64-bit inputs (no double rounding), else float32."""
    return x.cast(dtypes.float64 if x.dtype.itemsize == 8 else dtypes.float32)


def _layout(w: Tensor) -> tuple[DType, int, int]:
    """The integer dtype of w's bits, its mantissa width and its exponent bias."""
    return (dtypes.int64, 52, 1023) if w.dtype == dtypes.float64 else (dtypes.int32, 23, 127)


def _to_float(x: Tensor, kind: LowBitType, saturate: bool) -> Tensor:
    """x rounded to nearest even at kind's mantissa width, then its overflow, NaN and zero rules; float32 out."""
    w = _wide(x)
    ibits, mant, bias = _layout(w)
    bits = w.bitcast(ibits)
    negative = bits < 0
    magnitude_bits = bits.bitwise_and(2 ** (8 * ibits.itemsize - 1) - 1)
    a = magnitude_bits.bitcast(w.dtype)
    # the quantum 2^(e - mantissa), e the exponent of a: kept in the normal range of the type (below it: subnormals,
    # one quantum) and at most one past its largest exponent (where every value overflows anyway)
    top = int(np.floor(np.log2(kind.max_value))) + 1
    e = ((magnitude_bits >> mant) - bias).maximum(kind.min_exponent).minimum(top)
    quantum = ((e + (bias - kind.mantissa)) << mant).bitcast(w.dtype)
    r = (a / quantum).round() * quantum  # (both exact: quantum is a power of two)
    if saturate:
        overflow = kind.max_value
    else:
        overflow = float("inf") if kind.special == "ieee" else float("nan")
    r = (r > kind.max_value).where(overflow, r)
    if kind.special == "fnuz":  # no negative zero
        negative = negative & (r != 0)
    out = negative.where(-r, r)
    is_nan = w != w
    if kind.special == "none":  # no NaN: a zero, as ml_dtypes' conversion (and the backend suite) gives
        out = is_nan.where(0.0, out)
    else:
        out = is_nan.where(w, out)
    return out.cast(dtypes.float32)


def _to_e8m0(x: Tensor, saturate: bool, round_mode: str) -> Tensor:
    """x as a power of two 2^k, k in [-127, 127] (E8M0), rounded by round_mode; float32 out.

    Zero, inf and what rounds out of range become the nearest end (saturate) or NaN; NaN and negative values (which
    the spec leaves undefined) become NaN."""
    w = _wide(x)
    ibits, mant, bias = _layout(w)
    a = w.abs()
    # a subnormal (of w) scaled up by 2^64 is normal, so its exponent and mantissa read from its bits exactly
    sub = a < (2.0**-126 if w.dtype == dtypes.float32 else 2.0**-1022)
    bits = sub.where(a * 2.0**64, a).bitcast(ibits)
    e = (bits >> mant) - bias - sub.where(64, 0).cast(ibits)
    fraction = bits.bitwise_and(2**mant - 1)
    if round_mode == "up":
        e = e + (fraction != 0).cast(ibits)
    elif round_mode == "nearest":  # ties up
        e = e + (fraction >= 2 ** (mant - 1)).cast(ibits)
    too_big, too_small = (e > 127) | (a == float("inf")), (e < -127) | (a == 0)
    k = e.maximum(-127).minimum(127).cast(dtypes.int32)
    # 2^k from its float32 bits; 2^-127 is a float32 subnormal
    out = (k == -127).where(1 << 22, (k + 127) << 23).bitcast(dtypes.float32)
    if not saturate:
        out = (too_big | too_small).where(float("nan"), out)
    invalid = (w != w) | ((w < 0) & (a != 0))
    return invalid.where(float("nan"), out)


def _to_int(x: Tensor, kind: LowBitType) -> Tensor:
    """x in an integer type: integers (and bools) wrap to its bits, floats truncate toward zero; a float out of range
    (or NaN, inf), which the spec leaves undefined, becomes 0 as in ml_dtypes' conversion."""
    if x.dtype == dtypes.bool:
        return x.cast(kind.carrier)
    if dtypes.is_int(x.dtype):
        u = x.bitwise_and(2**kind.bits - 1).cast(dtypes.int32)
        if kind.lo < 0:
            u = (u > kind.hi).where(u - 2**kind.bits, u)
        return u.cast(kind.carrier)
    t = _wide(x).trunc()
    in_range = (t >= kind.lo) & (t <= kind.hi)  # (False for NaN)
    return in_range.where(t, 0.0).cast(kind.carrier)


# ***** which ops keep a low-bit type *****

# ops whose outputs are elements of one input moved or selected, by that input's position: they keep its type
MOVES_VALUES_OF: dict[str, int] = {
    **dict.fromkeys(
        ("Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
         "GatherElements", "GatherND", "Expand", "Tile", "DepthToSpace", "SpaceToDepth"),
        0,
    ),
    "Where": 1,
}  # fmt: skip


def keep_types(op_type: str, inputs: Sequence[Optional[Tensor]], outputs: list[Any]) -> list[Any]:
    """A data-movement op's outputs, typed as its low-bit input (the op itself computed on the carrier)."""
    i = MOVES_VALUES_OF.get(op_type)
    src = inputs[i] if i is not None and i < len(inputs) else None
    if not isinstance(src, LowBitTensor):
        return outputs
    return [
        LowBitTensor.of(t, src.kind) if type(t) is Tensor and t.dtype == src.kind.carrier else t for t in outputs
    ]


def check_input(name: str, value: Any, kind: LowBitType, device: str) -> LowBitTensor:
    """A graph input declared of a low-bit type: an array of its ml_dtypes dtype, or a LowBitTensor of it."""
    if not isinstance(value, Tensor):
        value = np.asarray(value)
    if isinstance(value, LowBitTensor) and value.kind == kind:
        return value if value.device == device else LowBitTensor.of(carrier(value).to(device), kind)
    if isinstance(value, np.ndarray) and value.dtype == kind.np_dtype:
        return from_numpy(value, device)
    got = value.kind.name if isinstance(value, LowBitTensor) else getattr(value, "dtype", type(value).__name__)
    raise OnnxError(
        f"input {name!r} is declared {kind.name}: pass a numpy array of ml_dtypes' {kind.np_dtype} "
        f"(or a LowBitTensor of {kind.name}), got {got}"
    )
