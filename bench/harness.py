"""The harness's parts every workload uses: timing, checking against numpy, peak memory, and the recorded results."""

from __future__ import annotations

import gc
import os
import re
import statistics
import sys
import time
import traceback
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np

from bench.runners import Runner


@dataclass(frozen=True)
class Case:
    """One row of the table: a workload's case and the unit of its figure."""

    workload: str  # the workload's letter, "a" .. "g"
    title: str  # the workload's name, "matmul"
    case: str  # "N=512"
    unit: str  # "GFLOP/s", "ms/step"
    higher_is_better: bool = True
    compare: bool = True  # False: the figures are shown without a ratio (they are not alike enough to divide)


@dataclass
class Result:
    """What one runner did on one case."""

    case: Case
    runner: str
    framework: str
    device: Optional[str]
    status: str  # "ok", "mismatch" (ran, disagrees with numpy), "skip" (with the reason), "error"
    value: Optional[float] = None
    times_s: list[float] = field(default_factory=list)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Measured:
    """A workload body's answer: the figure, the timed runs behind it, and the check against numpy."""

    value: float
    times_s: list[float]
    mismatch: Optional[str] = None  # None: the result agrees with numpy; else what disagrees
    extra: dict[str, Any] = field(default_factory=dict)


class Skip(Exception):
    """Raised by a workload body to leave a runner out of a case, with the reason."""


@dataclass
class Context:
    """What a workload gets: the runners, the run's settings, and where results go."""

    runners: list[Runner]
    quick: bool
    repeats: int  # timed runs of a measurement, at most
    budget_s: float  # seconds a measurement may take before it stops at its minimum number of runs
    results: list[Result] = field(default_factory=list)

    @property
    def tgcore(self) -> list[Runner]:
        return [r for r in self.runners if not r.is_peer]

    @property
    def peers(self) -> list[Runner]:
        return [r for r in self.runners if r.is_peer]

    def attempt(self, case: Case, runner: Runner, body: Callable[[], Measured]) -> Result:
        """Run `body` for `runner` on `case` and record what came of it; nothing it raises stops the run."""
        gc.collect()
        try:
            m = body()
        except Skip as s:
            result = Result(case, runner.name, runner.framework, runner.device, "skip", note=str(s))
        except Exception as e:
            print(f"!!! ERROR {case.title} {case.case} on {runner.name}:", file=sys.stderr)
            traceback.print_exc()
            note = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            result = Result(case, runner.name, runner.framework, runner.device, "error", note=note)
        else:
            status = "ok" if m.mismatch is None else "mismatch"
            result = Result(
                case,
                runner.name,
                runner.framework,
                runner.device,
                status,
                m.value,
                m.times_s,
                m.mismatch or "",
                m.extra,
            )
        self.results.append(result)
        _print_progress(result)
        return result

    def figure(self, case: Case, runner: Runner, value: float, times_s: Optional[list[float]] = None) -> None:
        """Record a figure already measured (and checked) elsewhere."""
        self.results.append(Result(case, runner.name, runner.framework, runner.device, "ok", value, times_s or []))
        _print_progress(self.results[-1])

    def skip(self, case: Case, runner: Runner, reason: str) -> None:
        """Record that `runner` leaves `case` out, and why."""
        self.results.append(Result(case, runner.name, runner.framework, runner.device, "skip", note=reason))
        _print_progress(self.results[-1])


def _print_progress(r: Result) -> None:
    head = f"  {r.case.workload} {r.case.title:11s} {r.case.case:32s} {r.runner:8s}"
    if r.status in ("ok", "mismatch"):
        runs = f"(median of {len(r.times_s)})" if r.times_s else ""
        line = f"{head} {r.value:10.4g} {r.case.unit:8s} {runs}"
        if r.status == "mismatch":
            line += f"\n!!! MISMATCH against numpy: {r.case.title} {r.case.case} on {r.runner}: {r.note}"
        print(line, flush=True)
    else:
        print(f"{head} {r.status}: {r.note}", flush=True)


MIN_RUNS = 3  # timed runs of a figure, at least, whatever its time
# the warm-up goes on for this long (at most MAX_WARMUP_CALLS calls) after its `warmup` calls: a core that was idle
# takes a few milliseconds to come up to speed (a 64 MB sum ran 2x slow for its first 3-5 calls, torch's for 1-2).
# (Until 2026-11-30 a first call that compiled for longer than this ended the warm-up: tgcore's figures of a new
# kernel were timed from its second call on, while torch's and numpy's had the whole warm-up)
WARMUP_S = 0.05
MAX_WARMUP_CALLS = 20


def too_slow(ctx: Context, last: Optional[tuple[str, float]], scale: float, case: str) -> Optional[str]:
    """Why a runner skips `case`, or None to run it: its last, smaller case `last` = (name, seconds a run; inf when
    it failed) predicts `scale` times that a run, and the warm-up and timed runs must fit in the budget."""
    if last is None:
        return None
    done, seconds = last
    if seconds == float("inf"):
        return f"{done} did not complete"
    runs = 1 + MIN_RUNS
    if seconds * scale * runs > ctx.budget_s:
        return (
            f"{done} took {seconds:.2f} s a run, so {case} would take ~{seconds * scale:.0f} s a run "
            f"(x{runs} runs > the {ctx.budget_s:.0f} s budget; raise it with --budget)"
        )
    return None


def last_run(result: Result, name: str) -> Optional[tuple[str, float]]:
    """What too_slow needs to know of `result`: None when it was skipped, else its name and seconds a run."""
    if result.status == "skip":
        return None
    return name, median(result.times_s) if result.times_s else float("inf")


def measure(
    fn: Callable[[], Any],
    sync: Callable[[], None],
    *,
    warmup: int,
    repeats: int,
    budget_s: float,
    min_runs: int = MIN_RUNS,
) -> tuple[list[float], Any]:
    """Seconds of each timed call of `fn` (then `sync`) after `warmup` untimed calls (more until WARMUP_S has passed),
    and the last call's output.

    Runs stop at `repeats`, or earlier once `min_runs` are done and `budget_s` is spent; when the warm-up alone
    overran the budget, one timed run is all there is, so that a slow runner cannot stall the harness."""
    # each call drops the last output first: while it is alive, a lazy framework may hand back the same result
    # instead of computing it again (tinygrad's lazycache does, for an op on the same realized inputs)
    out = None
    start = time.perf_counter()
    calls, last, warm_from = 0, 0.0, start
    # WARMUP_S counts from the end of the `warmup` calls, which may compile (so their time stops nothing); a call
    # after them that takes WARMUP_S alone is the last of the warm-up
    while calls < warmup or (
        calls < warmup + MAX_WARMUP_CALLS and last < WARMUP_S and time.perf_counter() - warm_from < WARMUP_S
    ):
        out = None
        t0 = time.perf_counter()
        out = fn()
        sync()
        calls += 1
        last = time.perf_counter() - t0 if calls > warmup else 0.0
        if calls == warmup:
            warm_from = time.perf_counter()
    if time.perf_counter() - start > budget_s:
        min_runs = 1
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        out = None
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
        if len(times) >= min(min_runs, repeats) and time.perf_counter() - start > budget_s:
            break
    return times, out


def median(times: list[float]) -> float:
    return statistics.median(times)


def check(got: Any, expected: np.ndarray, *, rtol: float, atol: Union[float, np.ndarray]) -> Optional[str]:
    """None when `got` equals `expected` within |got - expected| <= atol + rtol * |expected|, else what differs.

    `atol` may be an array that broadcasts against `expected` (a tolerance per value)."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    g, e = got.astype(np.float64), expected.astype(np.float64)
    bad = ~(np.abs(g - e) <= atol + rtol * np.abs(e))  # NaN compares False, so a NaN is bad too
    if not bad.any():
        return None
    excess = np.where(np.isnan(g), np.inf, np.abs(g - e) / (atol + rtol * np.abs(e) + 1e-300))
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.ndim else ()
    return (
        f"{int(bad.sum())} of {bad.size} values differ (rtol {rtol:g}, atol {np.max(atol):g}); worst at index "
        f"{tuple(int(i) for i in worst)}: got {float(g[worst])!r}, expected {float(e[worst])!r}"
    )


# ***** peak memory *****


def _proc_status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _reset_peak_rss() -> bool:
    """Set the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class PeakMemory:
    """Peak memory during a block, over its value when the block starts.

    rss_growth_bytes: the process's peak resident memory (Linux VmHWM, reset at the start), any framework.
    live_bytes: tgcore and tinygrad, the high-water mark of GlobalCounters.mem_used (device buffers alive at once,
    not counting memory their allocator caches for reuse); numpy, with `trace_numpy`, the peak of tracemalloc
    (numpy reports its arrays' memory to it); torch, None."""

    rss_growth_bytes: Optional[int] = None
    live_bytes: Optional[int] = None

    def as_dict(self) -> dict[str, Optional[int]]:
        return {"peak_rss_growth_bytes": self.rss_growth_bytes, "peak_live_bytes": self.live_bytes}


@contextmanager
def peak_memory(runner: Runner, trace_numpy: bool = False) -> Iterator[PeakMemory]:
    """Measure the peak memory of the block (see PeakMemory). tracemalloc slows numpy: never time with trace_numpy."""
    peak = PeakMemory()
    gc.collect()
    rss_ok = _reset_peak_rss()
    rss0 = _proc_status_kb("VmRSS")
    restore: Optional[Callable[[], None]] = None
    if runner.lazy:
        counters, buffer_cls = runner.lib.GlobalCounters, runner.lib.Buffer
        base = counters.mem_used
        high = [base]
        allocate = buffer_cls.allocate

        def tracking_allocate(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = allocate(self, *args, **kwargs)
            high[0] = max(high[0], counters.mem_used)
            return out

        buffer_cls.allocate = tracking_allocate

        def restore() -> None:
            buffer_cls.allocate = allocate
            peak.live_bytes = high[0] - base

    elif runner.framework == "numpy" and trace_numpy:
        tracemalloc.start()
        traced0 = tracemalloc.get_traced_memory()[0]

        def restore() -> None:
            peak.live_bytes = tracemalloc.get_traced_memory()[1] - traced0
            tracemalloc.stop()

    try:
        yield peak
    finally:
        if restore is not None:
            restore()
        hwm = _proc_status_kb("VmHWM")
        if rss_ok and rss0 is not None and hwm is not None:
            peak.rss_growth_bytes = (hwm - rss0) * 1024


# ***** the machine and the software, for the report *****


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        return m.group(1).strip() if m else "unknown"
    except OSError:
        return "unknown"


def _version(dist: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def blas_info() -> list[dict[str, Any]]:
    """The BLAS libraries numpy (and torch, if imported) loaded, with the kernel each runs, from threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"note": "threadpoolctl is not installed: pip install threadpoolctl to see numpy's BLAS kernel"}]
    keys = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads", "threading_layer")
    return [{k: lib.get(k) for k in keys} for lib in threadpool_info()]


def _tgcore_source() -> dict[str, Any]:
    """Where tgcore is imported from and, in a git checkout, its commit and whether the core or plugins differ."""
    import subprocess

    import tgcore

    root = os.path.dirname(os.path.dirname(os.path.abspath(tgcore.__file__)))
    out: dict[str, Any] = {"path": root}
    try:
        git = ["git", "-C", root]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            out["commit"] = commit.stdout.strip()
            status = [*git, "status", "--porcelain", "--", "tgcore", "plugins"]
            out["modified"] = bool(subprocess.run(status, capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def environment() -> dict[str, Any]:
    """Date, machine, load, software versions and the environment variables that change the figures."""
    import platform

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tgcore_source": _tgcore_source(),
        "versions": {
            d: _version(d) for d in ("tgcore", "tg-clang", "tg-llvm", "tg-opencl", "numpy", "torch", "tinygrad")
        },
        "env": {
            k: os.environ.get(k)
            for k in (
                "OPENBLAS_CORETYPE",
                "OPENBLAS_L2_SIZE",
                "OMP_NUM_THREADS",
                "DISABLE_COMPILER_CACHE",
                "DISABLE_PROGRAM_CACHE",
                "CC",
            )
        },
    }
