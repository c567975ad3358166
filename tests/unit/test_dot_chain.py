"""Tensor.dot of two float tensors of one dtype is one Function (function.Chain) of the steps the general path applies
one by one: the same kernels forward and backward, and numpy's values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.dtype import DType
from tgcore.engine.schedule import create_schedule
from tgcore.function import Chain
from tgcore.ops import LazyOp

SHAPES = [
    ((5,), (5,)),
    ((5,), (5, 3)),
    ((4, 5), (5,)),
    ((4, 5), (5, 3)),
    ((2, 4, 5), (5, 3)),
    ((4, 5), (2, 5, 3)),
    ((2, 1, 4, 5), (3, 5, 2)),
    ((3, 4, 5), (3, 5, 2)),
]


def _same_tree(a: LazyOp, b: LazyOp) -> bool:
    return a.op is b.op and a.arg == b.arg and len(a.src) == len(b.src) and all(map(_same_tree, a.src, b.src))


def _step_by_step(a: Tensor, b: Tensor) -> Tensor:
    """dot as the general path writes it: reshapes, a transpose, a broadcast product and a sum, each an apply."""
    ones = [1] * min(a.ndim - 1, b.ndim - 1, 1)
    x = a.reshape(*a.shape[:-1], *ones, a.shape[-1])
    w = b.reshape(*b.shape[:-2], *ones, *b.shape[-min(b.ndim, 2) :]).transpose(-1, -min(b.ndim, 2))
    return (x * w).sum(-1)


def _kernels(t: Tensor) -> list[LazyOp]:
    return [si.ast for si in create_schedule([t.lazydata])]


@pytest.mark.parametrize(
    "shapes,dtype,needs",
    list(itertools.product(SHAPES, [dtypes.float32, dtypes.float16], [(True, True), (True, False), (False, True)])),
)
def test_dot_as_one_function_gives_the_step_by_step_kernels_and_numpy_values(
    shapes: tuple[tuple[int, ...], tuple[int, ...]], dtype: DType, needs: tuple[bool, bool]
) -> None:
    rng = np.random.default_rng(len(shapes[0]) * 10 + len(shapes[1]))
    a_np, b_np = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    results = []
    for fast in (True, False):
        a0, b0 = Tensor(a_np, requires_grad=needs[0]), Tensor(b_np, requires_grad=needs[1])
        a, b = a0.cast(dtype), b0.cast(dtype)
        out = a @ b if fast else _step_by_step(a, b)
        assert isinstance(out._ctx, Chain) == fast
        out.float().sum().backward()
        results.append([out, a0.grad, b0.grad])
    for fast, slow, needed in zip(results[0], results[1], (True, *needs)):
        assert (fast is None) == (slow is None) == (not needed)
        if fast is not None:
            kf, ks = _kernels(fast), _kernels(slow)
            assert len(kf) == len(ks) and all(map(_same_tree, kf, ks))
            np.testing.assert_array_equal(fast.numpy(), slow.numpy())
    a64, b64 = a_np.astype(dtype.np).astype(np.float64), b_np.astype(dtype.np).astype(np.float64)
    tol = 2e-2 if dtype == dtypes.float16 else 1e-5
    np.testing.assert_allclose(results[0][0].numpy().astype(np.float64), np.matmul(a64, b64), rtol=tol, atol=tol)
    if needs[0] and a64.ndim == b64.ndim == 2:  # d(sum(a @ b))/da = ones @ b.T
        ga = np.ones((a64.shape[0], b64.shape[1])) @ b64.T
        np.testing.assert_allclose(results[0][1].numpy(), ga, rtol=tol, atol=tol)


@pytest.mark.parametrize("shapes,dtype", list(itertools.product(SHAPES, [dtypes.float32, dtypes.float16])))
@pytest.mark.parametrize("how", ["inputs without gradient", "under no_grad"])
def test_dot_that_records_nothing_builds_the_same_graph_on_the_lazybuffers(
    monkeypatch: pytest.MonkeyPatch, shapes: tuple[tuple[int, ...], tuple[int, ...]], dtype: DType, how: str
) -> None:
    # where no gradient is recorded, the plan's steps run on the LazyBuffers without a Function each: no Chain, the
    # same kernels as the recorded Chain's forward, the same values
    rng = np.random.default_rng(len(shapes[0]) * 10 + len(shapes[1]) + 1)
    a_np, b_np = (rng.standard_normal(s).astype(dtype.np) for s in shapes)
    recorded = Tensor(a_np, requires_grad=True) @ Tensor(b_np)
    assert isinstance(recorded._ctx, Chain)
    applied: list[int] = []
    apply = Chain.apply.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Chain, "apply", classmethod(lambda cls, *a, **k: applied.append(1) or apply(cls, *a, **k)))
    if how == "under no_grad":
        a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=False)
        with Tensor.inference_mode():
            out = a @ b
        assert out.requires_grad is True  # (as any op's result under no_grad: the flag kept, nothing recorded)
    else:
        out = Tensor(a_np) @ Tensor(b_np, requires_grad=False)
        assert out.requires_grad is None
    assert out._ctx is None and out.dtype == dtype and applied == []
    kf, kr = _kernels(out), _kernels(recorded)
    assert len(kf) == len(kr) and all(map(_same_tree, kf, kr))
    np.testing.assert_array_equal(out.numpy(), recorded.numpy())
    tol = 2e-2 if dtype == dtypes.float16 else 1e-5
    expected = np.matmul(a_np.astype(np.float64), b_np.astype(np.float64))
    np.testing.assert_allclose(out.numpy().astype(np.float64), expected, rtol=tol, atol=tol)


def test_dot_of_mixed_dtypes_or_an_accumulation_dtype_takes_the_general_path() -> None:
    a, b = Tensor([[1, 2], [3, 4]], dtype=dtypes.int32), Tensor([[0.5, 1.0], [2.0, 1.5]])
    out = a @ b
    assert not isinstance(out._ctx, Chain) and out.dtype == dtypes.float32
    np.testing.assert_array_equal(out.numpy(), np.array([[1, 2], [3, 4]]) @ np.array([[0.5, 1.0], [2.0, 1.5]]))
    c = Tensor([[1.0, 2.0]], dtype=dtypes.float16).dot(Tensor([[3.0], [4.0]], dtype=dtypes.float16), dtypes.float32)
    assert c.dtype == dtypes.float32 and c.numpy().tolist() == [[11.0]]


def test_dot_keeps_shape_errors() -> None:
    with pytest.raises(ValueError, match="do not align"):
        Tensor.ones(2, 3) @ Tensor.ones(4, 2)


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("view", ["base", "transposed", "sliced"])
def test_dot_without_gradient_reuses_its_views_trackers_for_new_tensors(
    monkeypatch: pytest.MonkeyPatch, shapes: tuple[tuple[int, ...], tuple[int, ...]], view: str
) -> None:
    # a product that records nothing keeps, per pair of input trackers, the trackers of the inputs' last views: a
    # second product of other tensors with the same trackers makes the same graph over its own buffers
    import tgcore.tensor as tensor_module

    def operand(shape: tuple[int, ...], seed: int) -> tuple[Tensor, np.ndarray]:
        rng = np.random.default_rng(seed)
        if view == "base" or len(shape) < 2:
            a = rng.standard_normal(shape).astype(np.float32)
            return Tensor(a), a
        if view == "transposed":
            a = rng.standard_normal((*shape[:-2], shape[-1], shape[-2])).astype(np.float32)
            return Tensor(a).transpose(-1, -2), np.swapaxes(a, -1, -2)
        a = rng.standard_normal((*shape[:-1], shape[-1] + 3)).astype(np.float32)
        return Tensor(a)[..., 1 : 1 + shape[-1]], a[..., 1 : 1 + shape[-1]]

    tensor_module._DOT_VIEWS.clear()
    stepwise = tensor_module._dot_views
    built: list[int] = []
    monkeypatch.setattr(tensor_module, "_dot_views", lambda *a: built.append(1) or stepwise(*a))
    outs, expected = [], []
    for seed in (0, 1):  # the first builds the views step by step, the second from the kept trackers
        (a, a_np), (b, b_np) = operand(shapes[0], seed), operand(shapes[1], seed + 10)
        outs.append(a @ b)
        expected.append(np.matmul(a_np, b_np))
    assert len(tensor_module._DOT_VIEWS) == 1 and len(built) == 1  # (the second product's views from the kept ones)
    first, second = (out.lazydata.base.srcs[0] for out in outs)  # the products (under the sum)
    for x0, x1 in zip(first.srcs, second.srcs):
        assert x0.st == x1.st and (x0._base is None) == (x1._base is None) and x0.base is not x1.base
    k0, k1 = _kernels(outs[0]), _kernels(outs[1])
    assert len(k0) == len(k1) and all(map(_same_tree, k0, k1))
    for out, want in zip(outs, expected):
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
