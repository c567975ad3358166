"""h. Whole models, tgcore against torch (and tinygrad 0.9.0): ResNet-18 (batch 2) and ResNet-50 (batch 1)
inference at 224x224, EfficientNet-B0 inference, a BERT-base-shaped encoder stack (12 layers, sequence 128),
GPT-2-small-shaped decoding (12 layers, KV cache, TinyJit over a bound start_pos; tokens per second) and a
training step of a small ResNet-like CNN (SGD with momentum). The models are in bench/models, written once in
tinygrad's API and once for torch, loaded with the same weights.

Two figures a model and runner. "first call": seconds for the first forward (GPT-2: the first two tokens, the
plain step at position 0 and the TinyJit's first call; CNN: the first training step), everything compiled on the
spot: the harness runs with DISABLE_COMPILER_CACHE=1, tgcore's CACHEDB points at a new, empty file for it, and the
kernels this process compiled before are dropped from the in-memory caches (tgcore's and tinygrad's), so a
model never reuses an earlier model's kernel. "steady": the median of the timed runs under TinyJit after a
warm-up (torch: eager, in inference mode; its threads set to the machine's cores).

Every runner's output is checked against torch's (computed once, untimed): inference outputs, every GPT-2 step's
logits and every training step's loss within 1e-3 of the largest value (max abs diff / max |torch|), the CNN's
weights after the last step within 1e-3 + 1e-3 relative. A disagreement is a mismatch, as in the other workloads.
`--quick` shrinks the images (64 px), the depth (one block a stage, three stages of EfficientNet, one BERT
layer, two GPT-2 layers) and the CNN's batch, so that fewer kernels compile.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import numpy as np

from bench import compile_latency
from bench.harness import Case, Context, Measured, check, measure, median
from bench.models import Weights, bert, cnn, efficientnet, gpt2, lazy_api, load_lazy, load_torch, make_weights, resnet
from bench.runners import Runner

TITLE = "models"
TINY = False
TOLERANCE = 1e-3  # of the largest |value| of torch's output
LR, MOMENTUM = 0.01, 0.9
GPT2_WARMUP = 4  # steps before the timed ones: position 0 (plain), then the TinyJit's run, capture, first replay
TRAIN_WARMUP = 3  # TinyJit: run, capture, first replay


@dataclass(frozen=True)
class Model:
    """An inference model: its name in the table, its two builders, and its input's shape."""

    name: str
    lazy: Callable[[Any], Any]  # api -> model
    torch: Callable[[], Any]
    input_shape: tuple[int, ...]


def _inference_models(quick: bool) -> list[Model]:
    """The inference models at full size, or for --quick at a smaller image size, depth and batch."""
    if quick:
        r18, r50, (eff, eff_stages), layers, image = (1, 1, 1, 1), (1, 1, 1, 1), (1, 3), 1, 64
    else:
        r18, r50, (eff, eff_stages), layers, image = resnet.DEPTHS[18], resnet.DEPTHS[50], (4, 7), 12, 224
    tag = " (quick: 1 block a stage)" if quick else ""
    eff_tag = " (quick: 3 stages of 1 block)" if quick else ""
    return [
        Model(f"ResNet-18 B=2 {image}px{tag}", lambda api: resnet.LazyResNet(api, 18, r18),
              lambda: resnet.torch_resnet(18, r18), (2, 3, image, image)),
        Model(f"ResNet-50 B=1 {image}px{tag}", lambda api: resnet.LazyResNet(api, 50, r50),
              lambda: resnet.torch_resnet(50, r50), (1, 3, image, image)),
        Model(f"EfficientNet-B0 B=1 {image}px{eff_tag}",
              lambda api: efficientnet.LazyEfficientNet(api, eff, eff_stages),
              lambda: efficientnet.torch_efficientnet(eff, eff_stages), (1, 3, image, image)),
        Model(f"BERT-base encoder {layers} layers B=1 seq 128", lambda api: bert.LazyBertEncoder(api, layers),
              lambda: bert.torch_bert_encoder(layers), (1, 128, bert.DIM)),
    ]  # fmt: skip


# ***** the parts every model uses *****


@contextmanager
def _cold(runner: Runner) -> Iterator[None]:
    """Nothing compiled before is reused inside the block: tgcore's CACHEDB is a new empty file, and the compiled
    kernels of earlier models are dropped from tgcore's and tinygrad's in-memory caches (module-level dicts of
    their realize modules; looked up by name, so that a version without them still runs)."""
    if not runner.lazy:
        yield
        return
    realize = importlib.import_module(f"{runner.framework}.engine.realize")
    for name in ("_runner_cache", "method_cache"):
        if isinstance(cache := getattr(realize, name, None), dict):
            cache.clear()
    if runner.framework != "tgcore":
        yield
        return
    helpers = importlib.import_module("tgcore.helpers")
    before = helpers.CACHEDB
    with tempfile.TemporaryDirectory() as folder:
        helpers.CACHEDB = os.path.join(folder, "cache.db")
        try:
            yield
        finally:
            helpers.CACHEDB = before


@contextmanager
def _default_device(runner: Runner) -> Iterator[None]:
    """The layers make their (replaced, never realized) initial weights on the default device: the runner's."""
    device = runner.lib.Device
    before = device.DEFAULT
    device.DEFAULT = runner.device
    try:
        yield
    finally:
        device.DEFAULT = before


def _build_lazy(runner: Runner, build: Callable[[Any], Any], weights: Weights) -> tuple[Any, Any]:
    api = lazy_api(runner.framework)
    with _default_device(runner):
        model = build(api)
    load_lazy(model, weights, api.Tensor, runner.device)
    return api, model


def _build_torch(build: Callable[[], Any], weights: Weights) -> Any:
    model = build()
    load_torch(model, weights)
    return model


def _disagreement(got: np.ndarray, expected: np.ndarray) -> tuple[Optional[str], float]:
    """(what disagrees with torch's output or None, max abs diff / max |torch|)."""
    scale = float(np.max(np.abs(expected))) or 1.0
    diff = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.shape == expected.shape else np.inf
    return check(got, expected, rtol=0.0, atol=TOLERANCE * scale), diff / scale


def _attempt_pair(ctx: Context, name: str, unit: str, higher: bool, runners: list[Runner], body: Callable) -> None:
    """Run `body(runner)` -> (steady figure's Measured, first-call seconds) for every runner; record both rows."""
    steady = Case("h", TITLE, f"{name}: steady", unit, higher_is_better=higher)
    first = Case("h", TITLE, f"{name}: first call", "s", higher_is_better=False)
    firsts: dict[str, float] = {}

    def measured(runner: Runner) -> Callable[[], Measured]:
        def run() -> Measured:
            m, first_s = body(runner)
            firsts[runner.name] = first_s
            m.extra["first_call_s"] = first_s
            return m

        return run

    for runner in runners:
        ctx.attempt(steady, runner, measured(runner))
    for runner in runners:
        if runner.name in firsts:
            ctx.figure(first, runner, firsts[runner.name])


# ***** inference *****


def _inference(ctx: Context, spec: Model, seed: int, runners: list[Runner]) -> None:
    import torch

    weights = make_weights(spec.torch(), seed)
    x_np = np.random.default_rng(seed).standard_normal(spec.input_shape).astype(np.float32)
    with torch.inference_mode():
        expected = _build_torch(spec.torch, weights)(torch.from_numpy(x_np)).numpy().astype(np.float64)

    def body(runner: Runner) -> tuple[Measured, float]:
        if runner.lazy:
            api, model = _build_lazy(runner, spec.lazy, weights)
            x = runner.put(x_np)
            runner.sync()
            with _cold(runner):
                t0 = time.perf_counter()
                model(x).realize()
                runner.sync()
                first_s = time.perf_counter() - t0
            jit = api.TinyJit(lambda x: model(x).realize())
            times, out = measure(lambda: jit(x), runner.sync, warmup=3, repeats=ctx.repeats, budget_s=ctx.budget_s)
            got = out.numpy()
        else:
            model, x = _build_torch(spec.torch, weights), torch.from_numpy(x_np)
            with torch.inference_mode():
                t0 = time.perf_counter()
                model(x)
                first_s = time.perf_counter() - t0
                times, out = measure(lambda: model(x), lambda: None, warmup=2, repeats=ctx.repeats,
                                     budget_s=ctx.budget_s)  # fmt: skip
            got = out.numpy()
        bad, rel = _disagreement(got, expected)
        return Measured(median(times) * 1e3, times, bad, {"max_abs_diff_rel": rel}), first_s

    _attempt_pair(ctx, spec.name, "ms", False, runners, body)


# ***** GPT-2 decoding *****


def _gpt2(ctx: Context, runners: list[Runner]) -> None:
    import torch

    layers, steps = (2, GPT2_WARMUP + 4) if ctx.quick else (12, GPT2_WARMUP + 28)
    max_context = steps
    weights = make_weights(gpt2.torch_gpt2(layers, max_context), 11)
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, gpt2.VOCAB, steps)]
    reference = _build_torch(lambda: gpt2.torch_gpt2(layers, max_context), weights)
    with torch.inference_mode():
        expected = np.stack([reference.step(t, pos).numpy() for pos, t in enumerate(tokens)]).astype(np.float64)
    del reference

    def body(runner: Runner) -> tuple[Measured, float]:
        logits: list[np.ndarray] = []
        times: list[float] = []
        if runner.lazy:
            _, model = _build_lazy(runner, lambda api: gpt2.LazyGPT2(api, layers, max_context), weights)
            runner.sync()
            with _cold(runner):
                for pos, t in enumerate(tokens):
                    t0 = time.perf_counter()
                    out = model.step(t, pos)
                    runner.sync()
                    times.append(time.perf_counter() - t0)
                    logits.append(out.numpy())  # the jit's output buffer is overwritten by the next step
        else:
            model = _build_torch(lambda: gpt2.torch_gpt2(layers, max_context), weights)
            with torch.inference_mode():
                for pos, t in enumerate(tokens):
                    t0 = time.perf_counter()
                    out = model.step(t, pos)
                    times.append(time.perf_counter() - t0)
                    logits.append(out.numpy())
        bad, rel = _disagreement(np.stack(logits), expected)
        timed = times[GPT2_WARMUP:]
        return Measured(1 / median(timed), timed, bad, {"max_abs_diff_rel": rel}), times[0] + times[1]

    name = f"GPT-2-small-shaped decode, {layers} layers, {steps} tokens"
    _attempt_pair(ctx, name, "tok/s", True, runners, body)


# ***** CNN training step *****


def _train(ctx: Context, runners: list[Runner]) -> None:
    import torch

    batch, image = (8, 16) if ctx.quick else (32, 32)
    steps = TRAIN_WARMUP + (3 if ctx.quick else 10)
    weights = make_weights(cnn.torch_cnn(), 21)
    rng = np.random.default_rng(21)
    x_np = rng.standard_normal((batch, 3, image, image)).astype(np.float32)
    y_np = rng.integers(0, cnn.CLASSES, batch).astype(np.int32)
    trained = [k for k in weights if not k.rsplit(".", 1)[-1].startswith("running_")]

    def torch_run(model: Any) -> tuple[list[float], list[float]]:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np.astype(np.int64))
        times, losses = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.item()))
        return times, losses

    reference = _build_torch(cnn.torch_cnn, weights)
    expected_losses = np.array(torch_run(reference)[1])
    expected_state = reference.state_dict()
    expected_weights = {k: expected_state[k].detach().numpy() for k in trained}

    def body(runner: Runner) -> tuple[Measured, float]:
        if runner.lazy:
            api, model = _build_lazy(runner, cnn.LazyCNN, weights)
            params = [_by_name(model, k) for k in trained]
            stats = [_by_name(model, k) for k in weights if k not in trained]
            opt = api.SGD(params, lr=LR, momentum=MOMENTUM)
            x, y = runner.put(x_np), runner.put(y_np)

            def step(x: Any, y: Any) -> Any:
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y)
                loss.backward()
                api.Tensor.realize(loss, *opt.schedule_step(), *stats)
                return loss

            jit = api.TinyJit(step)
            times, losses = [], []
            before = api.Tensor.training
            api.Tensor.training = True
            try:
                with _cold(runner):
                    for i in range(steps):
                        t0 = time.perf_counter()
                        loss = step(x, y) if i == 0 else jit(x, y)  # the first step plain: the first call
                        runner.sync()
                        times.append(time.perf_counter() - t0)
                        losses.append(float(loss.numpy()))
            finally:
                api.Tensor.training = before
            got = {k: _by_name(model, k).numpy() for k in trained}
        else:
            model = _build_torch(cnn.torch_cnn, weights)
            times, losses = torch_run(model)
            state = model.state_dict()
            got = {k: state[k].detach().numpy() for k in trained}
        bad, rel = _disagreement(np.array(losses), expected_losses)
        for k in trained:
            if bad is None and (bad := check(got[k], expected_weights[k], rtol=1e-3, atol=1e-3)) is not None:
                bad = f"{k} after {steps} steps: {bad}"
        timed = times[TRAIN_WARMUP + 1 :] if len(times) > TRAIN_WARMUP + 1 else times[-1:]
        return Measured(median(timed) * 1e3, timed, bad, {"max_abs_diff_rel": rel}), times[0]

    _attempt_pair(ctx, f"CNN train step B={batch} {image}px SGD", "ms", False, runners, body)


def _by_name(model: Any, name: str) -> Any:
    owner = model
    for part in name.split("."):
        owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
    return owner


_WARM_SCRIPT = """
import json, sys, time
st = time.perf_counter()
import numpy as np
from bench.models import lazy_api, resnet
from tgcore import Device, Tensor
Device.DEFAULT = sys.argv[1]
Tensor.manual_seed(0)
blocks, image = tuple(json.loads(sys.argv[2])), int(sys.argv[3])
model = resnet.LazyResNet(lazy_api("tgcore"), 18, blocks)
x = Tensor(np.random.default_rng(0).standard_normal((2, 3, image, image)).astype(np.float32)).realize()
built = time.perf_counter()
out = model(x).numpy()
print(json.dumps([built - st, time.perf_counter() - built, out.tobytes().hex()]))
"""


def _warm_start(ctx: Context, runners: list[Runner]) -> None:
    """ResNet-18's first call in a new process whose disk cache a first process filled (seconds)."""
    blocks, image = ((1, 1, 1, 1), 64) if ctx.quick else (resnet.DEPTHS[18], 224)
    case = Case("h", TITLE, f"ResNet-18 B=2 {image}px: new process, warm cache: first call", "s", False, False)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for runner in runners:
        if runner.framework != "tgcore" or runner.device == "PYTHON":
            continue

        def body(runner: Runner = runner) -> Measured:
            with tempfile.TemporaryDirectory() as folder:
                env = compile_latency.new_process_env(folder, runner.device)  # (both cache tables in use: the point)
                cmd = [sys.executable, "-c", _WARM_SCRIPT, runner.device, json.dumps(blocks), str(image)]
                runs = []
                for _ in range(2):  # the first fills the cache, the second is the figure
                    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
                    if proc.returncode != 0:
                        raise RuntimeError(f"ResNet-18 in a new process failed:\n{proc.stderr[-2000:]}")
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            bad = None if runs[0][2] == runs[1][2] else "the warm process's output differs from the cold one's"
            return Measured(runs[1][0] + runs[1][1], [runs[1][0] + runs[1][1]], bad)

        ctx.attempt(case, runner, body)


def run(ctx: Context) -> None:
    try:
        import torch
    except ImportError as e:
        for runner in ctx.runners:
            ctx.skip(Case("h", TITLE, "every model", "ms"), runner, f"torch is the reference here: {e}")
        return
    torch.set_num_threads(os.cpu_count() or 1)
    runners = [r for r in ctx.runners if r.framework != "numpy"]  # numpy has no model zoo to compare with
    for i, spec in enumerate(_inference_models(ctx.quick)):
        _inference(ctx, spec, 100 + i, runners)
    _gpt2(ctx, runners)
    _train(ctx, runners)
    _warm_start(ctx, runners)
