"""a. matmul: C = A @ B for N x N float32 matrices, in GFLOP/s (2 N^3 flops).

tgcore has no kernel optimizer yet, so a large N can take minutes on a CPU device: a size is skipped on a runner
when the previous size's time, scaled by N^3, says its runs would not fit in the measurement budget."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from bench.harness import Case, Context, Measured, check, last_run, measure, median, too_slow
from bench.runners import Runner

TITLE = "matmul"
TINY = False


def _body(ctx: Context, runner: Runner, a: np.ndarray, b: np.ndarray, ref: np.ndarray) -> Measured:
    n = a.shape[0]
    x, y = runner.put(a), runner.put(b)
    if runner.lazy:

        def fn() -> Any:
            return (x @ y).realize()

    elif runner.framework == "torch":
        torch = runner.torch

        def fn() -> Any:
            with torch.no_grad():
                return torch.mm(x, y)

    else:

        def fn() -> Any:
            return x @ y

    times, out = measure(fn, runner.sync, warmup=1, repeats=ctx.repeats, budget_s=ctx.budget_s)
    mismatch = check(runner.numpy(out), ref, rtol=1e-4, atol=1e-4 * n)
    return Measured(2 * n**3 / median(times) / 1e9, times, mismatch)


def run(ctx: Context) -> None:
    sizes = (128, 256) if ctx.quick else (512, 1024, 2048)
    rng = np.random.default_rng(0)
    last: dict[str, Optional[tuple[str, float]]] = {}  # runner -> its last size and seconds a run
    previous = None
    for n in sizes:
        a, b = (rng.random((n, n), dtype=np.float32) for _ in range(2))
        ref = a.astype(np.float64) @ b.astype(np.float64)
        case = Case("a", TITLE, f"N={n}", "GFLOP/s")
        for runner in ctx.runners:
            scale = (n / previous) ** 3 if previous else 1.0
            if (reason := too_slow(ctx, last.get(runner.name), scale, case.case)) is not None:
                ctx.skip(case, runner, reason)
                continue
            result = ctx.attempt(case, runner, lambda: _body(ctx, runner, a, b, ref))
            last[runner.name] = last_run(result, case.case)
        previous = n
