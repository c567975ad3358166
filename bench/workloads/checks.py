"""i. The cost of checking data on the device: `table[idx]` (a 512 x 64 float32 table, 256 int32 indices, an
embedding lookup) under TinyJit, with tgcore's range check of the indices (a count of the invalid ones, computed and
read back before the lookup runs) and with it turned off (CHECK_DATA=0), in microseconds per lookup. numpy and torch
check their indices too (on the host); tinygrad 0.9.0 does not check (an index out of range gives a row of zeros)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bench.harness import Case, Context, Measured, check, measure, median
from bench.runners import Runner

TITLE = "checks"
TINY = False
ROWS, WIDTH, LOOKUPS = 512, 64, 256


def _lookup(runner: Runner, checked: bool) -> tuple[Callable[[], Any], Callable[[], np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    idx = rng.integers(0, ROWS, LOOKUPS).astype(np.int32)
    expected = table[idx]
    t, i = runner.put(table), runner.put(idx)
    out: dict[str, Any] = {}
    if runner.lazy:
        from tgcore import Context as TgContext

        step = runner.lib.TinyJit(lambda i: t[i].realize())
        flag = 1 if checked else 0

        def fn() -> Any:
            if runner.framework == "tgcore":
                with TgContext(CHECK_DATA=flag):
                    out["y"] = step(i)
            else:
                out["y"] = step(i)
            return out["y"]

    elif runner.framework == "torch":
        ti = runner.torch.from_numpy(idx.astype(np.int64))

        def fn() -> Any:
            out["y"] = t[ti]
            return out["y"]

    else:

        def fn() -> Any:
            out["y"] = t[idx]
            return out["y"]

    return fn, lambda: runner.numpy(out["y"]), expected


def _body(ctx: Context, runner: Runner, checked: bool) -> Measured:
    fn, value, expected = _lookup(runner, checked)
    times, _ = measure(fn, runner.sync, warmup=3, repeats=max(5, ctx.repeats), budget_s=ctx.budget_s)
    return Measured(median(times) * 1e6, times, check(value(), expected, rtol=0, atol=0))


def run(ctx: Context) -> None:
    checked = Case("i", TITLE, f"table[idx] {ROWS}x{WIDTH}, {LOOKUPS} idx, TinyJit, checked", "us", False)
    for runner in ctx.runners:
        if runner.framework == "tinygrad":
            ctx.skip(checked, runner, "tinygrad 0.9.0 does not check indices (see the unchecked row)")
            continue
        ctx.attempt(checked, runner, lambda: _body(ctx, runner, True))
    unchecked = Case("i", TITLE, f"table[idx] {ROWS}x{WIDTH}, {LOOKUPS} idx, TinyJit, unchecked", "us", False)
    for runner in ctx.runners:
        if runner.lazy:
            ctx.attempt(unchecked, runner, lambda: _body(ctx, runner, False))
