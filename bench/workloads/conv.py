"""d. conv2d, float32: batch 8, 64 -> 64 channels, 56 x 56, 3 x 3 kernel, padding 1, in GFLOP/s
(2 * N * Cout * H * W * Cin * 9 flops). numpy has no conv: its figure is im2col and one matmul, the same
computation numpy users write. A smaller batch runs first, and the budget rule of matmul skips the full batch
on a runner whose small batch says it would not fit."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from bench.harness import Case, Context, Measured, Skip, check, last_run, measure, median, too_slow
from bench.runners import Runner

TITLE = "conv2d"
TINY = False


def im2col_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """conv2d of x (N, C, H, W) with w (F, C, 3, 3), stride 1, padding 1, as im2col and one matmul."""
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, h, wd, c, kh, kw), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, :, :, i, j] = xp[:, :, i : i + h, j : j + wd].transpose(0, 2, 3, 1)
    out = cols.reshape(n * h * wd, c * kh * kw) @ w.reshape(f, -1).T
    return out.reshape(n, h, wd, f).transpose(0, 3, 1, 2)


def _body(ctx: Context, runner: Runner, x_np: np.ndarray, w_np: np.ndarray, ref: np.ndarray) -> Measured:
    x, w = runner.put(x_np), runner.put(w_np)
    if runner.lazy:
        if not hasattr(runner.lib.Tensor, "conv2d"):
            raise Skip(f"{runner.framework} has no Tensor.conv2d")

        def fn() -> Any:
            return x.conv2d(w, padding=1).realize()

    elif runner.framework == "torch":
        torch = runner.torch

        def fn() -> Any:
            with torch.no_grad():
                return torch.nn.functional.conv2d(x, w, padding=1)

    else:

        def fn() -> Any:
            return im2col_conv(x, w)

    times, out = measure(fn, runner.sync, warmup=1, repeats=ctx.repeats, budget_s=ctx.budget_s)
    fan_in = w_np[0].size
    mismatch = check(runner.numpy(out), ref, rtol=1e-4, atol=1e-5 * fan_in)
    n, _, h, wd = x_np.shape
    flops = 2 * n * w_np.shape[0] * h * wd * fan_in
    return Measured(flops / median(times) / 1e9, times, mismatch)


def run(ctx: Context) -> None:
    channels, side = (16, 28) if ctx.quick else (64, 56)
    batches = (1,) if ctx.quick else (1, 8)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((channels, channels, 3, 3), dtype=np.float32) / np.float32(24)
    last: dict[str, Optional[tuple[str, float]]] = {}  # runner -> its last batch and seconds a run
    previous = None
    for batch in batches:
        x = rng.standard_normal((batch, channels, side, side), dtype=np.float32)
        ref = im2col_conv(x.astype(np.float64), w.astype(np.float64))
        case = Case("d", TITLE, f"B={batch} {channels}->{channels} {side}x{side} 3x3", "GFLOP/s")
        for runner in ctx.runners:
            scale = batch / previous if previous else 1.0
            if (reason := too_slow(ctx, last.get(runner.name), scale, f"B={batch}")) is not None:
                ctx.skip(case, runner, reason)
                continue
            result = ctx.attempt(case, runner, lambda: _body(ctx, runner, x, w, ref))
            last[runner.name] = last_run(result, f"B={batch}")
        previous = batch
