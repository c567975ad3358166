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


def test_unrealized_outputs_in_a_list_or_dict_are_realized_and_replayed():
    @TinyJit
    def f(x: Tensor) -> dict:
        return {"double": [x * 2, x + 1], "neg": -x}

    for i in range(5):
        xn = np.full(3, i, np.float32)
        out = f(Tensor(xn))
        np.testing.assert_array_equal(out["double"][0].numpy(), xn * 2)
        np.testing.assert_array_equal(out["double"][1].numpy(), xn + 1)
        np.testing.assert_array_equal(out["neg"].numpy(), -xn)


def test_the_same_tensor_twice_is_an_error():
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a + b).realize()

    x = Tensor([1.0, 2.0]).realize()
    with pytest.raises(JitError, match="same tensor"):
        for _ in range(3):
            f(x, x)
    g = TinyJit(lambda a, b: (a * b).realize())
    for _ in range(3):
        g(Tensor([1.0, 2.0]).realize(), Tensor([3.0, 4.0]).realize())
    with pytest.raises(JitError, match="same tensor"):
        g(x, x)


def test_an_input_of_another_layout_is_an_error():
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return (a * 2).realize()

    base = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    for i in range(3):
        np.testing.assert_array_equal(f(base[:, 1:3]).numpy(), np.arange(12).reshape(3, 4)[:, 1:3] * 2)
    with pytest.raises(JitError, match="layout"):
        f(base[:, 2:4])
    with pytest.raises(JitError, match="layout"):
        f(Tensor.ones(3, 2).contiguous().realize())


def test_keyword_arguments_in_another_order_replay():
    @TinyJit
    def f(*, a: Tensor, b: Tensor) -> Tensor:
        return (a - b).realize()

    for i in range(4):
        an, bn = np.full(2, 10.0 + i, np.float32), np.full(2, float(i), np.float32)
        out = f(a=Tensor(an), b=Tensor(bn)) if i % 2 else f(b=Tensor(bn), a=Tensor(an))
        np.testing.assert_array_equal(out.numpy(), an - bn)


def test_a_kernel_whose_output_size_is_symbolic():
    """A launch size that is symbolic (the output of a shrink to a Variable) runs, and replays for every size."""
    a = Tensor(np.arange(40, dtype=np.float32).reshape(4, 10)).realize()

    @TinyJit
    def f(n: Variable) -> Tensor:
        return (a.shrink((None, (0, n))) * 2).contiguous().sum(1).realize()

    for n in (3, 5, 7, 2):
        out = f(Variable("n", 1, 10).bind(n))
        np.testing.assert_array_equal(out.numpy(), (np.arange(40).reshape(4, 10)[:, :n] * 2).sum(1))
