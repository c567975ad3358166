"""Tensor API on the PYTHON device, checked against numpy (gradients against float64 finite differences)."""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.dtype import DType, bf16_round

R = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _reseed() -> None:
    """Each test draws the same data whichever tests run before it."""
    global R
    R = np.random.default_rng(1234)


def rnd(*shape: int, lo: float = -2.0, hi: float = 2.0, dtype: Any = np.float32) -> np.ndarray:
    return R.uniform(lo, hi, size=shape).astype(dtype)


def close(t: Tensor, expect: Any, rtol: float = 1e-6, atol: float = 1e-6, dtype: DType | None = None) -> None:
    got = t.numpy()
    expect = np.asarray(expect)
    assert got.shape == expect.shape, f"shape {got.shape} != {expect.shape}"
    if dtype is not None:
        assert t.dtype == dtype, f"dtype {t.dtype} != {dtype}"
    np.testing.assert_allclose(got, expect, rtol=rtol, atol=atol, equal_nan=True)


def exact(t: Tensor, expect: Any, dtype: DType | None = None) -> None:
    got = t.numpy()
    expect = np.asarray(expect)
    assert got.shape == expect.shape, f"shape {got.shape} != {expect.shape}"
    if dtype is not None:
        assert t.dtype == dtype, f"dtype {t.dtype} != {dtype}"
    np.testing.assert_array_equal(got, expect)


NP_OF = {
    dtypes.bool: np.bool_,
    dtypes.int8: np.int8,
    dtypes.uint8: np.uint8,
    dtypes.int16: np.int16,
    dtypes.uint16: np.uint16,
    dtypes.int32: np.int32,
    dtypes.uint32: np.uint32,
    dtypes.int64: np.int64,
    dtypes.uint64: np.uint64,
    dtypes.float16: np.float16,
    dtypes.float32: np.float32,
    dtypes.float64: np.float64,
}


# ***************************************************************** creation


def test_from_nested_list() -> None:
    exact(Tensor([[1, 2, 3], [4, 5, 6]]), np.int32([[1, 2, 3], [4, 5, 6]]), dtypes.int32)
    exact(Tensor([[1.5, 2], [3, 4]]), np.float32([[1.5, 2], [3, 4]]), dtypes.float32)
    exact(Tensor([True, False]), [True, False], dtypes.bool)
    exact(Tensor([[[1]], [[2]]]), np.int32([[[1]], [[2]]]))
    exact(Tensor(((1, 2), (3, 4))), np.int32([[1, 2], [3, 4]]))


def test_dtype_inference() -> None:
    assert Tensor([1, 2]).dtype == dtypes.int32
    assert Tensor([1, 2.0]).dtype == dtypes.float32
    assert Tensor([True, False]).dtype == dtypes.bool
    assert Tensor([True, 2]).dtype == dtypes.int32
    assert Tensor(3).dtype == dtypes.int32 and Tensor(3.0).dtype == dtypes.float32 and Tensor(True).dtype == dtypes.bool
    assert Tensor([]).dtype == dtypes.float32 and Tensor([]).shape == (0,)


def test_from_list_with_dtype() -> None:
    exact(Tensor([1, 2, 3], dtype=dtypes.float16), np.float16([1, 2, 3]), dtypes.float16)
    exact(Tensor([1.7, -2.2], dtype=dtypes.int32), np.int32([1, -2]), dtypes.int32)
    exact(Tensor([0, 1, 2], dtype="bool"), [False, True, True], dtypes.bool)
    exact(Tensor([1, 2], dtype=dtypes.int64), np.int64([1, 2]), dtypes.int64)


def test_ragged_list_raises() -> None:
    with pytest.raises(ValueError):
        Tensor([[1, 2], [3]])
    with pytest.raises(ValueError):
        Tensor([[1.0], [2.0, 3.0]])


def test_from_scalars() -> None:
    for v, dt in ((3, dtypes.int32), (2.5, dtypes.float32), (True, dtypes.bool), (-7, dtypes.int32)):
        t = Tensor(v)
        assert t.shape == () and t.dtype == dt and t.item() == v and t.ndim == 0
    assert Tensor(np.float64(1.5)).item() == 1.5
    assert Tensor(5, dtype=dtypes.uint8).item() == 5
    assert Tensor(300, dtype=dtypes.uint8).item() == 44


@pytest.mark.parametrize("dt", list(NP_OF), ids=str)
def test_from_numpy_each_dtype(dt: DType) -> None:
    np_t = NP_OF[dt]
    if dt == dtypes.bool:
        a = np.array([[True, False, True], [False, False, True]])
    elif dtypes.is_int(dt):
        info = np.iinfo(np_t)
        a = np.array([[info.min, 0, 1], [info.max, 7, info.max - 1]], dtype=np_t)
    else:
        a = np.array([[-1.5, 0.0, np.inf], [np.finfo(np_t).max, 1e-3, -np.inf]], dtype=np_t)
    t = Tensor(a)
    assert t.dtype == dt and t.shape == (2, 3)
    got = t.numpy()
    assert got.dtype == np_t
    np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(Tensor(a[:, ::-1]).numpy(), a[:, ::-1])  # non-contiguous source


def test_from_numpy_with_dtype_casts() -> None:
    exact(Tensor(np.float32([1.5, -2.5]), dtype=dtypes.int32), np.int32([1, -2]), dtypes.int32)
    exact(Tensor(np.int32([1, 2]), dtype=dtypes.float32), np.float32([1, 2]), dtypes.float32)


def test_from_numpy_errors() -> None:
    with pytest.raises(TypeError):
        Tensor(np.array([1 + 2j]))
    with pytest.raises(TypeError):
        Tensor(np.array([object()]))
    with pytest.raises(TypeError):
        Tensor("abc")  # type: ignore[arg-type]


def test_from_bytes() -> None:
    t = Tensor(b"\x01\x02\xff")
    exact(t, np.uint8([1, 2, 255]), dtypes.uint8)
    exact(Tensor(b""), np.zeros(0, np.uint8))


def test_numpy_is_a_copy() -> None:
    a = np.float32([1, 2, 3])
    t = Tensor(a)
    a[0] = 100
    exact(t, np.float32([1, 2, 3]))
    out = t.numpy()
    out[1] = 50
    exact(t, np.float32([1, 2, 3]))


def test_zeros_ones_full() -> None:
    exact(Tensor.zeros(2, 3), np.zeros((2, 3), np.float32), dtypes.float32)
    exact(Tensor.zeros((2, 3)), np.zeros((2, 3), np.float32))
    exact(Tensor.ones(4, dtype=dtypes.int32), np.ones(4, np.int32), dtypes.int32)
    exact(Tensor.full((2, 2), 7), np.full((2, 2), 7, np.int32), dtypes.int32)
    exact(Tensor.full((3,), 2.5), np.full(3, 2.5, np.float32), dtypes.float32)
    exact(Tensor.full((2,), True), [True, True], dtypes.bool)
    exact(Tensor.full(3, -1.0, dtype=dtypes.float16), np.float16([-1, -1, -1]), dtypes.float16)
    exact(Tensor.zeros(0, 3), np.zeros((0, 3), np.float32))
    exact(Tensor.ones(()), np.float32(1.0))
    with pytest.raises(ValueError):
        Tensor.zeros(-1, 2)


def test_like_constructors() -> None:
    base = Tensor(np.int8([[1, 2, 3]]))
    for t, v in ((base.zeros_like(), 0), (base.ones_like(), 1), (base.full_like(5), 5)):
        exact(t, np.full((1, 3), v, np.int8), dtypes.int8)
    exact(base.full_like(2, dtype=dtypes.float32), np.full((1, 3), 2, np.float32), dtypes.float32)
    f = Tensor(rnd(2, 2))
    exact(f.zeros_like(), np.zeros((2, 2), np.float32), dtypes.float32)


@pytest.mark.parametrize(
    "args", [(5,), (2, 9), (2, 9, 3), (10, 0, -3), (5, 5), (5, 2), (-3, 4), (0,), (3, -2, -1)], ids=str
)
def test_arange_int(args: tuple) -> None:
    exact(Tensor.arange(*args), np.arange(*args, dtype=np.int32), dtypes.int32)


@pytest.mark.parametrize("args", [(5.0,), (0, 1, 0.25), (1.5, -1.0, -0.5), (0.0, 2.0, 0.3), (2.0, 1.0)], ids=str)
def test_arange_float(args: tuple) -> None:
    close(Tensor.arange(*args), np.arange(*args, dtype=np.float32), dtype=dtypes.float32)


def test_arange_dtype_and_errors() -> None:
    exact(Tensor.arange(4, dtype=dtypes.int64), np.arange(4, dtype=np.int64), dtypes.int64)
    close(Tensor.arange(3, dtype=dtypes.float32), np.float32([0, 1, 2]), dtype=dtypes.float32)
    with pytest.raises(ValueError):
        Tensor.arange(0, 5, 0)


@pytest.mark.parametrize("n", [0, 1, 3, 5])
def test_eye(n: int) -> None:
    exact(Tensor.eye(n), np.eye(n, dtype=np.float32), dtypes.float32)


def test_eye_dtype() -> None:
    exact(Tensor.eye(3, dtype=dtypes.int32), np.eye(3, dtype=np.int32), dtypes.int32)


def test_empty() -> None:
    t = Tensor.empty(2, 3)
    assert t.shape == (2, 3) and t.dtype == dtypes.float32
    assert t.numpy().shape == (2, 3)


def test_rand_randn() -> None:
    Tensor.manual_seed(42)
    r = Tensor.rand(3, 50)
    assert r.shape == (3, 50) and r.dtype == dtypes.float32
    rv = r.numpy()
    assert (rv >= 0).all() and (rv < 1).all() and 0.3 < rv.mean() < 0.7
    n = Tensor.randn(2000)
    nv = n.numpy()
    assert n.dtype == dtypes.float32 and abs(nv.mean()) < 0.15 and 0.85 < nv.std() < 1.15
    assert Tensor.rand(2, 2, dtype=dtypes.float16).dtype == dtypes.float16
    assert Tensor.randn((4,), dtype=dtypes.float64).dtype == dtypes.float64
    assert Tensor.rand(0, 3).shape == (0, 3)


def test_manual_seed_reproducible() -> None:
    Tensor.manual_seed(7)
    a, b = Tensor.rand(5).numpy(), Tensor.randn(5).numpy()
    c = Tensor.rand(5).numpy()
    assert not np.array_equal(a, c)
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(Tensor.rand(5).numpy(), a)
    np.testing.assert_array_equal(Tensor.randn(5).numpy(), b)
    Tensor.manual_seed(8)
    assert not np.array_equal(Tensor.rand(5).numpy(), a)


def test_uniform_range() -> None:
    Tensor.manual_seed(0)
    u = Tensor.uniform(400, low=-3.0, high=-1.0).numpy()
    assert (u >= -3).all() and (u < -1).all()


# ***************************************************************** properties


def test_properties() -> None:
    t = Tensor(rnd(2, 3, 4))
    assert t.shape == (2, 3, 4) and t.dtype == dtypes.float32 and t.device == "PYTHON"
    assert t.ndim == 3 and t.numel() == 24 and t.element_size() == 4 and t.nbytes() == 96 and len(t) == 2
    i = Tensor(np.int16([1, 2, 3]))
    assert i.element_size() == 2 and i.nbytes() == 6 and len(i) == 3
    assert Tensor(np.zeros((0, 5), np.float64)).numel() == 0 and Tensor(np.zeros((0, 5), np.float64)).nbytes() == 0
    assert Tensor(1.0).numel() == 1 and Tensor(1.0).ndim == 0
    assert t.is_floating_point() and not i.is_floating_point()
    with pytest.raises(TypeError):
        len(Tensor(1.0))


def test_item_tolist_numpy() -> None:
    assert Tensor([[3.5]]).item() == 3.5 and isinstance(Tensor([[3.5]]).item(), float)
    assert Tensor([7]).item() == 7 and isinstance(Tensor([7]).item(), int)
    assert Tensor(True).item() is True
    with pytest.raises(ValueError):
        Tensor([1, 2]).item()
    assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert Tensor([0.5, 1.5]).tolist() == [0.5, 1.5]
    assert Tensor(2).tolist() == 2
    a = rnd(3, 2)
    out = Tensor(a).numpy()
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, a)


def test_repr_with_grad() -> None:
    x = Tensor([1.0, 2.0], requires_grad=True)
    assert "PYTHON" in repr(x)
    (x * 2).sum().backward()
    assert "PYTHON" in repr(x)


def test_realize_empty_elementwise() -> None:
    e = Tensor(np.zeros((0, 3), np.float32))
    (e + 1).realize()
    e.exp().realize()
    exact(Tensor(np.zeros(0, np.float32)).exp().pad(((2, 1),)), np.zeros(3, np.float32))


def test_empty_tensor_ops() -> None:
    a = np.zeros((0, 3), np.float32)
    e = Tensor(a)
    exact(e + 1, a + 1)
    exact(e.exp(), np.exp(a))
    exact(e.softmax(), a)
    exact(e.permute(1, 0), a.T)
    exact(e.flip(0), a)
    exact(e[::-1, 1], a[::-1, 1])
    exact(e.reshape(3, 0), a.reshape(3, 0))
    exact(e.pad(((1, 1), (0, 0))), np.pad(a, ((1, 1), (0, 0))))
    exact(e.cat(e), np.concatenate([a, a]))
    exact(e.max(1), np.zeros(0, np.float32))
    exact(Tensor(np.zeros((0, 1), np.float32)).expand(0, 4), np.zeros((0, 4), np.float32))
    exact(Tensor(np.zeros(0, np.float32)).pad(((2, 1),), value=3.0), np.full(3, 3.0, np.float32))
    exact(Tensor(np.zeros(0, np.float32)).cat(Tensor([1.0, 2.0])), np.float32([1, 2]))
    exact(e.mean(0), np.full(3, np.nan, np.float32))
    x = Tensor(a, requires_grad=True)
    (x * 2).sum().backward()
    exact(x.grad, a)


def test_bool_of_tensor_raises() -> None:
    with pytest.raises(TypeError):
        bool(Tensor([1]))


# ***************************************************************** elementwise arithmetic

BIN_OPS: list[tuple[str, Callable, Callable]] = [
    ("add", lambda a, b: a + b, lambda a, b: a + b),
    ("sub", lambda a, b: a - b, lambda a, b: a - b),
    ("mul", lambda a, b: a * b, lambda a, b: a * b),
    ("div", lambda a, b: a / b, lambda a, b: a / b),
]


@pytest.mark.parametrize("name,op,np_op", BIN_OPS, ids=[o[0] for o in BIN_OPS])
def test_binary_float(name: str, op: Callable, np_op: Callable) -> None:
    a, b = rnd(3, 5), rnd(3, 5, lo=0.5, hi=3.0)
    close(op(Tensor(a), Tensor(b)), np_op(a, b), dtype=dtypes.float32)
    close(op(Tensor(a), 2.5), np_op(a, np.float32(2.5)))
    close(op(2.5, Tensor(b)), np_op(np.float32(2.5), b))
    close(op(Tensor(a), Tensor(b[0])), np_op(a, b[0]))  # broadcast
    close(op(Tensor(a[:, :1]), Tensor(b[:1, :])), np_op(a[:, :1], b[:1, :]))


@pytest.mark.parametrize("name,op,np_op", BIN_OPS[:3], ids=[o[0] for o in BIN_OPS[:3]])
def test_binary_int_exact(name: str, op: Callable, np_op: Callable) -> None:
    a, b = np.int32([[5, -3, 0], [100, -7, 9]]), np.int32([[2, 4, -1], [-3, 3, 9]])
    exact(op(Tensor(a), Tensor(b)), np_op(a, b), dtypes.int32)
    exact(op(Tensor(a), 3), np_op(a, np.int32(3)), dtypes.int32)
    exact(op(3, Tensor(a)), np_op(np.int32(3), a), dtypes.int32)


def test_int_true_division_is_float() -> None:
    a, b = np.int32([7, -7, 1, 0]), np.int32([2, 2, 3, 5])
    close(Tensor(a) / Tensor(b), a / b, dtype=dtypes.float32)
    close(Tensor(a) / 2, a / 2, dtype=dtypes.float32)
    close(2 / Tensor(b), 2 / b, dtype=dtypes.float32)


def test_int_overflow_wraps() -> None:
    exact(Tensor(np.int8([127, -128])) + 1, np.int8([-128, -127]), dtypes.int8)
    exact(Tensor(np.uint8([250])) * 2, np.uint8([244]), dtypes.uint8)


def test_reflected_scalar_ops() -> None:
    a = rnd(4, lo=0.5, hi=2.0)
    t = Tensor(a)
    close(1 - t, 1 - a)
    close(3 / t, 3 / a)
    close(2 * t, 2 * a)
    close(1 + t, 1 + a)
    close(2**t, 2**a, rtol=1e-5)
    close(-t, -a)


PROMOTE = [
    (np.int32, 1.5, dtypes.float32),
    (np.int8, 1.5, dtypes.float32),
    (np.int32, 2, dtypes.int32),
    (np.int8, 2, dtypes.int8),
    (np.uint8, 2, dtypes.uint8),
    (np.float16, 2.0, dtypes.float16),
    (np.float16, 2, dtypes.float16),
    (np.bool_, 2, dtypes.int32),
    (np.bool_, 1.5, dtypes.float32),
    (np.int64, 2, dtypes.int64),
    (np.float64, 2.0, dtypes.float64),
    (np.int32, True, dtypes.int32),
]


@pytest.mark.parametrize("np_t,scalar,expect", PROMOTE, ids=[f"{p[0].__name__}-{p[1]!r}" for p in PROMOTE])
def test_tensor_scalar_promotion(np_t: type, scalar: Any, expect: DType) -> None:
    a = np.array([1, 0, 1], dtype=np_t)
    for out in (Tensor(a) + scalar, scalar + Tensor(a), Tensor(a) * scalar):
        assert out.dtype == expect
    close(Tensor(a) + scalar, a.astype(np.float64) + scalar)


TT_PROMOTE = [
    (np.int32, np.int8, dtypes.int32),
    (np.uint8, np.int8, dtypes.int16),
    (np.bool_, np.bool_, dtypes.bool),
    (np.bool_, np.int32, dtypes.int32),
    (np.int32, np.float32, dtypes.float32),
    (np.int64, np.float16, dtypes.float16),
    (np.float16, np.float32, dtypes.float32),
    (np.uint32, np.int32, dtypes.int64),
    (np.uint16, np.int8, dtypes.int32),
    (np.float32, np.float64, dtypes.float64),
    (np.uint8, np.uint16, dtypes.uint16),
]


@pytest.mark.parametrize("ta,tb,expect", TT_PROMOTE, ids=[f"{p[0].__name__}+{p[1].__name__}" for p in TT_PROMOTE])
def test_tensor_tensor_promotion(ta: type, tb: type, expect: DType) -> None:
    a, b = np.array([1, 0, 1], dtype=ta), np.array([1, 1, 0], dtype=tb)
    out = Tensor(a) + Tensor(b)
    assert out.dtype == expect and (Tensor(b) + Tensor(a)).dtype == expect
    if expect == dtypes.bool:
        exact(out, np.logical_or(a, b))
    else:
        exact(out, (a.astype(np.float64) + b).astype(NP_OF[expect]))


def test_bool_arith() -> None:
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    exact(Tensor(a) * Tensor(b), a & b, dtypes.bool)
    exact(Tensor(a) + 1, a.astype(np.int32) + 1, dtypes.int32)


def test_bfloat16_promotion() -> None:
    a = Tensor(np.float32([1.0, 2.5])).cast(dtypes.bfloat16)
    assert a.dtype == dtypes.bfloat16 and (a * 2 + 1).dtype == dtypes.bfloat16
    assert (a + Tensor(np.float16([1.0]))).dtype == dtypes.float32
    assert (a + Tensor(np.int64([1]))).dtype == dtypes.bfloat16
    assert a.sum().dtype == dtypes.bfloat16


def test_bfloat16_arith() -> None:
    a = Tensor(np.float32([1.0, 2.5, -3.0, 1.0 + 2.0**-8, 3.0e38])).cast(dtypes.bfloat16)
    rounded = bf16_round(np.float32([1.0, 2.5, -3.0, 1.0 + 2.0**-8, 3.0e38]))
    assert rounded[3] == 1.0
    exact(a, rounded)
    exact(a * 2 + 1, np.float32([3.0, 6.0, -5.0, 3.0, np.inf]))
    exact(a[:3].sum(), np.float32(0.5))
    exact(a.cast(dtypes.float32), rounded)


def test_bfloat16_from_list() -> None:
    exact(Tensor([1.0, 2.5, -3.0], dtype=dtypes.bfloat16), np.float32([1.0, 2.5, -3.0]))


# floor division and modulo follow numpy (floor, sign of the divisor)
INT_A = np.array([7, -7, 7, -7, 0, 6, -6, 1, -1, 13], dtype=np.int32)
INT_B = np.array([2, 2, -2, -2, 3, 3, -3, 5, 5, -4], dtype=np.int32)


@pytest.mark.parametrize("np_t", [np.int8, np.int16, np.int32, np.int64], ids=lambda t: t.__name__)
def test_int_floordiv_mod_signed(np_t: type) -> None:
    a, b = INT_A.astype(np_t), INT_B.astype(np_t)
    exact(Tensor(a) // Tensor(b), a // b, dtypes.from_np(np_t))
    exact(Tensor(a) % Tensor(b), a % b, dtypes.from_np(np_t))
    exact(Tensor(a) // 3, a // np_t(3))
    exact(Tensor(a) % -3, a % np_t(-3))
    exact(17 // Tensor(b), np_t(17) // b)
    exact(-17 % Tensor(b), np_t(-17) % b)


def test_uint_floordiv_mod() -> None:
    a, b = np.uint8([7, 255, 0, 9]), np.uint8([2, 16, 3, 9])
    exact(Tensor(a) // Tensor(b), a // b, dtypes.uint8)
    exact(Tensor(a) % Tensor(b), a % b, dtypes.uint8)


def test_int_floordiv_mod_by_zero_like_numpy() -> None:
    a, b = np.int32([5, -5, 0]), np.int32([0, 0, 0])
    with np.errstate(all="ignore"):
        exact(Tensor(a) // Tensor(b), a // b)
        exact(Tensor(a) % Tensor(b), a % b)


def test_float_floordiv_mod() -> None:
    a, b = np.float32([7.5, -7.5, 7.5, -7.5, 0.0, 3.0]), np.float32([2, 2, -2, -2, 3, 1.5])
    close(Tensor(a) // Tensor(b), a // b)
    close(Tensor(a) % Tensor(b), a % b, atol=1e-6)
    close(Tensor(a) % 2.5, a % np.float32(2.5), atol=1e-6)


def test_pow() -> None:
    a = rnd(6, lo=0.1, hi=3.0)
    close(Tensor(a) ** 2, a**2, rtol=1e-5)
    close(Tensor(a) ** 0.5, a**0.5, rtol=1e-5)
    close(Tensor(a) ** -1.5, a**-1.5, rtol=1e-5)
    close(Tensor(a) ** Tensor(a), a**a, rtol=1e-5)
    neg = np.float32([-2.0, -2.0, -3.0, 0.0, 0.0, -1.5])
    e = np.float32([3.0, 2.0, 0.0, 0.0, 2.0, 0.5])
    with np.errstate(invalid="ignore"):
        close(Tensor(neg) ** Tensor(e), neg**e, rtol=1e-5)
    close(Tensor([2, 3, -2]) ** 3, np.float64([8, 27, -8]), rtol=1e-5)


# ***************************************************************** unary math

POS = np.float32([0.1, 0.5, 1.0, 2.0, 3.7, 10.0])
ANY = np.float32([-3.2, -1.0, -0.3, 0.0, 0.4, 1.0, 2.6])

UNARY: list[tuple[str, Callable, Callable, np.ndarray, float]] = [
    ("neg", lambda t: -t, np.negative, ANY, 0),
    ("exp", lambda t: t.exp(), np.exp, ANY, 1e-6),
    ("log", lambda t: t.log(), np.log, POS, 1e-6),
    ("exp2", lambda t: t.exp2(), np.exp2, ANY, 1e-6),
    ("log2", lambda t: t.log2(), np.log2, POS, 1e-6),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, POS, 1e-7),
    ("rsqrt", lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), POS, 1e-6),
    ("sin", lambda t: t.sin(), np.sin, ANY, 1e-6),
    ("cos", lambda t: t.cos(), np.cos, ANY, 1e-6),
    ("tan", lambda t: t.tan(), np.tan, ANY[1:-1], 1e-5),
    ("relu", lambda t: t.relu(), lambda x: np.maximum(x, 0), ANY, 0),
    ("sigmoid", lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), ANY, 1e-6),
    ("tanh", lambda t: t.tanh(), np.tanh, ANY, 1e-6),
    ("gelu", lambda t: t.gelu(), lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))), ANY, 1e-6),
    ("leakyrelu", lambda t: t.leakyrelu(0.1), lambda x: np.where(x > 0, x, 0.1 * x), ANY, 1e-7),
    ("abs", lambda t: t.abs(), np.abs, ANY, 0),
    ("sign", lambda t: t.sign(), np.sign, ANY, 0),
    ("reciprocal", lambda t: t.reciprocal(), lambda x: 1 / x, POS, 1e-7),
    ("square", lambda t: t.square(), np.square, ANY, 0),
    ("trunc", lambda t: t.trunc(), np.trunc, ANY, 0),
    ("floor", lambda t: t.floor(), np.floor, ANY, 0),
    ("ceil", lambda t: t.ceil(), np.ceil, ANY, 0),
]


@pytest.mark.parametrize("name,fn,np_fn,x,tol", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name: str, fn: Callable, np_fn: Callable, x: np.ndarray, tol: float) -> None:
    out = fn(Tensor(x))
    assert out.dtype == dtypes.float32
    close(out, np_fn(x.astype(np.float64)).astype(np.float32), rtol=tol * 10, atol=tol)


@pytest.mark.parametrize("name,fn,np_fn,x,tol", UNARY, ids=[u[0] for u in UNARY])
def test_unary_float64(name: str, fn: Callable, np_fn: Callable, x: np.ndarray, tol: float) -> None:
    x64 = x.astype(np.float64)
    out = fn(Tensor(x64))
    assert out.dtype == dtypes.float64
    close(out, np_fn(x64), rtol=1e-12, atol=1e-12 if name != "gelu" else 1e-9)


def test_unary_on_ints_promotes_to_float() -> None:
    x = np.int32([1, 2, 4])
    for fn, np_fn in (
        (lambda t: t.exp(), np.exp),
        (lambda t: t.log(), np.log),
        (lambda t: t.sqrt(), np.sqrt),
        (lambda t: t.sin(), np.sin),
        (lambda t: t.sigmoid(), lambda v: 1 / (1 + np.exp(-v))),
    ):
        out = fn(Tensor(x))
        assert out.dtype == dtypes.float32
        close(out, np_fn(x).astype(np.float32), rtol=1e-6)
    exact(Tensor(x).relu(), x, dtypes.int32)
    exact(Tensor(np.int32([-3, 0, 5])).abs(), np.int32([3, 0, 5]), dtypes.int32)
    exact(Tensor(np.int32([-3, 0, 5])).sign(), np.int32([-1, 0, 1]), dtypes.int32)
    exact(-Tensor(np.int32([-3, 0, 5])), np.int32([3, 0, -5]), dtypes.int32)
    exact(Tensor(np.int32([-3, 0, 5])).trunc(), np.int32([-3, 0, 5]), dtypes.int32)


def test_unary_float16() -> None:
    x = np.float16([0.5, 1.0, 2.0])
    out = Tensor(x).exp()
    assert out.dtype == dtypes.float16
    close(out, np.exp(x.astype(np.float32)), rtol=2e-3)
    close(Tensor(x).sqrt(), np.sqrt(x), rtol=1e-3)


def test_floor_ceil_trunc_edges() -> None:
    x = np.float32([-2.5, -2.0, -0.5, -0.0, 0.5, 2.0, 2.5, 1e8, -1e8, 2.0**23 + 1, np.inf, -np.inf])
    exact(Tensor(x).floor(), np.floor(x))
    exact(Tensor(x).ceil(), np.ceil(x))
    exact(Tensor(x).trunc(), np.trunc(x))


def test_floor_ceil_trunc_nan() -> None:
    x = np.float32([np.nan, 1.5])
    exact(Tensor(x).trunc(), np.trunc(x))
    exact(Tensor(x).floor(), np.floor(x))
    exact(Tensor(x).ceil(), np.ceil(x))


def test_const_inf_nan_through_int_casts() -> None:
    exact(Tensor(np.float32([2.0, 0.5])) ** math.inf, np.float32([np.inf, 0.0]))
    exact(Tensor.full((2,), math.inf).floor(), np.float32([np.inf, np.inf]))
    exact(Tensor(math.nan).trunc(), np.float32(np.nan))


def test_nan_propagation() -> None:
    x = np.float32([np.nan, -1.0, 2.0, np.nan])
    y = np.float32([1.0, np.nan, 3.0, np.nan])
    exact(Tensor(x).relu(), np.maximum(x, 0))
    exact(Tensor(x).maximum(Tensor(y)), np.maximum(x, y))
    exact(Tensor(x).minimum(Tensor(y)), np.minimum(x, y))
    exact(Tensor(x).clip(0.0, 1.5), np.clip(x, 0.0, 1.5))
    exact(Tensor(x).max(), np.float32(np.nan))
    exact(Tensor(x).min(), np.float32(np.nan))
    exact(Tensor(x).abs(), np.abs(x))
    close(Tensor(x).exp(), np.exp(x))
    exact(Tensor(x).sum(), np.float32(np.nan))
    exact(Tensor(x[1:3]).maximum(np.nan), np.float32([np.nan, np.nan]))


def test_nan_comparisons_are_false() -> None:
    x, y = np.float32([np.nan, 1.0, np.nan]), np.float32([1.0, np.nan, np.nan])
    tx, ty = Tensor(x), Tensor(y)
    exact(tx < ty, x < y, dtypes.bool)
    exact(tx <= ty, x <= y)
    exact(tx > ty, x > y)
    exact(tx >= ty, x >= y)
    exact(tx == ty, x == y)
    exact(tx != ty, x != y)
    exact(tx < 1.0, x < 1.0)
    exact(tx >= 1.0, x >= 1.0)
    exact(tx <= 1.0, x <= 1.0)


def test_inf_handling() -> None:
    x = np.float32([np.inf, -np.inf, 0.0])
    exact(Tensor(x).relu(), np.maximum(x, 0))
    exact(Tensor(x).sigmoid(), np.float32([1.0, 0.0, 0.5]))
    exact(Tensor(x).exp(), np.exp(x))
    exact(Tensor(x).abs(), np.abs(x))
    exact(Tensor(x).tanh(), np.tanh(x))


def test_clip_maximum_minimum() -> None:
    a, b = rnd(4, 5), rnd(4, 5)
    exact(Tensor(a).clip(-0.5, 0.7), np.clip(a, -0.5, 0.7))
    exact(Tensor(a).clip(min_=0.0), np.maximum(a, 0))
    exact(Tensor(a).clip(max_=0.0), np.minimum(a, 0))
    exact(Tensor(a).maximum(Tensor(b)), np.maximum(a, b))
    exact(Tensor(a).minimum(Tensor(b)), np.minimum(a, b))
    exact(Tensor(a).maximum(0.25), np.maximum(a, np.float32(0.25)))
    ia, ib = np.int32([-5, 3, 7, 0]), np.int32([2, 3, -8, 0])
    exact(Tensor(ia).maximum(Tensor(ib)), np.maximum(ia, ib), dtypes.int32)
    exact(Tensor(ia).minimum(Tensor(ib)), np.minimum(ia, ib), dtypes.int32)
    exact(Tensor(ia).clip(-1, 4), np.clip(ia, -1, 4), dtypes.int32)
    with pytest.raises(ValueError):
        Tensor(a).clip()


def test_where() -> None:
    c, a, b = rnd(3, 4) > 0, rnd(3, 4), rnd(3, 4)
    exact(Tensor(c).where(Tensor(a), Tensor(b)), np.where(c, a, b))
    exact(Tensor(c).where(1.0, Tensor(b)), np.where(c, np.float32(1), b))
    exact(Tensor(c).where(Tensor(a), 0.0), np.where(c, a, np.float32(0)))
    exact(Tensor(c).where(2, 3), np.where(c, 2, 3).astype(np.int32), dtypes.int32)
    exact(Tensor(c[0]).where(Tensor(a), Tensor(b[:, :1])), np.where(c[0], a, b[:, :1]))
    exact(Tensor(np.float32([0.0, 2.0, -1.0])).where(5, 6), np.int32([6, 5, 5]))


def test_comparisons() -> None:
    a, b = np.float32([1, 2, 3, 4]), np.float32([4, 2, 1, 4])
    ta, tb = Tensor(a), Tensor(b)
    for op in (
        lambda x, y: x < y,
        lambda x, y: x <= y,
        lambda x, y: x > y,
        lambda x, y: x >= y,
        lambda x, y: x == y,
        lambda x, y: x != y,
    ):
        exact(op(ta, tb), op(a, b), dtypes.bool)
        exact(op(ta, 2), op(a, 2))
        exact(op(2.0, tb), op(2.0, b))
    ia = np.int32([-1, 0, 5])
    exact(Tensor(ia) < 0, ia < 0)
    exact(Tensor(ia) >= 0, ia >= 0)
    exact(Tensor(np.uint8([0, 200])) > 100, np.uint8([0, 200]) > 100)


def test_bitwise_bool_ops() -> None:
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    ta, tb = Tensor(a), Tensor(b)
    exact(ta & tb, a & b, dtypes.bool)
    exact(ta | tb, a | b, dtypes.bool)
    exact(ta ^ tb, a ^ b, dtypes.bool)
    exact(~ta, ~a, dtypes.bool)
    exact(ta & True, a & True)
    exact(ta | False, a | False)


def test_int_invert_and_xor() -> None:
    a = np.int32([0, 5, -1, 2**31 - 1])
    exact(~Tensor(a), ~a, dtypes.int32)
    exact(~Tensor(np.uint8([0, 5, 255])), ~np.uint8([0, 5, 255]), dtypes.uint8)
    exact(Tensor(a) ^ Tensor(np.int32([3, 3, 3, 3])), a ^ 3)
    exact(Tensor(a) ^ 1, a ^ 1)
    with pytest.raises(TypeError):
        ~Tensor([1.0])


def test_cast() -> None:
    x = np.float32([-2.7, -0.5, 0.0, 0.5, 2.7, 300.0])
    exact(Tensor(x).cast(dtypes.int32), x.astype(np.int32), dtypes.int32)
    exact(Tensor(x).cast(dtypes.bool), x.astype(np.bool_), dtypes.bool)
    exact(Tensor(x).cast(dtypes.float16), x.astype(np.float16), dtypes.float16)
    exact(Tensor(x).cast("float64"), x.astype(np.float64), dtypes.float64)
    exact(Tensor(np.int32([1, 0, -3])).cast(dtypes.bool), [True, False, True])
    exact(Tensor(np.int32([300, -1])).cast(dtypes.uint8), np.int32([300, -1]).astype(np.uint8), dtypes.uint8)
    exact(Tensor([True, False]).cast(dtypes.float32), np.float32([1, 0]))
    exact(Tensor(x).float(), x)
    exact(Tensor(x).half(), x.astype(np.float16))
    exact(Tensor(x).int(), x.astype(np.int32))
    exact(Tensor(x).bool(), x.astype(bool))


def test_bitcast() -> None:
    x = np.float32([1.0, -2.0, 0.0])
    exact(Tensor(x).bitcast(dtypes.int32), x.view(np.int32), dtypes.int32)
    exact(Tensor(x.view(np.uint32)).bitcast(dtypes.float32), x)
    with pytest.raises(ValueError):
        Tensor(x).bitcast(dtypes.float16)


# ***************************************************************** reductions

SHAPES_AXES = [
    ((5,), None),
    ((5,), 0),
    ((3, 4), None),
    ((3, 4), 0),
    ((3, 4), 1),
    ((3, 4), -1),
    ((2, 3, 5), (0, 2)),
    ((2, 3, 5), (-1, -2)),
    ((7, 1, 3), 1),
    ((1,), 0),
    ((2, 3, 5), (0, 1, 2)),
]


@pytest.mark.parametrize("shape,axis", SHAPES_AXES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_max_min_mean(shape: tuple, axis: Any, keepdim: bool) -> None:
    a = rnd(*shape)
    t = Tensor(a)
    close(t.sum(axis, keepdim=keepdim), a.sum(axis, keepdims=keepdim), rtol=1e-5, atol=1e-5)
    exact(t.max(axis, keepdim=keepdim), a.max(axis, keepdims=keepdim))
    exact(t.min(axis, keepdim=keepdim), a.min(axis, keepdims=keepdim))
    close(t.mean(axis, keepdim=keepdim), a.mean(axis, keepdims=keepdim), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,axis", [s for s in SHAPES_AXES if s[0] not in ((1,), (7, 1, 3))], ids=str)
def test_var_std(shape: tuple, axis: Any) -> None:
    a = rnd(*shape)
    close(Tensor(a).var(axis), a.var(axis, ddof=1), rtol=1e-5, atol=1e-6)
    close(Tensor(a).std(axis), a.std(axis, ddof=1), rtol=1e-5, atol=1e-6)
    close(Tensor(a).var(axis, keepdim=True, correction=0), a.var(axis, ddof=0, keepdims=True), rtol=1e-5, atol=1e-6)


def test_reduce_int_dtypes() -> None:
    a = np.int8([[100, 100, 100], [-100, -50, 1]])
    s = Tensor(a).sum(1)
    assert s.dtype == dtypes.int32
    exact(s, a.sum(1).astype(np.int32))
    exact(Tensor(a).max(0), a.max(0), dtypes.int8)
    exact(Tensor(a).min(0), a.min(0), dtypes.int8)
    u = np.uint8([200, 200, 200])
    exact(Tensor(u).sum(), np.uint32(600), dtypes.uint32)
    exact(Tensor(u).min(), np.uint8(200), dtypes.uint8)
    b = np.array([[True, False, True], [True, True, True]])
    exact(Tensor(b).sum(1), np.int32([2, 3]), dtypes.int32)
    exact(Tensor(b).max(1), b.max(1), dtypes.bool)
    exact(Tensor(b).min(1), b.min(1), dtypes.bool)
    close(Tensor(np.int32([1, 2, 4])).mean(), np.float32(7 / 3), dtype=dtypes.float32)
    h = np.float16([1000, 1000, 1000])
    exact(Tensor(h).sum(), np.float16(3000), dtypes.float16)


def test_reduce_0d() -> None:
    t = Tensor(2.5)
    exact(t.sum(), np.float32(2.5))
    exact(t.max(), np.float32(2.5))
    exact(t.min(), np.float32(2.5))
    exact(t.mean(), np.float32(2.5))
    exact(t.sum(0), np.float32(2.5))


def test_reduce_empty() -> None:
    e = Tensor(np.zeros((0,), np.float32))
    exact(e.sum(), np.float32(0))
    exact(Tensor(np.zeros((2, 0), np.float32)).sum(1), np.zeros(2, np.float32))
    exact(Tensor(np.zeros((2, 0), np.float32)).sum(0), np.zeros(0, np.float32))
    exact(Tensor(np.zeros((0, 3), np.int32)).sum(0), np.zeros(3, np.int32))
    with np.errstate(invalid="ignore"):
        exact(e.mean(), np.float32(np.nan))


def test_reduce_bad_axis() -> None:
    with pytest.raises(IndexError):
        Tensor(rnd(2, 3)).sum(2)
    with pytest.raises(IndexError):
        Tensor(rnd(2, 3)).max(-3)


def _np_softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("shape,axis", [((7,), -1), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((1, 1), 1)], ids=str)
def test_softmax_family(shape: tuple, axis: int) -> None:
    a = rnd(*shape, lo=-5, hi=5).astype(np.float64)
    close(Tensor(a).softmax(axis), _np_softmax(a, axis), rtol=1e-12, atol=1e-14)
    close(Tensor(a).log_softmax(axis), np.log(_np_softmax(a, axis)), rtol=1e-12, atol=1e-12)
    m = a.max(axis, keepdims=True)
    lse = np.log(np.exp(a - m).sum(axis, keepdims=True)) + m
    close(Tensor(a).logsumexp(axis), lse.squeeze(axis), rtol=1e-12)
    close(Tensor(a).logsumexp(axis, keepdim=True), lse, rtol=1e-12)
    a32 = a.astype(np.float32)
    close(Tensor(a32).softmax(axis), _np_softmax(a32, axis), rtol=1e-5, atol=1e-7)


def test_softmax_large_values_stable() -> None:
    a = np.float32([1000.0, 1001.0, 999.0])
    close(Tensor(a).softmax(), _np_softmax(a.astype(np.float64), 0), rtol=1e-5)
    close(Tensor(a).logsumexp(), np.float32(1001 + np.log(np.exp(-1) + 1 + np.exp(-2))), rtol=1e-6)


@pytest.mark.parametrize(
    "shape,axis",
    [((7,), None), ((7,), 0), ((3, 5), 1), ((3, 5), 0), ((3, 5), None), ((2, 3, 4), -1), ((2, 3, 4), 1)],
    ids=str,
)
def test_argmax_argmin(shape: tuple, axis: Any) -> None:
    a = rnd(*shape)
    exact(Tensor(a).argmax(axis), np.argmax(a, axis).astype(np.int32), dtypes.int32)
    exact(Tensor(a).argmin(axis), np.argmin(a, axis).astype(np.int32), dtypes.int32)
    ai = (a * 3).astype(np.int32)  # many ties: the first index wins
    exact(Tensor(ai).argmax(axis), np.argmax(ai, axis).astype(np.int32))
    exact(Tensor(ai).argmin(axis), np.argmin(ai, axis).astype(np.int32))


def test_argmax_keepdim_and_ties() -> None:
    a = np.float32([[1, 3, 3], [2, 2, 0]])
    exact(Tensor(a).argmax(1, keepdim=True), np.int32([[1], [0]]))
    exact(Tensor(a).argmin(0), np.argmin(a, 0).astype(np.int32))
    exact(Tensor(np.uint8([5, 0, 9, 0])).argmin(), np.int32(1))
    exact(Tensor(np.array([False, True, True])).argmax(), np.int32(1))


@pytest.mark.parametrize(
    "shape,axis", [((6,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), -1), ((2, 3, 4), 1), ((1,), 0)], ids=str
)
def test_cumsum(shape: tuple, axis: int) -> None:
    a = rnd(*shape)
    close(Tensor(a).cumsum(axis), np.cumsum(a, axis), rtol=1e-5, atol=1e-6)
    ai = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) - 3
    exact(Tensor(ai).cumsum(axis), np.cumsum(ai, axis).astype(np.int32))


def test_cumsum_empty() -> None:
    exact(Tensor(np.zeros((0,), np.float32)).cumsum(), np.zeros(0, np.float32))


# ***************************************************************** movement


def test_reshape() -> None:
    a = rnd(2, 3, 4)
    t = Tensor(a)
    exact(t.reshape(6, 4), a.reshape(6, 4))
    exact(t.reshape((4, 6)), a.reshape(4, 6))
    exact(t.reshape(-1), a.reshape(-1))
    exact(t.reshape(2, -1, 2), a.reshape(2, -1, 2))
    exact(t.reshape(24, 1, 1), a.reshape(24, 1, 1))
    exact(t.view(3, 8), a.reshape(3, 8))
    exact(Tensor(2.0).reshape(1, 1), np.float32([[2.0]]))
    exact(Tensor(np.float32([3])).reshape(()), np.float32(3))
    exact(Tensor(np.zeros((0, 4), np.float32)).reshape(4, 0), np.zeros((4, 0), np.float32))
    with pytest.raises(ValueError):
        t.reshape(5, 5)
    with pytest.raises(ValueError):
        t.reshape(-1, -1)
    with pytest.raises(ValueError):
        t.reshape(7, -1)
    with pytest.raises(ValueError, match=">= 0"):
        t.reshape(-2, -12)  # (its product is right: a negative size is still no size)
    exact(t.reshape(np.int64(6), 4), a.reshape(6, 4))


def test_expand() -> None:
    a = rnd(3, 1)
    exact(Tensor(a).expand(3, 4), np.broadcast_to(a, (3, 4)))
    exact(Tensor(a).expand(2, 3, 5), np.broadcast_to(a, (2, 3, 5)))
    exact(Tensor(a).expand(-1, 2), np.broadcast_to(a, (3, 2)))
    exact(Tensor(1.5).expand(2, 2), np.full((2, 2), 1.5, np.float32))
    with pytest.raises(ValueError):
        Tensor(a).expand(4, 4)
    with pytest.raises(ValueError):
        Tensor(rnd(2, 3)).expand(3)


def test_permute_transpose() -> None:
    a = rnd(2, 3, 4)
    t = Tensor(a)
    exact(t.permute(2, 0, 1), a.transpose(2, 0, 1))
    exact(t.permute((1, 2, 0)), a.transpose(1, 2, 0))
    exact(t.permute(-1, 0, 1), a.transpose(2, 0, 1))
    exact(t.transpose(0, 2), a.swapaxes(0, 2))
    exact(t.transpose(-1, -2), a.swapaxes(-1, -2))
    exact(Tensor(a[0]).T, a[0].T)
    exact(Tensor(a[0]).transpose(), a[0].T)
    with pytest.raises(ValueError):
        t.permute(0, 1)
    with pytest.raises(ValueError):
        t.permute(0, 0, 1)


def test_flip() -> None:
    a = rnd(2, 3, 4)
    t = Tensor(a)
    exact(t.flip(0), a[::-1])
    exact(t.flip(-1), a[..., ::-1])
    exact(t.flip((0, 2)), a[::-1, :, ::-1])
    exact(t.flip(1, 2), a[:, ::-1, ::-1])
    with pytest.raises(ValueError):
        t.flip(0, 0)


def test_shrink() -> None:
    a = rnd(4, 5)
    t = Tensor(a)
    exact(t.shrink(((1, 3), (0, 5))), a[1:3])
    exact(t.shrink((None, (2, 4))), a[:, 2:4])
    exact(t.shrink(((2, 2), None)), a[2:2])
    with pytest.raises(ValueError):
        t.shrink(((0, 5), None))
    with pytest.raises(ValueError):
        t.shrink(((3, 1), None))


def test_pad() -> None:
    a = rnd(2, 3)
    t = Tensor(a)
    exact(t.pad(((1, 2), (0, 1))), np.pad(a, ((1, 2), (0, 1))))
    exact(t.pad((None, (2, 2))), np.pad(a, ((0, 0), (2, 2))))
    exact(t.pad(((1, 1), (1, 1)), value=-3.5), np.pad(a, 1, constant_values=-3.5))
    exact(t.pad(((0, 1), (1, 0)), value=math.inf), np.pad(a, ((0, 1), (1, 0)), constant_values=np.inf))
    exact(t.pad(((-1, 0), (0, -1))), a[1:, :-1])
    exact(t.pad(((-1, 2), (1, -2))), np.pad(a[1:, :-2], ((0, 2), (1, 0))))
    exact(t.pad(((-1, 1), (0, 0)), value=9.0), np.pad(a[1:], ((0, 1), (0, 0)), constant_values=9))
    ai = np.int32([[1, 2]])
    exact(Tensor(ai).pad(((1, 0), (0, 1))), np.pad(ai, ((1, 0), (0, 1))), dtypes.int32)
    exact(Tensor(ai).pad(((1, 0), (0, 1)), value=7), np.pad(ai, ((1, 0), (0, 1)), constant_values=7), dtypes.int32)
    b = np.array([True, False])
    exact(Tensor(b).pad(((1, 1),)), np.pad(b, 1), dtypes.bool)
    with pytest.raises(ValueError):
        t.pad(((1, 1),))


def test_flatten_unflatten_squeeze_unsqueeze() -> None:
    a = rnd(2, 1, 3, 4)
    t = Tensor(a)
    exact(t.flatten(), a.reshape(-1))
    exact(t.flatten(1), a.reshape(2, -1))
    exact(t.flatten(1, 2), a.reshape(2, 3, 4))
    exact(t.flatten(-2, -1), a.reshape(2, 1, 12))
    exact(Tensor(2.0).flatten(), np.float32([2.0]))
    exact(Tensor(a.reshape(2, 12)).unflatten(1, (3, 4)), a.reshape(2, 3, 4))
    exact(Tensor(a.reshape(2, 12)).unflatten(-1, (2, 6)), a.reshape(2, 2, 6))
    exact(t.squeeze(), a.squeeze())
    exact(t.squeeze(1), a.squeeze(1))
    exact(t.squeeze(0), a)
    exact(t.squeeze(-3), a.squeeze(-3))
    exact(t.unsqueeze(0), a[None])
    exact(t.unsqueeze(-1), a[..., None])
    exact(t.unsqueeze(2), np.expand_dims(a, 2))
    exact(Tensor(1.0).unsqueeze(0), np.float32([1.0]))
    with pytest.raises(IndexError):
        t.unsqueeze(6)


@pytest.mark.parametrize(
    "shape,reps", [((3,), (2,)), ((2, 3), (2, 2)), ((2, 3), (3, 1, 2)), ((2,), (1,)), ((2, 1), (1, 3))], ids=str
)
def test_repeat(shape: tuple, reps: tuple) -> None:
    a = rnd(*shape)
    exact(Tensor(a).repeat(reps), np.tile(a, reps))


def test_cat_stack() -> None:
    a, b, c = rnd(2, 3), rnd(4, 3), rnd(2, 3)
    exact(Tensor(a).cat(Tensor(b)), np.concatenate([a, b]))
    exact(Tensor(a).cat(Tensor(c), dim=1), np.concatenate([a, c], 1))
    exact(Tensor(a).cat(Tensor(c), Tensor(a), dim=-1), np.concatenate([a, c, a], -1))
    exact(Tensor(a).cat(Tensor(np.zeros((0, 3), np.float32))), a)
    exact(Tensor.stack([Tensor(a), Tensor(c)]), np.stack([a, c]))
    exact(Tensor.stack([Tensor(a), Tensor(c)], dim=1), np.stack([a, c], 1))
    exact(Tensor.stack([Tensor(a), Tensor(c), Tensor(a)], dim=-1), np.stack([a, c, a], -1))
    ia, ib = np.int32([1, 2]), np.int32([-3])
    exact(Tensor(ia).cat(Tensor(ib)), np.concatenate([ia, ib]), dtypes.int32)
    exact(Tensor.stack([Tensor(1.0), Tensor(2.0)]), np.float32([1, 2]))
    with pytest.raises(ValueError):
        Tensor(a).cat(Tensor(b), dim=1)


def test_cat_nan_inf_operands() -> None:
    a, b = np.float32([np.inf, 1.0]), np.float32([np.nan, -np.inf])
    exact(Tensor(a).cat(Tensor(b)), np.concatenate([a, b]))
    exact(Tensor.stack([Tensor(a), Tensor(b)]), np.stack([a, b]))


GETITEM = [
    (1,),
    (-1,),
    (slice(None),),
    (slice(1, 3),),
    (slice(None, None, 2),),
    (slice(None, None, -1),),
    (slice(3, 0, -2),),
    (slice(-2, None),),
    (slice(None, -1, 3),),
    (slice(10, 20),),
    (slice(-10, 2),),
    (0, 1),
    (-1, -2, -3),
    (slice(None), 2),
    (Ellipsis, 1),
    (1, Ellipsis),
    (None,),
    (None, 1, None),
    (slice(None, None, -3), None, slice(1, None, 2)),
    (Ellipsis, None),
    (1, slice(4, 0, -1), slice(None, None, 3)),
    (slice(0, 0),),
    (Ellipsis,),
    (slice(None, None, -2), slice(None, None, -2), slice(None, None, -2)),
]


@pytest.mark.parametrize("idx", GETITEM, ids=str)
def test_getitem(idx: tuple) -> None:
    a = rnd(4, 5, 6)
    exact(Tensor(a)[idx], a[idx])


def test_getitem_scalar_and_int_types() -> None:
    a = rnd(5)
    exact(Tensor(a)[2], a[2])
    exact(Tensor(a)[np.int64(3)], a[3])
    assert Tensor(a)[4].item() == a[4]


def test_getitem_errors() -> None:
    t = Tensor(rnd(3, 4))
    for bad in (3, -4, (0, 4), (0, -5)):
        with pytest.raises(IndexError):
            t[bad]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[..., ...]
    with pytest.raises(IndexError):
        t["a"]  # type: ignore[index]


def _random_movement_chain(rng: random.Random, a: np.ndarray, t: Tensor, flips: bool) -> tuple[np.ndarray, Tensor]:
    """The same random chain of movement (and a few elementwise) ops applied to a numpy array and a tensor."""
    kinds = ["reshape", "permute", "shrink", "pad", "expand", "stride", "elementwise"] + (["flip"] * 2 if flips else [])
    for _ in range(rng.randint(3, 7)):
        kind, shape = rng.choice(kinds), a.shape
        if kind == "reshape":
            d = rng.choice([d for d in range(1, a.size + 1) if a.size % d == 0])
            new = (d, a.size // d) if rng.random() < 0.5 else (a.size // d, 1, d)
            a, t = a.reshape(new), t.reshape(new)
        elif kind == "permute" and a.ndim > 1:
            order = list(range(a.ndim))
            rng.shuffle(order)
            a, t = a.transpose(order), t.permute(order)
        elif kind == "shrink":
            arg = []
            for s in shape:
                b = rng.randint(0, s - 1) if s > 1 else 0
                arg.append((b, rng.randint(b + 1, s)))
            a, t = a[tuple(slice(b, e) for b, e in arg)], t.shrink(tuple(arg))
        elif kind == "pad":
            arg = [(rng.randint(0, 2), rng.randint(0, 2)) for _ in shape]
            a, t = np.pad(a, arg), t.pad(tuple(arg))
        elif kind == "expand":
            if 1 not in shape:
                a, t = a[None], t.unsqueeze(0)
            new = tuple(3 if s == 1 else s for s in a.shape)
            a, t = np.broadcast_to(a, new), t.expand(new)
        elif kind == "stride":
            idx = tuple(slice(None, None, rng.choice([1, 2, 3] + ([-1, -2] if flips else []))) for _ in shape)
            a, t = a[idx], t[idx]
        elif kind == "elementwise":
            a, t = a * 2 + 1, t * 2 + 1
        elif kind == "flip":
            ax = rng.randrange(a.ndim)
            a, t = np.flip(a, ax), t.flip(ax)
        if a.size > 3000:
            break
    return a, t


def _check_random_chains(seeds: range, flips: bool) -> None:
    base = (np.arange(24, dtype=np.float32) / 8).reshape(2, 3, 4)
    failures = []
    for seed in seeds:
        rng = random.Random(seed)
        a, t = _random_movement_chain(rng, base, Tensor(base), flips)
        got, ax = t.numpy(), rng.randrange(a.ndim)
        if got.shape != a.shape or not np.allclose(got, a) or not np.allclose(t.sum(ax).numpy(), a.sum(ax), rtol=1e-5):
            failures.append(seed)
    assert not failures, f"random movement chains differ from numpy for seeds {failures}"


def test_random_movement_chains() -> None:
    _check_random_chains(range(120), flips=False)


def test_random_movement_chains_with_flips() -> None:
    _check_random_chains(range(120), flips=True)


def test_flip_reshape_flip() -> None:
    a = np.arange(24, dtype=np.float32).reshape(3, 8)
    exact(Tensor(a).flip(0).reshape(2, 12).flip(1), np.flip(np.flip(a, 0).reshape(2, 12), 1))


def test_getitem_with_tensor() -> None:
    exact(Tensor([1, 2])[Tensor([1, 0, -1])], np.int32([2, 1, 2]))


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 3, 4)], ids=str)
def test_tril_triu(k: int, shape: tuple) -> None:
    a = rnd(*shape)
    exact(Tensor(a).tril(k), np.tril(a, k))
    exact(Tensor(a).triu(k), np.triu(a, k))
    ai = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    exact(Tensor(ai).tril(k), np.tril(ai, k), dtypes.int32)


# ***************************************************************** matmul and friends

MATMUL = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((4, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 7), (7, 3)),
    ((1, 1), (1, 1)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((11, 13), (13, 7)),
    ((3,), (2, 3, 4)),
    ((2, 3, 4), (4,)),
]


@pytest.mark.parametrize("sa,sb", MATMUL, ids=str)
def test_matmul(sa: tuple, sb: tuple) -> None:
    a, b = rnd(*sa), rnd(*sb)
    expect = a.astype(np.float64) @ b.astype(np.float64)
    close(Tensor(a) @ Tensor(b), expect, rtol=1e-5, atol=1e-5, dtype=dtypes.float32)
    close(Tensor(a).dot(Tensor(b)), expect, rtol=1e-5, atol=1e-5)
    close(Tensor(a).matmul(Tensor(b)), expect, rtol=1e-5, atol=1e-5)


def test_matmul_int_and_mixed() -> None:
    a, b = np.int32([[1, 2], [3, 4]]), np.int32([[5, -6], [7, 8]])
    exact(Tensor(a) @ Tensor(b), a @ b, dtypes.int32)
    fb = b.astype(np.float32)
    close(Tensor(a) @ Tensor(fb), a @ fb, dtype=dtypes.float32)
    c = rnd(3, 3).astype(np.float64)
    close(Tensor(c) @ Tensor(c), c @ c, rtol=1e-12, dtype=dtypes.float64)


def test_matmul_errors() -> None:
    with pytest.raises(ValueError):
        Tensor(rnd(2, 3)) @ Tensor(rnd(2, 3))
    with pytest.raises(ValueError):
        Tensor(1.0).dot(Tensor(rnd(2)))


def test_matmul_empty_inner() -> None:
    a, b = np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)
    exact(Tensor(a) @ Tensor(b), np.zeros((2, 3), np.float32))


def test_linear() -> None:
    x, w, b = rnd(4, 3), rnd(3, 5), rnd(5)
    close(Tensor(x).linear(Tensor(w), Tensor(b)), x @ w + b, rtol=1e-5, atol=1e-6)
    close(Tensor(x).linear(Tensor(w)), x @ w, rtol=1e-5, atol=1e-6)
    w1 = rnd(3)
    close(Tensor(x).linear(Tensor(w1), Tensor(b[:3])), x * w1 + b[:3], rtol=1e-6)


def _np_sparse_ce(logits: np.ndarray, y: np.ndarray, ignore_index: int = -1, smoothing: float = 0.0) -> float:
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    mask = y != ignore_index
    picked = logp[np.arange(len(y)), np.where(mask, y, 0)] * mask
    smooth = smoothing * (logp.mean(-1) * mask).sum()
    return float(-((1 - smoothing) * picked.sum() + smooth) / mask.sum())


def test_sparse_categorical_crossentropy() -> None:
    logits = rnd(6, 5, lo=-3, hi=3).astype(np.float64)
    y = np.int32([0, 4, 2, 2, 1, 3])
    close(Tensor(logits).sparse_categorical_crossentropy(Tensor(y)), _np_sparse_ce(logits, y), rtol=1e-12)
    y_ign = np.int32([0, -1, 2, -1, 1, 3])
    close(Tensor(logits).sparse_categorical_crossentropy(Tensor(y_ign)), _np_sparse_ce(logits, y_ign), rtol=1e-12)
    y_ign2 = np.int32([0, 9, 2, 9, 1, 3])
    close(
        Tensor(logits).sparse_categorical_crossentropy(Tensor(y_ign2), ignore_index=9),
        _np_sparse_ce(logits, y_ign2, 9),
        rtol=1e-12,
    )
    close(
        Tensor(logits).sparse_categorical_crossentropy(Tensor(y), label_smoothing=0.1),
        _np_sparse_ce(logits, y, smoothing=0.1),
        rtol=1e-12,
    )
    l32 = logits.astype(np.float32)
    close(Tensor(l32).sparse_categorical_crossentropy(Tensor(y)), _np_sparse_ce(l32.astype(np.float64), y), rtol=1e-5)


def test_sparse_categorical_crossentropy_of_a_minus_infinite_logit_off_the_label_is_finite() -> None:
    """As torch: a logit of -inf (a masked class) that is not the label adds nothing to the loss, and its gradient is
    0; a label whose logit is -inf gives an infinite loss."""
    logits = np.array([[0.0, -np.inf, 1.0], [2.0, 1.0, 0.0]], np.float32)
    x = Tensor(logits, requires_grad=True)
    loss = x.sparse_categorical_crossentropy(Tensor([0, 1]))
    finite = np.where(np.isinf(logits), -1e30, logits).astype(np.float64)
    close(loss, _np_sparse_ce(finite, np.int32([0, 1])), rtol=1e-6)
    loss.backward()
    p = np.exp(finite - finite.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    close(x.grad, (p - np.eye(3)[[0, 1]]) / 2, rtol=1e-5, atol=1e-7)
    assert Tensor(logits).sparse_categorical_crossentropy(Tensor([1, 0])).item() == np.inf


def test_one_hot() -> None:
    y = np.int32([0, 2, 1, 3])
    exact(Tensor(y).one_hot(4), np.eye(4, dtype=np.int32)[y], dtypes.int32)
    exact(Tensor(y).one_hot(5), np.eye(5, dtype=np.int32)[y])
    y2 = np.int32([[1, 0], [2, 2]])
    exact(Tensor(y2).one_hot(3), np.eye(3, dtype=np.int32)[y2])


# ***************************************************************** autograd


def fd_grad(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of scalar f at x, in float64."""
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def check_grad(t_fn: Callable[..., Tensor], np_fn: Callable[..., float], *xs: np.ndarray, tol: float = 1e-6) -> None:
    ts = [Tensor(x.astype(np.float64), requires_grad=True) for x in xs]
    out = t_fn(*ts)
    assert out.shape == ()
    close(out, np.float64(np_fn(*[x.astype(np.float64) for x in xs])), rtol=1e-10, atol=1e-10)
    out.backward()
    for i, (t, x) in enumerate(zip(ts, xs)):

        def f(v: np.ndarray, i: int = i) -> float:
            args = [a.astype(np.float64) for a in xs]
            args[i] = v
            return float(np_fn(*args))

        assert t.grad is not None, f"no gradient for input {i}"
        assert t.grad.shape == t.shape and t.grad.dtype == dtypes.float64
        close(t.grad, fd_grad(f, x), rtol=tol, atol=tol)


X34, Y34, P34 = rnd(3, 4), rnd(3, 4), rnd(3, 4, lo=0.5, hi=2.0)

GRADS: list[tuple[str, Callable, Callable, tuple]] = [
    ("add", lambda a, b: (a + b).sum(), lambda a, b: (a + b).sum(), (X34, Y34)),
    ("sub", lambda a, b: (a - b * 2).sum(), lambda a, b: (a - b * 2).sum(), (X34, Y34)),
    ("mul", lambda a, b: (a * b).sum(), lambda a, b: (a * b).sum(), (X34, Y34)),
    ("div", lambda a, b: (a / b).sum(), lambda a, b: (a / b).sum(), (X34, P34)),
    ("rdiv", lambda a: (3.0 / a).sum(), lambda a: (3.0 / a).sum(), (P34,)),
    ("exp", lambda a: a.exp().sum(), lambda a: np.exp(a).sum(), (X34,)),
    ("log", lambda a: a.log().sum(), lambda a: np.log(a).sum(), (P34,)),
    ("sqrt", lambda a: a.sqrt().sum(), lambda a: np.sqrt(a).sum(), (P34,)),
    ("sigmoid", lambda a: a.sigmoid().sum(), lambda a: (1 / (1 + np.exp(-a))).sum(), (X34,)),
    ("relu", lambda a: (a.relu() * a).sum(), lambda a: (np.maximum(a, 0) * a).sum(), (X34,)),
    ("sin", lambda a: a.sin().sum(), lambda a: np.sin(a).sum(), (X34,)),
    ("tanh", lambda a: a.tanh().sum(), lambda a: np.tanh(a).sum(), (X34,)),
    ("pow", lambda a: (a**2.5).sum(), lambda a: (a**2.5).sum(), (P34,)),
    ("sum_axis", lambda a: (a.sum(1) ** 2).sum(), lambda a: (a.sum(1) ** 2).sum(), (X34,)),
    ("max", lambda a: a.max(), lambda a: a.max(), (X34,)),
    (
        "max_axis",
        lambda a: (a.max(0) * Tensor(np.arange(4.0))).sum(),
        lambda a: (a.max(0) * np.arange(4.0)).sum(),
        (X34,),
    ),
    ("min", lambda a: a.min(1).sum(), lambda a: a.min(1).sum(), (X34,)),
    ("mean", lambda a: (a.mean(0) ** 2).mean(), lambda a: (a.mean(0) ** 2).mean(), (X34,)),
    ("var", lambda a: a.var(), lambda a: a.var(ddof=1), (X34,)),
    ("matmul", lambda a, b: (a @ b).square().sum(), lambda a, b: np.square(a @ b).sum(), (X34, Y34.T.copy())),
    ("matvec", lambda a, b: (a @ b).sum(), lambda a, b: (a @ b).sum(), (X34, rnd(4))),
    (
        "reshape",
        lambda a: (a.reshape(2, 6) * Tensor(np.arange(12.0).reshape(2, 6))).sum(),
        lambda a: (a.reshape(2, 6) * np.arange(12.0).reshape(2, 6)).sum(),
        (X34,),
    ),
    (
        "permute",
        lambda a: (a.permute(1, 0) * Tensor(np.arange(12.0).reshape(4, 3))).sum(),
        lambda a: (a.T * np.arange(12.0).reshape(4, 3)).sum(),
        (X34,),
    ),
    (
        "pad",
        lambda a: (a.pad(((1, 0), (0, 2))).exp() * Tensor(np.arange(24.0).reshape(4, 6))).sum(),
        lambda a: (np.exp(np.pad(a, ((1, 0), (0, 2)))) * np.arange(24.0).reshape(4, 6)).sum(),
        (X34,),
    ),
    ("shrink", lambda a: (a.shrink(((1, 3), (0, 2))) ** 2).sum(), lambda a: (a[1:3, 0:2] ** 2).sum(), (X34,)),
    (
        "flip",
        lambda a: (a.flip(1) * Tensor(np.arange(12.0).reshape(3, 4))).sum(),
        lambda a: (a[:, ::-1] * np.arange(12.0).reshape(3, 4)).sum(),
        (X34,),
    ),
    (
        "expand",
        lambda a: (a.reshape(3, 1, 4).expand(3, 2, 4) * Tensor(np.arange(24.0).reshape(3, 2, 4))).sum(),
        lambda a: (a.reshape(3, 1, 4) * np.arange(24.0).reshape(3, 2, 4)).sum(),
        (X34,),
    ),
    ("broadcast", lambda a, b: (a * b).sum(), lambda a, b: (a * b).sum(), (X34, rnd(4))),
    ("getitem", lambda a: (a[1:, ::-2] ** 2).sum(), lambda a: (a[1:, ::-2] ** 2).sum(), (X34,)),
    (
        "softmax",
        lambda a: (a.softmax() * Tensor(np.arange(12.0).reshape(3, 4))).sum(),
        lambda a: (_np_softmax(a, -1) * np.arange(12.0).reshape(3, 4)).sum(),
        (X34,),
    ),
    ("log_softmax", lambda a: a.log_softmax()[:, 1].sum(), lambda a: np.log(_np_softmax(a, -1))[:, 1].sum(), (X34,)),
    ("where", lambda a, b: (a > 0).where(a, b * 2).sum(), lambda a, b: np.where(a > 0, a, b * 2).sum(), (X34, Y34)),
    ("maximum", lambda a, b: a.maximum(b).sum(), lambda a, b: np.maximum(a, b).sum(), (X34, Y34)),
    ("abs", lambda a: a.abs().sum(), lambda a: np.abs(a).sum(), (X34,)),
    ("cat", lambda a, b: (a.cat(b, dim=1) ** 2).sum(), lambda a, b: (np.concatenate([a, b], 1) ** 2).sum(), (X34, Y34)),
    (
        "sparse_ce",
        lambda a: a.sparse_categorical_crossentropy(Tensor(np.int32([1, 0, 3]))),
        lambda a: _np_sparse_ce(a, np.int32([1, 0, 3])),
        (X34,),
    ),
]


@pytest.mark.parametrize("name,t_fn,np_fn,xs", GRADS, ids=[g[0] for g in GRADS])
def test_grad(name: str, t_fn: Callable, np_fn: Callable, xs: tuple) -> None:
    check_grad(t_fn, np_fn, *xs, tol=1e-5)


def test_grad_max_ties_split() -> None:
    x = Tensor(np.float32([1.0, 3.0, 3.0, 2.0]), requires_grad=True)
    x.max().backward()
    close(x.grad, np.float32([0, 0.5, 0.5, 0]))
    a, b = Tensor(np.float32([1.0, 2.0]), requires_grad=True), Tensor(np.float32([1.0, 3.0]), requires_grad=True)
    a.maximum(b).sum().backward()
    close(a.grad, np.float32([0.5, 0.0]))
    close(b.grad, np.float32([0.5, 1.0]))
    # a NaN operand wins the value (numpy's maximum) and takes the gradient; minimum mirrors it
    a_np = np.float32([np.nan, 1.0, np.nan, 4.0, 2.0])
    b_np = np.float32([1.0, np.nan, np.nan, 4.0, 5.0])
    for fn, pick_b in ((Tensor.maximum, [0, 1, 1, 0.5, 1]), (Tensor.minimum, [0, 1, 1, 0.5, 0])):
        a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
        out = fn(a, b)
        np.testing.assert_array_equal(out.numpy(), (np.maximum if fn is Tensor.maximum else np.minimum)(a_np, b_np))
        (out * 2).sum().backward()
        np.testing.assert_array_equal(b.grad.numpy(), 2 * np.float32(pick_b))
        np.testing.assert_array_equal(a.grad.numpy(), 2 - 2 * np.float32(pick_b))


def test_float_maximum_is_one_max_op() -> None:
    from tgcore.ops import BinaryOps, TernaryOps

    a, b = Tensor(np.float32([1.0, 5.0])), Tensor(np.float32([2.0, 3.0]))
    ops = [x.op for x in a.maximum(b).schedule()[-1].ast.lazyops()]
    assert ops.count(BinaryOps.MAX) == 1 and TernaryOps.WHERE not in ops and BinaryOps.CMPLT not in ops


def test_grad_accumulates() -> None:
    x = Tensor(np.float32([1.0, 2.0, 3.0]), requires_grad=True)
    (x * x).sum().backward()
    close(x.grad, np.float32([2, 4, 6]))
    (x * 3).sum().backward()
    close(x.grad, np.float32([5, 7, 9]))


def test_grad_of_reused_input() -> None:
    a = np.float32([0.5, -1.0, 2.0])
    x = Tensor(a, requires_grad=True)
    y = x * 2
    (y * y + y).sum().backward()
    close(x.grad, 8 * a + 2)


def test_backward_with_gradient_argument() -> None:
    a = rnd(2, 3)
    x = Tensor(a, requires_grad=True)
    g = rnd(2, 3)
    (x * 2).backward(Tensor(g))
    close(x.grad, 2 * g)


def test_backward_non_scalar_raises() -> None:
    x = Tensor(rnd(2, 3), requires_grad=True)
    with pytest.raises((ValueError, RuntimeError)):
        (x * 2).backward()
    with pytest.raises((ValueError, RuntimeError)):
        (x * 2).backward(Tensor(rnd(3, 2)))


def test_no_grad_for_non_requiring_inputs() -> None:
    x = Tensor(rnd(3), requires_grad=True)
    y = Tensor(rnd(3))
    (x * y).sum().backward()
    assert y.grad is None and x.grad is not None
    d = Tensor(rnd(3), requires_grad=True)
    (d.detach() * 2).sum()
    assert d.grad is None


def test_grad_float32_matches_numpy() -> None:
    a, b = rnd(4, 3), rnd(3, 2)
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    (ta @ tb).sum().backward()
    close(ta.grad, np.ones((4, 2), np.float32) @ b.T, rtol=1e-6)
    close(tb.grad, a.T @ np.ones((4, 2), np.float32), rtol=1e-5, atol=1e-6)
    assert ta.grad.dtype == dtypes.float32


def test_grad_through_cast() -> None:
    x = Tensor(np.float32([1.0, 2.0]), requires_grad=True)
    (x.cast(dtypes.float64) * 3).sum().backward()
    close(x.grad, np.float32([3, 3]), dtype=dtypes.float32)


def test_python_scalar_operands_follow_the_promotion_rules() -> None:
    # the scalar fast path builds the constant at the tensor's shape; dtypes and values must be those of numpy
    f = Tensor([1.5, -2.0])
    i = Tensor([3, -7], dtype=dtypes.int32)
    b = Tensor([True, False])
    i8 = Tensor([100, -100], dtype=dtypes.int8)
    assert (i + 2.5).dtype == dtypes.float32 and (i + 2.5).tolist() == [5.5, -4.5]
    assert (2.5 - i).tolist() == [-0.5, 9.5] and (2 - i).tolist() == [-1, 9] and (2 - i).dtype == dtypes.int32
    assert (b + 1).dtype == dtypes.int32 and (b + 1).tolist() == [2, 1]
    assert (b * True).dtype == dtypes.bool and (b * True).tolist() == [True, False]
    assert (i8 + 1000).dtype == dtypes.int8 and (i8 + 1000).numpy().tolist() == (
        np.array([100, -100], np.int8) + np.int8(1000 - 1024)
    ).tolist()
    assert (
        (f * np.float64(2)).tolist() == [3.0, -4.0]
        and (f / 2).tolist() == [0.75, -1.0]
        and (3 / f).dtype == dtypes.float32
    )
    assert (f + np.int32(1)).tolist() == [2.5, -1.0]
    assert (Tensor.ones(2, 0, 3) + 1).shape == (2, 0, 3) and (Tensor(2.0) + 1).tolist() == 3.0
    with pytest.raises(TypeError, match="cannot combine a Tensor with str"):
        _ = f + "1"  # type: ignore[operator]
    x = Tensor([1.0, 2.0], requires_grad=True)
    (x * 3 + 1).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [3.0, 3.0]


def test_exp2_and_log2_are_their_own_ops() -> None:
    # not exp(x * ln 2) and log(x) / ln 2: those add roundings that exp2 magnifies (~90 ulp near 2**128)
    rng = np.random.default_rng(0)
    x = rng.uniform(-126, 128, 4000).astype(np.float32)
    ref = np.exp2(x.astype(np.float64))
    ulps = np.abs(Tensor(x).exp2().numpy().astype(np.float64) - ref) / np.spacing(ref.astype(np.float32))
    assert ulps.max() <= 3
    y = rng.uniform(1e-30, 1e30, 4000).astype(np.float32)
    ref = np.log2(y.astype(np.float64))
    ulps = np.abs(Tensor(y).log2().numpy().astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32))
    assert ulps.max() <= 3
    t = Tensor(np.float32([-1.5, 0.5, 3.0]), requires_grad=True)
    (t.exp2() * 2).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 2 * np.exp2([-1.5, 0.5, 3.0]) * np.log(2), rtol=1e-6)
    t = Tensor(np.float32([0.5, 3.0]), requires_grad=True)
    t.log2().sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 1 / (np.float32([0.5, 3.0]) * np.log(2)), rtol=1e-6)


def test_max_min_argmax_over_an_empty_axis_raise_like_numpy() -> None:
    x = Tensor(np.zeros((0, 3), np.float32))
    assert x.max(axis=1).shape == (0,) and x.argmax(axis=1).numpy().shape == (0,)  # nothing to reduce: fine
    assert Tensor(np.zeros((3, 0), np.float32)).min(axis=0).shape == (0,)
    for fn in (lambda t: t.max(), lambda t: t.max(axis=0), lambda t: t.min(axis=0), lambda t: t.argmax(0)):
        with pytest.raises(ValueError, match="axis of size 0"):
            fn(x)
    assert x.sum().numpy() == 0 and np.isnan(x.mean().numpy())  # sum and mean of nothing: 0 and NaN
