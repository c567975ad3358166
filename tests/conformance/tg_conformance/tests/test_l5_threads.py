"""Level 5, host threads (devices whose Renderer declares `threads`): a big kernel's outermost loop is split across
threads, and every result stays the same, bit for bit, whatever the thread count (TGCORE_THREADS) and with the
optimizer off (NOOPT)."""
from __future__ import annotations

import numpy as np
import pytest

from tg_conformance.target import Target
from tgcore import Tensor
from tgcore.codegen.program import to_program
from tgcore.engine.realize import get_kernel, thread_count
from tgcore.helpers import Context

CASES = {
    "elementwise": (lambda a, b: (a * b + a).exp(), [(1021, 389), (1021, 389)]),
    "matmul": (lambda a, b: a @ b, [(300, 128), (128, 256)]),
    "sum_rows": (lambda a: a.sum(axis=1), [(1031, 700)]),
    "sum_columns": (lambda a: a.sum(axis=0), [(700, 1031)]),
    "max": (lambda a: a.max(axis=1), [(1024, 512)]),
}


@pytest.fixture
def threaded(executing: Target) -> Target:
    if not getattr(executing.renderer, "threads", False):
        pytest.skip(f"{executing.name}'s renderer does not run kernels on host threads (Renderer.threads)")
    return executing


@pytest.mark.tg_op("threads")
@pytest.mark.parametrize("case", sorted(CASES))
def test_thread_counts_give_the_same_bits(threaded: Target, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    build, shapes = CASES[case]
    # every case split, on a renderer whose threads start at more work than these cases do (LLVM's: 4M units)
    monkeypatch.setattr(threaded.renderer, "thread_min_work", min(threaded.renderer.thread_min_work, 1 << 16))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def run() -> np.ndarray:
        return build(*[Tensor(x, device=threaded.name) for x in inputs]).numpy()

    last = build(*[Tensor(x, device=threaded.name) for x in inputs]).schedule()[-1]
    assert to_program(get_kernel(threaded.renderer, last.ast)).thread_extent is not None  # (the case is split)

    with Context(NOOPT=1):
        reference = run()
    for threads in ("1", "2", "3", "7"):
        monkeypatch.setenv("TGCORE_THREADS", threads)
        assert thread_count() == int(threads)
        np.testing.assert_array_equal(run(), reference, err_msg=f"{case} on {threads} threads")


@pytest.mark.tg_op("threads")
def test_big_kernels_split_and_small_ones_do_not(threaded: Target) -> None:
    rows = max(1024, -(-threaded.renderer.thread_min_work // 1024))  # (an add: one unit of work an element)
    big = (Tensor.ones(rows, 1024, device=threaded.name).contiguous() + 1).schedule()[-1]
    small = (Tensor.ones(16, device=threaded.name).contiguous() + 1).schedule()[-1]
    program = to_program(get_kernel(threaded.renderer, big.ast))
    assert program.thread_extent is not None and program.thread_extent >= 2
    assert [u.arg[0] for u in program.uops if u.op.name == "DEFINE_VAR"][-2:] == ["core_start", "core_end"]
    assert to_program(get_kernel(threaded.renderer, small.ast)).thread_extent is None


@pytest.mark.tg_op("threads")
def test_in_place_update_is_not_split(threaded: Target) -> None:
    x = Tensor(np.arange(1 << 18, dtype=np.float32), device=threaded.name).realize()
    si = x.assign(x * 2 + 1).schedule()[-1]  # reads the buffer it writes: the kernel stays on one thread
    program = to_program(get_kernel(threaded.renderer, si.ast))
    assert any(leaf.arg.idx == 0 for leaf in si.ast.lazyops() if leaf.op.name == "LOAD")
    assert program.thread_extent is None
    x.realize()
    np.testing.assert_array_equal(x.numpy(), np.arange(1 << 18, dtype=np.float32) * 2 + 1)
