"""c. Sums of float32 values: over the last axis of a 4096 x 4096 matrix, and over all of a 16M vector, in GB/s
of the input read. The inputs are centred on 0 so that a float32 sum stays accurate in any summation order."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from bench.harness import Case, Context, Measured, check, measure, median
from bench.runners import Runner

TITLE = "reduce"
TINY = False


def _body(ctx: Context, runner: Runner, data: np.ndarray, axis: Optional[int], ref: np.ndarray) -> Measured:
    x = runner.put(data)
    if runner.lazy:

        def fn() -> Any:
            return x.sum(axis=axis).realize()

    elif runner.framework == "torch":
        torch = runner.torch

        def fn() -> Any:
            with torch.no_grad():
                return x.sum() if axis is None else x.sum(dim=axis)

    else:

        def fn() -> Any:
            return x.sum(axis=axis)

    times, out = measure(fn, runner.sync, warmup=1, repeats=ctx.repeats, budget_s=ctx.budget_s)
    # float32 rounding grows with the number of terms: allow 1e-6 of each sum of magnitudes (a few of its ulps)
    magnitude = np.abs(data.astype(np.float64)).sum(axis=axis)
    mismatch = check(runner.numpy(out), ref, rtol=0.0, atol=1e-6 * magnitude)
    return Measured(data.nbytes / median(times) / 1e9, times, mismatch)


def run(ctx: Context) -> None:
    side = 1024 if ctx.quick else 4096
    rng = np.random.default_rng(2)
    data = rng.random((side, side), dtype=np.float32) - np.float32(0.5)
    cases = [
        (Case("c", TITLE, f"sum axis=-1 {side}x{side}", "GB/s"), data, -1),
        (Case("c", TITLE, f"sum all {side * side // (1 << 20)}M", "GB/s"), data.reshape(-1), None),
    ]
    for case, x, axis in cases:
        ref = x.astype(np.float64).sum(axis=axis)
        for runner in ctx.runners:
            ctx.attempt(case, runner, lambda: _body(ctx, runner, x, axis, ref))
