"""_assign_hazard (whether an assign's value reads its target at other positions) against a direct recursive
definition, and the assigns it guards computing what numpy computes."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tgcore import Tensor
from tgcore import tensor as tensor_module
from tgcore.lazy import LazyBuffer
from tgcore.nn import Linear, optim
from tgcore.ops import LoadOps, ReduceOps

REDUCES = set(ReduceOps)
OWN_KERNEL = {LoadOps.ASSIGN, LoadOps.CONTIGUOUS}


def reference_hazard(src: LazyBuffer, target: LazyBuffer) -> bool:
    """The definition, by recursion: a node reads the target if it is the target, a view of its memory, or computed
    from a node that reads it; a hazard is a read through a moved view or by a reduction. What lies below a reduce
    that is itself below a reduce is not looked at (the scheduler computes it in a kernel of its own), nor what a
    contiguous copy or another assign is computed from (each is a kernel of its own, run before: its buffer is read;
    an assign into the target's own memory counts as a read of it through a view)."""
    hazard = False

    def reads(n: LazyBuffer, under: bool) -> bool:
        nonlocal hazard
        if n is target:
            return True
        b = n.base
        if b is target.base or (b.realized is None and b.op in OWN_KERNEL and b.buffer is target.base.buffer):
            hazard = True
            return True
        if b.realized is not None or (under and b.op in REDUCES) or b.op in OWN_KERNEL:
            return False
        below = under or b.op in REDUCES
        found = any([reads(s, below) for s in b.srcs])
        if found and (n is not b or b.op in REDUCES):
            hazard = True
        return found

    reads(src, False)
    return hazard


def _square() -> Tensor:
    return Tensor(np.arange(16, dtype=np.float32).reshape(4, 4)).realize()


CASES: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], bool]] = {
    "elementwise": (lambda t, u: t * 2 + 1, False),
    "other tensor": (lambda t, u: u + 1, False),
    "transposed": (lambda t, u: t.T + 1, True),
    "flipped": (lambda t, u: t.flip(0) * u, True),
    "row sums": (lambda t, u: t.sum(1, keepdim=True).expand(4, 4), True),
    "matmul": (lambda t, u: u @ t, True),
    "matmul of other": (lambda t, u: (u @ u) + t, False),
    # the inner sum is computed in a kernel of its own before the assign: only the direct read of t remains
    "sum below sum": (lambda t, u: (t.sum(1, keepdim=True) * u).sum(0, keepdim=True).expand(4, 4) + t, False),
    "shared node": (lambda t, u: (lambda a: a * a + a)(t + u), False),
    # a contiguous copy is computed (reading t transposed) by a kernel of its own, before the assign's: no copy more
    "copy of the transposed": (lambda t, u: t.T.contiguous() * u + 1, False),
    "sum of a copy": (lambda t, u: (t.T.contiguous() + u).sum(0, keepdim=True).expand(4, 4), False),
    # a node that reads t at the top is also read by a reduce, or through a moved view: hazards all the same
    "plain and summed": (lambda t, u: (lambda r: r + r.sum(0, keepdim=True).expand(4, 4))(t * 2), True),
    "plain and transposed": (lambda t, u: (lambda r: r + r.T)(t * 2), True),
    "plain at the top": (lambda t, u: t * 0.9 + (u @ u) * 0.1, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hazard_matches_definition(name: str) -> None:
    make, expected = CASES[name]
    t, u = _square(), Tensor(np.ones((4, 4), np.float32)).realize()
    value = make(t, u).lazydata
    assert reference_hazard(value, t.lazydata) is expected
    assert tensor_module._assign_hazard(value, t.lazydata) is expected


@pytest.mark.parametrize("name", list(CASES))
def test_assign_equals_numpy(name: str) -> None:
    make, _ = CASES[name]
    t, u = _square(), Tensor(np.ones((4, 4), np.float32)).realize()
    expected = make(Tensor(t.numpy()), Tensor(u.numpy())).numpy()
    t.assign(make(t, u)).realize()
    np.testing.assert_allclose(t.numpy(), expected, rtol=1e-6)


def test_training_step_assigns_match_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every assign of Adam steps on an MLP (a graph with reduces below reduces, views and shared nodes): the check
    against the definition, and none a hazard (Adam's step on LazyBuffers makes its assigns without the check,
    optim._assign, because its new values cannot be one)."""
    rng = np.random.default_rng(0)
    layers = [Linear(12, 8), Linear(8, 8), Linear(8, 3)]
    opt = optim.Adam([p for layer in layers for p in (layer.weight, layer.bias)], lr=1e-2)
    x = Tensor(rng.standard_normal((5, 12)).astype(np.float32))
    y = Tensor(rng.integers(0, 3, 5).astype(np.int32))
    real = tensor_module._assign_hazard
    seen: list[tuple[bool, bool]] = []

    def checked(src: Any, target: Any) -> bool:
        got = real(src, target)
        seen.append((got, reference_hazard(src, target)))
        return got

    plain_assign = optim._assign

    def checked_assign(t: Tensor, value: LazyBuffer) -> None:
        target = t.lazydata
        if isinstance(target, LazyBuffer) and target.realized is not None:  # (what Tensor.assign would check)
            checked(value, target)
        plain_assign(t, value)

    monkeypatch.setattr(tensor_module, "_assign_hazard", checked)
    monkeypatch.setattr(optim, "_assign", checked_assign)
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            h = x
            for i, layer in enumerate(layers):
                h = layer(h)
                h = h.relu() if i < len(layers) - 1 else h
            loss = h.sparse_categorical_crossentropy(y)
            loss.backward()
            Tensor.realize(loss, *opt.schedule_step())
    assert len(seen) > 20
    assert all(got == want for got, want in seen)
    assert not any(want for _, want in seen)
