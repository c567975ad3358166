"""tg-llvm's compile processes (tg_llvm/workers.py): the same object code as a compile in this process, errors
carried back, a worker that dies replaced by this process, and a schedule's kernels built by them running right."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tg_llvm.compiler as compiler_module
from tg_llvm import workers as workers_module
from tg_llvm.compiler import LLVMCompiler
from tg_llvm.workers import Workers, workers

from tgcore import Device, Tensor
from tgcore.engine.realize import lower_program
from tgcore.plugin import CompileError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers serve ELF hosts (Linux)")


def _sources(n: int) -> list[str]:
    """The LLVM IR of n different kernels (sums of shapes no other test uses)."""
    out = []
    for i in range(n):
        t = Tensor.empty(3 + i, 41, device="LLVM").sum(1)
        si = t.schedule_with_vars()[0][-1]
        out.append(lower_program("LLVM", si.ast).src)
    return out


@pytest.fixture
def pool() -> Workers:
    p = Workers(LLVMCompiler().opt, 2)
    yield p
    p.close()


def test_a_worker_builds_the_object_code_this_process_builds(pool: Workers) -> None:
    here = LLVMCompiler(workers=0)
    for src in _sources(3):
        assert pool.compile(src) == here.compile(src)
    assert pool.compiled == 3 and 1 <= pool.started <= 2


def test_a_compile_error_in_a_worker_carries_its_log_and_source(pool: Workers) -> None:
    bad = "define void @k(ptr %x) {\n  ret i32 0\n}\n"
    with pytest.raises(CompileError) as info:
        pool.compile(bad)
    assert info.value.message == "LLVM rejected the kernel's IR" and info.value.src == bad and info.value.log
    assert pool.compile(_sources(1)[0])[:4] == b"\x7fELF"  # (the worker serves on)


def test_a_dead_worker_leaves_its_kernels_to_this_process(monkeypatch: pytest.MonkeyPatch, pool: Workers) -> None:
    srcs = _sources(4)
    pool.compile(srcs[0])
    for worker in pool.free:
        worker.proc.kill()
        worker.proc.wait()
    monkeypatch.setattr(workers_module, "workers", lambda opt, count: pool)
    monkeypatch.setattr(compiler_module, "WORKER_MIN_IR", 0)
    c = LLVMCompiler(workers=2)
    assert c.compile_many(srcs) == [LLVMCompiler(workers=0).compile(src) for src in srcs]


def test_compile_many_starts_workers_only_for_enough_ir(monkeypatch: pytest.MonkeyPatch, pool: Workers) -> None:
    monkeypatch.setattr(workers_module, "workers", lambda opt, count: pool)
    srcs = _sources(3)
    assert sum(map(len, srcs)) < compiler_module.WORKER_MIN_IR
    LLVMCompiler(workers=2).compile_many(srcs)
    assert pool.started == 0  # (a few small kernels: built here)
    monkeypatch.setattr(compiler_module, "WORKER_MIN_IR", 0)
    LLVMCompiler(workers=2).compile_many(srcs)
    assert pool.compiled == 3


def test_workers_are_off_with_a_count_of_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert workers(2, 0) is None
    monkeypatch.setenv("TGCORE_LLVM_WORKERS", "0")
    assert workers(2, 4) is None
    monkeypatch.setenv("TGCORE_LLVM_WORKERS", "3")
    assert (w := workers(2, 1)) is not None and w.count == 3


def test_a_schedule_built_by_the_workers_computes_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels new to this process, lowered and compiled ahead in groups (the core's compile threads), built by the
    workers: each output against numpy."""
    monkeypatch.setattr(compiler_module, "WORKER_MIN_IR", 0)
    monkeypatch.setenv("TGCORE_LLVM_WORKERS", "2")
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # (built now, not read from an earlier run's disk cache)
    if "LLVM" not in Device.available():
        pytest.skip("LLVM is not available here")
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((5 + i, 29 + 2 * i)).astype(np.float32) for i in range(12)]
    outs = [Tensor(a, device="LLVM").exp().sum(1) * (i + 1) for i, a in enumerate(arrays)]
    pool = workers(LLVMCompiler().opt, 2)
    assert pool is not None
    before = pool.compiled
    Tensor.realize(*outs)
    assert pool.compiled > before
    for i, (a, out) in enumerate(zip(arrays, outs)):
        np.testing.assert_allclose(out.numpy(), np.exp(a.astype(np.float64)).sum(1) * (i + 1), rtol=1e-5)


def test_a_forked_child_starts_workers_of_its_own() -> None:
    pool = workers(LLVMCompiler().opt, 2)
    assert pool is not None
    pid = os.fork()
    if pid == 0:  # the child: its parent's workers are forgotten (their pipes are shared)
        os._exit(0 if workers(LLVMCompiler().opt, 2) is not pool else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_workers_that_cannot_start_are_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that ends before its first answer (here: a 'Python' that exits at once) marks the pool broken: the
    kernels compile in this process, and no other worker is started."""
    pool = Workers(LLVMCompiler().opt, 2)
    starts = []
    real_popen = workers_module.subprocess.Popen

    def popen(args: list, **kwargs: object) -> object:
        starts.append(args)
        return real_popen(["/bin/false"], **kwargs)

    monkeypatch.setattr(workers_module.subprocess, "Popen", popen)
    monkeypatch.setattr(workers_module, "workers", lambda opt, count: pool)
    monkeypatch.setattr(compiler_module, "WORKER_MIN_IR", 0)
    srcs = _sources(3)
    expected = [LLVMCompiler(workers=0).compile(src) for src in srcs]
    assert LLVMCompiler(workers=2).compile_many(srcs) == expected
    assert pool.broken and len(starts) == 1 and pool.started == 0
    assert LLVMCompiler(workers=2).compile_many(srcs) == expected and len(starts) == 1
