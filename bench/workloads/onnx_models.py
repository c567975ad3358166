"""o. ONNX models exported from torch (torch.onnx, the dynamo exporter with onnxscript), run by onnxruntime (CPU,
its default threads) and by tgcore.onnx on each tgcore device, in ms per inference; every output checked against
onnxruntime's. Two models:

- a ResNet: ResNet-50 at batch 1 and 224 px (quick: ResNet-18 with one block a stage at 64 px), the same weights as
  workload h;
- a GPT-2-like causal language model (bench/models/transformer.py: learned positions, pre-norm blocks of causal
  scaled dot-product attention and GELU, LM head tied to the token embedding) reading int64 token ids and returning
  the logits of every position: 4 layers, width 256, 4 heads, vocab 4096, batch 1 and 128 tokens (quick: 2 layers,
  64 tokens), its weights drawn by make_weights with seed 0 and its ids with seed 1.

tgcore.onnx is timed as a user calls it: `model(input=array)` each time, the graph walked again (its kernels come from
the cache after the first call). Needs `tgcore[onnx]`, onnxruntime, torch and onnxscript; skipped, saying which is
missing, without them."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Any, Callable

import numpy as np

from bench.harness import Case, Context, Measured, Skip, check, measure, median
from bench.models import load_torch, make_weights
from bench.models.resnet import DEPTHS, torch_resnet
from bench.models.transformer import LMShape, torch_lm
from bench.runners import Runner

TITLE = "onnx models"
TINY = False

Exporter = Callable[[str], tuple[str, np.ndarray]]  # a folder -> the .onnx file written there, and its input


def _missing() -> list[str]:
    return [m for m in ("onnx", "onnxruntime", "torch", "onnxscript") if importlib.util.find_spec(m) is None]


def _export(model: Any, x: np.ndarray, path: str) -> tuple[str, np.ndarray]:
    """`model` written to `path` by the dynamo exporter, traced on `x`; the path and `x` back."""
    import torch

    torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=True, verbose=False)
    return path, x


def _export_resnet(depth: int, blocks: tuple[int, ...], size: int) -> Exporter:
    def export(folder: str) -> tuple[str, np.ndarray]:
        model = torch_resnet(depth, blocks)
        load_torch(model, make_weights(model, seed=0))
        x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
        return _export(model, x, os.path.join(folder, f"resnet{depth}.onnx"))

    return export


def _export_lm(shape: LMShape, tokens: int) -> Exporter:
    def export(folder: str) -> tuple[str, np.ndarray]:
        model = torch_lm(shape)
        load_torch(model, make_weights(model, seed=0))
        ids = np.random.default_rng(1).integers(0, shape.vocab, (1, tokens), dtype=np.int64)
        return _export(model, ids, os.path.join(folder, f"lm{shape.layers}.onnx"))

    return export


def _run_case(ctx: Context, case: Case, ort_runner: Runner, export: Exporter, python_reason: str) -> None:
    """Export the model once, time it under onnxruntime, then under tgcore.onnx on each device, checked."""
    import onnxruntime

    with tempfile.TemporaryDirectory() as folder:
        try:
            path, x = export(folder)
        except Exception as e:  # an exporter that fails here fails for every runner: say so once per runner
            for runner in [*ctx.tgcore, ort_runner]:
                ctx.skip(case, runner, f"torch.onnx.export failed: {type(e).__name__}: {str(e)[:200]}")
            return
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        want: dict[str, Any] = {}

        def ort() -> Measured:
            times, out = measure(
                lambda: session.run(None, {name: x})[0],
                lambda: None,
                warmup=2,
                repeats=ctx.repeats,
                budget_s=ctx.budget_s,
            )
            want["y"] = out
            return Measured(median(times) * 1e3, times)

        ctx.attempt(case, ort_runner, ort)
        for runner in ctx.tgcore:
            if runner.device == "PYTHON":
                ctx.skip(case, runner, python_reason)
                continue

            def tg(runner: Runner = runner) -> Measured:
                if "y" not in want:
                    raise Skip("onnxruntime did not run, so there is nothing to check against")
                from tgcore.onnx import OnnxModel

                model = OnnxModel(path, device=runner.device)
                times, out = measure(
                    lambda: model(**{name: x})[model.output_names[0]],
                    runner.sync,
                    warmup=2,
                    repeats=ctx.repeats,
                    budget_s=ctx.budget_s,
                )
                return Measured(median(times) * 1e3, times, check(out.numpy(), want["y"], rtol=1e-3, atol=1e-3))

            ctx.attempt(case, runner, tg)


def run(ctx: Context) -> None:
    depth, blocks, size = (18, (1, 1, 1, 1), 64) if ctx.quick else (50, DEPTHS[50], 224)
    tokens = 64 if ctx.quick else 128
    lm = LMShape(layers=2 if ctx.quick else 4, dim=256, heads=4, vocab=4096, context=tokens)
    resnet_case = Case("o", TITLE, f"ResNet-{depth} B=1 {size}px: inference", "ms", higher_is_better=False)
    lm_case = Case("o", TITLE, f"LM {lm.layers}L d{lm.dim} B=1 T={tokens}: inference", "ms", higher_is_better=False)
    ort_runner = Runner("onnxruntime", "onnxruntime")
    if missing := _missing():
        for case in (resnet_case, lm_case):
            for runner in [*ctx.tgcore, ort_runner]:
                reason = f"needs {', '.join(missing)} (pip install './[onnx]' onnxruntime torch onnxscript)"
                ctx.skip(case, runner, reason)
        return
    _run_case(
        ctx,
        resnet_case,
        ort_runner,
        _export_resnet(depth, blocks, size),
        "interprets its kernels: a ResNet takes minutes",
    )
    _run_case(
        ctx,
        lm_case,
        ort_runner,
        _export_lm(lm, tokens),
        "interprets its kernels: a transformer's matmuls take minutes",
    )
