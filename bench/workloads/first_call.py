"""g. First-call latency of a never-seen elementwise kernel (4096 float32, 5 ops), compile included, in ms, per
device (bench/compile_latency.py; the harness runs with DISABLE_COMPILER_CACHE=1, so every compile is real), with
the warm call of the same kernel and, for tgcore, the first call's stages: render, compile, load. The peer is
tinygrad on CLANG (numpy and torch compile nothing). Then, for tgcore, `Tensor.randn(1024, 1024, dtype).max().item()`
in a new process, import included, in s: with an empty disk cache, and again with the cache that run left."""

from __future__ import annotations

import math
import random
from typing import Callable, Optional

from bench import compile_latency
from bench.harness import Case, Context, Measured, check, median
from bench.runners import Runner

TITLE = "first call"
TINY = True
STAGES = ("render", "compile", "load")


def _first_calls(runner: Runner, kernels: int, rng: random.Random, warm: list[float]) -> Callable[[], Measured]:
    def measured() -> Measured:
        tensor, sync = runner.lib.Tensor, runner.sync
        compile_latency.first_and_warm_call(tensor, runner.device, sync, rng)  # open the device and its toolchain
        calls = [compile_latency.first_and_warm_call(tensor, runner.device, sync, rng) for _ in range(kernels)]
        bad = None
        for _, _, out, x, c in calls:
            bad = bad or check(out, compile_latency.expected(x, c), rtol=1e-5, atol=1e-6)
        warm.extend(call[1] for call in calls)
        times = [call[0] for call in calls]
        return Measured(median(times) * 1e3, times, bad)

    return measured


def run(ctx: Context) -> None:
    kernels = 2 if ctx.quick else 10
    rng = random.Random(5)
    first = Case("g", TITLE, "new kernel, compile incl.", "ms", higher_is_better=False)
    again = Case("g", TITLE, "same kernel again", "ms", higher_is_better=False)
    stages = [Case("g", TITLE, f"new kernel: {s}", "ms", higher_is_better=False) for s in STAGES]
    for runner in (r for r in ctx.runners if r.lazy):
        warm: list[float] = []
        if ctx.attempt(first, runner, _first_calls(runner, kernels, rng, warm)).status not in ("ok", "mismatch"):
            continue
        ctx.figure(again, runner, median(warm) * 1e3, warm)
        if runner.is_peer:
            continue
        parts: list[tuple[float, float, float]] = []

        def breakdown(runner: Runner = runner, parts: list = parts) -> Measured:
            parts.extend(compile_latency.stages(runner.device, rng) for _ in range(kernels))
            return Measured(median([p[0] for p in parts]) * 1e3, [p[0] for p in parts])

        if ctx.attempt(stages[0], runner, breakdown).status == "ok":
            for i in (1, 2):
                ctx.figure(stages[i], runner, median([p[i] for p in parts]) * 1e3, [p[i] for p in parts])
    _randn_cases(ctx)


def _randn_cases(ctx: Context) -> None:
    """randn in each float dtype (float32 alone in a quick run), each cold and warm in new processes."""
    from tgcore import Device, dtypes

    for dtype in compile_latency.RANDN_DTYPES[:1] if ctx.quick else compile_latency.RANDN_DTYPES:
        cold = Case("g", TITLE, f"randn 1024^2 {dtype}: empty cache", "s", higher_is_better=False, compare=False)
        warm = Case("g", TITLE, f"randn 1024^2 {dtype}: new process", "s", higher_is_better=False, compare=False)
        for runner in ctx.tgcore:
            if runner.device == "PYTHON":  # 2**20 Threefry draws in the interpreter: minutes, a figure of nothing
                ctx.skip(cold, runner, "interprets its kernels: 2**20 draws take minutes")
                continue
            if getattr(dtypes, dtype) not in Device[runner.device].spec.dtypes:  # (pocl without cl_khr_fp16: float16)
                ctx.skip(cold, runner, f"the device does not support {dtype}")
                continue
            runs: list[tuple[tuple[float, float, float], tuple[float, float, float]]] = []

            def measured(runner: Runner = runner, dtype: str = dtype, runs: list = runs) -> Measured:
                runs.append(compile_latency.randn_cold_and_warm(runner.device, dtype))
                (imp, first, value), (_, _, again) = runs[-1]
                bad: Optional[str] = None
                if value != again or not (math.isfinite(value) and 3 < value < 7):
                    bad = f"the max of 2**20 normals was {value}, then {again} from the same seed"
                return Measured(imp + first, [imp + first], bad)

            if ctx.attempt(cold, runner, measured).status == "ok":
                (imp, first, _) = runs[-1][1]
                ctx.figure(warm, runner, imp + first, [imp + first])
