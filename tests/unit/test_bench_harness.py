"""The benchmark harness's timing rules (bench/harness.py): what gets warmed up and what gets timed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, where `bench` lives

from bench import harness  # noqa: E402


def _runner(first_s: float, then_s: float) -> tuple[list[float], object]:
    calls: list[float] = []

    def fn() -> int:
        time.sleep(first_s if not calls else then_s)
        calls.append(time.perf_counter())
        return len(calls)

    return calls, fn


def test_a_first_call_that_compiles_does_not_end_the_warm_up() -> None:
    # the first call takes longer than the whole warm-up (a compile); the fast calls after it still warm up
    calls, fn = _runner(harness.WARMUP_S * 1.5, 0.0)
    times, out = harness.measure(fn, lambda: None, warmup=1, repeats=3, budget_s=10)
    assert len(times) == 3 and out == len(calls)
    # (the fast calls go on for WARMUP_S or MAX_WARMUP_CALLS; before the fix there were none: 1 + 3 calls in all)
    assert 1 + 1 + 3 <= len(calls) <= 1 + harness.MAX_WARMUP_CALLS + 3


def test_a_call_as_long_as_the_warm_up_is_its_last_call() -> None:
    calls, fn = _runner(harness.WARMUP_S * 1.2, harness.WARMUP_S * 1.2)
    times, _ = harness.measure(fn, lambda: None, warmup=1, repeats=3, budget_s=10)
    assert len(calls) == 2 + 3 and len(times) == 3  # the first call, one more, then the timed ones
    assert all(t >= harness.WARMUP_S for t in times)
