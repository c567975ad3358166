"""TinyJit: capture on the second call, replay from the third with new inputs, symbolic shapes, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import GlobalCounters, Tensor, TinyJit, Variable
from tgcore.engine.jit import JitError

rng = np.random.default_rng(0)
W = rng.standard_normal((4, 3)).astype(np.float32)


def test_replay_gives_fresh_results_and_runs_only_recorded_kernels():
    w = Tensor(W).realize()
    calls = []

    @TinyJit
    def f(x: Tensor) -> Tensor:
        calls.append(1)
        return (x @ w).relu() * 2

    for i in range(5):
        xn = rng.standard_normal((2, 4)).astype(np.float32)
        GlobalCounters.reset()
        out = f(Tensor(xn)).numpy()
        np.testing.assert_allclose(out, np.maximum(xn @ W, 0) * 2, rtol=1e-5, atol=1e-6)
        if i >= 2:
            assert GlobalCounters.kernel_count == 1
    assert len(calls) == 2  # the Python function runs for the warm-up and the capture only


def test_changed_input_shape_is_a_clear_error():
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x + 1

    for _ in range(3):
        f(Tensor.ones(2, 3))
    with pytest.raises(JitError, match=r"\(2, 3\).*\(3, 3\)"):
        f(Tensor.ones(3, 3))


def test_function_without_kernels_is_an_error():
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x

    f(Tensor([1.0]).realize())
    with pytest.raises(JitError, match="no kernel"):
        f(Tensor([1.0]).realize())


def test_symbolic_shapes_replay_one_recording():
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a * 2 + 1).sum(1).realize()

    for n in (3, 5, 7, 4, 9):
        x = np.arange(3 * n, dtype=np.float32).reshape(3, n)
        a = Tensor(x).reshape(3, Variable("i", 1, 10).bind(n))
        GlobalCounters.reset()
        np.testing.assert_allclose(f(a).numpy(), (x * 2 + 1).sum(1))
        assert GlobalCounters.kernel_count == 1


def test_symbolic_reshape_checks_the_bound_size():
    with pytest.raises(ValueError, match="cannot reshape"):
        Tensor.ones(3, 3).reshape(3, Variable("i", 1, 10).bind(4))


def test_unbound_variable_argument_is_an_error():
    @TinyJit
    def f(x: Tensor, v: Variable) -> Tensor:
        return x + 1

    with pytest.raises(JitError, match="bound"):
        f(Tensor([1.0]), Variable("j", 1, 4))
