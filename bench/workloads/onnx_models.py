"""o. ONNX models: a ResNet exported from torch (torch.onnx, the dynamo exporter with onnxscript) run by onnxruntime
(CPU, its default threads) and by tgcore.onnx on each tgcore device, in ms per inference; ResNet-50 at batch 1 and
224 px (quick: ResNet-18 with one block a stage at 64 px). The same weights as workload h; every output checked against
onnxruntime's. tgcore.onnx is timed as a user calls it: `model(input=array)` each time, the graph walked again (its
kernels come from the cache after the first call). Needs `tgcore[onnx]`, onnxruntime, torch and onnxscript; skipped,
saying which is missing, without them."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Any

import numpy as np

from bench.harness import Case, Context, Measured, Skip, check, measure, median
from bench.models import load_torch, make_weights
from bench.models.resnet import DEPTHS, torch_resnet
from bench.runners import Runner

TITLE = "onnx models"
TINY = False


def _missing() -> list[str]:
    return [m for m in ("onnx", "onnxruntime", "torch", "onnxscript") if importlib.util.find_spec(m) is None]


def _export(depth: int, blocks: tuple[int, ...], size: int, folder: str) -> tuple[str, np.ndarray]:
    import torch

    model = torch_resnet(depth, blocks)
    load_torch(model, make_weights(model, seed=0))
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    path = os.path.join(folder, f"resnet{depth}.onnx")
    torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=True, verbose=False)
    return path, x


def run(ctx: Context) -> None:
    depth, blocks, size = (18, (1, 1, 1, 1), 64) if ctx.quick else (50, DEPTHS[50], 224)
    case = Case("o", TITLE, f"ResNet-{depth} B=1 {size}px: inference", "ms", higher_is_better=False)
    ort_runner = Runner("onnxruntime", "onnxruntime")
    if missing := _missing():
        for runner in [*ctx.tgcore, ort_runner]:
            ctx.skip(case, runner, f"needs {', '.join(missing)} (pip install './[onnx]' onnxruntime torch onnxscript)")
        return
    import onnxruntime

    with tempfile.TemporaryDirectory() as folder:
        try:
            path, x = _export(depth, blocks, size, folder)
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
                ctx.skip(case, runner, "interprets its kernels: a ResNet takes minutes")
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
