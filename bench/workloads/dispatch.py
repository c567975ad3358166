"""e. Dispatch cost: a loop of tiny realized ops, `x = x + 1` on 16 float32 elements, in microseconds per op,
plain and under TinyJit (tgcore and tinygrad; numpy and torch run the plain loop only). Every op is realized
(tgcore: .realize(), the device synchronized after the loop), so the figure is what one small kernel costs from
Python: building the lazy graph, scheduling, finding the compiled kernel, and the launch."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bench.harness import Case, Context, Measured, measure, median
from bench.runners import Runner

TITLE = "dispatch"
TINY = True
ELEMENTS = 16


def _loop(runner: Runner, ops: int, jit: bool) -> tuple[Callable[[], Any], Callable[[], np.ndarray], list[int]]:
    """A function running `ops` ops, one reading the current x, and a counter of the ops run so far."""
    state = {"x": runner.put(np.zeros(ELEMENTS, dtype=np.float32))}
    done = [0]
    if runner.lazy:
        add_one: Callable[[Any], Any] = lambda t: (t + 1).realize()  # noqa: E731
        if jit:
            add_one = runner.lib.TinyJit(add_one)
    elif runner.framework == "torch":
        torch = runner.torch

        def add_one(t: Any) -> Any:
            with torch.no_grad():
                return t + 1

    else:
        add_one = lambda t: t + 1  # noqa: E731

    def fn() -> Any:
        x = state["x"]
        for _ in range(ops):
            x = add_one(x)
        state["x"] = x
        done[0] += ops
        return x

    return fn, lambda: runner.numpy(state["x"]), done


def _body(ctx: Context, runner: Runner, ops: int, jit: bool) -> Measured:
    fn, value, done = _loop(runner, ops, jit)
    times, _ = measure(fn, runner.sync, warmup=1, repeats=max(3, ctx.repeats // 2), budget_s=ctx.budget_s)
    expected = np.full(ELEMENTS, done[0], dtype=np.float32)
    got = value()
    bad = None if np.array_equal(got, expected) else f"after {done[0]} ops x is {got[:4]}..., expected {done[0]}"
    return Measured(median(times) / ops * 1e6, times, bad, {"ops_per_run": ops})


def run(ctx: Context) -> None:
    ops = 100 if ctx.quick else 1000
    plain = Case("e", TITLE, f"{ops} x (x+1), 16 el, plain", "us/op", higher_is_better=False)
    for runner in ctx.runners:
        ctx.attempt(plain, runner, lambda: _body(ctx, runner, ops, jit=False))
    jitted = Case("e", TITLE, f"{ops} x (x+1), 16 el, TinyJit", "us/op", higher_is_better=False)
    for runner in ctx.runners:
        if runner.lazy:
            ctx.attempt(jitted, runner, lambda: _body(ctx, runner, ops, jit=True))
