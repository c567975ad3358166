"""Optimizers against numpy re-implementations of the same update rules, over a few steps."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from tgcore import Tensor, TinyJit, dtypes
from tgcore.nn import optim
from tgcore.nn.optim import LAMB, LARS, SGD, Adam, AdamW, Optimizer, OptimizerGroup

STEPS = 3


@pytest.fixture(autouse=True)
def _training() -> Iterator[None]:
    prev = Tensor.training
    Tensor.training = True
    yield
    Tensor.training = prev


def _problem(seed: int = 0, shapes: tuple[tuple[int, ...], ...] = ((3, 4), (4,))) -> list[dict[str, np.ndarray]]:
    """Parameters p and the constants of loss = sum(c * p**2 + d * p), whose gradient is 2 c p + d."""
    rng = np.random.default_rng(seed)
    return [
        {
            "p": rng.standard_normal(s).astype(np.float32),
            "c": rng.uniform(0.5, 1.5, s).astype(np.float32),
            "d": rng.standard_normal(s).astype(np.float32),
        }
        for s in shapes
    ]


def _run_tgcore(problem: list[dict[str, np.ndarray]], make: Callable[[list[Tensor]], Optimizer]) -> list[np.ndarray]:
    params = [Tensor(q["p"].copy(), requires_grad=True) for q in problem]
    opt = make(params)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = sum(((p * p * Tensor(q["c"]) + p * Tensor(q["d"])).sum() for p, q in zip(params, problem)), Tensor(0.0))
        loss.backward()
        opt.step()
    return [p.numpy() for p in params]


def _grad(q: dict[str, np.ndarray], p: np.ndarray) -> np.ndarray:
    return 2 * q["c"].astype(np.float64) * p + q["d"]


def _lars_np(
    problem: list[dict[str, np.ndarray]],
    lr: float,
    momentum: float,
    wd: float,
    nesterov: bool,
    classic: bool,
    tcoef: float,
) -> list[np.ndarray]:
    out = []
    for q in problem:
        p, b = q["p"].astype(np.float64), np.zeros(q["p"].shape)
        for _ in range(STEPS):
            g = _grad(q, p)
            trust = 1.0
            if tcoef:
                wn, gn = np.sqrt((p * p).sum()), np.sqrt((g * g).sum())
                trust = tcoef * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
            g = g + wd * p
            if classic:
                g = g * trust * lr
            if momentum:
                b = momentum * b + g
                g = g + momentum * b if nesterov else b
            if not classic:
                g = g * trust * lr
            p = p - g
        out.append(p)
    return out


def _lamb_np(
    problem: list[dict[str, np.ndarray]], lr: float, b1: float, b2: float, eps: float, wd: float, adam: bool
) -> list[np.ndarray]:
    out = []
    for q in problem:
        p, m, v = q["p"].astype(np.float64), np.zeros(q["p"].shape), np.zeros(q["p"].shape)
        for t in range(1, STEPS + 1):
            g = _grad(q, p)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            up = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p
            trust = 1.0
            if not adam:
                wn, un = np.sqrt((p * p).sum()), np.sqrt((up * up).sum())
                trust = wn / un if wn > 0 and un > 0 else 1.0
            p = p - lr * trust * up
        out.append(p)
    return out


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    "momentum,wd,nesterov,classic",
    [
        (0.0, 0.0, False, False),
        (0.9, 0.0, False, False),
        (0.9, 0.1, True, False),
        (0.8, 0.05, False, True),
        (0.0, 0.2, False, True),
    ],
)
def test_sgd_matches_numpy(momentum: float, wd: float, nesterov: bool, classic: bool) -> None:
    problem = _problem()
    got = _run_tgcore(
        problem, lambda ps: SGD(ps, lr=0.05, momentum=momentum, weight_decay=wd, nesterov=nesterov, classic=classic)
    )
    _close(got, _lars_np(problem, 0.05, momentum, wd, nesterov, classic, tcoef=0.0))


@pytest.mark.parametrize("nesterov,classic", [(False, True), (True, False)])
def test_lars_matches_numpy(nesterov: bool, classic: bool) -> None:
    problem = _problem(1)
    got = _run_tgcore(problem, lambda ps: LARS(ps, lr=0.5, nesterov=nesterov, classic=classic, tcoef=0.01))
    _close(got, _lars_np(problem, 0.5, 0.9, 1e-4, nesterov, classic, tcoef=0.01))


def test_lamb_matches_numpy() -> None:
    problem = _problem(2)
    got = _run_tgcore(problem, lambda ps: LAMB(ps, lr=0.01, weight_decay=0.1))
    _close(got, _lamb_np(problem, 0.01, 0.9, 0.999, 1e-6, 0.1, adam=False))


def test_adam_matches_numpy() -> None:
    problem = _problem(3)
    got = _run_tgcore(problem, lambda ps: Adam(ps, lr=0.01))
    _close(got, _lamb_np(problem, 0.01, 0.9, 0.999, 1e-8, 0.0, adam=True))


def test_adamw_matches_numpy() -> None:
    problem = _problem(4)
    got = _run_tgcore(problem, lambda ps: AdamW(ps, lr=0.01, b1=0.8, b2=0.99, weight_decay=0.05))
    _close(got, _lamb_np(problem, 0.01, 0.8, 0.99, 1e-8, 0.05, adam=True))


def test_optimizer_group_steps_each_member() -> None:
    problem = _problem(5)
    params = [Tensor(q["p"].copy(), requires_grad=True) for q in problem]
    group = OptimizerGroup(SGD([params[0]], lr=0.05, momentum=0.9), Adam([params[1]], lr=0.01))
    assert group.params == params and isinstance(group[1], Adam)
    for _ in range(STEPS):
        group.zero_grad()
        assert all(p.grad is None for p in params)
        loss = sum(((p * p * Tensor(q["c"]) + p * Tensor(q["d"])).sum() for p, q in zip(params, problem)), Tensor(0.0))
        loss.backward()
        group.step()
    _close([params[0].numpy()], _lars_np(problem[:1], 0.05, 0.9, 0.0, False, False, 0.0))
    _close([params[1].numpy()], _lamb_np(problem[1:], 0.01, 0.9, 0.999, 1e-8, 0.0, adam=True))


def test_scalar_parameter_keeps_its_shape() -> None:
    for make in (lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.1)):
        p = Tensor(2.0, requires_grad=True)
        opt = make([p])
        (p * p).backward()
        opt.step()
        assert p.shape == ()
    assert abs(p.item() - 1.9) < 1e-5  # Adam's first step is lr * sign(g)


def test_lr_is_a_tensor_that_can_be_changed() -> None:
    p = Tensor([1.0, 2.0], requires_grad=True)
    opt = SGD([p], lr=0.5)
    assert opt.lr.dtype == dtypes.float32 and opt.lr.shape == (1,)
    opt.lr.assign(Tensor([0.25])).realize()
    p.sum().backward()
    opt.step()
    np.testing.assert_allclose(p.numpy(), [0.75, 1.75])


def test_params_and_buffers() -> None:
    w, b = Tensor([1.0]), Tensor([2.0], requires_grad=True)
    stat = Tensor([3.0], requires_grad=False)
    opt = SGD([w, b, b, stat])
    assert w.requires_grad is True  # None becomes True inside an optimizer
    assert opt.params == [w, b] and opt.buffers == [stat]
    with pytest.raises(ValueError, match="no parameters"):
        SGD([stat])


def test_step_needs_training_mode_and_gradients() -> None:
    p = Tensor([1.0], requires_grad=True)
    opt = Adam([p])
    with pytest.raises(RuntimeError, match="no gradient"):
        opt.step()
    p.sum().backward()
    Tensor.training = False
    with pytest.raises(RuntimeError, match="Tensor.training"):
        opt.step()
    assert p.numpy().tolist() == [1.0]


def test_half_parameters_keep_their_dtype() -> None:
    p = Tensor([1.0, -1.0], dtype=dtypes.float16, requires_grad=True)
    opt = Adam([p], lr=0.1)
    (p * p).sum().backward()
    opt.step()
    assert p.dtype == dtypes.float16 and opt.m[0].dtype == dtypes.float32
    np.testing.assert_allclose(p.numpy(), [0.9, -0.9], rtol=1e-3)


# signatures and defaults of tinygrad 0.9.0, so that positional and keyword calls mean the same thing
SIGNATURES: dict[str, list[tuple[str, Any]]] = {
    "SGD": [
        ("params", None),
        ("lr", 0.001),
        ("momentum", 0.0),
        ("weight_decay", 0.0),
        ("nesterov", False),
        ("classic", False),
    ],
    "LARS": [
        ("params", None),
        ("lr", 0.001),
        ("momentum", 0.9),
        ("weight_decay", 1e-4),
        ("nesterov", False),
        ("classic", True),
        ("tcoef", 0.001),
    ],
    "Adam": [("params", None), ("lr", 0.001), ("b1", 0.9), ("b2", 0.999), ("eps", 1e-8)],
    "AdamW": [("params", None), ("lr", 0.001), ("b1", 0.9), ("b2", 0.999), ("eps", 1e-8), ("weight_decay", 0.01)],
    "LAMB": [
        ("params", None),
        ("lr", 0.001),
        ("b1", 0.9),
        ("b2", 0.999),
        ("eps", 1e-6),
        ("weight_decay", 0.0),
        ("adam", False),
    ],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_match_tinygrad(name: str) -> None:
    params = list(inspect.signature(getattr(optim, name)).parameters.values())
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == SIGNATURES[name]


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.1)])
def test_step_inside_tinyjit_matches_eager(make: Callable[[list[Tensor]], Optimizer]) -> None:
    def train(use_jit: bool) -> np.ndarray:
        w = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), requires_grad=True)
        opt = make([w])

        def step(x: Tensor) -> Tensor:
            opt.zero_grad()
            loss = ((x @ w) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.realize()

        run = TinyJit(step) if use_jit else step
        rng = np.random.default_rng(0)
        for _ in range(4):  # the jit records on the second call and replays on the rest
            run(Tensor(rng.standard_normal((2, 4)).astype(np.float32)))
        return w.numpy()

    np.testing.assert_array_equal(train(True), train(False))


def _same_tree(a: Any, b: Any) -> bool:
    return a.op is b.op and a.arg == b.arg and len(a.src) == len(b.src) and all(map(_same_tree, a.src, b.src))


@pytest.mark.parametrize(
    "make",
    [lambda ps: Adam(ps, lr=0.01), lambda ps: AdamW(ps, lr=0.01, weight_decay=0.1)],
    ids=["Adam", "AdamW"],
)
def test_adam_on_float32_builds_its_step_on_lazybuffers_with_the_tensor_steps_kernels(
    make: Callable[[list[Tensor]], Optimizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adam's step on float32 parameters (LAMB._plain_step) builds on LazyBuffers the graph its Tensor ops build: the
    same kernels step after step, and the same parameters."""
    from tgcore.engine.schedule import create_schedule

    problem = _problem(3, ((3, 4), (4,), ()))
    runs = []
    for plain in (True, False):
        if not plain:
            monkeypatch.setattr(LAMB, "_plain", lambda self: False)
        params = [Tensor(q["p"].copy(), requires_grad=True) for q in problem]
        opt = make(params)
        steps = []
        for _ in range(STEPS):
            opt.zero_grad()
            terms = [(p * p * Tensor(q["c"]) + p * Tensor(q["d"])).sum() for p, q in zip(params, problem)]
            sum(terms, Tensor(0.0)).backward()
            assert opt._plain() is plain  # type: ignore[attr-defined]
            outs = opt.schedule_step()
            steps.append([si.ast for si in create_schedule([t.lazydata for t in outs])])
            Tensor.realize(*outs)
        runs.append((steps, [p.numpy() for p in params]))
    (plain_steps, plain_params), (tensor_steps, tensor_params) = runs
    for a, b in zip(plain_steps, tensor_steps):
        assert len(a) == len(b) and all(map(_same_tree, a, b))
    for a, b in zip(plain_params, tensor_params):
        np.testing.assert_array_equal(a, b)


def test_adam_on_float16_parameters_takes_the_tensor_steps() -> None:
    p = Tensor(np.ones(3, np.float16), requires_grad=True)
    opt = Adam([p])
    (p * p).sum().backward()
    assert not opt._plain()  # type: ignore[attr-defined]
