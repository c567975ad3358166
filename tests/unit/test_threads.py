"""Host threads for CPU kernels (engine/realize.py): every part of the outer loop runs exactly once, errors reach the
caller, and callers on several Python threads at once all get their work done."""

from __future__ import annotations

import threading

import pytest

from tgcore.engine import realize
from tgcore.plugin import Program


class Recorder:
    """A stand-in for a compiled program: records the (start, end) vals of each call."""

    def __init__(self, fail_at: int = -1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.fail_at = fail_at

    def __call__(self, *bufs: object, vals: tuple[int, ...] = ()) -> None:
        start, end = vals[-2:]
        if start <= self.fail_at < end:
            raise RuntimeError(f"part {start}..{end} failed")
        with self.lock:
            self.calls.append((start, end))


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("per_thread", [1, 4])
def test_parts_cover_the_loop_once(monkeypatch: pytest.MonkeyPatch, threads: str, per_thread: int) -> None:
    monkeypatch.setenv("TGCORE_THREADS", threads)
    for extent in (1, 2, 5, 64, 1000):
        prg = Recorder()
        realize._run_threaded(prg, [], (7,), extent, False, per_thread)
        covered = sorted(prg.calls)
        assert covered[0][0] == 0 and covered[-1][1] == extent
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # no gap, no overlap
        assert len(covered) == min(extent, int(threads) * per_thread) or int(threads) == 1


def test_an_error_in_a_part_reaches_the_caller_and_the_threads_stay_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGCORE_THREADS", "2")
    with pytest.raises(RuntimeError, match="failed"):
        realize._run_threaded(Recorder(fail_at=63), [], (), 64, False, 4)
    prg = Recorder()
    realize._run_threaded(prg, [], (), 64, False, 4)
    assert sum(e - s for s, e in prg.calls) == 64


def test_callers_on_several_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGCORE_THREADS", "2")
    results: list[int] = []

    def caller() -> None:
        for _ in range(50):
            prg = Recorder()
            realize._run_threaded(prg, [], (), 100, False, 4)
            results.append(sum(e - s for s, e in prg.calls))

    callers = [threading.Thread(target=caller) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert results == [100] * 200


def test_only_compute_bound_kernels_run_in_several_parts_per_thread() -> None:
    # a 1024^3 matmul (~24 ops per byte) balances its threads through parts; a 64 MB sum (0.1-0.4 ops per byte, a
    # compensated one included) and a small kernel run one part per thread
    assert realize.parts_per_thread(302_000_000, 12_600_000) == 4
    assert realize.parts_per_thread(27_800_000, 67_100_000) == 1
    assert realize.parts_per_thread(6_800_000, 67_100_000) == 1
    assert realize.parts_per_thread(1_000_000, 10_000) == 1


class OwnThreads(Program):
    """A Program that runs a threaded launch's parts itself (plugin API 2.3): records what it was handed."""

    def __init__(self) -> None:
        super().__init__("OWN", "k", b"")
        self.handed: list[tuple[tuple[int, ...], list[int], int]] = []

    def __call__(self, *bufs: object, vals: tuple[int, ...] = (), **kw: object) -> None:
        self.handed.append((vals[:-2], [vals[-2], vals[-1]], 1))

    def run_parts(self, *bufs: object, vals: tuple[int, ...], bounds: list[int], threads: int) -> None:
        self.handed.append((vals, list(bounds), threads))


def test_defining_run_parts_declares_it() -> None:
    assert OwnThreads.supports_parts and not Program.supports_parts
    assert not type("Plain", (Program,), {}).supports_parts


@pytest.mark.parametrize("threads,per_thread,extent", [(2, 1, 64), (2, 4, 64), (3, 4, 5), (4, 1, 3)])
def test_a_program_with_threads_of_its_own_gets_every_part_in_one_call(
    monkeypatch: pytest.MonkeyPatch, threads: int, per_thread: int, extent: int
) -> None:
    monkeypatch.setenv("TGCORE_THREADS", str(threads))
    prg = OwnThreads()
    realize._run_threaded(prg, [], (7, 8), extent, False, per_thread, own_threads=True)
    [(vals, bounds, used)] = prg.handed
    parts = min(extent, threads * per_thread)
    assert vals == (7, 8) and used == min(threads, extent) and len(bounds) == parts + 1
    assert bounds[0] == 0 and bounds[-1] == extent and all(a < b for a, b in zip(bounds, bounds[1:]))
    # one thread: a plain call over the whole loop, no parts
    monkeypatch.setenv("TGCORE_THREADS", "1")
    prg = OwnThreads()
    realize._run_threaded(prg, [], (7, 8), extent, False, per_thread, own_threads=True)
    assert prg.handed == [((7, 8), [0, extent], 1)]
