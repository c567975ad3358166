"""l. An embedding lookup, the first layer of a language model: rows of a float32 table (vocab x dim) picked by 2 x 64
int32 token ids, in microseconds per lookup. tgcore runs `nn.Embedding` under TinyJit, with its range check of the ids
(a count of the invalid ones before the lookup runs); numpy and torch index the table (`emb[idx]`). A lookup loads each
row at its index, so its time should not grow with the vocabulary (tinygrad 0.9.0's one-hot form reduces over all of
it: skipped at GPT-2's vocabulary)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import numpy as np

from bench.harness import Case, Context, Measured, Skip, check, measure, median
from bench.runners import Runner

TITLE = "embedding"
TINY = False
BATCH, TOKENS = 2, 64
SIZES = ((4096, 256), (4096, 768), (50257, 256), (50257, 768))  # (vocab, dim): a small BERT's, GPT-2's
ONE_HOT_MAX = 4096  # the largest vocabulary a one-hot peer runs


def _lookup(runner: Runner, table: np.ndarray, idx: np.ndarray) -> Callable[[], Any]:
    t, i = runner.put(table), runner.put(idx)
    out: dict[str, Any] = {}
    if runner.lazy:
        vocab, dim = table.shape
        # made on the runner's device (its own weights are replaced before anything computes them)
        device, runner.lib.Device.DEFAULT = runner.lib.Device.DEFAULT, runner.device
        try:
            emb = importlib.import_module(f"{runner.framework}.nn").Embedding(vocab, dim)
        finally:
            runner.lib.Device.DEFAULT = device
        emb.weight = t
        step = runner.lib.TinyJit(lambda i: emb(i).realize())

        def fn() -> Any:
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

    return fn


def _body(ctx: Context, runner: Runner, table: np.ndarray, idx: np.ndarray) -> Measured:
    if runner.framework == "tinygrad" and table.shape[0] > ONE_HOT_MAX:
        raise Skip(f"tinygrad 0.9.0's Embedding reduces a one-hot mask over all {table.shape[0]} rows")
    fn = _lookup(runner, table, idx)
    times, out = measure(fn, runner.sync, warmup=3, repeats=max(5, ctx.repeats), budget_s=ctx.budget_s)
    return Measured(median(times) * 1e6, times, check(runner.numpy(out), table[idx], rtol=0, atol=0))


def run(ctx: Context) -> None:
    rng = np.random.default_rng(0)
    for vocab, dim in SIZES[:2] if ctx.quick else SIZES:
        table = rng.standard_normal((vocab, dim), dtype=np.float32)
        idx = rng.integers(0, vocab, (BATCH, TOKENS)).astype(np.int32)
        case = Case("l", TITLE, f"vocab {vocab}, dim {dim}, {BATCH}x{TOKENS} ids", "us", False)
        for runner in ctx.runners:
            ctx.attempt(case, runner, lambda: _body(ctx, runner, table, idx))
