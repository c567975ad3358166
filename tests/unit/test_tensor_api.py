"""The Tensor API of tinygrad 0.9.0 on tgcore (PYTHON device), each method checked against numpy.

Gradients are checked in float64 against central finite differences. Random numbers are checked against a numpy
reference of Threefry-2x32 and the published known-answer vectors.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tgcore import Device, Tensor, dtypes
from tgcore.dtype import DType
from tgcore.tensor import _threefry2x32

R = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _reseed() -> None:
    global R
    R = np.random.default_rng(7)


def rnd(*shape: int, lo: float = -2.0, hi: float = 2.0, dtype: Any = np.float32) -> np.ndarray:
    return R.uniform(lo, hi, size=shape).astype(dtype)


def close(t: Tensor, expect: Any, rtol: float = 1e-5, atol: float = 1e-6, dtype: DType | None = None) -> None:
    got, expect = t.numpy(), np.asarray(expect)
    assert got.shape == expect.shape, f"shape {got.shape} != {expect.shape}"
    if dtype is not None:
        assert t.dtype == dtype, f"dtype {t.dtype} != {dtype}"
    np.testing.assert_allclose(got, expect, rtol=rtol, atol=atol, equal_nan=True)


def exact(t: Tensor, expect: Any, dtype: DType | None = None) -> None:
    got, expect = t.numpy(), np.asarray(expect)
    assert got.shape == expect.shape, f"shape {got.shape} != {expect.shape}"
    if dtype is not None:
        assert t.dtype == dtype, f"dtype {t.dtype} != {dtype}"
    np.testing.assert_array_equal(got, expect)


def fd_grad(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x, dtype=np.float64)
    for i in np.ndindex(x.shape):
        xp, xm = x.astype(np.float64), x.astype(np.float64)
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def check_grad(t_fn: Callable[..., Tensor], np_fn: Callable[..., Any], *xs: np.ndarray, tol: float = 1e-5) -> None:
    """t_fn's value and gradients (of the sum of its output) against np_fn and finite differences, in float64."""
    ts = [Tensor(x.astype(np.float64), requires_grad=True) for x in xs]
    out = t_fn(*ts)
    close(out, np_fn(*[x.astype(np.float64) for x in xs]), rtol=1e-9, atol=1e-9)
    out.sum().backward()
    for i, t in enumerate(ts):

        def f(v: np.ndarray, i: int = i) -> float:
            args = [a.astype(np.float64) for a in xs]
            args[i] = v
            return float(np.sum(np_fn(*args)))

        assert t.grad is not None, f"no gradient for input {i}"
        close(t.grad, fd_grad(f, xs[i]), rtol=tol, atol=tol)


# ***************************************************************** random numbers


def np_threefry(x0: np.ndarray, x1: np.ndarray, key: int) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32, 20 rounds, on uint64 arrays holding uint32 values (the reference the kernel must match)."""
    m = np.uint64(0xFFFFFFFF)
    x0, x1 = x0.astype(np.uint64), x1.astype(np.uint64)
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    ks = [np.uint64(k) for k in (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)]
    x0, x1 = (x0 + ks[0]) & m, (x1 + ks[1]) & m
    for r in range(20):
        rot = np.uint64((13, 15, 26, 6, 17, 29, 16, 24)[r % 8])
        x0 = (x0 + x1) & m
        x1 = (((x1 << rot) | (x1 >> (np.uint64(32) - rot))) & m) ^ x0
        if r % 4 == 3:
            i = r // 4 + 1
            x0, x1 = (x0 + ks[i % 3]) & m, (x1 + ks[(i + 1) % 3] + np.uint64(i)) & m
    return x0, x1


@pytest.mark.parametrize(
    "ctr,key,expect",
    [
        ((0, 0), 0, (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), 0xFFFFFFFFFFFFFFFF, (0x1CB996FC, 0xBB002BE7)),
        ((0x243F6A88, 0x85A308D3), 0x03707344_13198A2E, (0xC4923A9C, 0x483DF7A0)),
    ],
)
def test_threefry_known_answers(ctr: tuple[int, int], key: int, expect: tuple[int, int]) -> None:
    # the known-answer vectors of Random123 (Salmon et al., 2011) for threefry2x32 with 20 rounds
    assert tuple(int(v[0]) for v in np_threefry(np.array([ctr[0]]), np.array([ctr[1]]), key)) == expect
    x0, x1 = (Tensor(np.array([c], np.uint32)) for c in ctr)
    y0, y1 = _threefry2x32(x0, x1, key)
    assert y0.dtype == dtypes.uint32 and (int(y0.item()), int(y1.item())) == expect


def test_rand_matches_reference_generator() -> None:
    Tensor.manual_seed(1234)
    for call in range(2):
        got = Tensor.rand(7, 3).numpy()
        pairs = 11
        w0, w1 = np_threefry(np.arange(pairs), np.full(pairs, call), 1234)
        words = np.concatenate([w0, w1])[:21]
        np.testing.assert_array_equal(got.reshape(-1), (words >> np.uint64(8)).astype(np.float32) * np.float32(2**-24))


def test_rand_range_dtypes_and_statistics() -> None:
    Tensor.manual_seed(0)
    for dt, npdt in ((dtypes.float32, np.float32), (dtypes.float16, np.float16), (dtypes.float64, np.float64)):
        r = Tensor.rand(4000, dtype=dt)
        v = r.numpy()
        assert r.dtype == dt and v.dtype == npdt and v.min() >= 0 and v.max() < 1
        assert abs(v.mean() - 0.5) < 0.02 and abs(v.var() - 1 / 12) < 0.01
    b = Tensor.rand(300, dtype=dtypes.bfloat16)
    assert b.dtype == dtypes.bfloat16 and 0 <= b.numpy().min() and b.numpy().max() < 1
    assert Tensor.rand(0, 3).shape == (0, 3) and Tensor.rand(()).shape == ()
    assert Tensor.rand(2, requires_grad=True).requires_grad
    # other dtypes draw float32 and cast, as tinygrad 0.9.0: ints are 0, bools True unless the draw was exactly 0
    Tensor.manual_seed(0)
    f = Tensor.rand(50).numpy()
    Tensor.manual_seed(0)
    np.testing.assert_array_equal(Tensor.rand(50, dtype=dtypes.int32).numpy(), f.astype(np.int32))
    Tensor.manual_seed(0)
    np.testing.assert_array_equal(Tensor.rand(50, dtype=dtypes.bool).numpy(), f.astype(np.bool_))


def test_manual_seed_streams() -> None:
    Tensor.manual_seed(3)
    a, b = Tensor.rand(50).numpy(), Tensor.rand(50).numpy()
    assert not np.array_equal(a, b)
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(Tensor.rand(50).numpy(), a)
    np.testing.assert_array_equal(Tensor.rand(50).numpy(), b)
    Tensor.manual_seed(4)
    assert not np.array_equal(Tensor.rand(50).numpy(), a)
    with pytest.raises(TypeError):
        Tensor.manual_seed(1.5)  # type: ignore[arg-type]


def test_rand_same_on_clang() -> None:
    pytest.importorskip("tg_clang")
    if "CLANG" not in Device.available():
        pytest.skip("CLANG is not available here")
    Tensor.manual_seed(11)
    py = Tensor.rand(5, 7, device="PYTHON").numpy()
    Tensor.manual_seed(11)
    cl = Tensor.rand(5, 7, device="CLANG").numpy()
    np.testing.assert_array_equal(py, cl)


def test_rand_in_tinyjit_draws_fresh_numbers() -> None:
    from tgcore import TinyJit

    @TinyJit
    def noisy(x: Tensor) -> Tensor:
        return (x + Tensor.rand(6)).realize()

    x = Tensor.zeros(6).contiguous().realize()
    outs = [noisy(x).numpy().copy() for _ in range(4)]  # run, capture, then two replays
    assert len({o.tobytes() for o in outs}) == 4 and all((o >= 0).all() and (o < 1).all() for o in outs)


def test_randn_normal_kaiming() -> None:
    Tensor.manual_seed(5)
    z = Tensor.randn(5000).numpy()
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05 and np.isfinite(z).all()
    n = Tensor.normal(5000, mean=3.0, std=0.5).numpy()
    assert abs(n.mean() - 3) < 0.03 and abs(n.std() - 0.5) < 0.03
    assert Tensor.randn(2, 3, dtype=dtypes.float16).dtype == dtypes.float16
    assert Tensor.normal(3, dtype=dtypes.float64).dtype == dtypes.float64
    k = Tensor.kaiming_normal(200, 50, a=0.0).numpy()
    assert k.shape == (200, 50) and abs(k.std() - np.sqrt(2 / 50)) < 0.02
    Tensor.manual_seed(5)
    z = Tensor.randn(50).numpy() * 4
    Tensor.manual_seed(5)
    n = (Tensor.randn(50) * 4).cast(dtypes.int8).numpy()
    np.testing.assert_array_equal(n, z.astype(np.int8))  # cast, truncating toward 0
    Tensor.manual_seed(5)
    assert Tensor.randn(3, dtype=dtypes.int8).dtype == dtypes.int8


def test_randn_same_on_every_device() -> None:
    """randn draws from + - * / sqrt and bit operations only: the same bits on every device, float32 and float64."""
    devices = [d for d in Device.available() if d.split(":")[0] in ("PYTHON", "CLANG", "LLVM")]
    for dt in (dtypes.float32, dtypes.float64):
        draws = []
        for d in devices:
            Tensor.manual_seed(21)
            draws.append(Tensor.randn(3001, device=d, dtype=dt).numpy())
        for d, got in zip(devices, draws):
            np.testing.assert_array_equal(got, draws[0], err_msg=f"{d} vs {devices[0]}")
        z = draws[0].astype(np.float64)
        assert abs(z.mean()) < 0.06 and abs(z.std() - 1) < 0.05


def test_randn_is_box_muller_of_the_uniform_draws() -> None:
    """The two uniform draws randn turns into normals (its cos and log are its own, from exact operations)."""
    Tensor.manual_seed(8)
    u = Tensor.rand(2, 4000, dtype=dtypes.float64).numpy()
    Tensor.manual_seed(8)
    z = Tensor.randn(4000, dtype=dtypes.float64).numpy()
    np.testing.assert_allclose(z, np.cos(2 * np.pi * u[0]) * np.sqrt(-2 * np.log(1 - u[1])), rtol=1e-13, atol=1e-14)


def test_randint() -> None:
    Tensor.manual_seed(9)
    r = Tensor.randint(4000, low=-3, high=4)
    v = r.numpy()
    assert r.dtype == dtypes.int32 and v.min() == -3 and v.max() == 3
    assert np.all(np.abs(np.bincount(v + 3) / 4000 - 1 / 7) < 0.03)
    assert Tensor.randint(2, 3).shape == (2, 3) and (Tensor.randint(50).numpy() < 10).all()
    u = Tensor.randint(100, low=0, high=256, dtype=dtypes.uint8).numpy()
    assert u.dtype == np.uint8
    wide = Tensor.randint(100, low=-(2**31), high=2**31 - 1).numpy()
    assert wide.min() < -(2**29) and wide.max() > 2**29
    Tensor.manual_seed(2)
    ints = Tensor.randint(40, low=-5, high=9).numpy()
    Tensor.manual_seed(2)
    floats = Tensor.randint(40, low=-5, high=9, dtype=dtypes.float32)
    assert floats.dtype == dtypes.float32
    np.testing.assert_array_equal(floats.numpy(), ints.astype(np.float32))  # drawn as ints, cast (tinygrad 0.9.0)
    for bad in (dict(low=5, high=5), dict(low=0, high=300, dtype=dtypes.int8), dict(low=0.5, high=3)):
        with pytest.raises((ValueError, TypeError)):
            Tensor.randint(3, **bad)


def test_uniform_family_bounds() -> None:
    Tensor.manual_seed(2)
    u = Tensor.uniform(2000, low=-3.0, high=-1.0).numpy()
    assert u.min() >= -3 and u.max() < -1 and abs(u.mean() + 2) < 0.05
    s = Tensor.scaled_uniform(20, 30).numpy()
    assert np.abs(s).max() <= 30 * 20**-0.5 / 30 + 1e-6 and s.shape == (20, 30)
    g = Tensor.glorot_uniform(20, 30).numpy()
    assert np.abs(g).max() <= np.sqrt(6 / 50) + 1e-6
    k = Tensor.kaiming_uniform(20, 30, a=0.0).numpy()
    assert np.abs(k).max() <= np.sqrt(3) * np.sqrt(2 / 30) + 1e-6
    for make in (Tensor.uniform, Tensor.scaled_uniform, Tensor.glorot_uniform, Tensor.kaiming_uniform, Tensor.randn,
                 Tensor.normal, Tensor.kaiming_normal, Tensor.rand):  # fmt: skip
        leaf = make(3, 2, requires_grad=True)
        (leaf * 2).sum().backward()
        assert leaf.requires_grad and leaf.grad is not None, make.__name__
        exact(leaf.grad, np.full((3, 2), 2, np.float32))


def test_multinomial() -> None:
    Tensor.manual_seed(4)
    w = Tensor([[0.1, 0.9, 0.0], [2.0, 1.0, 1.0]])
    m = w.multinomial(4000, replacement=True)
    assert m.dtype == dtypes.int32 and m.shape == (2, 4000)
    f = [np.bincount(r, minlength=3) / 4000 for r in m.numpy()]
    np.testing.assert_allclose(f[0], [0.1, 0.9, 0.0], atol=0.03)
    np.testing.assert_allclose(f[1], [0.5, 0.25, 0.25], atol=0.03)
    one = Tensor([0.0, 0.0, 1.0]).multinomial()
    exact(one, np.int32([2]))
    with pytest.raises(ValueError):
        Tensor([0.5, 0.5]).multinomial(2)  # without replacement only one draw
    with pytest.raises(ValueError):
        Tensor.ones(2, 2, 2).multinomial()


def test_dropout() -> None:
    x = Tensor.ones(2000)
    exact(x.dropout(0.5), np.ones(2000, np.float32))  # not training: the identity
    Tensor.manual_seed(1)
    with Tensor.train():
        d = x.dropout(0.25).numpy()
        assert set(np.unique(d)) <= {0.0, np.float32(1 / 0.75)} and abs((d == 0).mean() - 0.25) < 0.04
        exact(x.dropout(1.0), np.zeros(2000, np.float32))
        exact(x.dropout(0.0), np.ones(2000, np.float32))
        with pytest.raises(ValueError):
            x.dropout(1.5)
        g = Tensor.ones(10, requires_grad=True)
        g.dropout(0.5).sum().backward()
        assert g.grad is not None and set(np.unique(g.grad.numpy())) <= {0.0, 2.0}


# ***************************************************************** creation and state


def test_creation_helpers() -> None:
    exact(Tensor.empty(2, 3).zeros_like(), np.zeros((2, 3), np.float32))
    exact(Tensor.full((2,), 3, dtype=dtypes.int8), np.int8([3, 3]), dtypes.int8)
    exact(Tensor.ones(2, dtype=dtypes.bool), [True, True], dtypes.bool)
    exact(Tensor.arange(2, 11, 3), np.arange(2, 11, 3, dtype=np.int32), dtypes.int32)
    close(Tensor.arange(0, 1, 0.25), np.arange(0, 1, 0.25, dtype=np.float32), dtype=dtypes.float32)
    exact(Tensor.eye(3, dtype=dtypes.int64), np.eye(3, dtype=np.int64), dtypes.int64)
    t = Tensor(np.int16([1, 2]))
    exact(t.ones_like(), np.int16([1, 1]), dtypes.int16)
    exact(t.full_like(7.0), np.int16([7, 7]), dtypes.int16)
    exact(t.zeros_like(dtype=dtypes.float16), np.float16([0, 0]), dtypes.float16)


def test_properties_and_size() -> None:
    t = Tensor(rnd(2, 3, 4))
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and t.element_size() == 4 and t.nbytes() == 96
    assert t.T.shape == (3, 2, 4) and t.view(6, 4).shape == (6, 4) and t.view((4, 6)).shape == (4, 6)
    assert t.view(-1, 2).shape == (12, 2)
    with pytest.raises(IndexError):
        t.size(3)


def test_train_and_inference_mode() -> None:
    assert Tensor.training is False and Tensor.no_grad is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(mode=False):
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False

    @Tensor.train()
    def inside() -> bool:
        return Tensor.training

    assert inside() is True and Tensor.training is False
    with Tensor.inference_mode():
        assert Tensor.no_grad is True
        x = Tensor([1.0], requires_grad=True)
        assert (x * 2)._ctx is None
    assert Tensor.no_grad is False
    assert (Tensor([1.0], requires_grad=True) * 2)._ctx is not None


def test_state_methods() -> None:
    a = Tensor([1.5, 2.5], requires_grad=True)
    assert a.detach().requires_grad is False
    assert a.realize(do_update_stats=False) is a
    assert a.to("PYTHON") is a and a.python().device == "PYTHON"
    b = Tensor([1, 2])
    assert b.to_("PYTHON") is b
    assert a.data().tolist() == [1.5, 2.5] and a.tolist() == [1.5, 2.5] and Tensor([[4]]).item() == 4
    exact(a.contiguous(), np.float32([1.5, 2.5]))
    (a.contiguous_backward() * 2).sum().backward()
    exact(a.grad, np.float32([2, 2]))
    exact(Tensor([1.7, -1.2]).int(), np.int32([1, -1]), dtypes.int32)
    exact(Tensor([0, 2]).bool(), [False, True], dtypes.bool)
    exact(Tensor([1, 2]).half(), np.float16([1, 2]), dtypes.float16)
    exact(Tensor([1, 2]).float(), np.float32([1, 2]), dtypes.float32)
    exact(Tensor(np.float32([1.0])).bitcast(dtypes.uint32), np.uint32([0x3F800000]), dtypes.uint32)
    r = Tensor([1.0, 2.0])
    r.replace(Tensor([3.0, 4.0]))
    exact(r, np.float32([3, 4]))
    with pytest.raises(ValueError):
        r.replace(Tensor([1.0]))


def test_assign_and_inplace_operators() -> None:
    x = Tensor([1.0, 2.0, 3.0]).realize()
    buf = x.lazydata.base.buffer
    x += 1
    x.realize()
    assert x.lazydata.base.buffer is buf  # in place
    x -= Tensor([0.5, 0.5, 0.5])
    x *= 2
    x /= 4
    exact(x, np.float32([0.75, 1.25, 1.75]))
    i = Tensor(np.int32([7, -7, 9])).realize()
    i //= 2
    exact(i, np.int32([3, -4, 4]))
    i %= 3
    exact(i, np.int32([0, 2, 1]))
    i <<= 2
    i >>= 1
    i ^= 1
    i |= 8
    i &= 13
    exact(i, np.int32([9, 13, 9]))
    p = Tensor([2.0, 3.0])
    p **= 2
    exact(p, np.float32([4, 9]))
    m = Tensor(np.eye(2, dtype=np.float32))
    m @= Tensor(np.float32([[1, 2], [3, 4]]))
    exact(m, np.float32([[1, 2], [3, 4]]))
    with pytest.raises(ValueError):
        i /= 2  # int32 /= gives float32: like numpy, the dtype cannot change in place


def test_assign_reading_its_own_buffer_elsewhere() -> None:
    from tgcore.tensor import _assign_hazard

    m = Tensor(np.arange(6, dtype=np.float32)).realize()
    assert not _assign_hazard((m * 2 + 1).lazydata, m.lazydata)
    assert _assign_hazard(m.flip(0).lazydata, m.lazydata) and _assign_hazard((m - m.sum()).lazydata, m.lazydata)
    devices = ["PYTHON"] + (["CLANG"] if "CLANG" in Device.available() else [])
    for dev in devices:  # a compiled loop would overwrite what it has yet to read without the hazard check
        x = Tensor(np.arange(6, dtype=np.float32), device=dev).realize()
        x.assign(x.flip(0)).realize()
        exact(x, np.float32([5, 4, 3, 2, 1, 0]))
        w = Tensor(np.eye(2, dtype=np.float32), device=dev).realize()
        w @= Tensor(np.float32([[1, 2], [3, 4]]), device=dev)
        exact(w, np.float32([[1, 2], [3, 4]]))
        # a reduce that feeds a reduce is a kernel of its own, run before the assign: reading w there (transposed) is
        # no hazard, as in a training step's update of a weight its forward matmul reads transposed
        src = w - (w.T @ w).sum() * 0.5
        assert not _assign_hazard(src.lazydata, w.lazydata)
        w.assign(src).realize()
        exact(w, np.float32([[1, 2], [3, 4]]) - 29.0)  # w.T @ w sums to 58


def test_from_node_variable() -> None:
    from tgcore import Variable

    v = Variable("n", 1, 10).bind(4)
    t = Tensor.from_node(v)
    assert t.shape == () and t.dtype == dtypes.int32
    exact(Tensor.ones(3, dtype=dtypes.int32) * t, np.int32([4, 4, 4]))
    exact(Tensor.from_node(5), np.int32(5))


# ***************************************************************** movement and indexing

A234 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

INDICES: list[Any] = [
    [0, 1], ([0, 1], [2, 0]), (slice(None), [2, 0]), [-1], (slice(None), [0, 1], [1, 3]),
    ([0, 1], slice(None), [1, 3]), (None, [0, 1], slice(1, 3), [1, 3]), ([[0], [1]], [[0, 1, 2]]),
    (Ellipsis, [1, 2]), ([0, 1], Ellipsis, [1, 2]), (slice(None, None, -1), [2, 0], slice(None, None, 2)),
    ([1, 0], 1), (1, [2, 2, 0]), (slice(1, None), [[0, 1], [1, 0]], None), np.array([1, 0]), ([],),
]  # fmt: skip


@pytest.mark.parametrize("idx", INDICES, ids=[str(i) for i in range(len(INDICES))])
def test_getitem_advanced(idx: Any) -> None:
    exact(Tensor(A234)[idx], A234[idx])


def test_getitem_advanced_with_tensors_and_grad() -> None:
    t = Tensor(A234)
    exact(t[Tensor([1, -1, 0])], A234[[1, -1, 0]])
    exact(t[:, Tensor([[2], [-3]]), Tensor([0, 3])], A234[:, [[2], [-3]], [0, 3]])
    exact(Tensor(np.int8([5, 6, 7]))[[2, 0]], np.int8([7, 5]), dtypes.int8)
    exact(Tensor([True, False])[[1, 1, 0]], [False, False, True], dtypes.bool)
    exact(Tensor(np.float32([np.inf, np.nan, 1]))[[0, 1]], np.float32([np.inf, np.nan]))
    # numpy's rule (tinygrad and torch differ): an int counts as an advanced index once there is an array, so the
    # index axes go first when the advanced indices do not stand together
    np.testing.assert_array_equal(Tensor(A234)[0, :, [1, 3]].numpy(), A234[0, :, [1, 3]])
    np.testing.assert_array_equal(Tensor(A234)[:, 0, [1, 3]].numpy(), A234[:, 0, [1, 3]])
    np.testing.assert_array_equal(Tensor(A234)[[1], None, [2]].numpy(), A234[[1], None, [2]])
    x = rnd(4, 3)
    check_grad(lambda a: a[[0, 2, 2], 1:], lambda a: a[[0, 2, 2], 1:], x)
    check_grad(lambda a: a[Tensor([3, 0]), Tensor([1, 1])], lambda a: a[[3, 0], [1, 1]], x)


def test_getitem_errors() -> None:
    t = Tensor(A234)
    with pytest.raises(IndexError):
        t[[2]]
    with pytest.raises(IndexError):
        t[:, [-4]]
    with pytest.raises(IndexError):
        t[[True, False]]
    with pytest.raises(IndexError):
        t[Tensor([True, False])]
    with pytest.raises(IndexError):
        t[[0.5]]
    with pytest.raises(IndexError):
        t[Tensor([0.0])]
    with pytest.raises(IndexError):
        t["a"]


def test_setitem() -> None:
    a = np.zeros((3, 4), np.float32)
    t = Tensor(a).contiguous().realize()
    buf = t.lazydata.base.buffer
    cases = [((1,), 5), ((slice(None), slice(1, 3)), np.float32([[1, 2]])), ((Ellipsis, 2), np.float32([8, 9, 10])),
             ((slice(None, None, -2), slice(None, None, 3)), 7), ((0, -1), -1),
             ((slice(None), None, 0), 4)]  # fmt: skip
    for idx, v in cases:
        t[idx] = Tensor(v) if isinstance(v, np.ndarray) else v
        a[idx] = v
        exact(t, a)
    assert t.lazydata.base.buffer is buf
    i = Tensor(np.zeros((2, 3), np.int32)).contiguous().realize()
    i[1] = 5.7  # cast to the tensor's dtype, as numpy does
    exact(i, np.int32([[0, 0, 0], [5, 5, 5]]))
    lazy = Tensor.zeros(3, 2)  # not realized: updated functionally
    lazy[1, 1] = 3
    exact(lazy, np.float32([[0, 0], [0, 3], [0, 0]]))
    s = Tensor(np.arange(5, dtype=np.float32)).contiguous().realize()
    s[1:] = s[:-1]  # overlapping read and write, like numpy
    exact(s, np.float32([0, 0, 1, 2, 3]))
    with pytest.raises(ValueError):
        t[0] = Tensor([1.0, 2.0])
    with pytest.raises(NotImplementedError):
        t[[0, 1]] = 1
    with pytest.raises(NotImplementedError):
        Tensor([1.0, 2.0], requires_grad=True)[0] = 1


def test_gather() -> None:
    x = rnd(3, 4)
    idx = np.int32([[0, 3, 1], [2, 2, 0]])
    exact(Tensor(x).gather(1, Tensor(idx)), np.take_along_axis(x[:2], idx, 1))
    idx0 = np.int32([[2, 0, 1, 1], [0, 0, 2, -1]])
    exact(Tensor(x).gather(0, Tensor(idx0)), np.take_along_axis(x, idx0 % 3, 0))
    exact(Tensor(np.int64([5, 6, 7])).gather(-1, Tensor([2, 0])), np.int64([7, 5]), dtypes.int64)
    check_grad(lambda a: a.gather(1, Tensor(idx)), lambda a: np.take_along_axis(a[:2], idx, 1), x)
    with pytest.raises(TypeError):
        Tensor(x).gather(0, Tensor([0.0]))
    with pytest.raises(ValueError):
        Tensor(x).gather(0, Tensor([[0] * 5]))


def test_split_chunk() -> None:
    a = np.arange(10, dtype=np.int32)
    parts = Tensor(a).split(3)
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [(3,), (3,), (3,), (1,)]
    for p, e in zip(parts, np.split(a, [3, 6, 9])):
        exact(p, e)
    for p, e in zip(Tensor(a).split([2, 0, 8]), np.split(a, [2, 2])):
        exact(p, e)
    b = np.arange(12).reshape(3, 4)
    for p, e in zip(Tensor(b).split(2, dim=-1), np.split(b, 2, axis=1)):
        exact(p, e)
    chunks = Tensor(a).chunk(4)
    assert isinstance(chunks, list) and [c.shape for c in chunks] == [(3,), (3,), (3,), (1,)]
    assert [c.shape for c in Tensor(a).chunk(3)] == [(4,), (4,), (2,)]
    assert [c.shape for c in Tensor(a).chunk(20)] == [(1,)] * 10
    for bad in (lambda: Tensor(a).split([3, 3]), lambda: Tensor(a).split(0), lambda: Tensor(a).chunk(0)):
        with pytest.raises(ValueError):
            bad()


def test_repeat_unflatten_pad2d_stack() -> None:
    a = rnd(2, 3)
    exact(Tensor(a).repeat(2, 1), np.tile(a, (2, 1)))
    exact(Tensor(a).repeat((1, 2, 3)), np.tile(a, (1, 2, 3)))
    exact(Tensor(a).repeat(0, 1), np.tile(a, (0, 1)))
    with pytest.raises(ValueError):
        Tensor(a).repeat(2)
    exact(Tensor(np.arange(6)).unflatten(0, (2, 3)), np.arange(6).reshape(2, 3))
    exact(Tensor(np.arange(6)).unflatten(-1, (-1, 2)), np.arange(6).reshape(3, 2))
    x = rnd(2, 3, 4)
    exact(Tensor(x).pad2d((1, 2)), np.pad(x, ((0, 0), (0, 0), (1, 2))))
    exact(Tensor(x).pad2d((1, 1, 2, 0), value=-1.0), np.pad(x, ((0, 0), (2, 0), (1, 1)), constant_values=-1))
    exact(Tensor(x).pad2d((1, -1, -1, 0)), np.pad(x, ((0, 0), (0, 0), (1, 0)))[:, 1:, :-1])
    with pytest.raises(ValueError):
        Tensor(x).pad2d((1, 2, 3))
    exact(Tensor(np.int8([1, 2])).pad(((1, 1),), value=7.9), np.int8([7, 1, 2, 7]), dtypes.int8)
    b = rnd(2, 3)
    exact(Tensor.stack(Tensor(a), Tensor(b)), np.stack([a, b]))
    exact(Tensor(a).stack(Tensor(b), dim=-1), np.stack([a, b], -1))
    exact(Tensor.stack([Tensor(a), Tensor(b)], dim=1), np.stack([a, b], 1))


def test_masked_fill_one_hot_triu_tril() -> None:
    x = rnd(3, 4)
    m = x > 0
    exact(Tensor(x).masked_fill(Tensor(m), -9.0), np.where(m, -9, x).astype(np.float32))
    exact(Tensor(np.int32([1, 2, 3])).masked_fill(Tensor([True, False, True]), 9.5), np.float32([9.5, 2, 9.5]))
    exact(Tensor([1.0, 2.0]).masked_fill(Tensor([True]), Tensor(5.0)), np.float32([5, 5]))
    exact(Tensor([[1, 0], [2, 2]]).one_hot(3), np.eye(3, dtype=np.int32)[[[1, 0], [2, 2]]], dtypes.int32)
    exact(Tensor([1.0, 0.0]).one_hot(2), np.int32([[0, 1], [1, 0]]))
    with pytest.raises(ValueError):
        Tensor([1]).one_hot(0)
    for k in (-1, 0, 2):
        exact(Tensor(x).triu(k), np.triu(x, k))
        exact(Tensor(x).tril(k), np.tril(x, k))
    b = np.ones((2, 3, 3), bool)
    exact(Tensor(b).tril(), np.tril(b), dtypes.bool)


# ***************************************************************** math

XF = np.float32([-3.5, -1.2, -0.5, 0.0, 0.3, 0.5, 1.0, 2.5, 7.0])
SP = np.log1p(np.exp(-np.abs(XF.astype(np.float64)))) + np.maximum(XF, 0)
UNARY: list[tuple[str, Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], np.ndarray]] = [
    ("relu6", Tensor.relu6, lambda x: np.clip(x, 0, 6), XF),
    ("elu", Tensor.elu, lambda x: np.where(x > 0, x, np.exp(x) - 1), XF),
    ("elu_alpha", lambda t: t.elu(0.5), lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1)), XF),
    ("celu", lambda t: t.celu(2.0), lambda x: np.maximum(x, 0) + np.minimum(0, 2 * (np.exp(x / 2) - 1)), XF),
    ("gelu", Tensor.gelu, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))), XF),
    ("quick_gelu", Tensor.quick_gelu, lambda x: x / (1 + np.exp(-1.702 * x)), XF),
    ("silu", Tensor.silu, lambda x: x / (1 + np.exp(-x)), XF),
    ("swish", Tensor.swish, lambda x: x / (1 + np.exp(-x)), XF),
    ("mish", Tensor.mish, lambda x: x * np.tanh(np.logaddexp(0, x)), XF),
    ("softplus", Tensor.softplus, lambda x: np.logaddexp(0, x), np.float32([-100, -1, 0, 1, 100])),
    ("softplus_beta", lambda t: t.softplus(2), lambda x: np.logaddexp(0, 2 * x) / 2, XF),
    ("softsign", Tensor.softsign, lambda x: x / (1 + np.abs(x)), XF),
    ("hardswish", Tensor.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6, XF),
    ("hardtanh", Tensor.hardtanh, lambda x: np.clip(x, -1, 1), XF),
    ("hardtanh_args", lambda t: t.hardtanh(-2, 0.5), lambda x: np.clip(x, -2, 0.5), XF),
    ("hardsigmoid", Tensor.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1), XF),
    ("sinh", Tensor.sinh, np.sinh, XF),
    ("cosh", Tensor.cosh, np.cosh, XF),
    ("asinh", Tensor.asinh, np.arcsinh, np.float32([-1e30, -5, -0.5, 0, 0.5, 3, 1e30])),
    ("acosh", Tensor.acosh, np.arccosh, np.float32([1, 1.5, 3, 100, 1e30])),
    ("atanh", Tensor.atanh, np.arctanh, np.float32([-0.9, -0.5, 0, 0.3, 0.99])),
    (
        "round",
        Tensor.round,
        np.round,
        np.float32([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 3.7, -3.2, np.inf, -np.inf, np.nan, 1e30, 8388609.0]),
    ),  # fmt: skip
    ("floor", Tensor.floor, np.floor, np.float32([-1.5, -0.5, 0.5, 2.0, 1e30, np.nan, -np.inf])),
    ("ceil", Tensor.ceil, np.ceil, np.float32([-1.5, -0.5, 0.5, 2.0, 1e30, np.nan, -np.inf])),
    ("trunc", Tensor.trunc, np.trunc, np.float32([-1.5, -0.5, 0.5, 2.0, 1e30, np.nan, -np.inf])),
    ("logical_not", Tensor.logical_not, np.logical_not, np.float32([0, 1.5, -0.0, np.nan])),
    ("exp2", Tensor.exp2, np.exp2, XF),
    ("log2", Tensor.log2, np.log2, np.float32([0.25, 1, 3, 1024])),
    ("rsqrt", Tensor.rsqrt, lambda x: 1 / np.sqrt(x), np.float32([0.25, 1, 3])),
    ("tan", Tensor.tan, np.tan, XF[1:-1] / 2),
    ("clip", lambda t: t.clip(-1, 2), lambda x: np.clip(x, -1, 2), np.float32([-3, 0, 5, np.nan])),
    ("relu_nan", Tensor.relu, lambda x: np.maximum(x, 0), np.float32([np.nan, -1, 2])),
    ("sign", Tensor.sign, np.sign, XF),
]


@pytest.mark.parametrize("name,fn,np_fn,x", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name: str, fn: Callable, np_fn: Callable, x: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        expect = np_fn(x.astype(np.float64)).astype(np.float32) if name != "logical_not" else np_fn(x)
    close(fn(Tensor(x)), expect, rtol=2e-5, atol=2e-6)


UNARY_GRADS = ["relu6", "elu", "celu", "gelu", "quick_gelu", "silu", "mish", "softplus_beta", "softsign", "hardswish",
               "hardtanh", "hardsigmoid", "sinh", "cosh", "asinh"]  # fmt: skip


@pytest.mark.parametrize("name", UNARY_GRADS)
def test_unary_grad(name: str) -> None:
    _, fn, np_fn, _ = next(u for u in UNARY if u[0] == name)
    x = np.float64([-3.3, -1.2, -0.4, 0.3, 0.7, 2.2, 6.5])  # away from kinks
    check_grad(fn, np_fn, x)


def test_inverse_hyperbolic_gradients_at_edges() -> None:
    x = Tensor([0.0, 1e30, -1e30, -0.5], requires_grad=True)
    x.asinh().sum().backward()
    close(x.grad, np.float32([1, 1e-30, 1e-30, 1 / np.sqrt(1.25)]), rtol=1e-5, atol=0)
    y = Tensor([1.5, 1e30], requires_grad=True)
    y.acosh().sum().backward()
    close(y.grad, np.float32([1 / np.sqrt(1.25), 1e-30]), rtol=1e-5, atol=0)


def test_step_functions_have_zero_gradient() -> None:
    for fn in (Tensor.floor, Tensor.ceil, Tensor.round, Tensor.trunc):
        x = Tensor([1.5, -0.4], requires_grad=True)
        (fn(x) * 3).sum().backward()
        exact(x.grad, np.float32([0, 0]))
    exact(Tensor(np.int32([3, -2])).round(), np.int32([3, -2]), dtypes.int32)  # integers are already round


def test_unary_on_ints_and_halves() -> None:
    close(Tensor([1, 2]).sinh(), np.sinh(np.float32([1, 2])), dtype=dtypes.float32)
    close(Tensor(np.float16([0.5, -1])).silu(), (np.float16([0.5, -1]) / (1 + np.exp(-np.float16([0.5, -1])))),
          rtol=2e-3, dtype=dtypes.float16)  # fmt: skip
    exact(Tensor(np.int32([-7, 3, 9])).relu6(), np.int32([0, 3, 6]), dtypes.int32)
    exact(Tensor(np.uint8([0, 5, 255])).abs(), np.uint8([0, 5, 255]), dtypes.uint8)
    exact(Tensor(np.int8([-128, -5, 5])).abs(), np.abs(np.int8([-128, -5, 5])), dtypes.int8)


def test_integer_pow() -> None:
    # an integer tensor to a Python int power stays an integer, exact and wrapping (tinygrad's dtype, numpy's values)
    exact(Tensor([1, 2, 3]) ** 2, np.int32([1, 4, 9]), dtypes.int32)
    exact(Tensor([3, -2, 5]) ** 0, np.int32([1, 1, 1]), dtypes.int32)
    exact(Tensor(np.int64([3, -2])) ** 39, np.int64([3, -2]) ** 39, dtypes.int64)
    exact(Tensor(np.uint8([3, 200])) ** 5, np.uint8([3, 200]) ** 5, dtypes.uint8)
    with pytest.raises(ValueError):
        Tensor([2]) ** -1
    close(Tensor([2, 4]) ** 0.5, np.sqrt(np.float32([2, 4])), dtype=dtypes.float32)
    exact(2 ** Tensor([1, 3]), np.int32([2, 8]), dtypes.int32)  # an int to int powers stays an int, as numpy's
    exact(Tensor([3, -2, 7]) ** Tensor([21, 5, 0]), np.int32([3, -2, 7]) ** np.int32([21, 5, 0]), dtypes.int32)
    with pytest.raises(ValueError):
        (Tensor([2, 3]) ** Tensor([1, -1])).numpy()  # checked on the device


def test_bfloat16_ops() -> None:
    a = np.float32([[1.5, -2.0, 3.25], [0.5, 8.0, -1.0]])
    t = Tensor(a, dtype=dtypes.bfloat16)
    assert t.dtype == dtypes.bfloat16
    cases = [(t + t, a + a), (t * 2, a * 2), (t.max(1), a.max(1)), (t[[1, 0], 1:], a[[1, 0], 1:]),
             (t.relu(), np.maximum(a, 0)), (t.cat(t), np.concatenate([a, a])), (t.sum(), a.sum())]  # fmt: skip
    for got, expect in cases:
        assert got.dtype == dtypes.bfloat16
        close(got, expect, rtol=1e-2)
    close(t.exp(), np.exp(a), rtol=2e-2)  # x / ln 2 is rounded to bfloat16 before exp2: a few ulp


def test_lerp() -> None:
    a, b, w = rnd(3, 4), rnd(3, 4), rnd(4, lo=0, hi=1)
    close(Tensor(a).lerp(Tensor(b), 0.25), a + (b - a) * 0.25)
    close(Tensor(a).lerp(Tensor(b), Tensor(w)), a + (b - a) * w)
    close(Tensor([1, 2]).lerp(Tensor([3, 6]), 0.5), np.float32([2, 4]), dtype=dtypes.float32)
    check_grad(lambda x, y, z: x.lerp(y, z), lambda x, y, z: x + (y - x) * z, a, b, w)


INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64]  # fmt: skip


@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
def test_bitwise_and_shifts(dt: DType) -> None:
    npt = dt.np
    info = np.iinfo(npt)
    a = np.array([0, 1, 5, info.max, info.min, 77 % (info.max + 1)], dtype=npt)
    b = np.array([3, 1, 6, 1, 2, 4], dtype=npt)
    ta, tb = Tensor(a), Tensor(b)
    exact(ta ^ tb, a ^ b, dt)
    exact(ta & tb, a & b, dt)
    exact(ta | tb, a | b, dt)
    exact(ta.xor(3), a ^ npt(3), dt)
    exact(ta << 3, a << npt(3), dt)
    exact(ta >> 2, a >> npt(2), dt)
    exact(ta.lshift(tb), a << b, dt)
    exact(ta.rshift(tb), a >> b, dt)
    exact(~ta, ~a, dt)


def test_bitwise_bool_and_reflected() -> None:
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    exact(Tensor(p) ^ Tensor(q), p ^ q, dtypes.bool)
    exact(Tensor(p) & Tensor(q), p & q, dtypes.bool)
    exact(Tensor(p) | Tensor(q), p | q, dtypes.bool)
    exact(Tensor(p) & True, p, dtypes.bool)
    exact(Tensor(p) << 1, p.astype(np.int32) << 1, dtypes.int32)
    exact(1 ^ Tensor(np.uint32([1, 2])), np.uint32([0, 3]))
    exact(6 & Tensor([3, 12]), np.int32([2, 4]))
    exact(1 | Tensor([2, 4]), np.int32([3, 5]))
    exact(1 << Tensor([0, 3]), np.int32([1, 8]))
    exact(64 >> Tensor([1, 3]), np.int32([32, 8]))
    exact(Tensor([-8, 9]) >> 1, np.int32([-4, 4]))  # arithmetic for signed, as numpy
    for bad in (lambda: Tensor([1.0]) ^ 1, lambda: Tensor([1.0]) << 1, lambda: Tensor([1.0]) & Tensor([1.0])):
        with pytest.raises(TypeError):
            bad()
    # a negative amount shifts every bit out, as numpy and torch give: 0, or -1 for a negative number shifted right
    exact(Tensor([1, -8]) << -1, np.int32([0, 0]))
    exact(Tensor([5, -8]) >> -1, np.int32([0, -1]))


# ***************************************************************** reductions


def test_reduction_edge_cases() -> None:
    x = np.float32([[1, np.nan, 3, np.nan], [2, 5, 5, 1]])
    exact(Tensor(x).argmax(1), np.argmax(x, 1).astype(np.int32), dtypes.int32)
    exact(Tensor(x).argmin(1), np.argmin(x, 1).astype(np.int32), dtypes.int32)
    exact(Tensor(x).argmax(), np.int32(np.argmax(x)))
    exact(Tensor(x).argmax(0, keepdim=True), np.argmax(x, 0, keepdims=True).astype(np.int32))
    close(Tensor(x).max(1), np.max(x, 1))
    close(Tensor(x).min(1), np.min(x, 1))
    inf = np.float32([[np.inf, 1], [-np.inf, -np.inf], [0, 1]])
    with np.errstate(all="ignore"):
        expect = np.log(np.exp(inf.astype(np.float64)).sum(1))
    close(Tensor(inf).logsumexp(1), expect.astype(np.float32))
    close(Tensor(inf).logsumexp(1, keepdim=True), expect.astype(np.float32)[:, None])
    c = np.float32([1, np.inf, 2, -1])
    close(Tensor(c).cumsum(), np.cumsum(c))
    exact(Tensor(np.int8([100, 100, 100])).cumsum(), np.int32([100, 200, 300]), dtypes.int32)
    exact(Tensor([True, True, False]).cumsum(), np.int32([1, 2, 2]), dtypes.int32)
    r = rnd(3, 4)
    close(Tensor(r).cumsum(-1), np.cumsum(r, -1))


@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, True), (-1, False), ((0, 2), False), ((1, 2), True)])
def test_reductions_axes(axis: Any, keepdim: bool) -> None:
    x = rnd(2, 3, 4)
    for name, np_fn in (("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean)):
        close(getattr(Tensor(x), name)(axis=axis, keepdim=keepdim), np_fn(x, axis=axis, keepdims=keepdim), rtol=1e-5)
    close(Tensor(x).var(axis=axis, keepdim=keepdim), np.var(x, axis=axis, ddof=1, keepdims=keepdim), rtol=1e-5)
    close(Tensor(x).std(axis, keepdim, correction=0), np.std(x, axis=axis, keepdims=keepdim), rtol=1e-5)


def test_reduction_dtypes() -> None:
    assert Tensor(np.int8([1, 2])).sum().dtype == dtypes.int32
    assert Tensor(np.uint8([1, 2])).sum().dtype == dtypes.uint32
    assert Tensor([True, False]).sum().dtype == dtypes.int32
    assert Tensor(np.float16([1, 2])).sum().dtype == dtypes.float16
    assert Tensor(np.int8([1, 2])).max().dtype == dtypes.int8
    assert Tensor(np.uint8([1, 2])).mean().dtype == dtypes.float32
    assert Tensor(np.float16([1, 2])).mean().dtype == dtypes.float16
    assert Tensor([1, 2]).var().dtype == dtypes.float32 and Tensor([1, 2]).softmax().dtype == dtypes.float32
    exact(Tensor(np.uint8([200, 100])).sum(), np.uint32(300))
    exact(Tensor(np.int16([-5, 3])).min(), np.int16(-5))
    exact(Tensor([True, False]).max(), np.bool_(True))
    exact(Tensor([True, False]).min(), np.bool_(False))


# ***************************************************************** processing


def np_conv(x: np.ndarray, w: np.ndarray, stride: Any = 1, dilation: Any = 1, groups: int = 1) -> np.ndarray:
    nd = w.ndim - 2
    st = (stride,) * nd if isinstance(stride, int) else stride
    dl = (dilation,) * nd if isinstance(dilation, int) else dilation
    cout, cg, k = w.shape[0], w.shape[1], w.shape[2:]
    out_sp = [(x.shape[2 + i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    out = np.zeros((x.shape[0], cout, *out_sp))
    rc = cout // groups
    for o in np.ndindex(*out_sp):
        for kk in np.ndindex(*k):
            xv = x[(slice(None), slice(None)) + tuple(o[i] * st[i] + kk[i] * dl[i] for i in range(nd))]
            for g in range(groups):
                wv = w[(slice(g * rc, (g + 1) * rc), slice(None)) + kk]
                out[(slice(None), slice(g * rc, (g + 1) * rc)) + o] += xv[:, g * cg : (g + 1) * cg] @ wv.T
    return out


CONVS = [
    ((2, 3, 5, 6), (4, 3, 3, 3), {}, None),
    ((2, 3, 5, 6), (4, 3, 3, 3), dict(padding=1, stride=2), [(1, 1), (1, 1)]),
    ((1, 3, 7, 6), (2, 3, 2, 3), dict(padding=(1, 2), stride=(2, 1), dilation=2), [(1, 1), (2, 2)]),
    ((1, 6, 5, 6), (6, 2, 3, 3), dict(groups=3, padding=(1, 2, 0, 1)), [(0, 1), (1, 2)]),
    ((2, 3, 9), (4, 3, 3), dict(stride=2), None),
    ((1, 2, 4, 4, 5), (3, 2, 2, 2, 3), dict(dilation=(1, 2, 1)), None),
]


@pytest.mark.parametrize("xs,ws,kw,pads", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_conv2d(xs: tuple, ws: tuple, kw: dict, pads: Any) -> None:
    x, w, b = R.standard_normal(xs), R.standard_normal(ws), R.standard_normal(ws[0])
    xp = np.pad(x, [(0, 0), (0, 0)] + pads) if pads else x
    expect = np_conv(xp, w, kw.get("stride", 1), kw.get("dilation", 1), kw.get("groups", 1))
    close(Tensor(x).conv2d(Tensor(w), **kw), expect, rtol=1e-10, atol=1e-10)
    close(Tensor(x).conv2d(Tensor(w), Tensor(b), **kw), expect + b.reshape(1, -1, *[1] * (len(xs) - 2)), rtol=1e-10)


def test_conv2d_grad_dtypes_and_errors() -> None:
    x, w = R.standard_normal((1, 2, 4, 5)), R.standard_normal((2, 1, 2, 3))
    check_grad(lambda a, b: a.conv2d(b, groups=2, stride=(1, 2), padding=1),
               lambda a, b: np_conv(np.pad(a, [(0, 0), (0, 0), (1, 1), (1, 1)]), b, (1, 2), 1, 2), x, w)  # fmt: skip
    ones = Tensor.ones(1, 1, 4, 4, dtype=dtypes.int32)
    exact(ones.conv2d(Tensor.ones(1, 1, 2, 2, dtype=dtypes.int32)), np.full((1, 1, 3, 3), 4, np.int32), dtypes.int32)
    assert Tensor.ones(1, 1, 3, 3, dtype=dtypes.float16).conv2d(Tensor.ones(1, 1, 2, 2).half()).dtype == dtypes.float16
    with pytest.raises(ValueError):
        Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(4, 2, 3, 3))
    with pytest.raises(ValueError):
        Tensor.ones(1, 1, 2, 2).conv2d(Tensor.ones(1, 1, 3, 3))
    with pytest.raises(ValueError):
        Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), padding=(1, 2, 3))


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((2, 3, 5, 6), (3, 4, 3, 3), {}),
        ((1, 3, 4, 5), (3, 2, 3, 3), dict(stride=2, padding=1, output_padding=1)),
        ((1, 4, 3, 4), (4, 1, 3, 2), dict(groups=2, dilation=2, stride=(2, 3))),
    ],  # fmt: skip
    ids=["plain", "strided", "groups"],
)
def test_conv_transpose2d(xs: tuple, ws: tuple, kw: dict) -> None:
    # conv_transpose2d is the adjoint of conv2d: <convT(x), z> == <x, conv(z)>
    x, w = R.standard_normal(xs), R.standard_normal(ws)
    y = Tensor(x).conv_transpose2d(Tensor(w), **kw)
    s, p = kw.get("stride", 1), kw.get("padding", 0)
    d, op = kw.get("dilation", 1), kw.get("output_padding", 0)
    expect_sp = [(n - 1) * (s if isinstance(s, int) else s[i]) - 2 * p + d * (k - 1) + op + 1
                 for i, (n, k) in enumerate(zip(xs[2:], ws[2:]))]  # fmt: skip
    assert y.shape == (xs[0], ws[1] * kw.get("groups", 1), *expect_sp)
    z = R.standard_normal(y.shape)
    cz = Tensor(z).conv2d(Tensor(w), groups=kw.get("groups", 1), stride=s, dilation=d, padding=p).numpy()
    np.testing.assert_allclose((y.numpy() * z).sum(), (x * cz[..., : xs[2], : xs[3]]).sum(), rtol=1e-9)
    b = R.standard_normal(y.shape[1])
    close(Tensor(x).conv_transpose2d(Tensor(w), Tensor(b), **kw), y.numpy() + b.reshape(1, -1, 1, 1), rtol=1e-10)


def np_pool(x: np.ndarray, k: tuple, s: tuple, d: tuple, fn: Callable) -> np.ndarray:
    out_sp = [(x.shape[-2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    out = np.zeros(x.shape[:-2] + tuple(out_sp), x.dtype)
    for o in np.ndindex(*out_sp):
        win = x[..., o[0] * s[0] : o[0] * s[0] + d[0] * (k[0] - 1) + 1 : d[0],
                o[1] * s[1] : o[1] * s[1] + d[1] * (k[1] - 1) + 1 : d[1]]  # fmt: skip
        out[(...,) + o] = fn(win, axis=(-2, -1))
    return out


@pytest.mark.parametrize("k,s,d", [(2, None, 1), (3, 1, 1), ((2, 3), (1, 2), 1), (2, 2, 2), ((1, 1), 3, 1)], ids=str)
def test_pools(k: Any, s: Any, d: Any) -> None:
    x = rnd(2, 3, 6, 7)
    kk = (k, k) if isinstance(k, int) else k
    ss = kk if s is None else ((s, s) if isinstance(s, int) else s)
    close(Tensor(x).max_pool2d(k, s, d), np_pool(x, kk, ss, (d, d), np.max))
    close(Tensor(x).avg_pool2d(k, s, d), np_pool(x, kk, ss, (d, d), np.mean), rtol=1e-5)


def test_pool_grads_and_dtypes() -> None:
    x = rnd(1, 1, 4, 5).astype(np.float64)
    check_grad(lambda a: a.avg_pool2d(), lambda a: np_pool(a, (2, 2), (2, 2), (1, 1), np.mean), x)
    check_grad(lambda a: a.max_pool2d(2, 1), lambda a: np_pool(a, (2, 2), (1, 1), (1, 1), np.max), x)
    ints = Tensor(np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4))
    exact(ints.max_pool2d(), np.int32([[[[5, 7], [13, 15]]]]), dtypes.int32)
    close(ints.avg_pool2d(), np.float32([[[[2.5, 4.5], [10.5, 12.5]]]]), dtype=dtypes.float32)
    exact(Tensor(np.float32([[[[np.nan, 1], [2, 3]]]])).max_pool2d(), np.float32([[[[np.nan]]]]))


EINSUMS = [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("ij,jk", [(2, 3), (3, 4)]), ("i,i->", [(5,), (5,)]), ("ij->ji", [(2, 3)]),
    ("ij,kl->ijkl", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]),
    ("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)]), ("i j , j k -> i k", [(2, 3), (3, 4)]), ("ij->", [(3, 4)]),
    ("ij,ij,ij->i", [(2, 3), (2, 3), (2, 3)]), ("b...,...->b...", [(2, 3, 4), (3, 4)]), ("iij->ji", [(2, 2, 3)]),
    ("ba,ab", [(3, 2), (2, 3)]),
]  # fmt: skip


@pytest.mark.parametrize("formula,shapes", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum(formula: str, shapes: list) -> None:
    xs = [rnd(*s) for s in shapes]
    close(Tensor.einsum(formula, *[Tensor(x) for x in xs]), np.einsum(formula.replace(" ", ""), *xs), rtol=1e-5)


def test_einsum_list_grad_dtype_errors() -> None:
    a, b = rnd(2, 3), rnd(3, 4)
    close(Tensor.einsum("ij,jk->ik", [Tensor(a), Tensor(b)]), a @ b, rtol=1e-5)
    exact(Tensor.einsum("i,i->", Tensor([1, 2]), Tensor([3, 4])), np.int32(11), dtypes.int32)
    check_grad(lambda x, y: Tensor.einsum("ij,jk->ik", x, y), lambda x, y: x @ y, a, b)
    check_grad(lambda x: Tensor.einsum("ii->i", x), lambda x: np.diagonal(x).copy(), rnd(3, 3))
    bad = (("ij,jk->ik", [a, a]), ("ij->k", [a]), ("ij,jk->ik", [a]), ("ij->ii", [a]), ("i...->i", [a]))
    for formula, xs in bad:
        with pytest.raises(ValueError):
            Tensor.einsum(formula, *[Tensor(x) for x in xs])


def test_layernorm_batchnorm() -> None:
    x = rnd(2, 3, 4)
    for axis in (-1, 0, (1, 2)):
        m, v = x.mean(axis=axis, keepdims=True), x.var(axis=axis, keepdims=True)
        close(Tensor(x).layernorm(axis), (x - m) / np.sqrt(v + 1e-5), rtol=1e-4, atol=1e-5)
    close(Tensor(np.int32([[1, 2], [3, 5]])).layernorm(eps=0.0), np.float32([[-1, 1], [-1, 1]]), dtype=dtypes.float32)
    mean, invstd, w, b = rnd(3), rnd(3, lo=0.5, hi=2), rnd(3), rnd(3)
    sh = (1, 3, 1)
    expect = (x - mean.reshape(sh)) * invstd.reshape(sh) * w.reshape(sh) + b.reshape(sh)
    close(Tensor(x).batchnorm(Tensor(w), Tensor(b), Tensor(mean), Tensor(invstd)), expect, rtol=1e-5, atol=1e-6)
    close(Tensor(x).batchnorm(None, None, Tensor(mean), Tensor(invstd)), (x - mean.reshape(sh)) * invstd.reshape(sh),
          rtol=1e-5, atol=1e-6)  # fmt: skip
    m2, s2 = rnd(3, 4), rnd(3, 4, lo=0.5, hi=2)
    close(Tensor(x).batchnorm(None, None, Tensor(m2), Tensor(s2), axis=(1, 2)), (x - m2) * s2, rtol=1e-5, atol=1e-6)
    check_grad(lambda t: t.layernorm(), lambda t: (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True)
               + 1e-5), x[0])  # fmt: skip


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_scaled_dot_product_attention() -> None:
    q, k, v = rnd(2, 3, 4), rnd(2, 5, 4), rnd(2, 5, 6)
    s = q @ k.swapaxes(-1, -2) / 2.0
    close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v)), np_softmax(s) @ v, rtol=1e-5)
    mask = R.uniform(size=(3, 5)) > 0.3
    mask[:, 0] = True
    close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(mask)),
          np_softmax(np.where(mask, s, -np.inf)) @ v, rtol=1e-5)  # fmt: skip
    add = rnd(3, 5)
    close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(add)),
          np_softmax(s + add) @ v, rtol=1e-5)  # fmt: skip
    causal = np.tril(np.ones((3, 5), bool))
    close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True),
          np_softmax(np.where(causal, s, -np.inf)) @ v, rtol=1e-5)  # fmt: skip
    with pytest.raises(ValueError):
        Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(mask), is_causal=True)


def test_losses() -> None:
    p, y = rnd(6, lo=0.05, hi=0.95), (R.uniform(size=6) > 0.5).astype(np.float32)
    close(Tensor(p).binary_crossentropy(Tensor(y)), -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(), rtol=1e-5)
    z = rnd(6, lo=-30, hi=30)
    sig = 1 / (1 + np.exp(-z.astype(np.float64)))
    bce = -(y * np.log(sig) + (1 - y) * np.log1p(-sig))
    close(Tensor(z).binary_crossentropy_logits(Tensor(y)), np.float32(bce.mean()), rtol=1e-4)
    check_grad(lambda a: a.binary_crossentropy_logits(Tensor(y.astype(np.float64))),
               lambda a: (np.maximum(a, 0) - y * a + np.log1p(np.exp(-np.abs(a)))).mean(), rnd(6))  # fmt: skip
    logits = np.float32([[1, 2, 3], [1, 2, 3]])
    close(Tensor(logits).sparse_categorical_crossentropy(Tensor([1, -1])), np.float32(1.4076059), rtol=1e-6)


def test_dot_matmul_linear_sequential() -> None:
    a, b, v = rnd(2, 3), rnd(3, 4), rnd(3)
    close(Tensor(v).dot(Tensor(v)), v @ v, rtol=1e-5)
    close(Tensor(a).matmul(Tensor(b)), a @ b, rtol=1e-5)
    close(Tensor(b).matmul(Tensor(a), reverse=True), a @ b, rtol=1e-5)
    close(Tensor(v) @ Tensor(b), v @ b, rtol=1e-5)
    bias = rnd(4)
    close(Tensor(a).linear(Tensor(b), Tensor(bias)), a @ b + bias, rtol=1e-5)
    close(Tensor(a).sequential([lambda t: t * 2, Tensor.relu]), np.maximum(a * 2, 0))


# ***************************************************************** every dtype

ALL_DTYPES = [dtypes.bool, *INT_DTYPES, dtypes.float16, dtypes.float32, dtypes.float64]


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=str)
def test_ops_every_dtype(dt: DType) -> None:
    npt = dt.np
    if dt == dtypes.bool:
        a, b = (
            np.array([[True, False, True], [False, False, True]]),
            np.array([[True, True, False], [False, True, True]]),
        )
    elif dtypes.is_int(dt):
        a = np.array([[1, 7, 3], [100, 0, 5]], dtype=npt)
        b = np.array([[2, 2, 9], [3, 1, 5]], dtype=npt)
    else:
        a, b = rnd(2, 3).astype(npt), rnd(2, 3).astype(npt)
    ta, tb = Tensor(a), Tensor(b)
    assert ta.dtype == dt
    exact((ta < tb).where(ta, tb), np.where(a < b, a, b), dt)
    exact(ta == tb, a == b, dtypes.bool)
    exact(ta.maximum(tb), np.maximum(a, b), dt)
    exact(ta.max(1), a.max(1), dt)
    exact(ta.min(0), a.min(0), dt)
    exact(ta[[1, 0], ::-1], a[[1, 0], ::-1], dt)
    exact(ta.cat(tb, dim=1), np.concatenate([a, b], 1), dt)
    exact(ta.pad(((1, 0), (0, 1))), np.pad(a, ((1, 0), (0, 1))), dt)
    exact(ta.flip(0).T, a[::-1].T, dt)
    exact(ta.repeat(2, 1), np.tile(a, (2, 1)), dt)
    exact(ta.gather(1, Tensor([[2, 0], [1, 1]])), np.take_along_axis(a, np.array([[2, 0], [1, 1]]), 1), dt)
    exact(ta.triu(), np.triu(a), dt)
    if dt != dtypes.bool:
        tol = 1e-2 if dt == dtypes.float16 else 1e-6
        close(ta + tb, a + b, rtol=tol, dtype=dt)
        close(ta * tb, a * b, rtol=tol, dtype=dt)
        close(ta.sum(), a.sum(dtype=np.float64), rtol=tol)
        close(ta.cumsum(1), np.cumsum(a.astype(np.float64), 1), rtol=tol)
        exact(ta.argmax(1), np.argmax(a, 1).astype(np.int32), dtypes.int32)
        close(ta.mean(), a.astype(np.float64).mean(), rtol=tol)
        exact(ta.max_pool2d((1, 2), 1), np.maximum(a[:, :-1], a[:, 1:]), dt)
        wide = np.float64 if dtypes.is_float(dt) else np.int64  # integer products wrap in the dtype, as numpy's
        close(ta.dot(tb.T), (a.astype(wide) @ b.T.astype(wide)).astype(npt), rtol=tol, dtype=dt)
        close(Tensor.einsum("ij,ij->i", ta, tb), (a.astype(wide) * b).sum(1).astype(npt), rtol=tol, dtype=dt)
    if dtypes.is_float(dt):
        close(ta.exp(), np.exp(a), rtol=tol, dtype=dt)
        close(ta.round(), np.round(a), dtype=dt)
        close(ta.softmax(), np_softmax(a.astype(np.float64)), rtol=10 * tol, atol=tol)


def test_clone_copies_into_memory_of_its_own() -> None:
    """clone keeps every bit (-0.0, NaN) in a new buffer, which a later assign to the source leaves alone; its
    gradient is the incoming one; contiguous() of a contiguous tensor, by contrast, is the same memory."""
    src = np.array([1.5, -0.0, np.nan, -3.0], np.float32)
    a = Tensor(src, requires_grad=True).realize()
    c = a.clone().realize()
    assert c.lazydata.base.realized is not a.lazydata.base.realized
    assert a.contiguous().realize().lazydata.base.realized is a.lazydata.base.realized
    np.testing.assert_array_equal(c.numpy().view(np.uint32), src.view(np.uint32))
    a.assign(Tensor.full((4,), 7.0)).realize()
    np.testing.assert_array_equal(c.numpy().view(np.uint32), src.view(np.uint32))
    b = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (b.clone() * Tensor([2.0, 3.0, 4.0])).sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), [2.0, 3.0, 4.0])
    i = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)).T.clone()
    np.testing.assert_array_equal(i.numpy(), np.arange(6).reshape(2, 3).T)
