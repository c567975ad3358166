"""CLANG's C thread pool (tg_clang/pool.py): every part of a threaded launch runs exactly once with its own bounds, from
any number of callers at once, in a forked child, and without the pool (the core's Python threads) alike."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest
from tg_clang.compiler import ClangCompiler
from tg_clang.pool import MAX_VALS
from tg_clang.runtime import ClangProgram

from tgcore import Tensor, TinyJit
from tgcore.engine.runner import CompiledRunner

# adds vals[0] + i to out[i] for each i of its part [vals[n], vals[n + 1]) (n = vals[1]): a part run twice, or not at
# all, or with another part's bounds leaves a wrong element
_KERNEL = """
#include <stdint.h>
void parts(uintptr_t *bufs, const long long *vals) {
  long long *out = (long long *)bufs[0];
  long long n = vals[1];
  for (long long i = vals[n]; i < vals[n + 1]; i++) out[i] += vals[0] + i;
}
"""


@pytest.fixture(scope="module")
def program() -> ClangProgram:
    return ClangProgram("CLANG", "parts", ClangCompiler().compile_cached(_KERNEL))


def _run(prg: ClangProgram, extent: int, parts: int, threads: int, extra: int = 0) -> np.ndarray:
    out = (ctypes.c_longlong * extent)()
    vals = (5, 2 + extra) + (0,) * extra
    prg.run_parts(out, vals=vals, bounds=tuple(extent * i // parts for i in range(parts + 1)), threads=threads)
    return np.frombuffer(out, dtype=np.int64)


def test_the_pool_builds_and_loads(program: ClangProgram) -> None:
    assert program.supports_parts


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("extent,parts", [(1, 1), (7, 7), (64, 8), (1000, 3), (100_000, 64)])
def test_every_part_runs_once_with_its_bounds(program: ClangProgram, threads: int, extent: int, parts: int) -> None:
    np.testing.assert_array_equal(_run(program, extent, parts, threads), 5 + np.arange(extent))


def test_many_vals_and_the_most_the_pool_takes(program: ClangProgram) -> None:
    for extra in (0, 10, MAX_VALS - 2):  # vals of MAX_VALS in all: through the pool
        np.testing.assert_array_equal(_run(program, 500, 8, 2, extra), 5 + np.arange(500))
    # more vals than the pool's per-part array holds: the parts run one by one on this thread, still each once
    np.testing.assert_array_equal(_run(program, 500, 8, 2, MAX_VALS), 5 + np.arange(500))


def test_idle_workers_stop_spinning(program: ClangProgram) -> None:
    """After a job the workers spin (pauses, then yields) for at most 0.5 ms, then sleep: a process whose kernels have
    stopped uses no CPU. Over 0.3 s of idling (after 0.1 s of grace) its CPU time stays far below the wall time that
    3 spinning workers would burn."""
    import time

    np.testing.assert_array_equal(_run(program, 1000, 8, 4), 5 + np.arange(1000))
    time.sleep(0.1)
    cpu = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - cpu < 0.05


def test_callers_on_several_threads_at_once(program: ClangProgram) -> None:
    # one job at a time goes to the pool; a caller that finds it busy runs its parts itself
    failures: list[str] = []

    def caller(seed: int) -> None:
        for j in range(200):
            extent = 1 + (seed * 131 + j * 17) % 3000
            got = _run(program, extent, min(extent, 1 + j % 9), 2 + j % 3)
            if not np.array_equal(got, 5 + np.arange(extent)):
                failures.append(f"caller {seed}, call {j}")

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert failures == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_starts_threads_of_its_own(program: ClangProgram) -> None:
    _run(program, 1000, 8, 2)  # the parent's workers are running
    pid = os.fork()
    if pid == 0:  # the child: its pool must not wait for the parent's threads
        ok = np.array_equal(_run(program, 1000, 8, 2), 5 + np.arange(1000))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_threaded_kernels_match_numpy_through_the_pool_and_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import tg_clang.runtime

    monkeypatch.setenv("TGCORE_THREADS", "2")
    w_np = np.random.default_rng(1).standard_normal((1024, 96)).astype(np.float32)
    for rows, with_pool in ((256, True), (192, False)):  # (other shapes: kernels of their own, new Programs)
        if not with_pool:  # as where the pool does not build: the core's Python threads run the parts
            monkeypatch.setattr(tg_clang.runtime, "pool", lambda ffi: None)
        x_np = np.random.default_rng(rows).standard_normal((rows, 1024)).astype(np.float32)
        expected_silu = x_np / (1 + np.exp(-x_np.astype(np.float64)))
        x, w = Tensor(x_np, device="CLANG"), Tensor(w_np, device="CLANG")
        step = TinyJit(lambda x, w: ((x @ w).relu().sum(0), x.silu()))
        for _ in range(3):
            s, silu = step(x, w)
            np.testing.assert_allclose(s.numpy(), np.maximum(x_np @ w_np, 0).sum(0), rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(silu.numpy(), expected_silu, rtol=1e-6, atol=1e-30)
        runners = [item.prg for item in step.jit_cache if isinstance(item.prg, CompiledRunner)]
        threaded = [r for r in runners if r.p.thread_extent is not None]
        assert threaded and all(r.own_threads is with_pool for r in threaded)
