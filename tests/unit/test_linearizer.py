"""The linearizer's choices that depend on what a Renderer declares (fused_mulacc, shared memory: STAGE), and the
summation orders every device shares: compensated float32 sums and lane reduces."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOp, UOps
from tgcore.device import Buffer, Device
from tgcore.engine.realize import CompiledRunner, get_kernel, run_schedule
from tgcore.ops import BinaryOps, TernaryOps
from tgcore.runtime.python import PythonRenderer


class FusedRenderer(PythonRenderer):
    fused_mulacc = True


def _uops(t: Tensor, fused: bool, optimize: bool = True) -> list[UOp]:
    renderer = FusedRenderer() if fused else PythonRenderer()
    ast = t.schedule()[-1].ast
    k = get_kernel(renderer, ast, "PYTHON") if optimize else Kernel(ast, renderer)
    return to_program(k).uops


def _value_ops(uops: list[UOp]) -> list[object]:
    """The ALU ops on non-index values (anything but int32)."""
    return [u.arg for u in uops if u.op is UOps.ALU and u.dtype is not None and u.dtype.scalar() != dtypes.int32]


def test_a_fused_renderer_accumulates_products_with_mulacc() -> None:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((8, 12)).astype(np.float32))
    b = Tensor(rng.standard_normal((12, 4)).astype(np.float32))
    for optimize in (False, True):
        fused = _uops(a @ b, True, optimize)
        assert TernaryOps.MULACC in _value_ops(fused) and BinaryOps.MUL not in _value_ops(fused)
        read = {id(s) for u in fused for s in u.src}
        assert all(id(u) in read for u in fused if u.op is UOps.ALU)  # the products MULACC took over are gone
        plain = _value_ops(_uops(a @ b, False, optimize))
        assert TernaryOps.MULACC not in plain and BinaryOps.MUL in plain and BinaryOps.ADD in plain
    # only float32 / float64 SUMs of products: a plain sum, a max of products and an int contraction keep their ops
    assert TernaryOps.MULACC not in _value_ops(_uops(a.sum(axis=1), True))
    assert TernaryOps.MULACC not in _value_ops(_uops((a * 2).max(axis=1), True))
    ints = Tensor(np.arange(96, dtype=np.int32).reshape(8, 12)) @ Tensor(np.ones((12, 4), np.int32))
    assert TernaryOps.MULACC not in [u.arg for u in _uops(ints, True) if u.op is UOps.ALU]
    assert TernaryOps.MULACC in _value_ops(_uops(a.cast(dtypes.float64) @ b.cast(dtypes.float64), True))


# ***** STAGE: inputs read through a workgroup's shared memory *****


class WorkgroupRenderer(PythonRenderer):
    """PYTHON with workgroups and shared memory (the interpreter runs them; the built-in renderer declares none)."""

    has_local = True
    has_shared = True
    local_max = (64, 64, 64)
    shared_max = 8192


def _run(si, k: Kernel) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = si.outputs[0]
    dest = Buffer("PYTHON", out.size, out.dtype).allocate()
    CompiledRunner("PYTHON", to_program(k))([dest] + [x.base.buffer.allocate() for x in si.inputs], si.var_vals)
    return dest.numpy()


def _last_item(t: Tensor):  # type: ignore[no-untyped-def]
    schedule = t.schedule()
    run_schedule(schedule[:-1])
    return schedule[-1]


def _staged(si, opts: list[Opt]) -> tuple[np.ndarray, np.ndarray, Kernel]:  # type: ignore[no-untyped-def]
    k = Kernel(si.ast, WorkgroupRenderer())
    k.apply_opts(opts)
    return _run(si, k), _run(si, Kernel(si.ast, WorkgroupRenderer())), k


def test_stage_copies_inputs_into_shared_memory_and_keeps_results() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    si = _last_item(Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON"))
    local = [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 4)]  # -> (4, 2, 4, 4, 32): reduce loop at axis 4
    for opts in (
        [*local, Opt(OptOps.SPLIT, 4, 8), Opt(OptOps.STAGE, 0, 0), Opt(OptOps.STAGE, 1, 0)],
        [
            Opt(OptOps.UPCAST, 1, 2),
            Opt(OptOps.UPCAST, 0, 2),
            Opt(OptOps.UNROLL, 0, 4),
            *local,  # -> (2, 4, 4, 8, 4, 2, 2): the reduce loop is axis 3, then the upcast and unrolled lanes
            Opt(OptOps.SPLIT, 3, 4),
            Opt(OptOps.STAGE, 1, 0),
            Opt(OptOps.STAGE, 0, 0),
        ],
        [*local, Opt(OptOps.STAGE, 0, 0)],  # the whole reduce axis at once
    ):
        got, plain, k = _staged(si, opts)
        assert np.array_equal(got, plain), opts  # the same bits as the unoptimized kernel
        np.testing.assert_allclose(got.reshape(16, 8), a @ b, rtol=1e-5, atol=1e-5)
        uops = to_program(k).uops
        assert sum(u.op is UOps.DEFINE_LOCAL for u in uops) == len(k.staged) and any(u.op is UOps.BARRIER for u in uops)


def test_stage_of_a_padded_input_copies_zeros_for_the_padding() -> None:
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 6, 6)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    si = _last_item(Tensor(x, device="PYTHON").conv2d(Tensor(w, device="PYTHON"), padding=1))
    k = Kernel(si.ast, WorkgroupRenderer())
    k.hand_coded_optimizations()
    assert OptOps.STAGE in {o.op for o in k.applied_opts}  # shared memory is fast here: the heuristics stage
    got, plain = _run(si, k), _run(si, Kernel(si.ast, WorkgroupRenderer()))
    assert np.array_equal(got, plain)
    ref = Tensor(x, device="PYTHON").conv2d(Tensor(w, device="PYTHON"), padding=1).numpy()
    np.testing.assert_array_equal(got.reshape(ref.shape), ref)


def test_stage_is_refused_where_it_cannot_apply() -> None:
    a, b = Tensor(np.ones((16, 32), np.float32), device="PYTHON"), Tensor(np.ones((32, 8), np.float32), device="PYTHON")
    ast = (a @ b).schedule()[-1].ast

    def refused(renderer: PythonRenderer, opts: list[Opt], why: str) -> None:
        k = Kernel(ast, renderer)
        k.apply_opts(opts[:-1])
        before = (k.full_shape, list(k.applied_opts), k.staged)
        with pytest.raises(KernelOptError, match=why):
            k.apply_opt(opts[-1])
        assert (k.full_shape, k.applied_opts, k.staged) == before

    local = [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 4)]
    refused(PythonRenderer(), [Opt(OptOps.STAGE, 0, 0)], "no shared memory")
    refused(WorkgroupRenderer(), [Opt(OptOps.STAGE, 0, 0)], "needs a workgroup")
    refused(WorkgroupRenderer(), [*local, Opt(OptOps.STAGE, 2, 0)], "not an input")
    refused(WorkgroupRenderer(), [Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.STAGE, 1, 0)], "reuses")  # b varies along j
    refused(WorkgroupRenderer(), [*local, Opt(OptOps.STAGE, 0, 0), Opt(OptOps.STAGE, 0, 0)], "staged already")
    refused(WorkgroupRenderer(), [*local, Opt(OptOps.STAGE, 0, 0), Opt(OptOps.UPCAST, 0, 2)], "only STAGE")
    small = type("SmallShared", (WorkgroupRenderer,), {"shared_max": 256})()
    refused(small, [*local, Opt(OptOps.STAGE, 0, 0)], "shared memory is too much")


def test_stage_is_refused_on_a_symbolic_kernel() -> None:
    from tgcore import Variable

    n = Variable("n", 1, 32).bind(16)
    a = Tensor(np.ones((8, 16), np.float32), device="PYTHON").reshape(8, n)
    b = Tensor(np.ones((16, 8), np.float32), device="PYTHON").reshape(n, 8)
    k = Kernel((a @ b).schedule()[-1].ast, WorkgroupRenderer())
    k.apply_opts([Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 4)])
    with pytest.raises(KernelOptError, match="symbolic"):
        k.apply_opt(Opt(OptOps.STAGE, 0, 0))


# ***** compensated sums *****


def _group_of(n: int) -> int:
    """The terms a compensated sum takes at once from an innermost loop of n (kernel.COMPENSATED_GROUP, else 2)."""
    return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1


def _grouped(terms: np.ndarray, group: int) -> np.ndarray:
    """Each `group` consecutive terms (along axis 0) summed plainly in float32 as a balanced tree."""
    parts = [terms[i::group] for i in range(group)]
    with np.errstate(invalid="ignore", over="ignore"):
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def _compensated_np(terms: np.ndarray, group: Optional[int] = None) -> np.ndarray:
    """A compensated float32 sum along axis 0, step by step as the kernels take it: each group of consecutive terms
    summed plainly (v), then t = s + v, the error (s - t) + v into e; then s + e where that is finite, else s."""
    s = np.zeros(terms.shape[1:], np.float32)
    e = np.zeros_like(s)
    with np.errstate(invalid="ignore", over="ignore"):
        for v in _grouped(terms, _group_of(len(terms)) if group is None else group):
            t = s + v
            e = e + ((s - t) + v)
            s = t
        total = s + e
    return np.where(np.isfinite(total), total, s)


def _accumulators(t: Tensor) -> int:
    return sum(u.op is UOps.DEFINE_ACC for u in _uops(t, False, optimize=False))


DEVICES = ["PYTHON"] + sorted(d for d in Device.available() if d != "PYTHON")


@pytest.mark.parametrize("device", DEVICES)
def test_long_float32_sums_are_compensated_the_same_way_on_every_device(device: str) -> None:
    # 3000 x 0.1 in one float32 chain drifts to 300.00894 (3e-5 off); compensated it is the float32 nearest the sum
    col = np.full((3000, 3), 0.1, np.float32)
    np.testing.assert_array_equal(
        Tensor(col, device=device).sum(axis=0).numpy(), col.astype(np.float64).sum(axis=0).astype(np.float32)
    )
    data = np.random.default_rng(3).standard_normal((2048, 5)).astype(np.float32) + np.float32(10)
    np.testing.assert_array_equal(Tensor(data, device=device).sum(axis=0).numpy(), _compensated_np(data))


def test_long_float32_sums_are_compensated_the_same_way_whatever_the_optimizations() -> None:
    col = np.full((3000, 3), 0.1, np.float32)
    chain = np.zeros(3, np.float32)
    for row in col:
        chain += row
    assert abs(float(chain[0]) - 300.0) > 1e-3  # (what an uncompensated sum gives)
    data = np.random.default_rng(3).standard_normal((2048, 5)).astype(np.float32) + np.float32(10)
    expected = _compensated_np(data)
    np.testing.assert_array_equal(Tensor(data).sum(axis=0).numpy(), expected)
    si = _last_item(Tensor(data).sum(axis=0))
    optimized = Kernel(si.ast, PythonRenderer())
    optimized.hand_coded_optimizations()
    assert optimized.applied_opts  # (so the two kernels differ)
    np.testing.assert_array_equal(_run(si, optimized), expected)
    np.testing.assert_array_equal(_run(si, Kernel(si.ast, PythonRenderer())), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_a_compensated_sum_adds_groups_of_consecutive_terms_then_compensates(device: str) -> None:
    # 1, t, -1, t, ... with t = 0.75 * 2^-24: in a group, (1 + t) rounds to 1 and part of each t is lost, which one
    # compensated add a term would keep. The groups are pinned exactly, and the error stays within 2 ulps of the
    # terms' magnitudes (numpy's pairwise float32 sum loses the t's outright here)
    t = np.float32(0.75 * 2**-24)
    col = np.tile(np.array([1, t, -1, t], np.float32), 512)[:, None].repeat(3, axis=1)  # (2048, 3)
    got = Tensor(col, device=device).sum(axis=0).numpy()
    np.testing.assert_array_equal(got, _compensated_np(col))
    assert not np.array_equal(got, _compensated_np(col, group=1))
    exact = col.astype(np.float64).sum(axis=0)
    assert np.all(np.abs(got - exact) <= 2 * 2**-24 * np.abs(col.astype(np.float64)).sum(axis=0))
    assert np.all(np.abs(got - exact) <= np.abs(col.sum(axis=0) - exact))
    odd = np.random.default_rng(4).standard_normal((2049, 2)).astype(np.float32)  # no group: one term at a time
    np.testing.assert_array_equal(Tensor(odd, device=device).sum(axis=0).numpy(), _compensated_np(odd))


@pytest.mark.parametrize("device", DEVICES)
def test_a_compensated_sum_keeps_infinities_nans_and_overflow(device: str) -> None:
    ones = np.ones((2048, 1), np.float32)
    cases = [
        (np.inf, np.inf),  # one inf among finite terms
        (np.nan, np.nan),
    ]
    for value, expected in cases:
        x = ones.copy()
        x[700] = value
        got = Tensor(x, device=device).sum(axis=0).numpy()[0]
        assert got == expected or (np.isnan(expected) and np.isnan(got))
    both = ones.copy()
    both[5], both[900] = np.inf, -np.inf
    assert np.isnan(Tensor(both, device=device).sum(axis=0).numpy()[0])
    huge = np.full((2048, 1), 3e38, np.float32)
    assert (
        Tensor(huge, device=device).sum(axis=0).numpy()[0] == np.inf
        and Tensor(-huge, device=device).sum(axis=0).numpy()[0] == -np.inf
    )


def test_only_long_float32_sums_that_are_not_contractions_are_compensated() -> None:
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2048, 2)).astype(np.float32))
    assert _accumulators(x.sum(axis=0)) == 2  # the sum and its errors
    assert _accumulators((x * x).sum(axis=0)) == 2  # a sum of squares is no contraction
    w = Tensor(rng.standard_normal((2048, 3)).astype(np.float32))
    assert _accumulators(x.T @ w) == 1  # a matmul accumulates its products as they come, as BLAS does
    assert _accumulators(x.max(axis=0)) == 1
    assert _accumulators(x[:1000].sum(axis=0)) == 1  # too short to need it
    if dtypes.float64 in Device[Device.DEFAULT].spec.dtypes:
        assert _accumulators(x.cast(dtypes.float64).sum(axis=0)) == 1


# ***** lane reduces *****


def _lanes(t: Tensor) -> int:
    """The lanes of the kernel computing `t` (0: not a lane reduce)."""
    return Kernel(t.schedule()[-1].ast, Device[t.device].renderer).reduce_lanes


def _lane_sums(rows: np.ndarray, compensated: bool, group: Optional[int] = None) -> np.ndarray:
    """A lane reduce's float32 row sums, in its order: lane l adds a[r, l], a[r, 16 + l], ... (compensated:
    Fast2Sum, the errors kept apart), then the 16 lanes are added from the first (compensated: the same way, and
    every error added back at the end)."""
    s, e = np.zeros((len(rows), 16), np.float32), np.zeros((len(rows), 16), np.float32)
    chunks = rows.reshape(len(rows), -1, 16).transpose(1, 0, 2)
    if compensated:  # (groups of consecutive terms of each lane, summed plainly first)
        chunks = _grouped(chunks, _group_of(len(chunks)) if group is None else group)
    for chunk in chunks:
        t = s + chunk
        e, s = (e + ((s - t) + chunk), t) if compensated else (e, t)
    total, err = np.zeros(len(rows), np.float32), np.zeros(len(rows), np.float32)
    for lane, lane_err in zip(s.T, e.T):
        t = total + lane
        err, total = (err + (((total - t) + lane) + lane_err), t) if compensated else (err, t)
    return total + err


@pytest.mark.parametrize("device", DEVICES)
def test_a_sum_over_several_axes_takes_its_lanes_along_the_innermost(device: str) -> None:
    # BatchNorm's statistics: (N, C, H, W) summed over N, H and W; lane l of channel c adds x[n, c, 16j + l] for
    # every n, then j, in order (the flattened H*W axis is the innermost reduce axis)
    rng = np.random.default_rng(8)
    for n, hw, compensated in ((8, 16, False), (16, 32, True)):  # 128 or 1024 terms per lane
        x_np = rng.standard_normal((n, 6, hw, hw)).astype(np.float32) + np.float32(1)
        out = Tensor(x_np, device=device).sum(axis=(0, 2, 3))
        assert len(out.schedule()) == 1 and _lanes(out) == 16
        rows = x_np.reshape(n, 6, hw * hw).transpose(1, 0, 2).reshape(6, -1)
        np.testing.assert_array_equal(out.numpy(), _lane_sums(rows, compensated, _group_of(hw * hw // 16)))
    # inner axis too short (7 x 7 maps) or not contiguous: no lanes
    assert _lanes(Tensor.ones(4, 6, 7, 7, device=device).sum(axis=(0, 2, 3))) == 0
    assert _lanes(Tensor.ones(64, 6, 64, device=device).sum(axis=(0, 1))) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_long_rows_are_one_kernel_in_lanes_in_a_fixed_order(device: str) -> None:
    rng = np.random.default_rng(5)
    for width, compensated in ((4096, False), (1 << 14, True)):  # 256 or 1024 terms per lane
        a_np = rng.standard_normal((4, width)).astype(np.float32) + np.float32(1)
        a = Tensor(a_np, device=device)
        assert len(a.sum(axis=1).schedule()) == 1 and _lanes(a.sum(axis=1)) == 16
        # in exactly this order on every device, whatever the optimizer does
        np.testing.assert_array_equal(a.sum(axis=1).numpy(), _lane_sums(a_np, compensated))
        np.testing.assert_array_equal(a.max(axis=1).numpy(), a_np.max(axis=1))
        # a MAX runs in lanes where the renderer has a vector MAX (it has no order to fix)
        vector_max = BinaryOps.MAX in getattr(Device[device].renderer, "vector_math", ())
        assert _lanes(a.max(axis=1)) == (16 if vector_max else 0)
    with_nan = a_np.copy()
    with_nan[1, 5] = np.nan
    t = Tensor(with_nan, device=device)
    assert np.isnan(t.max(axis=1).numpy()[1]) and np.isnan(t.sum(axis=1).numpy()[1])
    short = Tensor(rng.standard_normal(1000).astype(np.float32), device=device).sum()
    for out in (a.sum(axis=0), short, a[:, :48].sum(axis=1), a[:, :2056].sum(axis=1)):
        assert _lanes(out) == 0  # not a contiguous axis, not a multiple of 16, too short
    assert _lanes(a[:, :64].sum(axis=1)) == 16
    assert _lanes(a.cast(dtypes.int32).sum(axis=1)) == 0  # integer lanes would be scalar accumulators
    np.testing.assert_array_equal(a[:, :64].sum(axis=1).numpy(), _lane_sums(a_np[:, :64], False))
    x_np, w_np = rng.standard_normal((3, 4096)).astype(np.float32), rng.standard_normal((4096, 2)).astype(np.float32)
    x = Tensor(x_np, device=device)
    mm = x @ Tensor(w_np, device=device)  # a reduce over broadcast operands is a contraction: tiled instead
    assert _lanes(mm) == 0
    np.testing.assert_allclose(mm.numpy(), x_np @ w_np, rtol=1e-4, atol=1e-3)
    centred = x - x.mean(axis=1, keepdim=True)  # broadcast along the reduce axis only
    assert _lanes((centred * centred).sum(axis=1)) == 16
    ref = ((x_np - x_np.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    np.testing.assert_allclose((centred * centred).sum(axis=1).numpy(), ref, rtol=1e-5)



def test_grid_sums_walk_the_grid_in_c_order_with_python_ints_past_int64() -> None:
    from tgcore.codegen.linearizer import _grid_sums

    sizes, weights = (2, 3, 4), [7, 0, -5]
    expected = [i * 7 + k * -5 for i in range(2) for _ in range(3) for k in range(4)]
    assert _grid_sums(sizes, weights) == expected
    big = [2**62, 3]  # (past int64: exact Python ints, not wrapped)
    assert _grid_sums((3, 2), big) == [i * 2**62 + j * 3 for i in range(3) for j in range(2)]
    assert _grid_sums((), []) == [0]
