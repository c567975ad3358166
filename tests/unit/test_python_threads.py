"""tgcore used from several Python threads at once: realizing graphs that share nodes, TinyJit capture and replay, and
random draws, each thread getting its own right results."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from tgcore import Tensor, TinyJit

THREADS = 4


def _in_threads(work: Callable[[int], None]) -> None:
    """Run work(i) on THREADS threads started together; re-raise the first error."""
    barrier, errors = threading.Barrier(THREADS), []

    def run(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_one_jitted_function_from_several_threads() -> None:
    w = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3)).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x @ w).relu() * 2

    wrong: list[int] = []

    def work(i: int) -> None:
        rng = np.random.default_rng(i)
        for _ in range(100):
            xn = rng.standard_normal((2, 4)).astype(np.float32)
            got = f(Tensor(xn)).numpy()
            if not np.allclose(got, np.maximum(xn @ w.numpy(), 0) * 2, rtol=1e-5, atol=1e-5):
                wrong.append(i)

    _in_threads(work)
    assert not wrong, f"{len(wrong)} wrong results, from threads {sorted(set(wrong))}"


def test_graphs_sharing_nodes_realized_from_several_threads() -> None:
    base = Tensor(np.arange(64, dtype=np.float32))
    shared = base * 3 + 1  # not computed: every thread's graph reads it
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for k in range(30):
            results[i] = ((shared + i) * (k + 1)).sum().numpy()

    _in_threads(work)
    ref = np.arange(64, dtype=np.float32) * 3 + 1
    for i, got in results.items():
        np.testing.assert_allclose(got, ((ref + i) * 30).sum(), rtol=1e-6)


def test_random_draws_from_several_threads_are_all_different() -> None:
    draws: list[bytes] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for _ in range(20):
            d = Tensor.rand(8).numpy().tobytes()
            with lock:
                draws.append(d)

    _in_threads(work)
    assert len(set(draws)) == len(draws) == THREADS * 20
