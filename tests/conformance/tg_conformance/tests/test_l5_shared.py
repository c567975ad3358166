"""Level 5, shared memory (devices whose Renderer declares `has_local` and `has_shared`): inputs staged through a
workgroup's shared memory (OptOps.STAGE: cooperative copies, barriers, a gated last round, zeros for padding) give
the same bits as the unoptimized kernel, and so does whatever the device's own heuristics pick."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tg_conformance.target import Target
from tgcore import Tensor
from tgcore.codegen.kernel import Kernel, Opt, OptOps
from tgcore.codegen.program import to_program
from tgcore.device import Buffer
from tgcore.engine.realize import CompiledRunner, get_kernel, run_schedule
from tgcore.helpers import Context

U, LOCAL, UNROLL, SPLIT = OptOps.UPCAST, OptOps.LOCAL, OptOps.UNROLL, OptOps.SPLIT
STAGE_BOTH = [Opt(OptOps.STAGE, 0, 0), Opt(OptOps.STAGE, 1, 0)]
# build(a, b), input shapes, and optimizations that stage both inputs
CASES: dict[str, tuple[Callable[[Any, Any], Any], list[tuple[int, ...]], list[Opt]]] = {
    # (32, 8 | locals 8, 4 | reduce 48 | lanes 2, 2, 4): tiles of 8 reduce steps, 256 elements each
    "matmul": (
        lambda a, b: a @ b,
        [(64, 96), (96, 32)],
        [Opt(U, 1, 4), Opt(U, 0, 2), Opt(UNROLL, 0, 2), Opt(LOCAL, 0, 8), Opt(LOCAL, 1, 4), Opt(SPLIT, 4, 8)],
    ),
    # (2, 2, 9 | locals 4 output channels, 8 columns | reduce 4, 3, 3): 24- and 12-element tiles for 32 work items
    "conv2d_padded": (
        lambda x, w: x.conv2d(w, padding=1),
        [(2, 4, 9, 8), (8, 4, 3, 3)],
        [Opt(LOCAL, 3, 8), Opt(LOCAL, 1, 4)],
    ),
}


@pytest.fixture
def shared(executing: Target) -> Target:
    if not (getattr(executing.renderer, "has_local", False) and getattr(executing.renderer, "has_shared", False)):
        pytest.skip(f"{executing.name}'s renderer declares no workgroups with shared memory")
    return executing


@pytest.mark.tg_op("shared memory")
@pytest.mark.parametrize("case", sorted(CASES))
def test_staged_inputs_give_the_unoptimized_bits(shared: Target, case: str) -> None:
    build, shapes, opts = CASES[case]
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def tensors() -> list[Tensor]:
        return [Tensor(x, device=shared.name) for x in inputs]

    with Context(NOOPT=1):
        reference = build(*tensors()).numpy()
    np.testing.assert_array_equal(build(*tensors()).numpy(), reference, err_msg=f"{case}: the device's heuristics")
    *before, si = build(*tensors()).schedule()
    run_schedule(before)  # a conv's weights are laid out by a kernel of their own
    k = Kernel(si.ast, shared.renderer)
    k.apply_opts(opts + STAGE_BOTH)
    assert len(k.staged) == 2
    dest = Buffer(shared.name, si.outputs[0].size, si.outputs[0].dtype).allocate()
    CompiledRunner(shared.name, to_program(k))([dest] + [t.base.buffer for t in si.inputs], {})
    np.testing.assert_array_equal(dest.numpy().reshape(reference.shape), reference, err_msg=f"{case}: staged")


@pytest.mark.tg_op("shared memory")
def test_heuristics_stage_only_where_shared_memory_is_fast(shared: Target) -> None:
    a, b = Tensor.ones(256, 512, device=shared.name), Tensor.ones(512, 256, device=shared.name)
    staged = OptOps.STAGE in {o.op for o in get_kernel(shared.renderer, (a @ b).schedule()[-1].ast).applied_opts}
    assert staged == bool(getattr(shared.renderer, "shared_is_fast", True))
