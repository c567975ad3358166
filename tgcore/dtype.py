"""Data types: the scalar types tensors hold, their promotion lattice and conversions."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Final, Optional, Union

import numpy as np

ConstType = Union[float, int, bool]


@dataclass(frozen=True, order=True)
class DType:
    """A scalar (count == 1) or vector (count > 1) element type."""

    priority: int  # orders dtypes in promotion: the higher wins among candidates
    itemsize: int  # bytes of one element (of the whole vector for count > 1)
    name: str  # the C spelling, used by C-family renderers
    fmt: Optional[str]  # struct/memoryview format character, None where Python has none
    count: int = 1

    # dtypes are compared and hashed on every op (a kernel's lowering: ~1M times for EfficientNet-B0's 161 kernels):
    # identity first, the hash computed when the dtype is made, and each vector type made once (vec)
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self._fields()))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (
            self.name == other.name  # type: ignore[attr-defined]
            and self.count == other.count  # type: ignore[attr-defined]
            and self._fields() == other._fields()  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def _fields(self) -> tuple:
        return (self.priority, self.itemsize, self.name, self.fmt, self.count)

    def __getstate__(self) -> dict:
        # the cached hash is of strings, which hash differently in each process: a pickle carries the fields only,
        # and the hash is made again where it is unpickled
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def __repr__(self) -> str:
        if self.count > 1:
            return f"dtypes.{self.scalar().short_name}.vec({self.count})"
        return f"dtypes.{self.short_name}"

    @property
    def short_name(self) -> str:
        """The attribute name on `dtypes` (float32, uint8, ...)."""
        return INVERSE_DTYPES_DICT[self.scalar().name]

    def vec(self, size: int) -> DType:
        """The vector type of `size` elements of this scalar type (the same object each time)."""
        if (got := _VECTORS.get((self, size))) is not None:
            return got
        if self.count != 1 or size <= 1:
            raise ValueError(
                f"cannot make a vector of {size} elements from {self}: expected a scalar dtype and size > 1"
            )
        made = DType(self.priority, self.itemsize * size, f"{INVERSE_DTYPES_DICT[self.name]}{size}", None, size)
        _SCALARS[made] = self
        return _VECTORS.setdefault((self, size), made)

    def scalar(self) -> DType:
        """The element type of a vector type (self for scalars)."""
        if self.count == 1:
            return self
        if (got := _SCALARS.get(self)) is not None:
            return got
        return DTYPES_DICT[self.name[: -len(str(self.count))]]

    @property
    def np(self) -> Optional[type]:
        """The numpy scalar type with the same layout, None for bfloat16."""
        return _NUMPY_TYPES.get(self.name) if self.count == 1 else None


# vec's vector types by (scalar type, size), and their scalar types (a scalar type's vectors are few: every width a
# renderer uses)
_VECTORS: dict[tuple[DType, int], DType] = {}
_SCALARS: dict[DType, DType] = {}


@dataclass(frozen=True, repr=False)
class PtrDType(DType):
    """A pointer to elements of a dtype: the type of a kernel's buffer arguments."""

    def __repr__(self) -> str:
        return f"ptr.{super().__repr__()}"

    @staticmethod
    def of(dt: DType) -> PtrDType:
        return PtrDType(dt.priority, dt.itemsize, dt.name, dt.fmt, dt.count)

    @property
    def base(self) -> DType:
        return DType(self.priority, self.itemsize, self.name, self.fmt, self.count)


@dataclass(frozen=True, repr=False)
class ImageDType(DType):
    """A 2D image of 4-channel texels (kept for API parity; no device in the core uses images)."""

    shape: tuple[int, ...] = ()
    base_dtype: Optional[DType] = None

    def __repr__(self) -> str:
        return f"dtypes.{self.name}({self.shape})"


class dtypes:
    """Namespace of every dtype and the helpers that classify them."""

    @staticmethod
    def is_float(x: DType) -> bool:
        return x.scalar() in dtypes._float_set

    @staticmethod
    def is_int(x: DType) -> bool:
        return x.scalar() in dtypes._int_set

    @staticmethod
    def is_unsigned(x: DType) -> bool:
        return x.scalar() in dtypes._uint_set

    @staticmethod
    def from_np(x: Union[type, np.dtype]) -> DType:
        name = np.dtype(x).name
        if name not in _FROM_NUMPY:
            raise TypeError(f"numpy dtype {name} has no tgcore dtype; expected one of {sorted(_FROM_NUMPY)}")
        return _FROM_NUMPY[name]

    @staticmethod
    def from_py(x: object) -> DType:
        """The dtype a Python value (or nested list of them) becomes."""
        if isinstance(x, (bool, np.bool_)):
            return dtypes.bool
        if isinstance(x, (int, np.integer)):
            return dtypes.default_int
        if isinstance(x, (float, np.floating)):
            return dtypes.default_float
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(v) for v in x), default=dtypes.default_float)
        raise TypeError(f"cannot infer a dtype from {type(x).__name__}: expected bool, int, float or a list of them")

    @staticmethod
    def as_const(val: ConstType, dtype: DType) -> ConstType:
        """`val` as the Python type that holds constants of `dtype`."""
        if (known := _CONST_TYPES.get(id(dtype))) is None or known[0] is not dtype:  # (no DType hash: an id)
            known = _const_type(dtype)
        return known[1](val)

    @staticmethod
    def min(dtype: DType) -> ConstType:
        if dtypes.is_int(dtype):
            return 0 if dtypes.is_unsigned(dtype) else -(2 ** (dtype.itemsize * 8 - 1))
        return -math.inf if dtypes.is_float(dtype) else False

    @staticmethod
    def max(dtype: DType) -> ConstType:
        if dtypes.is_int(dtype):
            return 2 ** (dtype.itemsize * 8 - (0 if dtypes.is_unsigned(dtype) else 1)) - 1
        return math.inf if dtypes.is_float(dtype) else True

    @staticmethod
    def fields() -> dict[str, DType]:
        return dict(DTYPES_DICT_BY_ATTR)

    @staticmethod
    def imageh(shape: tuple[int, ...]) -> ImageDType:
        return ImageDType(100, 2, "imageh", "e", 1, shape, dtypes.float32)

    @staticmethod
    def imagef(shape: tuple[int, ...]) -> ImageDType:
        return ImageDType(100, 4, "imagef", "f", 1, shape, dtypes.float32)

    bool: Final[DType] = DType(0, 1, "bool", "?")
    int8: Final[DType] = DType(1, 1, "char", "b")
    uint8: Final[DType] = DType(2, 1, "unsigned char", "B")
    int16: Final[DType] = DType(3, 2, "short", "h")
    uint16: Final[DType] = DType(4, 2, "unsigned short", "H")
    int32: Final[DType] = DType(5, 4, "int", "i")
    uint32: Final[DType] = DType(6, 4, "unsigned int", "I")
    int64: Final[DType] = DType(7, 8, "long", "q")
    uint64: Final[DType] = DType(8, 8, "unsigned long", "Q")
    float16: Final[DType] = DType(9, 2, "half", "e")
    bfloat16: Final[DType] = DType(10, 2, "__bf16", None)
    float32: Final[DType] = DType(11, 4, "float", "f")
    float64: Final[DType] = DType(12, 8, "double", "d")

    # aliases
    half = float16
    float = float32
    double = float64
    char = int8
    uchar = uint8
    short = int16
    ushort = uint16
    int = int32
    uint = uint32
    long = int64
    ulong = uint64

    default_float: DType = float32
    default_int: DType = int32

    _int_set = frozenset((int8, uint8, int16, uint16, int32, uint32, int64, uint64))
    _uint_set = frozenset((uint8, uint16, uint32, uint64))
    _float_set = frozenset((float16, bfloat16, float32, float64))


_NUMPY_TYPES: dict[str, type] = {
    "bool": np.bool_,
    "char": np.int8,
    "unsigned char": np.uint8,
    "short": np.int16,
    "unsigned short": np.uint16,
    "int": np.int32,
    "unsigned int": np.uint32,
    "long": np.int64,
    "unsigned long": np.uint64,
    "half": np.float16,
    "float": np.float32,
    "double": np.float64,
}
DTYPES_DICT_BY_ATTR: dict[str, DType] = {
    k: v
    for k, v in vars(dtypes).items()
    if isinstance(v, DType) and not k.startswith("_") and not k.startswith("default")
}
# canonical attribute name of each dtype: the first one defined (float32 rather than float)
INVERSE_DTYPES_DICT: dict[str, str] = {}
for _attr, _dt in DTYPES_DICT_BY_ATTR.items():
    INVERSE_DTYPES_DICT.setdefault(_dt.name, _attr)
DTYPES_DICT: dict[str, DType] = {dt.name: dt for dt in DTYPES_DICT_BY_ATTR.values()}
DTYPES_DICT.update({attr: DTYPES_DICT_BY_ATTR[attr] for attr in INVERSE_DTYPES_DICT.values()})
_FROM_NUMPY: dict[str, DType] = {np.dtype(t).name: DTYPES_DICT[n] for n, t in _NUMPY_TYPES.items()}

# Promotion: each dtype lists the dtypes it may be promoted to directly (a lattice, as in JAX and tinygrad).
_PROMOTES_TO: dict[DType, tuple[DType, ...]] = {
    dtypes.bool: (dtypes.int8, dtypes.uint8),
    dtypes.int8: (dtypes.int16,),
    dtypes.int16: (dtypes.int32,),
    dtypes.int32: (dtypes.int64,),
    dtypes.int64: (dtypes.float16, dtypes.bfloat16),
    dtypes.uint8: (dtypes.int16, dtypes.uint16),
    dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64),
    dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
    dtypes.float16: (dtypes.float32,),
    dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float64,),
    dtypes.float64: (),
}


def _upper_bounds(dt: DType) -> set[DType]:
    out = {dt}
    for parent in _PROMOTES_TO[dt]:
        out |= _upper_bounds(parent)
    return out


@functools.lru_cache(maxsize=1024)  # asked for on every sum and every binary op of mixed dtypes
def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every one of `ds` promotes to."""
    if not ds:
        raise ValueError("least_upper_dtype needs at least one dtype")
    images = [d for d in ds if isinstance(d, ImageDType)]
    if images:
        return images[0]
    return min(set.intersection(*[_upper_bounds(d.scalar()) for d in ds]))


def least_upper_float(dt: DType) -> DType:
    """`dt` if it is a float, else the smallest float it promotes to with the default float."""
    return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.default_float)


@functools.lru_cache(maxsize=None)  # (asked at every sum: a few dtypes, each promotion worked out once)
def sum_acc_dtype(dt: DType) -> DType:
    """The dtype a sum of `dt` values accumulates in."""
    if dtypes.is_unsigned(dt):
        return least_upper_dtype(dt, dtypes.uint32)
    if dtypes.is_int(dt) or dt == dtypes.bool:
        return least_upper_dtype(dt, dtypes.int32)
    return least_upper_dtype(dt, dtypes.float32)


def to_dtype(x: Union[DType, str, type, np.dtype]) -> DType:
    """A DType from a DType, a name ("float32", "half") or a numpy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in DTYPES_DICT_BY_ATTR:
            return DTYPES_DICT_BY_ATTR[x]
        raise ValueError(f"unknown dtype name {x!r}; expected one of {sorted(DTYPES_DICT_BY_ATTR)}")
    return dtypes.from_np(x)


def truncate(val: ConstType, dtype: DType) -> ConstType:
    """`val` as a value of `dtype`: ints wrap, floats round to the dtype's precision."""
    if (fmt := _STRUCT_FLOAT.get(dtype)) is not None:  # struct rounds like numpy (to nearest even), and faster
        try:
            return struct.unpack(fmt, struct.pack(fmt, val))[0]
        except (OverflowError, struct.error):  # out of range: numpy decides (inf, or an error for huge ints)
            with np.errstate(over="ignore"):
                return float(np.array(val, dtype=dtype.np))
    if dtype == dtypes.bool:
        return bool(val)
    if dtypes.is_int(dtype):
        bits = dtype.itemsize * 8
        v = int(val) & ((1 << bits) - 1)
        return v - (1 << bits) if not dtypes.is_unsigned(dtype) and v >= 1 << (bits - 1) else v
    if dtype == dtypes.bfloat16:
        return float(bf16_round(np.array([val], dtype=np.float32))[0])
    if dtype == dtypes.float64:
        return float(val)
    with np.errstate(over="ignore"):
        return float(np.array(val, dtype=dtype.np))


_STRUCT_FLOAT = {dtypes.float32: "f", dtypes.float16: "e"}

# the Python type of each dtype object's constants, by id (the dtype is kept here, so its id is not reused)
_CONST_TYPES: dict[int, tuple[DType, type]] = {}


def _const_type(dtype: DType) -> tuple[DType, type]:
    known = (dtype, int if dtypes.is_int(dtype) else float if dtypes.is_float(dtype) else bool)
    if len(_CONST_TYPES) >= 256:  # vec() makes a new DType object per call
        _CONST_TYPES.clear()
    _CONST_TYPES[id(dtype)] = known
    return known


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded (to nearest even) to bfloat16 precision, kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(x)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    out = rounded.view(np.float32).copy()
    out[nan] = np.nan
    return out
