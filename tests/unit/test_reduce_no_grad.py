"""A reduction that records no gradient (an input without one, or under no_grad) is built on the LazyBuffer directly,
without its Functions: the same kernels as the recorded path's forward, numpy's values, and the result's flags."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.engine.schedule import create_schedule
from tgcore.function import Function
from tgcore.ops import LazyOp

CASES = [
    ((6,), None),
    ((4, 5), -1),
    ((4, 5), 0),
    ((2, 3, 4), (0, 2)),
    ((3, 1, 4), 1),
    ((2, 3, 4), None),
    ((1 << 16,), 0),
    ((256, 256), None),  # (split in two stages, from a 2-d view)
    ((3, 40001), None),  # (split, padded to whole parts)
]
OPS: dict[str, tuple[Callable[..., Tensor], Callable[..., np.ndarray]]] = {
    "sum": (Tensor.sum, np.sum),
    "max": (Tensor.max, np.max),
    "mean": (Tensor.mean, np.mean),
}


def _same_tree(a: LazyOp, b: LazyOp) -> bool:
    return a.op is b.op and a.arg == b.arg and len(a.src) == len(b.src) and all(map(_same_tree, a.src, b.src))


def _kernels(t: Tensor) -> list[LazyOp]:
    return [si.ast for si in create_schedule([t.lazydata])]


@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("op,keepdim", list(itertools.product(OPS, [False, True])))
@pytest.mark.parametrize("how", ["input without gradient", "under no_grad"])
def test_a_reduction_that_records_nothing_builds_the_recorded_graph_without_functions(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], axis: Any, op: str, keepdim: bool, how: str
) -> None:
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    reduce, reference = OPS[op]
    recorded = reduce(Tensor(x, requires_grad=True), axis, keepdim=keepdim)
    assert recorded._ctx is not None
    applied: list[str] = []
    apply = Function.apply.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        Function, "apply", classmethod(lambda cls, *a, **k: applied.append(cls.__name__) or apply(cls, *a, **k))
    )
    if how == "under no_grad":
        with Tensor.inference_mode():
            out = reduce(Tensor(x, requires_grad=True), axis, keepdim=keepdim)
        assert out.requires_grad is True  # (as any op's result under no_grad: the flag kept, nothing recorded)
    else:
        out = reduce(Tensor(x), axis, keepdim=keepdim)
        assert out.requires_grad is None
    assert out._ctx is None and not {"Sum", "Max", "Reshape"} & set(applied), applied
    assert out.shape == recorded.shape == reference(x, axis=axis, keepdims=keepdim).shape
    kf, kr = _kernels(out), _kernels(recorded)
    assert len(kf) == len(kr) and all(map(_same_tree, kf, kr))
    np.testing.assert_array_equal(out.numpy(), recorded.numpy())
    np.testing.assert_allclose(
        out.numpy(), reference(x.astype(np.float64), axis=axis, keepdims=keepdim), rtol=1e-5, atol=1e-5
    )


def test_a_reduction_of_a_tensor_that_needs_a_gradient_still_records_it() -> None:
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    x.max(1).sum().backward()
    assert x.grad is not None and x.grad.numpy().tolist() == [[0, 0, 1], [0, 0, 1]]
