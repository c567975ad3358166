"""Dtypes: layout, names, numpy mapping, the promotion lattice of tinygrad 0.9.0, conversions and limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgcore.dtype import (
    DType,
    PtrDType,
    dtypes,
    least_upper_dtype,
    least_upper_float,
    sum_acc_dtype,
    to_dtype,
    truncate,
)

# (dtype, itemsize, C name, numpy type, attribute name)
TABLE = [
    (dtypes.bool, 1, "bool", np.bool_, "bool"),
    (dtypes.int8, 1, "char", np.int8, "int8"),
    (dtypes.uint8, 1, "unsigned char", np.uint8, "uint8"),
    (dtypes.int16, 2, "short", np.int16, "int16"),
    (dtypes.uint16, 2, "unsigned short", np.uint16, "uint16"),
    (dtypes.int32, 4, "int", np.int32, "int32"),
    (dtypes.uint32, 4, "unsigned int", np.uint32, "uint32"),
    (dtypes.int64, 8, "long", np.int64, "int64"),
    (dtypes.uint64, 8, "unsigned long", np.uint64, "uint64"),
    (dtypes.float16, 2, "half", np.float16, "float16"),
    (dtypes.bfloat16, 2, "__bf16", None, "bfloat16"),
    (dtypes.float32, 4, "float", np.float32, "float32"),
    (dtypes.float64, 8, "double", np.float64, "float64"),
]
ALL = [row[0] for row in TABLE]
B, I8, U8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64 = ALL


@pytest.mark.parametrize("dt,itemsize,name,np_type,attr", TABLE, ids=[r[4] for r in TABLE])
def test_dtype_layout(dt: DType, itemsize: int, name: str, np_type: type | None, attr: str) -> None:
    assert dt.itemsize == itemsize and dt.name == name and dt.np is np_type and dt.count == 1
    assert getattr(dtypes, attr) is dt and dt.short_name == attr and repr(dt) == f"dtypes.{attr}"
    if np_type is not None:
        assert np.dtype(np_type).itemsize == itemsize
        assert dtypes.from_np(np_type) == dt and dtypes.from_np(np.dtype(np_type)) == dt
    assert to_dtype(attr) == dt and to_dtype(dt) is dt


def test_priorities_are_ordered() -> None:
    assert [d.priority for d in ALL] == sorted(d.priority for d in ALL)
    assert len({d.priority for d in ALL}) == len(ALL)


def test_aliases() -> None:
    assert dtypes.half == F16 and dtypes.float == F32 and dtypes.double == F64
    assert dtypes.char == I8 and dtypes.uchar == U8 and dtypes.short == I16 and dtypes.ushort == U16
    assert dtypes.int == I32 and dtypes.uint == U32 and dtypes.long == I64 and dtypes.ulong == U64
    assert to_dtype("half") == F16 and to_dtype("float") == F32 and to_dtype("long") == I64
    assert dtypes.default_float == F32 and dtypes.default_int == I32


def test_classification() -> None:
    assert [d for d in ALL if dtypes.is_float(d)] == [F16, BF16, F32, F64]
    assert [d for d in ALL if dtypes.is_int(d)] == [I8, U8, I16, U16, I32, U32, I64, U64]
    assert [d for d in ALL if dtypes.is_unsigned(d)] == [U8, U16, U32, U64]
    assert not dtypes.is_int(B) and not dtypes.is_float(B)


def test_fields_lists_every_dtype() -> None:
    fields = dtypes.fields()
    for dt, *_, attr in TABLE:
        assert fields[attr] == dt
    assert all(isinstance(v, DType) for v in fields.values())


def test_vec_and_scalar() -> None:
    v = F32.vec(4)
    assert v.count == 4 and v.itemsize == 16 and v.scalar() == F32 and v.np is None
    assert repr(v) == "dtypes.float32.vec(4)"
    assert F16.vec(2).scalar() == F16 and U8.vec(8).itemsize == 8
    with pytest.raises(ValueError):
        F32.vec(1)
    with pytest.raises(ValueError):
        v.vec(2)


def test_ptr_dtype() -> None:
    p = PtrDType.of(I32)
    assert p.itemsize == 4 and p.base == I32 and repr(p) == "ptr.dtypes.int32"
    assert dtypes.is_int(p.base)


def test_dtypes_hashable_and_equal_by_value() -> None:
    assert len({F32, dtypes.float, DType(11, 4, "float", "f")}) == 1
    assert F32 != F64


def test_vector_dtypes_are_made_once_and_survive_pickling() -> None:
    """vec gives the same object for the same scalar type and size (a kernel's lowering asks ~100k times); a vector
    type unpickled in another process (its fields hashed anew) is equal to it, hashes alike and knows its scalar."""
    import pickle

    v = F32.vec(8)
    assert F32.vec(8) is v and F32.vec(4) is not v and F16.vec(8) is not v and v.scalar() is F32
    made = DType(v.priority, v.itemsize, v.name, v.fmt, v.count)  # equal, made by hand
    assert made == v and hash(made) == hash(v) and made.scalar() is F32
    back = pickle.loads(pickle.dumps(v))
    assert "_hash" not in v.__getstate__() and back == v and hash(back) == hash(v) and {back: 1}[v] == 1
    assert back.scalar() == F32 and pickle.loads(pickle.dumps(F32)) == F32


# ***** promotion lattice (tinygrad 0.9.0) *****

PROMOTIONS = [
    ((B, B), B),
    ((B, I8), I8),
    ((B, U8), U8),
    ((B, I32), I32),
    ((B, F32), F32),
    ((B, U64), U64),
    ((I8, I8), I8),
    ((I8, U8), I16),
    ((I8, I16), I16),
    ((I8, U16), I32),
    ((I8, U32), I64),
    ((I8, U64), F16),
    ((U8, I16), I16),
    ((U8, U16), U16),
    ((U8, U32), U32),
    ((U8, I32), I32),
    ((U8, U64), U64),
    ((U16, I16), I32),
    ((U16, U32), U32),
    ((U16, I64), I64),
    ((I32, U32), I64),
    ((U32, U64), U64),
    ((U32, I64), I64),
    ((I32, U64), F16),
    ((I64, U64), F16),
    ((I64, F16), F16),
    ((I64, BF16), BF16),
    ((U64, BF16), BF16),
    ((I32, F16), F16),
    ((I32, F32), F32),
    ((I64, F64), F64),
    ((U8, BF16), BF16),
    ((F16, BF16), F32),
    ((F16, F32), F32),
    ((BF16, F32), F32),
    ((F16, F64), F64),
    ((BF16, F64), F64),
    ((F32, F64), F64),
    ((I8, U8, F16), F16),
    ((B, I8, U8), I16),
    ((U16, I8, B), I32),
    ((F16, BF16, I8), F32),
    ((I32,), I32),
]


@pytest.mark.parametrize("args,expected", PROMOTIONS, ids=["-".join(a.short_name for a in p[0]) for p in PROMOTIONS])
def test_least_upper_dtype(args: tuple[DType, ...], expected: DType) -> None:
    assert least_upper_dtype(*args) == expected
    assert least_upper_dtype(*reversed(args)) == expected


@pytest.mark.parametrize("a", ALL, ids=str)
def test_least_upper_dtype_properties(a: DType) -> None:
    assert least_upper_dtype(a, a) == a
    assert least_upper_dtype(a, F64) == F64
    for b in ALL:
        up = least_upper_dtype(a, b)
        assert up == least_upper_dtype(b, a)
        assert least_upper_dtype(up, a) == up and least_upper_dtype(up, b) == up
        assert up.priority >= max(a.priority, b.priority)


def test_least_upper_dtype_needs_args() -> None:
    with pytest.raises(ValueError):
        least_upper_dtype()


def test_least_upper_float() -> None:
    assert least_upper_float(F16) == F16 and least_upper_float(BF16) == BF16 and least_upper_float(F64) == F64
    for d in (B, I8, U8, I16, U16, I32, U32, I64, U64):
        assert least_upper_float(d) == F32


@pytest.mark.parametrize(
    "dt,acc",
    [
        (B, I32),
        (I8, I32),
        (U8, U32),
        (I16, I32),
        (U16, U32),
        (I32, I32),
        (U32, U32),
        (I64, I64),
        (U64, U64),
        (F16, F32),
        (BF16, F32),
        (F32, F32),
        (F64, F64),
    ],
    ids=str,
)
def test_sum_acc_dtype(dt: DType, acc: DType) -> None:
    assert sum_acc_dtype(dt) == acc


# ***** conversions *****


def test_to_dtype() -> None:
    assert to_dtype("float32") == F32 and to_dtype("bfloat16") == BF16 and to_dtype("bool") == B
    assert to_dtype(np.float16) == F16 and to_dtype(np.dtype("int64")) == I64
    with pytest.raises(ValueError, match="unknown dtype"):
        to_dtype("float128x")
    with pytest.raises(TypeError):
        to_dtype(np.complex64)


@pytest.mark.parametrize(
    "bad", [np.complex64, np.complex128, np.dtype("U3"), np.object_, np.dtype("datetime64[s]")], ids=str
)
def test_from_np_errors(bad: object) -> None:
    with pytest.raises(TypeError, match="no tgcore dtype"):
        dtypes.from_np(bad)


def test_from_py() -> None:
    assert dtypes.from_py(True) == B and dtypes.from_py(3) == I32 and dtypes.from_py(3.0) == F32
    assert dtypes.from_py([1, 2]) == I32 and dtypes.from_py([1, 2.0]) == F32 and dtypes.from_py([True, False]) == B
    assert dtypes.from_py([[True], [2]]) == I32 and dtypes.from_py([]) == F32
    assert dtypes.from_py(np.float64(1.0)) == F32 and dtypes.from_py(np.int8(1)) == I32
    with pytest.raises(TypeError):
        dtypes.from_py("x")


def test_as_const() -> None:
    assert dtypes.as_const(2.7, I32) == 2 and isinstance(dtypes.as_const(2.7, I32), int)
    assert dtypes.as_const(2, F32) == 2.0 and isinstance(dtypes.as_const(2, F32), float)
    assert dtypes.as_const(3, B) is True and dtypes.as_const(0.0, B) is False


# ***** limits and truncation *****


@pytest.mark.parametrize("dt", [I8, U8, I16, U16, I32, U32, I64, U64], ids=str)
def test_int_min_max(dt: DType) -> None:
    info = np.iinfo(dt.np)
    assert dtypes.min(dt) == int(info.min) and dtypes.max(dt) == int(info.max)
    assert isinstance(dtypes.min(dt), int) and isinstance(dtypes.max(dt), int)


def test_float_bool_min_max() -> None:
    for dt in (F16, BF16, F32, F64):
        assert dtypes.min(dt) == -math.inf and dtypes.max(dt) == math.inf
    assert dtypes.min(B) is False and dtypes.max(B) is True


@pytest.mark.parametrize("dt", [I8, U8, I16, U16, I32, U32, I64, U64], ids=str)
def test_truncate_wraps_ints(dt: DType) -> None:
    lo, hi = int(dtypes.min(dt)), int(dtypes.max(dt))
    span = hi - lo + 1
    for v in (0, 1, -1, hi, lo, hi + 1, lo - 1, 3 * span + 5, -2 * span - 7):
        expect = (v - lo) % span + lo
        assert truncate(v, dt) == expect
    assert truncate(2.9, dt) == 2 and truncate(-2.9, dt) == truncate(-2, dt)


def test_truncate_examples() -> None:
    assert truncate(200, I8) == -56 and truncate(-1, U8) == 255 and truncate(2**32, U32) == 0
    assert truncate(2**63, I64) == -(2**63) and truncate(-1, U64) == 2**64 - 1
    assert truncate(2, B) is True and truncate(0, B) is False


def test_truncate_floats() -> None:
    assert truncate(70000.0, F16) == math.inf and truncate(1 / 3, F16) == float(np.float16(1 / 3))
    assert truncate(1 / 3, F32) == float(np.float32(1 / 3)) and truncate(1 / 3, F64) == 1 / 3
    assert truncate(1e39, F32) == math.inf and math.isnan(truncate(math.nan, F32))
    assert truncate(1.0 + 2.0**-8, BF16) == 1.0 and truncate(1.0 + 3 * 2.0**-8, BF16) == 1.0 + 2.0**-6
    assert truncate(3, F32) == 3.0 and isinstance(truncate(3, F32), float)


@pytest.mark.parametrize("dt", [F16, F32], ids=str)
def test_truncate_floats_match_numpy_rounding(dt: DType) -> None:
    # truncate rounds float16/float32 through struct; it must agree with numpy everywhere, overflow included
    rng = np.random.default_rng(0)
    big = 65504.0 if dt == F16 else float(np.finfo(np.float32).max)
    values = [0.0, -0.0, math.inf, -math.inf, big, -big, big * (1 + 2**-12), big * 1.01, -big * 1.01, 5e-324, -1e-45]
    values += [float(v) for v in rng.standard_normal(200) * rng.choice([1e-8, 1.0, 1e4, 1e38], 200)]
    for v in values:
        with np.errstate(over="ignore"):
            expect = float(np.array(v, dtype=dt.np))
        got = truncate(v, dt)
        assert got == expect and math.copysign(1, got) == math.copysign(1, expect), (v, got, expect)
    assert truncate(10**40, dt) == math.inf and truncate(-(10**40), dt) == -math.inf
    with pytest.raises(OverflowError):  # a Python int beyond float64 has no float value at all
        truncate(2**1100, dt)


def test_dtype_equality_and_hash_are_structural() -> None:
    twin = DType(F32.priority, F32.itemsize, F32.name, F32.fmt)
    assert twin == F32 and hash(twin) == hash(F32) and twin is not F32
    assert dtypes.is_float(twin) and not dtypes.is_int(twin) and {F32: 1}[twin] == 1
    assert PtrDType.of(F32) != F32 and F32 != PtrDType.of(F32) and F32 != I32 and F32 != "float32"
    assert sorted([F64, I8, F16]) == [I8, F16, F64]


def test_python_device_rounds_bfloat16_constants_and_accumulators():
    # a CONST or DEFINE_ACC of bfloat16 with a value it cannot hold (0.1) is that value rounded to nearest even, as
    # every renderer spells it: x == 0.1 holds for x = bfloat16(0.1), and 0.1 + 0.0 stores bfloat16(0.1)
    from tgcore.codegen.uops import UOp, UOps
    from tgcore.device import Buffer, Device
    from tgcore.dtype import bf16_round
    from tgcore.ops import BinaryOps

    rounded = float(bf16_round(np.array([0.1], np.float32))[0])
    out_eq = UOp(UOps.DEFINE_GLOBAL, PtrDType.of(dtypes.bool), (), (0, "data0", True))
    out_acc = UOp(UOps.DEFINE_GLOBAL, PtrDType.of(BF16), (), (1, "data1", True))
    src = UOp(UOps.DEFINE_GLOBAL, PtrDType.of(BF16), (), (2, "data2", False))
    gidx = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 1))
    c = UOp(UOps.CONST, BF16, (), 0.1)
    x = UOp(UOps.LOAD, BF16, (src, gidx))
    eq = UOp(UOps.ALU, dtypes.bool, (x, c), BinaryOps.CMPEQ)
    acc = UOp(UOps.DEFINE_ACC, BF16, (), 0.1)
    zero = UOp(UOps.CONST, BF16, (), 0.0)
    total = UOp(UOps.ALU, BF16, (acc, zero), BinaryOps.ADD)
    store_eq, store_acc = UOp(UOps.STORE, None, (out_eq, gidx, eq)), UOp(UOps.STORE, None, (out_acc, gidx, total))
    uops = [out_eq, out_acc, src, gidx, c, zero, x, eq, store_eq, acc, total, store_acc]
    dev = Device["PYTHON"]
    prg = dev.runtime("PYTHON", "k", dev.compiler.compile(dev.renderer.render("k", uops)))
    bufs = [Buffer("PYTHON", 1, dt).allocate() for dt in (dtypes.bool, BF16, BF16)]
    bufs[2].copyin(memoryview(bytearray((np.array([rounded], np.float32).view(np.uint32) >> 16).astype(np.uint16))))
    prg(*[b._opaque for b in bufs], global_size=(1, 1, 1), local_size=(1, 1, 1))
    assert bufs[0].numpy()[0] and bufs[1].numpy()[0] == rounded
