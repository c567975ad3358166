"""A schedule's kernels are lowered in order and compiled on worker threads before they run (engine/realize.py
compile_ahead): the same programs and results as one kernel at a time, the error of the kernel that failed, and a
random-number kernel small enough to compile fast (codegen/kernel.py LONG_KERNEL_OPS)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np
import pytest

from tgcore import Device, Tensor, dtypes, plugin
from tgcore.codegen import kernel as kernel_module
from tgcore.codegen.program import to_program
from tgcore.engine import realize
from tgcore.helpers import prod
from tgcore.ops import BufferOps
from tgcore.plugin import CompileError


def _devices() -> list[str]:
    """PYTHON, and CLANG where it is installed and works here (its compiler is a process of its own)."""
    return ["PYTHON"] + (["CLANG"] if Device.status("CLANG") is None else [])


@pytest.fixture
def cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel of this process is lowered or compiled yet, and the disk cache is not read."""
    monkeypatch.setattr(realize, "_runner_cache", {})
    monkeypatch.setattr(realize, "_runner_by_id", {})
    monkeypatch.setattr(plugin, "_compiled", {})
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")


def _chain(device: str, xn: np.ndarray) -> Tensor:
    """Three dependent kernels: two elementwise ones and a sum."""
    x = Tensor(xn, device=device)
    return (((x + 1).contiguous() * 2).contiguous().exp2() - 3).sum(axis=1)


def _expected(xn: np.ndarray) -> np.ndarray:
    return (np.exp2((xn.astype(np.float64) + 1) * 2) - 3).sum(axis=1)


def _run(device: str, xn: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The chain's result and the source of each kernel its schedule ran, in order."""
    out = _chain(device, xn)
    schedule = out.schedule()
    kernels = [si for si in schedule if si.ast.op is BufferOps.STORE]
    assert len(kernels) >= 3, [si.ast.op for si in schedule]
    realize.run_schedule(schedule)
    sources = [realize.get_runner(si.outputs[0].device, si.ast).p.src for si in kernels]
    return out.numpy(), sources


@pytest.mark.parametrize("device", _devices())
def test_compiled_ahead_same_programs_and_results_as_one_at_a_time(
    cold: None, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    xn = np.linspace(-2, 2, 4 * 33, dtype=np.float32).reshape(4, 33)
    compiled_on: list[str] = []
    compiler = Device[device].compiler
    compile_cached = compiler.compile_cached

    def recording(src: str) -> bytes:
        compiled_on.append(threading.current_thread().name)
        return compile_cached(src)

    monkeypatch.setattr(compiler, "compile_cached", recording)
    ahead, ahead_sources = _run(device, xn)
    # every kernel of the schedule was compiled on the pool, none on this thread
    assert len(compiled_on) == len(ahead_sources) and all(n.startswith("tgcore-compile") for n in compiled_on)

    monkeypatch.setattr(realize, "_runner_cache", {})
    monkeypatch.setattr(realize, "_runner_by_id", {})
    monkeypatch.setattr(plugin, "_compiled", {})
    monkeypatch.setattr(realize, "compile_ahead", lambda schedule: None)  # one at a time, as get_runner does it
    compiled_on.clear()
    serial, serial_sources = _run(device, xn)
    assert compiled_on == [threading.current_thread().name] * len(serial_sources)

    assert ahead_sources == serial_sources
    np.testing.assert_array_equal(ahead, serial)
    np.testing.assert_allclose(ahead, _expected(xn), rtol=1e-5)


@pytest.mark.parametrize("device", _devices())
def test_a_failing_compile_in_the_middle_raises_its_error_after_the_kernels_before_it(
    cold: None, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    xn = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = _chain(device, xn)
    schedule = out.schedule()
    kernels = [si for si in schedule if si.ast.op is BufferOps.STORE]
    programs = [to_program(realize.get_kernel(Device[device].renderer, si.ast, device)) for si in kernels]
    realize._runner_cache.clear()
    realize._runner_by_id.clear()
    compiler = Device[device].compiler
    compile_cached = compiler.compile_cached
    raised: list[CompileError] = []

    def failing_second(src: str) -> bytes:
        if src == programs[1].src:
            raised.append(CompileError(f"cannot compile {programs[1].name}", log="error: made to fail", src=src))
            raise raised[-1]
        return compile_cached(src)

    monkeypatch.setattr(compiler, "compile_cached", failing_second)
    with pytest.raises(CompileError) as info:
        realize.run_schedule(schedule)
    assert raised and info.value is raised[0]
    assert programs[1].name in str(info.value)
    # the first kernel ran, as it would have one kernel at a time; the failing one and those after it did not
    assert kernels[0].outputs[0].realized is not None
    assert all(out_lb.realized is None for si in kernels[1:] for out_lb in si.outputs)
    expected_first = xn + 1
    first = np.frombuffer(kernels[0].outputs[0].buffer.as_buffer(), dtype=np.float32).reshape(expected_first.shape)
    np.testing.assert_array_equal(first, expected_first)
    assert realize._known_runner(device, kernels[2].ast) is None


def test_a_lowering_error_is_raised_at_its_kernel(cold: None, monkeypatch: pytest.MonkeyPatch) -> None:
    xn = np.arange(8, dtype=np.float32).reshape(2, 4)
    schedule = _chain("PYTHON", xn).schedule()
    kernels = [si for si in schedule if si.ast.op is BufferOps.STORE]
    get_kernel = realize.get_kernel

    def failing_last(renderer: Any, ast: Any, device: Optional[str] = None) -> Any:
        if ast is kernels[-1].ast:
            raise ValueError("made to fail: the last kernel")
        return get_kernel(renderer, ast, device)

    monkeypatch.setattr(realize, "get_kernel", failing_last)
    with pytest.raises(ValueError, match="the last kernel"):
        realize.run_schedule(schedule)
    assert all(out_lb.realized is not None for si in kernels[:-1] for out_lb in si.outputs)
    assert kernels[-1].outputs[0].realized is None


def test_compiling_ahead_from_several_threads_at_once(cold: None) -> None:
    """Each thread's schedules compile on the shared pool; every result is right."""
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            xn = np.full((2, 5), i / 8, dtype=np.float32)
            results[i] = (_chain("PYTHON", xn).numpy(), _expected(xn))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in results.values():
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(results) == 4


@pytest.mark.parametrize("device", _devices())
def test_a_long_fused_kernel_gets_few_lanes_and_the_same_numbers(device: str) -> None:
    """~380 integer ops a lane fused into a max (a balanced sum of 128 terms x * c - d): more than LONG_KERNEL_OPS,
    so at most LONG_KERNEL_LANES lanes (16 or 32 lanes of randn's old 520-op kernel made 200-380k characters of C
    and 1.2-3 s of gcc); the max equals numpy's."""
    xn = np.arange(64 * 64, dtype=np.int32).reshape(64, 64) - 2000
    x = Tensor(xn, device=device)
    terms = [x * (i % 5 + 1) - i for i in range(128)]
    want = [xn * np.int32(i % 5 + 1) - np.int32(i) for i in range(128)]
    while len(terms) > 1:
        terms = [a + b for a, b in zip(terms[::2], terms[1::2])]
        want = [a + b for a, b in zip(want[::2], want[1::2])]
    fused = terms[0].max()
    schedule = fused.schedule()
    reduces = [si for si in schedule if si.ast.op is BufferOps.STORE and si.ast.lazyops()]
    first = realize.get_kernel(Device[device].renderer, reduces[0].ast, device)
    ops = sum(1 for x in reduces[0].ast.lazyops() if not isinstance(x.op, (BufferOps, kernel_module.ReduceOps)))
    assert ops > kernel_module.LONG_KERNEL_OPS
    assert prod(first.upcast_sizes) <= kernel_module.LONG_KERNEL_LANES, first.applied_opts
    realize.run_schedule(schedule)
    assert fused.item() == want[0].max()


@pytest.mark.parametrize("device", _devices())
def test_random_words_are_a_kernel_of_their_own_and_fuse_the_same_numbers(device: str) -> None:
    """randn's Threefry words are computed in a kernel of their own, (2, n / 2): each counter's rounds once for its
    two words (Kernel._shared_lanes), then read by what uses them; a max over a draw equals the max of the same draw
    made alone."""
    Tensor.manual_seed(11)
    alone = Tensor.randn(64, 64, device=device).numpy()
    Tensor.manual_seed(11)
    fused = Tensor.randn(64, 64, device=device).max()
    schedule = fused.schedule()
    kernels = [si for si in schedule if si.ast.op is BufferOps.STORE]
    words = [si for si in kernels if si.outputs[0].shape == (2, 64 * 64)]  # (two uniform draws of 64 x 64 a word)
    assert len(words) == 1 and words[0].outputs[0].dtype == dtypes.uint32
    k = realize.get_kernel(Device[device].renderer, words[0].ast, device)
    if Device[device].renderer.vector_widths.get(dtypes.float32, 1) > 1:
        assert kernel_module.Opt(kernel_module.OptOps.UPCAST, 0, 2) in k.applied_opts, k.applied_opts
    realize.run_schedule(schedule)
    assert fused.item() == alone.max()


def test_a_compiler_that_is_not_concurrent_compiles_on_the_calling_thread(
    cold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = Device["PYTHON"].compiler
    compile_cached = compiler.compile_cached
    compiled_on: list[str] = []

    def recording(src: str) -> bytes:
        compiled_on.append(threading.current_thread().name)
        return compile_cached(src)

    monkeypatch.setattr(compiler, "compile_cached", recording)
    monkeypatch.setattr(compiler, "concurrent", False)
    xn = np.linspace(0, 1, 10, dtype=np.float32).reshape(2, 5)
    got, sources = _run("PYTHON", xn)
    assert compiled_on == [threading.current_thread().name] * len(sources)
    np.testing.assert_allclose(got, _expected(xn), rtol=1e-5)


def _many(device: str, xn: np.ndarray) -> Tensor:
    """Seven dependent kernels, of five names: elementwise ones over 2-, 3- and 4-d views, and a sum."""
    x = Tensor(xn, device=device)
    for i, shape in enumerate([(4, 36), (4, 36), (12, 12), (2, 6, 12), (2, 6, 12), (3, 4, 12)]):
        x = (x.reshape(shape) * (i + 2) - 1).contiguous()
    return x.reshape(4, 36).sum(axis=1)


def _many_expected(xn: np.ndarray) -> np.ndarray:
    x = xn.astype(np.float64)
    for i in range(6):
        x = x * (i + 2) - 1
    return x.sum(axis=1)


@pytest.fixture
def grouped(cold: None, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Any]:
    """The compiler of a device, made to take groups of up to 3 sources, with one compile thread (groups of up to half
    the kernels a thread: here up to 3) and every kernel lowered and built in the test (no rendered or compiled one
    from the disk caches)."""
    monkeypatch.setenv("TGCORE_THREADS", "1")
    monkeypatch.setattr(realize, "_program_key", lambda device, ast: None)

    def compiler(device: str) -> Any:
        compiler = Device[device].compiler
        monkeypatch.setattr(compiler, "batch", 3)
        monkeypatch.setattr(compiler, "cachekey", None)
        return compiler

    return compiler


@pytest.mark.parametrize("device", _devices())
def test_a_compiler_that_builds_several_at_once_gets_groups_of_distinct_names(
    grouped: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    xn = np.linspace(-1, 1, 144, dtype=np.float32).reshape(4, 36)
    compiler = grouped(device)
    sizes: list[int] = []
    compile_cached_many = compiler.compile_cached_many

    def recording(srcs: list[str]) -> list[bytes]:
        sizes.append(len(srcs))
        return compile_cached_many(srcs)

    monkeypatch.setattr(compiler, "compile_cached_many", recording)
    out = _many(device, xn)
    schedule = out.schedule()
    kernels = [si for si in schedule if si.ast.op is BufferOps.STORE]
    realize.run_schedule(schedule)
    names = [realize.get_runner(device, si.ast).p.name for si in kernels]
    assert len(kernels) == 7 and len(set(names)) < len(names)  # (some kernels share a name)
    # groups of consecutive kernels, at most 3, names all different within one, every kernel in exactly one
    start, expect = 0, []
    while start < len(names):
        end = start
        while end < len(names) and end - start < 3 and names[end] not in names[start:end]:
            end += 1
        expect.append(end - start)
        start = end
    assert [s for s in expect if s > 1] == sizes
    np.testing.assert_allclose(out.numpy(), _many_expected(xn), rtol=1e-5)


@pytest.mark.parametrize("device", _devices())
def test_a_group_that_fails_to_build_is_built_again_one_by_one(
    grouped: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    xn = np.linspace(-1, 1, 144, dtype=np.float32).reshape(4, 36)
    compiler = grouped(device)
    groups: list[int] = []

    def failing(srcs: list[str]) -> list[bytes]:
        groups.append(len(srcs))
        raise CompileError("made to fail: the group", log="error: made to fail", src=srcs[0])

    monkeypatch.setattr(compiler, "compile_many", failing)
    np.testing.assert_allclose(_many(device, xn).numpy(), _many_expected(xn), rtol=1e-5)
    assert groups
    # and a kernel that fails on its own too raises its error at its place, after the kernels before it ran
    monkeypatch.setattr(realize, "_runner_cache", {})
    monkeypatch.setattr(realize, "_runner_by_id", {})
    monkeypatch.setattr(plugin, "_compiled", {})
    out = _many(device, xn)
    schedule = out.schedule()
    kernels = [si for si in schedule if si.ast.op is BufferOps.STORE]
    bad = to_program(realize.get_kernel(Device[device].renderer, kernels[2].ast, device)).src
    compile_cached = compiler.compile_cached

    def failing_third(src: str) -> bytes:
        if src == bad:
            raise CompileError("cannot compile the third", log="error: made to fail", src=src)
        return compile_cached(src)

    monkeypatch.setattr(compiler, "compile_cached", failing_third)
    with pytest.raises(CompileError, match="the third"):
        realize.run_schedule(schedule)
    assert all(o.realized is not None for si in kernels[:2] for o in si.outputs)
    assert all(o.realized is None for si in kernels[2:] for o in si.outputs)


@pytest.mark.parametrize("device", _devices())
def test_a_cached_schedule_that_ran_is_not_searched_for_kernels_to_compile(
    device: str, cold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedule of a graph that repeats comes from a cached template; once one made from it has run, its kernels
    are compiled and run_schedule does not call compile_ahead for the next (a training step's 42 kernels: 20-80 us).
    A kernel whose runner is gone all the same (a cleared cache) is compiled when it is reached, with the same
    result."""
    calls: list[int] = []
    real = realize.compile_ahead

    def counted(schedule: list[Any]) -> Optional[tuple[int, Exception]]:
        calls.append(len(schedule))
        return real(schedule)

    monkeypatch.setattr(realize, "compile_ahead", counted)
    xn = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
    want = (np.exp2((xn.astype(np.float64) + 1) * 2) - 3).sum(axis=1)
    for run in range(3):
        np.testing.assert_allclose(_chain(device, xn).numpy(), want, rtol=1e-5)
        if run == 1:
            monkeypatch.setattr(realize, "_runner_cache", {})  # (the runners are gone: compiled again on the way)
            monkeypatch.setattr(realize, "_runner_by_id", {})
    assert len(calls) == 1  # the first run only: the others are made from its template, which it marked as run
