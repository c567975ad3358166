"""Level 4: Tensor reductions, movement, matmul, conv, indexing, random numbers, gradients, 0-d and empty tensors,
on the device under test, every result compared with numpy."""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import pytest

from tg_conformance import reference as ref
from tg_conformance.checks import assert_array
from tg_conformance.target import Target
from tg_conformance.tensors import tensor, values
from tgcore import Tensor
from tgcore.dtype import DType, dtypes

pytestmark = pytest.mark.usefixtures("executing")

F32, F16, BF16, F64 = dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64
I8, U8, I32, I64 = dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64
Axis = Optional[Union[int, tuple[int, ...]]]


# ***** reductions *****

def _np_sum(x: np.ndarray, axis: Axis, keepdim: bool, dt: DType) -> np.ndarray:
    # tgcore sums ints in (at least) int32 / uint32 and bool as int32; half and bfloat16 come back in their dtype
    acc = {dtypes.bool: np.int32, I8: np.int32, dtypes.int16: np.int32, U8: np.uint32, dtypes.uint16: np.uint32}.get(dt)
    out = x.astype(np.float64).sum(axis=axis, keepdims=keepdim)
    if acc is not None:
        return out.astype(acc)
    return ref.round_to(out, dt) if dtypes.is_float(dt) else out.astype(x.dtype)


def _np_mean(x: np.ndarray, axis: Axis, keepdim: bool, dt: DType) -> np.ndarray:
    out = x.astype(np.float64).mean(axis=axis, keepdims=keepdim)
    return ref.round_to(out, dt if dtypes.is_float(dt) else F32)


REDUCTIONS: dict[str, tuple[Callable[..., Tensor], Callable[..., np.ndarray], tuple[DType, ...]]] = {
    "sum": (Tensor.sum, _np_sum, (F32, F16, BF16, I32, U8, dtypes.bool)),
    "max": (Tensor.max, lambda x, axis, keepdim, dt: x.max(axis=axis, keepdims=keepdim), (F32, I8, U8)),
    "min": (Tensor.min, lambda x, axis, keepdim, dt: x.min(axis=axis, keepdims=keepdim), (F32, I32, U8)),
    "mean": (Tensor.mean, _np_mean, (F32, F16)),
}
REDUCE_CASES = [pytest.param(op, dt, id=f"{op}-{dt.short_name}") for op, (_, _, dts) in REDUCTIONS.items()
                for dt in dts]
AXES: list[tuple[Axis, bool]] = [(None, False), (1, True), ((0, 2), False)]


@pytest.mark.parametrize("op,dtype", REDUCE_CASES)
def test_reduce(executing: Target, op: str, dtype: DType, rng: np.random.Generator) -> None:
    """Over all axes, one axis with keepdim, two axes; shape (3, 5, 7). Float inputs are small
    multiples of 1/4 so every order of summation gives the same exact result."""
    executing.require(dtype)
    fn, reference, _ = REDUCTIONS[op]
    if dtypes.is_float(dtype):
        x = ref.make_array(rng.integers(-16, 16, 105) / 4, dtype).reshape(3, 5, 7)
    else:
        x = values(dtype, (3, 5, 7), rng, -100, 100)
    t = tensor(executing, x, dtype)
    for axis, keepdim in AXES:
        exp = np.asarray(reference(x, axis, keepdim, dtype))
        got = fn(t, axis=axis, keepdim=keepdim).numpy()
        if op == "mean":
            assert_array(f"Tensor.mean(axis={axis}, keepdim={keepdim}) of {dtype.short_name}", executing.name, got,
                         exp, rtol=4 * 2.0**-10 if dtype == F16 else 1e-6, inputs=[("x", x)])
        else:
            assert_array(f"Tensor.{op}(axis={axis}, keepdim={keepdim}) of {dtype.short_name}", executing.name, got,
                         exp, inputs=[("x", x)])


@pytest.mark.tg_op("reduce large/odd")
def test_reduce_large_and_odd(executing: Target, rng: np.random.Generator) -> None:
    """A sum over 10007 elements (prime) and a max over a (31, 257) matrix along each axis."""
    x = rng.integers(-1000, 1000, 10007).astype(np.int32)
    assert_array("int32 sum of 10007 elements", executing.name, Tensor(x, device=executing.name).sum().numpy(),
                 np.int32(x.sum()))
    m = rng.standard_normal((31, 257)).astype(np.float32)
    tm = Tensor(m, device=executing.name)
    assert_array("max over axis 0 of (31, 257)", executing.name, tm.max(axis=0).numpy(), m.max(axis=0))
    assert_array("max over axis 1 of (31, 257)", executing.name, tm.max(axis=1).numpy(), m.max(axis=1))
    assert_array("float32 sum of (31, 257)", executing.name, tm.sum().numpy(), np.float32(m.astype(np.float64).sum()),
                 atol=1e-4, rtol=1e-5)


@pytest.mark.tg_op("argmax/argmin")
def test_argmax_argmin(executing: Target, rng: np.random.Generator) -> None:
    x = rng.permutation(60).reshape(6, 10).astype(np.float32)
    t = Tensor(x, device=executing.name)
    assert_array("argmax(axis=1)", executing.name, t.argmax(axis=1).numpy(), x.argmax(axis=1).astype(np.int32))
    assert_array("argmin(axis=0)", executing.name, t.argmin(axis=0).numpy(), x.argmin(axis=0).astype(np.int32))
    assert_array("argmax()", executing.name, t.argmax().numpy(), np.int32(x.argmax()))


# ***** movement *****

MOVEMENT: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
    "reshape": (lambda t: t.reshape(4, 3, 6), lambda x: x.reshape(4, 3, 6)),
    "reshape -1": (lambda t: t.reshape(-1, 6), lambda x: x.reshape(-1, 6)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1)),
    "transpose": (lambda t: t.transpose(0, 2), lambda x: x.swapaxes(0, 2)),
    "expand": (lambda t: t[:, :1, :].expand(3, 6, 4), lambda x: np.broadcast_to(x[:, :1, :], (3, 6, 4))),
    "pad": (lambda t: t.pad(((1, 2), None, (0, 3))), lambda x: np.pad(x, ((1, 2), (0, 0), (0, 3)))),
    "pad value": (lambda t: t.pad(((0, 1), (2, 0), None), value=1),
                  lambda x: np.pad(x, ((0, 1), (2, 0), (0, 0)), constant_values=1)),
    "shrink": (lambda t: t.shrink(((1, 3), (2, 5), None)), lambda x: x[1:3, 2:5, :]),
    "flip": (lambda t: t.flip(0, 2), lambda x: x[::-1, :, ::-1]),
    "slice steps": (lambda t: t[::2, 1::3, ::-2], lambda x: x[::2, 1::3, ::-2]),
    "cat": (lambda t: t.cat(t[:, :2], dim=1), lambda x: np.concatenate([x, x[:, :2]], axis=1)),
    "stack": (lambda t: Tensor.stack([t, t.flip(0)], dim=1), lambda x: np.stack([x, x[::-1]], axis=1)),
    "repeat": (lambda t: t[:2, :2].repeat((2, 1, 3)), lambda x: np.tile(x[:2, :2], (2, 1, 3))),
    "chain": (lambda t: t.permute(1, 0, 2).reshape(6, 12)[1::2].flip(1).pad((None, (1, 1))),
              lambda x: np.pad(x.transpose(1, 0, 2).reshape(6, 12)[1::2][:, ::-1], ((0, 0), (1, 1)))),
}
MOVEMENT_CASES = [pytest.param(op, dt, id=f"{op.replace(' ', '_')}-{dt.short_name}") for op in MOVEMENT
                  for dt in (F32, dtypes.bool)]


@pytest.mark.parametrize("op,dtype", MOVEMENT_CASES)
def test_movement(executing: Target, op: str, dtype: DType, rng: np.random.Generator) -> None:
    """Movement ops (and a chain of them) on a (3, 6, 4) tensor, realized to a contiguous buffer."""
    executing.require(dtype)
    fn, reference = MOVEMENT[op]
    x = values(dtype, (3, 6, 4), rng, -100, 100)
    got = fn(tensor(executing, x, dtype)).numpy()
    exp = np.ascontiguousarray(reference(x)).astype(x.dtype)
    assert_array(f"{op} of a (3, 6, 4) {dtype.short_name} tensor", executing.name, got, exp, inputs=[("x", x)])


# ***** matmul and conv *****

MATMUL_SHAPES = [((7, 13), (13, 5)), ((1, 1), (1, 1)), ((13,), (13, 5)), ((7, 13), (13,)), ((13,), (13,)),
                 ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((17, 1), (1, 11)), ((16, 32), (32, 16))]


@pytest.mark.tg_op("matmul")
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}@{s[1]}".replace(" ", ""))
def test_matmul_shapes(executing: Target, shapes: tuple[tuple[int, ...], tuple[int, ...]],
                       rng: np.random.Generator) -> None:
    """Odd, prime, 1-d and batched shapes; integer-valued float32 inputs, so the result is exact."""
    executing.require(F32)
    a = rng.integers(-4, 5, shapes[0]).astype(np.float32)
    b = rng.integers(-4, 5, shapes[1]).astype(np.float32)
    got = (Tensor(a, device=executing.name) @ Tensor(b, device=executing.name)).numpy()
    assert_array(f"matmul {shapes[0]} @ {shapes[1]}", executing.name, got, np.matmul(a, b),
                 inputs=[("a", a), ("b", b)])


@pytest.mark.tg_op("matmul")
@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64, I32, I64], ids=lambda d: d.short_name)
def test_matmul_dtypes(executing: Target, dtype: DType, rng: np.random.Generator) -> None:
    """7x13 @ 13x5 in each dtype (small integers: exact in every dtype)."""
    executing.require(dtype)
    a = ref.make_array(rng.integers(-3, 4, 7 * 13), dtype).reshape(7, 13)
    b = ref.make_array(rng.integers(-3, 4, 13 * 5), dtype).reshape(13, 5)
    got = (tensor(executing, a, dtype) @ tensor(executing, b, dtype)).numpy()
    exp = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    assert_array(f"matmul (7,13) @ (13,5) in {dtype.short_name}", executing.name, got, exp, inputs=[("a", a), ("b", b)])


@pytest.mark.tg_op("matmul")
def test_matmul_random_floats(executing: Target, rng: np.random.Generator) -> None:
    a, b = rng.standard_normal((19, 23)).astype(np.float32), rng.standard_normal((23, 11)).astype(np.float32)
    got = (Tensor(a, device=executing.name) @ Tensor(b, device=executing.name)).numpy()
    assert_array("matmul of random float32 (19,23) @ (23,11)", executing.name, got, a.astype(np.float64) @ b,
                 atol=1e-5, rtol=1e-5, exact_dtype=False)


@pytest.mark.tg_op("conv2d")
def test_conv2d(executing: Target, rng: np.random.Generator) -> None:
    if not hasattr(Tensor, "conv2d"):
        pytest.skip("conv2d is not implemented in tgcore yet (Tensor has no conv2d)")
    x = rng.integers(-3, 4, (2, 3, 7, 9)).astype(np.float32)
    w = rng.integers(-2, 3, (4, 3, 3, 2)).astype(np.float32)
    got = Tensor(x, device=executing.name).conv2d(Tensor(w, device=executing.name)).numpy()
    exp = np.zeros((2, 4, 5, 8), np.float32)
    for i in range(5):
        for j in range(8):
            exp[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i:i + 3, j:j + 2], w)
    assert_array("conv2d (2,3,7,9) * (4,3,3,2)", executing.name, got, exp, inputs=[("x", x), ("w", w)])


# ***** indexing *****

INDEXES: dict[str, Any] = {
    "x[1]": 1, "x[-1]": -1, "x[1:3]": slice(1, 3), "x[::2]": slice(None, None, 2), "x[::-1]": slice(None, None, -1),
    "x[1:-1:3]": (slice(None), slice(1, -1, 3)), "x[..., 1]": (Ellipsis, 1), "x[None, 2]": (None, 2),
    "x[:, None, 1:]": (slice(None), None, slice(1, None)), "x[2, ::-2, 1:]": (2, slice(None, None, -2), slice(1, None)),
    "x[-2, 3, -1]": (-2, 3, -1), "x[4:1:-1, 0]": (slice(4, 1, -1), 0),
}


@pytest.mark.tg_op("indexing")
@pytest.mark.parametrize("expr", list(INDEXES))
def test_indexing(executing: Target, expr: str) -> None:
    x = np.arange(5 * 6 * 7, dtype=np.int32).reshape(5, 6, 7)
    idx = INDEXES[expr]
    got = Tensor(x, device=executing.name)[idx].numpy()
    assert_array(f"{expr} of a (5, 6, 7) tensor", executing.name, got, np.asarray(x[idx]))


@pytest.mark.tg_op("indexing (tensor)")
def test_indexing_with_a_tensor(executing: Target) -> None:
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    idx = np.array([3, 0, 2], dtype=np.int32)
    try:
        got = Tensor(x, device=executing.name)[Tensor(idx, device=executing.name)].numpy()
    except NotImplementedError as e:
        pytest.skip(f"tgcore does not implement it yet: {e}")
    assert_array("x[Tensor([3, 0, 2])]", executing.name, got, x[idx])


# ***** random numbers *****

@pytest.mark.tg_op("random")
@pytest.mark.parametrize("kind", ["rand", "randn"])
def test_random_statistics(executing: Target, kind: str) -> None:
    """10k samples: rand in [0, 1) with mean 1/2 and std 1/sqrt(12); randn with mean 0 and std 1 (loose bounds)."""
    Tensor.manual_seed(1234)
    x = getattr(Tensor, kind)(10_000, device=executing.name)
    assert x.device == executing.name and x.shape == (10_000,) and x.dtype == F32
    s = x.numpy()
    mean, std = float(s.mean()), float(s.std())
    want_mean, want_std = (0.5, 1 / np.sqrt(12)) if kind == "rand" else (0.0, 1.0)
    assert abs(mean - want_mean) < 0.03 and abs(std - want_std) < 0.03, (
        f"Tensor.{kind}(10000) on {executing.name}: mean {mean:.4f} std {std:.4f}, expected about {want_mean:.4f} "
        f"and {want_std:.4f}")
    if kind == "rand":
        assert s.min() >= 0.0 and s.max() < 1.0, f"rand outside [0, 1): min {s.min()} max {s.max()}"
    assert len(np.unique(s)) > 9_000, f"Tensor.{kind}(10000) has only {len(np.unique(s))} distinct values"


@pytest.mark.tg_op("random")
def test_random_seed_reproducible(executing: Target) -> None:
    Tensor.manual_seed(7)
    a = Tensor.rand(3, 17, device=executing.name).numpy()
    b = Tensor.randn(50, device=executing.name).numpy()
    Tensor.manual_seed(7)
    d = executing.name
    assert_array("Tensor.rand after manual_seed(7), twice", d, Tensor.rand(3, 17, device=d).numpy(), a)
    assert_array("Tensor.randn after manual_seed(7), twice", d, Tensor.randn(50, device=d).numpy(), b)
    Tensor.manual_seed(8)
    c = Tensor.rand(3, 17, device=executing.name).numpy()
    assert not np.array_equal(a, c), "manual_seed(7) and manual_seed(8) gave the same rand values"


@pytest.mark.tg_op("random")
@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: d.short_name)
def test_random_same_bits_as_python(executing: Target, dtype: DType) -> None:
    """A seed draws the same bits on every device: rand and randint are integer Threefry, randn uses + - * / sqrt
    and bit operations only, which every device must round as IEEE does (no contraction into fused multiply-adds)."""
    executing.require(dtype)
    draws = {}
    for d in (executing.name, "PYTHON"):
        Tensor.manual_seed(12)
        draws[d] = (Tensor.rand(257, device=d, dtype=dtype).numpy(), Tensor.randn(513, device=d, dtype=dtype).numpy(),
                    Tensor.randint(99, low=-7, high=1000, device=d).numpy())
    for name, got, want in zip(("rand", "randn", "randint"), draws[executing.name], draws["PYTHON"]):
        assert got.shape == want.shape, f"Tensor.{name}: shape {got.shape}, PYTHON's {want.shape}"
        differ = np.flatnonzero(got != want)
        assert not differ.size, (f"Tensor.{name} of seed 12 in {dtype.short_name} differs from PYTHON's bits at "
                                 f"{differ[:5].tolist()}: {got[differ[:3]]} vs {want[differ[:3]]}")


@pytest.mark.tg_op("random")
@pytest.mark.parametrize("dtype", [F16, BF16, F64], ids=lambda d: d.short_name)
def test_random_dtypes(executing: Target, dtype: DType) -> None:
    executing.require(dtype)
    Tensor.manual_seed(3)
    x = Tensor.rand(1000, device=executing.name, dtype=dtype)
    assert x.dtype == dtype
    s = x.numpy().astype(np.float64)
    assert s.min() >= 0 and s.max() <= 1 and 0.4 < s.mean() < 0.6, f"rand in {dtype}: min {s.min()} max {s.max()}"


# ***** gradients *****

def _grad_close(what: str, target: Target, t: Tensor, exp: np.ndarray) -> None:
    assert t.grad is not None, f"{what}: no gradient was computed"
    assert_array(what, target.name, t.grad.numpy(), exp.astype(np.float32), atol=1e-5, rtol=1e-5)


@pytest.mark.tg_op("gradient")
def test_grad_matmul_relu_exp(executing: Target, rng: np.random.Generator) -> None:
    """loss = sum(relu(x @ w) * c) + mean(exp(x) * x)."""
    x, w = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    c = rng.standard_normal((4, 3)).astype(np.float32)
    tx = Tensor(x, device=executing.name, requires_grad=True)
    tw = Tensor(w, device=executing.name, requires_grad=True)
    loss = ((tx @ tw).relu() * Tensor(c, device=executing.name)).sum() + (tx.exp() * tx).mean()
    loss.backward()
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    dy = ((x64 @ w64) > 0) * c
    _grad_close("d loss / d x", executing, tx, dy @ w64.T + (np.exp(x64) * (1 + x64)) / x.size)
    _grad_close("d loss / d w", executing, tw, x64.T @ dy)


@pytest.mark.tg_op("gradient")
def test_grad_sigmoid_sqrt_log(executing: Target, rng: np.random.Generator) -> None:
    """loss = sum(log(sigmoid(a) * sqrt(b)))."""
    a, b = rng.uniform(-2, 2, (3, 4)).astype(np.float32), rng.uniform(0.5, 3, (3, 4)).astype(np.float32)
    ta = Tensor(a, device=executing.name, requires_grad=True)
    tb = Tensor(b, device=executing.name, requires_grad=True)
    (ta.sigmoid() * tb.sqrt()).log().sum().backward()
    sig = 1 / (1 + np.exp(-a.astype(np.float64)))
    _grad_close("d/da log(sigmoid(a) sqrt(b))", executing, ta, 1 - sig)
    _grad_close("d/db log(sigmoid(a) sqrt(b))", executing, tb, 0.5 / b.astype(np.float64))


@pytest.mark.tg_op("gradient")
def test_grad_broadcast_and_max(executing: Target, rng: np.random.Generator) -> None:
    """Broadcast gradients sum over the broadcast axes; max sends the gradient to the (unique) maximum."""
    a, b = rng.standard_normal((3, 1)).astype(np.float32), rng.standard_normal((1, 4)).astype(np.float32)
    wgt = rng.standard_normal((3, 4)).astype(np.float32)
    ta = Tensor(a, device=executing.name, requires_grad=True)
    tb = Tensor(b, device=executing.name, requires_grad=True)
    ((ta + tb) * Tensor(wgt, device=executing.name)).sum().backward()
    _grad_close("broadcast gradient of a (3,1)", executing, ta, wgt.sum(axis=1, keepdims=True))
    _grad_close("broadcast gradient of b (1,4)", executing, tb, wgt.sum(axis=0, keepdims=True))
    m = rng.permutation(12).reshape(3, 4).astype(np.float32)
    tm = Tensor(m, device=executing.name, requires_grad=True)
    tm.max(axis=1).sum().backward()
    _grad_close("gradient of max(axis=1)", executing, tm, (m == m.max(axis=1, keepdims=True)).astype(np.float32))


# ***** 0-d and empty tensors *****

@pytest.mark.tg_op("0-d tensors")
def test_zero_dim(executing: Target) -> None:
    d = executing.name
    a, b = Tensor(3.5, device=d), Tensor(1.25, device=d)
    s = a + b
    assert s.shape == () and s.numpy().shape == (), f"0-d + 0-d has shape {s.shape}"
    assert s.item() == 4.75, f"3.5 + 1.25 = {s.item()}"
    assert_array("exp of a 0-d tensor", d, a.exp().numpy(), np.float32(np.exp(3.5)), rtol=1e-5)
    assert_array("0-d * (3,)", d, (a * Tensor([1.0, 2.0, -1.0], device=d)).numpy(),
                 np.array([3.5, 7.0, -3.5], np.float32))
    assert_array("sum of a 0-d tensor", d, a.sum().numpy(), np.float32(3.5))
    assert_array("0-d reshape(1)", d, a.reshape(1).numpy(), np.array([3.5], np.float32))
    i = Tensor(7, device=d)
    assert i.dtype == dtypes.int32 and (i * 6 - 2).item() == 40, "int 0-d: 7 * 6 - 2"
    assert_array("Tensor([[5.0]]).sum().reshape(())", d, Tensor([[5.0]], device=d).sum().numpy(), np.float32(5.0))


@pytest.mark.tg_op("empty tensors")
def test_empty(executing: Target) -> None:
    d = executing.name
    e = Tensor.zeros(0, 3, device=d) + 1
    assert e.shape == (0, 3), f"zeros(0, 3) + 1 has shape {e.shape}"
    assert_array("zeros(0, 3) + 1", d, e.numpy(), np.zeros((0, 3), np.float32))
    x = Tensor(np.zeros((2, 0), np.float32), device=d)
    assert_array("sum over an empty axis", d, x.sum(axis=1).numpy(), np.zeros(2, np.float32))
    assert_array("sum of an empty tensor", d, x.sum().numpy(), np.float32(0))
    assert_array("reshape of an empty tensor", d, x.reshape(0, 5).numpy(), np.zeros((0, 5), np.float32))
    y = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=d)
    assert_array("cat with an empty tensor", d, y.cat(Tensor.zeros(0, 3, device=d), dim=0).numpy(),
                 np.arange(6, dtype=np.float32).reshape(2, 3))
    assert_array("empty slice", d, y[1:1].numpy(), np.zeros((0, 3), np.float32))


# ***** lookups: loads at an index computed from data *****

@pytest.mark.tg_op("gather")
@pytest.mark.parametrize("index_dtype", [I32, I64, U8], ids=lambda d: d.short_name)
def test_lookups_load_at_the_index(executing: Target, index_dtype: DType) -> None:
    """nn.Embedding, gather and x[Tensor] read each element at its index (a LOAD whose address comes from a loaded
    value, vector-wide where the row is contiguous); an out-of-range index raises before anything reads it."""
    from tgcore.errors import IndexOutOfRangeError
    from tgcore.nn import Embedding

    executing.require(index_dtype)
    rng = np.random.default_rng(7)
    table = rng.standard_normal((37, 32)).astype(np.float32)
    idx = rng.integers(0, 37, (2, 5)).astype(ref.carrier(index_dtype))
    emb = Embedding(37, 32)
    emb.weight = Tensor(table, device=executing.name)
    index = Tensor(idx, device=executing.name)
    assert_array("Embedding(37, 32) of (2, 5) ids", executing.name, emb(index).numpy(), table[idx])
    assert_array("x[Tensor (2, 5)] of (37, 32)", executing.name, emb.weight[index].numpy(), table[idx])
    cols = (idx % 32).astype(idx.dtype)
    got = emb.weight[:2].gather(1, Tensor(cols, device=executing.name)).numpy()
    assert_array("gather(1, (2, 5) ids) of (2, 32)", executing.name, got, np.take_along_axis(table[:2], cols, 1))
    with pytest.raises(IndexOutOfRangeError):
        emb(Tensor(np.array([0, 37], dtype=ref.carrier(index_dtype)), device=executing.name)).numpy()
