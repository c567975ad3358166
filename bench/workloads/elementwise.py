"""b. A fused elementwise chain, out = exp(a * b + c * 0.5) - a, over float32 vectors, in GB/s.

The bytes counted are the 16 per element the chain must move (three inputs read, one output written), whatever a
framework moves on top (numpy and torch write and read temporaries between their ops; tgcore fuses them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.harness import Case, Context, Measured, check, measure, median
from bench.runners import Runner

TITLE = "elementwise"
TINY = False
BYTES_PER_ELEMENT = 16


def _body(ctx: Context, runner: Runner, inputs: list[np.ndarray], ref: np.ndarray) -> Measured:
    a, b, c = (runner.put(v) for v in inputs)
    if runner.lazy:

        def fn() -> Any:
            return ((a * b + c * 0.5).exp() - a).realize()

    elif runner.framework == "torch":
        torch = runner.torch

        def fn() -> Any:
            with torch.no_grad():
                return torch.exp(a * b + c * 0.5) - a

    else:

        def fn() -> Any:
            return np.exp(a * b + c * np.float32(0.5)) - a

    times, out = measure(fn, runner.sync, warmup=1, repeats=ctx.repeats, budget_s=ctx.budget_s)
    got = runner.numpy(out)
    mismatch = None if got.dtype == np.float32 else f"dtype {got.dtype}, expected float32"
    mismatch = mismatch or check(got, ref, rtol=1e-5, atol=1e-6)
    return Measured(BYTES_PER_ELEMENT * ref.size / median(times) / 1e9, times, mismatch)


def run(ctx: Context) -> None:
    n = 1 << (20 if ctx.quick else 24)
    rng = np.random.default_rng(1)
    inputs = [rng.random(n, dtype=np.float32) for _ in range(3)]
    a, b, c = (v.astype(np.float64) for v in inputs)
    ref = np.exp(a * b + c * 0.5) - a
    case = Case("b", TITLE, f"{n // (1 << 20)}M: exp(a*b+c*0.5)-a", "GB/s")
    for runner in ctx.runners:
        ctx.attempt(case, runner, lambda: _body(ctx, runner, inputs, ref))
