"""The kernel optimizer: every optimization leaves every result bit for bit the same as the unoptimized kernel.

Each case schedules a tensor expression, then runs its last kernel unoptimized (NOOPT) and optimized (the
heuristics, or a given list of Opts) on the same input buffers, on PYTHON and on every other device that works here
(the tox envs of the CPU plugins run this file with their device installed).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional

import numpy as np
import pytest

import tgcore.tensor as tensor_module
from tgcore import Device, Tensor, dtypes
from tgcore.codegen.kernel import (
    BLOCK_REDUCE,
    INTERLEAVE_VECTORS,
    MAX_UPCAST,
    ONE_BLOCK,
    PANEL_TILES,
    Kernel,
    KernelOptError,
    Opt,
    OptOps,
)
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOps
from tgcore.device import Buffer
from tgcore.dtype import DType
from tgcore.engine.realize import CompiledRunner, get_kernel
from tgcore.helpers import Context, prod
from tgcore.ops import BinaryOps, BufferOps, TernaryOps, UnaryOps
from tgcore.renderer import Renderer
from tgcore.runtime.python import PythonRenderer

DEVICES = ["PYTHON"] + sorted(d for d in Device.available() if d != "PYTHON")
# devices whose kernels are CPU loops (global_max None): the ones that block reduces for the cache and HOIST
CPU_DEVICES = [d for d in DEVICES if Device[d].renderer.global_max is None]


def data(shape: tuple[int, ...], dtype: DType = dtypes.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtypes.is_float(dtype):
        return rng.standard_normal(shape).astype(dtype.np)  # type: ignore[arg-type]
    return rng.integers(-100, 100, shape).astype(dtype.np)  # type: ignore[arg-type]


def last_kernel(device: str, build: Callable[..., Tensor], *inputs: np.ndarray):  # type: ignore[no-untyped-def]
    """The last kernel of the schedule of `build(*inputs)` on `device`, with everything before it realized."""
    out = build(*[Tensor(x, device=device) for x in inputs])
    schedule = out.schedule()
    from tgcore.engine.realize import run_schedule

    run_schedule(schedule[:-1])
    si = schedule[-1]
    assert si.ast.op is BufferOps.STORE
    return si


def run(device: str, si, kernel: Kernel) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The output of `kernel` on the schedule item's input buffers, in a fresh output buffer."""
    out = si.outputs[0]
    dest = Buffer(device, out.size, out.dtype).allocate()
    inputs = [x.base.buffer.allocate() for x in si.inputs]
    CompiledRunner(device, to_program(kernel))([dest] + inputs, si.var_vals)
    return dest.numpy()


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equal (NaNs of any payload equal)."""
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b)))
    return bool(np.array_equal(a, b))


def check(
    device: str,
    build: Callable[..., Tensor],
    *inputs: np.ndarray,
    opts: Optional[list[Opt]] = None,
    renderer: Optional[Renderer] = None,
) -> Kernel:
    si = last_kernel(device, build, *inputs)
    renderer = renderer or Device[device].renderer
    reference = run(device, si, Kernel(si.ast, renderer))
    if opts is None:
        k = get_kernel(renderer, si.ast)
    else:
        k = Kernel(si.ast, renderer)
        k.apply_opts(opts)
    got = run(device, si, k)
    assert same(reference, got), f"{k.applied_opts} changed the result: max diff {np.abs(reference - got).max()}"
    return k


CASES: dict[str, tuple[Callable[..., Tensor], list[tuple[int, ...]]]] = {
    "matmul": (lambda a, b: a @ b, [(32, 48), (48, 64)]),
    "matmul_odd": (lambda a, b: a @ b, [(13, 7), (7, 11)]),
    "matmul_vector": (lambda a, b: a @ b, [(1, 40), (40, 24)]),
    "batched_matmul": (lambda a, b: a @ b, [(3, 8, 12), (3, 12, 16)]),
    "matmul_relu": (lambda a, b: (a @ b).relu() * 2 + 1, [(16, 32), (32, 16)]),
    "conv2d": (lambda x, w: x.conv2d(w), [(2, 4, 10, 10), (8, 4, 3, 3)]),
    "conv2d_padded": (lambda x, w: x.conv2d(w, padding=1), [(2, 3, 8, 8), (4, 3, 3, 3)]),
    "sum_rows": (lambda a: a.sum(axis=1), [(24, 40)]),
    "sum_columns": (lambda a: a.sum(axis=0), [(40, 24)]),
    "sum_all": (lambda a: a.sum(), [(16, 36)]),
    "max_middle": (lambda a: a.max(axis=1), [(4, 12, 8)]),
    "softmax": (lambda a: a.softmax(), [(8, 32)]),
    "elementwise": (lambda a, b: (a + b) * a - b * 3, [(32, 40), (32, 40)]),
    "broadcast": (lambda a, b: (a * b).exp(), [(32, 1), (1, 40)]),
    "transpose": (lambda a: a.T * 2, [(24, 40)]),
    "pad": (lambda a: a.pad(((1, 2), (3, 0))) + 1, [(16, 16)]),
    "odd_size": (lambda a: a * 3 + 1, [(97,)]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_heuristics_keep_results(device: str, case: str) -> None:
    build, shapes = CASES[case]
    check(device, build, *[data(s, seed=i) for i, s in enumerate(shapes)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.float16, dtypes.int8])
def test_heuristics_keep_results_other_dtypes(device: str, dtype: DType) -> None:
    if dtype not in Device.specs()[device].dtypes:
        pytest.skip(f"{device} does not claim {dtype}")
    a, b = data((16, 24), dtype), data((24, 32), dtype, seed=1)
    check(device, lambda x, y: x @ y, a, b)
    check(device, lambda x: x.sum(axis=0), a)
    check(device, lambda x, y: x * 3 + y[:16, :24], a, b)


def test_heuristics_optimize_matmul_and_elementwise() -> None:
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((64, 64)), data((64, 64)))
    k = get_kernel(Device["PYTHON"].renderer, si.ast)
    kinds = {o.op for o in k.applied_opts}
    assert OptOps.UPCAST in kinds and OptOps.UNROLL in kinds
    with Context(NOOPT=1):
        assert get_kernel(Device["PYTHON"].renderer, si.ast).applied_opts == []


VECTOR_CPU_DEVICES = [d for d in CPU_DEVICES if Device[d].renderer.vector_widths.get(dtypes.float32, 1) > 1]


@pytest.mark.parametrize("device", VECTOR_CPU_DEVICES)
def test_a_tile_stores_whole_vectors_where_the_output_is_contiguous(device: str) -> None:
    # dz.T @ x: both inputs are contiguous along an output axis; the columns of 48 hold one vector of 16 (or two of 8)
    # and the rows of 64 two of 16: the tile's vector axis is the output's contiguous one (stores of whole vectors)
    k = check(device, lambda d, x: d.T @ x, data((32, 64)), data((32, 48)))
    width = Device[device].renderer.vector_widths[dtypes.float32]
    assert k.applied_opts[0].op is OptOps.UPCAST and k.applied_opts[0].axis == 1, k.applied_opts
    assert k.applied_opts[0].amount in (width, 2 * width)


def test_heuristics_are_deterministic() -> None:
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((32, 64)), data((64, 16)))
    runs = [get_kernel(Device["PYTHON"].renderer, si.ast) for _ in range(2)]
    assert runs[0].applied_opts == runs[1].applied_opts
    assert to_program(runs[0]).src == to_program(runs[1]).src


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "opts",
    [
        [Opt(OptOps.UPCAST, 0, 4)],
        [Opt(OptOps.UPCAST, 1, 0)],
        [Opt(OptOps.UNROLL, 0, 0)],
        [Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.UNROLL, 0, 3)],
        [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4)],
        [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.UNROLL, 0, 12)],
    ],
    ids=repr,
)
def test_explicit_opts_keep_results(device: str, opts: list[Opt]) -> None:
    check(device, lambda a, b: a @ b, data((8, 24)), data((24, 16)), opts=opts)


@pytest.mark.parametrize("device", DEVICES)
def test_unroll_keeps_the_order_of_a_float_sum(device: str) -> None:
    # values whose float32 sum depends on the order: any reordering shows up in the low bits
    # (rows of 48: shorter than a lane reduce, which fixes its own order, see test_linearizer)
    x = (np.random.default_rng(3).standard_normal((4, 48)) * 10.0 ** np.arange(48) % 1e6).astype(np.float32)
    for opts in (
        [Opt(OptOps.UNROLL, 0, 4)],
        [Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.UNROLL, 0, 2)],
        [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 0)],
    ):
        check(device, lambda a: a.sum(axis=1), x, opts=opts)


def test_invalid_opts_are_refused_without_change() -> None:
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((8, 24)), data((24, 16)))
    k = Kernel(si.ast, Device["PYTHON"].renderer)
    shape = k.full_shape
    for bad in (
        Opt(OptOps.UPCAST, 0, 3),  # does not divide 8
        Opt(OptOps.UPCAST, 2, 2),  # the reduce axis is not a global axis
        Opt(OptOps.UNROLL, 1, 2),  # there is one reduce loop
        Opt(OptOps.SWAP, 1, 0),
        Opt(OptOps.LOCAL, 0, 2),  # PYTHON has no workgroups
    ):
        with pytest.raises(KernelOptError):
            k.apply_opt(bad)
        assert k.full_shape == shape and k.applied_opts == []


def test_only_the_innermost_reduce_loop_unrolls() -> None:
    si = last_kernel("PYTHON", lambda a: a.sum(axis=(0, 2)), data((6, 5, 8)))
    k = Kernel(si.ast, Device["PYTHON"].renderer)
    assert k.n_reduce == 2
    with pytest.raises(KernelOptError):
        k.apply_opt(Opt(OptOps.UNROLL, 0, 2))
    k.apply_opt(Opt(OptOps.UNROLL, 1, 0))  # the whole inner loop: the outer one becomes the innermost
    k.apply_opt(Opt(OptOps.UNROLL, 0, 2))
    assert k.n_reduce == 1


def cpu_style_python() -> Renderer:
    """The PYTHON renderer with CPU-style kernels (global loops), for the optimizations only CPUs get."""
    r = PythonRenderer()
    r.global_max = None
    return r


@pytest.mark.parametrize("device", [d for d in DEVICES if getattr(Device[d].renderer, "vector_uops", False)])
def test_vector_uops_keep_results(device: str) -> None:
    k = check(device, lambda a, b: a @ b, data((8, 24)), data((24, 32)), opts=[Opt(OptOps.UPCAST, 1, 16)])
    uops = to_program(k).uops
    # vectors of 16 lanes, or of one register where the target's is narrower (AVX2: 8 floats)
    lanes = min(16, Device[device].renderer.vector_widths.get(dtypes.float32, 16))
    assert any(u.op is UOps.LOAD and u.dtype is not None and u.dtype.count == lanes for u in uops)
    assert any(u.op is UOps.DEFINE_ACC and u.dtype is not None and u.dtype.count == lanes for u in uops)
    assert not any(u.dtype is not None and u.dtype.count > lanes for u in uops)
    # a vector axis over strided memory: VECTORIZE of scalar loads, GEP to store
    check(device, lambda a: (a.T * 2 + 1).exp(), data((16, 8)), opts=[Opt(OptOps.UPCAST, 1, 8)])
    check(device, lambda a: a.T.sum(axis=1), data((16, 8)), opts=[Opt(OptOps.UPCAST, 0, 8)])
    check(device, lambda a: a.max(axis=0), data((16, 8)), opts=[Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4)])


HOISTED = [
    Opt(OptOps.UPCAST, 1, 8),
    Opt(OptOps.UPCAST, 0, 2),
    Opt(OptOps.SPLIT, 1, 2),
    Opt(OptOps.SWAP, 0, 1),
    Opt(OptOps.SPLIT, 3, 8),
    Opt(OptOps.HOIST, 2, 1),
]


def test_hoisted_reduce_keeps_results_on_python() -> None:
    x = (np.random.default_rng(3).standard_normal((8, 32)) * 10.0 ** np.arange(32) % 1e6).astype(np.float32)
    check("PYTHON", lambda a, b: a @ b, x, data((32, 32)), opts=HOISTED, renderer=cpu_style_python())
    sums = [Opt(OptOps.SPLIT, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.SPLIT, 1, 8), Opt(OptOps.HOIST, 1, 1)]
    check("PYTHON", lambda a: a.sum(axis=0), x.T.copy(), opts=sums, renderer=cpu_style_python())


def test_hoisted_reduce_computes_what_follows_it_in_a_pass_after_the_blocks() -> None:
    # a Linear layer's bias and GELU, a ReLU and a scale: the blocks leave the bare sums in the output, then one pass
    # over the tiles reads them back and stores the rest; bit for bit what the unoptimized kernel computes
    x = (np.random.default_rng(3).standard_normal((8, 32)) * 10.0 ** np.arange(32) % 1e6).astype(np.float32)
    for build in (lambda a, b, c: (a @ b + c).gelu(), lambda a, b, c: (a @ b).relu() * c - a.sum() * 0 + 1):
        k = check("PYTHON", build, x, data((32, 32)), data((32,)), opts=HOISTED, renderer=cpu_style_python())
        assert k.applied_opts[-1] == Opt(OptOps.HOIST, 2, 1)
    sums = [Opt(OptOps.SPLIT, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.SPLIT, 1, 8), Opt(OptOps.HOIST, 1, 1)]
    check("PYTHON", lambda a: a.max(axis=0).exp() * 2, x.T.copy(), opts=sums, renderer=cpu_style_python())


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_linear_layer_with_bias_and_gelu_runs_in_blocks(device: str) -> None:
    # (BERT's feed-forward, smaller): blocked for the cache like a bare matmul, and as fast a tile
    x, w, b = data((64, 512)), data((256, 512), seed=1) / 20, data((256,), seed=2)
    k = check(device, lambda x, w, b: x.linear(w.T, b).gelu(), x, w, b)
    plain = check(device, lambda x, w: x @ w.T, x, w)
    assert OptOps.HOIST in {o.op for o in k.applied_opts}
    upcasts = [[o for o in kernel.applied_opts if o.op is OptOps.UPCAST] for kernel in (k, plain)]
    assert upcasts[0] == upcasts[1]
    got = Tensor(x, device=device).linear(Tensor(w, device=device).T, Tensor(b, device=device)).gelu().numpy()
    y = x.astype(np.float64) @ w.T.astype(np.float64) + b
    ref = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_hoisted_reduce_keeps_results_on_cpu_devices(device: str) -> None:
    check(device, lambda a, b: a @ b, data((8, 32)), data((32, 32)), opts=HOISTED)
    # big enough for the heuristics to block it for the cache (64 rows: more than one tile of rows on any target)
    k = check(device, lambda a, b: a @ b, data((64, 512)), data((512, 256)))
    assert OptOps.HOIST in {o.op for o in k.applied_opts}
    # a reduce of 392 steps runs in blocks of 196, and the column tiles in panels of panel_tiles() or a near count
    # that divides them: 320 columns are 20 tiles of 16 (AVX2: panels of 10) or 10 tiles of 32 (AVX-512: of 5)
    k = check(device, lambda a, b: a @ b, data((64, 392)), data((392, 320)))
    splits = [o.amount for o in k.applied_opts if o.op is OptOps.SPLIT]
    panel = expected_panel(320 // tile_columns(k), k.panel_tiles())
    assert OptOps.HOIST in {o.op for o in k.applied_opts} and splits == [panel, 196]


def expected_panel(tiles: int, want: int) -> int:
    """The tiles of a panel: `want`, else a near count that divides the tiles, else PANEL_TILES or one near it; at
    least two panels."""
    near = [want, want + 1, want - 1, want + 2, PANEL_TILES, PANEL_TILES + 1, PANEL_TILES - 1, PANEL_TILES + 2]
    return next(p for p in near if p < tiles and tiles % p == 0)


@pytest.mark.parametrize("side, tile, unroll", [(14, [8, 14], 4), (7, [16, 7], 2)])
def test_16_registers_take_14_rows_one_vector_wide_before_7_rows_of_two(
    side: int, tile: list[int], unroll: int
) -> None:
    # 7 rows of two 8-lane vectors need 17 registers: a 1x1 conv with 14 x 14 outputs gets 14 rows one vector wide
    # (14 accumulators fit), one with 7 x 7 outputs, where no 14 rows fit, keeps the 7 rows of two vectors, and that
    # tile, which spills, unrolls its reduce by 2 instead of 4
    renderer = cpu_style_python()
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    renderer.vector_registers = 16
    x, w = data((1, 8, side, side)), data((16, 8, 1, 1), seed=1)
    k = check("PYTHON", lambda a, b: a.conv2d(b), x, w, renderer=renderer)
    assert [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST] == tile, k.applied_opts
    assert [o.amount for o in k.applied_opts if o.op is OptOps.UNROLL] == [unroll], k.applied_opts


@pytest.mark.parametrize("batch, side, tile", [(1, 7, [16, 7]), (2, 7, [8, 7, 2]), (1, 14, [8, 14])])
def test_16_registers_padded_rows_two_vectors_wide_only_when_one_vector_holds_too_few(
    batch: int, side: int, tile: list[int]
) -> None:
    # a padded 3x3 conv's rows are gated loads, so its tile stays one vector wide (14 rows at 14 x 14), except where
    # that tile would have fewer than 8 accumulators and no other axis to take more rows along: 7 x 7 outputs at
    # batch 1 get 7 rows of two vectors; at batch 2, two images of 7 rows one vector wide
    renderer = cpu_style_python()
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    renderer.vector_registers = 16
    x, w = data((batch, 17, side, side)), data((16, 17, 3, 3), seed=1)  # (over 16 channels: no padded copy)
    build = lambda a, b: a.conv2d(b, padding=1)  # noqa: E731
    k = Kernel(last_kernel("PYTHON", build, x, w).ast, renderer)
    k.hand_coded_optimizations()
    assert [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST] == tile, k.applied_opts
    for device in CPU_DEVICES:  # the tile's results (the interpreter takes minutes over these gated loads)
        if device != "PYTHON":
            check(device, build, x, w, opts=k.applied_opts)


@pytest.mark.parametrize("lanes, registers", [(4, 16), (8, 16), (16, 32)])  # SSE, AVX2, AVX-512 float32 vectors
def test_blocking_heuristics_on_every_vector_target(lanes: int, registers: int) -> None:
    # the heuristics' blocking on targets other than this CPU (their kernels are not run here: only planned)
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: lanes}
    renderer.vector_registers = registers
    width = lanes * 2
    # panels of PANEL_TILES tiles with 32 registers, twice as many (half as wide) with 16: the same columns a panel
    want = PANEL_TILES * (2 if registers < 32 else 1)
    for (m, n, steps), block in {(512, 256, 512): 256, (392, 320, 392): 196}.items():
        k = Kernel(last_kernel("PYTHON", lambda a, b: a @ b, data((64, m)), data((m, n))).ast, renderer)
        k.hand_coded_optimizations()
        assert k.panel_tiles() == want
        panel = expected_panel(n // width, want)
        assert tile_columns(k) == width
        # two vectors wide everywhere: AVX-512's tiles of 8 rows reach MAX_UPCAST; SSE's and AVX2's 16 registers
        # hold 6 rows of two vectors, and 6 does not divide 64 rows, so they are padded to 66 (a long reduce)
        assert k.applied_opts[1] == (Opt(OptOps.UPCAST, 0, 8) if registers >= 32 else Opt(OptOps.PADTO, 0, 6))
        assert [o.amount for o in k.applied_opts if o.op is OptOps.SPLIT] == [panel, block]
        assert k.applied_opts[-2:] == [Opt(OptOps.HOIST, 2, 1), Opt(OptOps.PACK, 1, 0)]
        assert [u.arg[1] for u in to_program(k).uops if u.op is UOps.DEFINE_LOCAL] == [panel * block * width]


@pytest.mark.parametrize("lanes, registers", [(4, 16), (8, 16), (16, 32)])
def test_a_conv_tile_keeps_16_rows_of_neighbouring_positions(
    monkeypatch: pytest.MonkeyPatch, lanes: int, registers: int
) -> None:
    # a conv's rows are neighbouring output positions (one element apart in its input): 16 of them on SSE and AVX2
    monkeypatch.setattr(tensor_module, "CONV_PREPAD_CHANNELS", 0)  # (the padding's masked windows, not a padded copy)
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: lanes}
    renderer.vector_registers = registers
    si = last_kernel("PYTHON", lambda x, w: x.conv2d(w, padding=1), data((1, 16, 32, 32)), data((32, 16, 3, 3)))
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    upcasts = [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST]
    width = lanes * (2 if registers >= 32 else 1)
    assert upcasts[:2] == [width, min(16, MAX_UPCAST // width)]  # (AVX-512's two-vector tiles: 8 rows by MAX_UPCAST)


@pytest.mark.parametrize("lanes", [4, 8])  # SSE, AVX2: 16 vector registers
def test_tiles_two_vectors_wide_where_6_7_or_5_rows_divide_the_rows(
    monkeypatch: pytest.MonkeyPatch, lanes: int
) -> None:
    """With 16 registers a tile is two vectors wide where WIDE_ROWS rows divide its row axis (each broadcast row value
    feeds two FMAs), and one vector wide where they do not, or where the rows read a padded input."""
    monkeypatch.setattr(tensor_module, "CONV_PREPAD_CHANNELS", 0)  # (the padding's masked windows, not a padded copy)
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: lanes}
    renderer.vector_registers = 16
    a, b = data((96, 64)), data((64, 32))
    si = last_kernel("PYTHON", lambda a, b: a @ b, a, b)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    assert [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST][:2] == [2 * lanes, 6]
    np.testing.assert_allclose(run("PYTHON", si, k).reshape(96, 32), a @ b, rtol=1e-5, atol=1e-5)
    # a 1x1 conv: vectors along its 784 positions, 6 of its 48 output channels a tile; a 3x3 conv with padding over
    # rows of 28 positions: vectors along the output channels, its rows (14) the padded input's: one vector wide
    x, w1, w3 = data((1, 16, 28, 28)), data((48, 16, 1, 1)), data((48, 16, 3, 3))
    for w, padding, tile in ((w1, 0, [2 * lanes, 6]), (w3, 1, [lanes, 14])):
        si = last_kernel("PYTHON", lambda x, w: x.conv2d(w, padding=padding), x, w)
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST][:2] == tile
        if padding == 0:
            want = np.einsum("kc,nchw->nkhw", w1[:, :, 0, 0], x)
            np.testing.assert_allclose(run("PYTHON", si, k).reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    # 64 rows: no such divisor, and a reduce of 64 steps too short to run in blocks: with 32 columns (too few for the
    # packed column tile where a vector is 8 wide) one vector; with 128 the packed column tile, its rows padded to 66
    k = Kernel(last_kernel("PYTHON", lambda a, b: a @ b, data((64, 64)), b).ast, renderer)
    k.hand_coded_optimizations()
    if lanes == 8:
        assert tile_columns(k) == lanes, k.applied_opts
    a, b = data((64, 64)), data((64, 128), seed=1)
    si = last_kernel("PYTHON", lambda a, b: a @ b, a, b)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    assert k.applied_opts[:2] == [Opt(OptOps.UPCAST, 1, 2 * lanes), Opt(OptOps.PADTO, 0, 6)], k.applied_opts
    assert k.applied_opts[-1].op is OptOps.PACK
    np.testing.assert_allclose(run("PYTHON", si, k).reshape(64, 128), a @ b, rtol=1e-5, atol=1e-5)


def sixteen_registers(device: str) -> Renderer:
    """The device's renderer planning for 16 vector registers of 8 floats (AVX2) whatever this CPU has (the heuristics
    read only these settings); PYTHON's as CPU-style loops."""
    renderer = copy.copy(Device[device].renderer) if device != "PYTHON" else cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    renderer.vector_registers = 16
    return renderer


def run_fenced(device: str, si, kernel: Kernel, extra: int = 64) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Like run, into an output buffer `extra` elements longer, filled with a sentinel: returns the output, after
    checking that the kernel wrote nothing past its end."""
    out = si.outputs[0]
    fence = np.full(out.size + extra, 7.25, dtype=out.dtype.np)
    dest = Buffer(device, out.size + extra, out.dtype).allocate().copyin(memoryview(fence))
    inputs = [x.base.buffer.allocate() for x in si.inputs]
    CompiledRunner(device, to_program(kernel))([dest] + inputs, si.var_vals)
    got = dest.numpy()
    assert (got[out.size :] == 7.25).all(), "the kernel wrote past the end of its output"
    return got[: out.size]


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_rows_padded_to_a_wide_tile_keep_results_and_store_nothing_past_the_output(device: str) -> None:
    """With 16 registers, rows that none of 6, 7 or 5 divides are padded to a multiple of 6 (PADTO) where the kernel
    runs in blocks for the cache: the tile stays two vectors wide. The padded rows store nothing, and the inputs padded
    by PADTO alone are read with no test (a padded lane reads its tile's first row)."""
    renderer = sixteen_registers(device)
    linear = lambda x, w, b: (x @ w.T + b).gelu()  # noqa: E731
    cases = [
        (lambda a, b: a @ b, (64, 512), (512, 256)),  # 64 rows -> 66
        (lambda a, b: a @ b.T, (104, 768), (96, 768)),  # 104 -> 108, b's rows gathered into the pack
        (linear, (52, 768), (128, 768), (128,)),  # 52 -> 54, a bias and GELU after the reduce
    ]
    for build, *shapes in cases:
        inputs = [data(s, seed=i) for i, s in enumerate(shapes)]
        si = last_kernel(device, build, *inputs)
        reference = run_fenced(device, si, Kernel(si.ast, renderer))
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert Opt(OptOps.PADTO, 0, 6) in k.applied_opts and tile_columns(k) == 16, k.applied_opts
        assert OptOps.HOIST in {o.op for o in k.applied_opts}
        got = run_fenced(device, si, k)
        assert same(reference, got), f"{k.applied_opts} changed the result"
        want = build(*[Tensor(x, device="PYTHON") for x in inputs]).numpy()
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
        uops = to_program(k).uops
        assert any(u.op is UOps.STORE and len(u.src) == 4 for u in uops)  # (the padded rows' stores are gated)
        assert not any(u.op is UOps.LOAD and len(u.src) == 4 for u in uops)  # (and no load is)
    # an unblocked kernel (attention's weights @ values, 4 column tiles: too few for panels) pads its rows too, in the
    # packed column tile: the column tiles outermost, b's share of each packed, no HOIST
    a, b = data((64, 128)), data((128, 64), seed=1)
    si = last_kernel(device, lambda a, b: a @ b, a, b)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    tile = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.PADTO, 0, 6), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 1, 0)]
    assert k.applied_opts == tile, k.applied_opts
    np.testing.assert_allclose(run_fenced(device, si, k).reshape(64, 64), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", CPU_DEVICES)
@pytest.mark.parametrize("outputs", [16, 500])
def test_a_model_trained_through_padded_tiles_matches_numpy(
    device: str, outputs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole program: a 2-layer MLP trained by SGD for 3 steps, its first layer a blocked matmul of 104 rows (padded
    to 108 with 16 registers, on any CPU), against the same training in float64 numpy. With 500 outputs the second
    layer's columns are padded too (to 512), and the backward's matmuls over them."""
    monkeypatch.setattr(Device[device].renderer, "vector_registers", 16)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((104, 392)).astype(np.float32), rng.standard_normal((104, outputs)).astype(np.float32)
    shapes = ((256, 392), (256,), (outputs, 256), (outputs,))
    params = [rng.standard_normal(s).astype(np.float32) * 0.05 for s in shapes]
    lr = 0.05

    def forward(t: list[Tensor], xt: Tensor) -> tuple[Tensor, Tensor]:
        h = (xt @ t[0].T + t[1]).relu()
        return h, h @ t[2].T + t[3]

    tensors = [Tensor(p, device=device, requires_grad=True) for p in params]
    si = forward(tensors, Tensor(x, device=device))[0].schedule()[-1]  # the first layer's kernel: padded rows
    assert Opt(OptOps.PADTO, 0, 6) in get_kernel(Device[device].renderer, si.ast).applied_opts
    si = forward(tensors, Tensor(x, device=device))[1].schedule()[-1]  # the second's: its columns padded or not
    opts = get_kernel(Device[device].renderer, si.ast).applied_opts
    padded = [o.amount for o in opts if o.op is OptOps.PADTO and o.axis == 1]  # (to two vectors: 16 or 32 floats)
    assert padded == ([2 * Device[device].renderer.vector_widths[dtypes.float32]] if outputs == 500 else []), opts
    ref = [p.astype(np.float64) for p in params]
    for _ in range(3):
        loss = ((forward(tensors, Tensor(x, device=device))[1] - Tensor(y, device=device)) ** 2).mean()
        loss.backward()
        for t in tensors:
            t.assign((t - lr * t.grad).detach()).realize()
            t.grad = None
        pre = x @ ref[0].T + ref[1]  # numpy: the same step by hand
        h = np.maximum(pre, 0)
        d_out = 2 * (h @ ref[2].T + ref[3] - y) / y.size
        d_h = (d_out @ ref[2]) * (pre > 0)
        grads = [d_h.T @ x, d_h.sum(0), d_out.T @ h, d_out.sum(0)]
        ref = [p - lr * g for p, g in zip(ref, grads)]
    for t, want in zip(tensors, ref):
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_columns_no_tile_divides_are_padded_and_their_input_packed(device: str) -> None:
    """A matmul whose output columns no tile two vectors wide divides (GPT-2's 50,257-word logits, N = 1000) pads them
    to a multiple of two vectors (PADTO) where that adds at most 1/16 of the columns: the tile keeps its two vectors
    instead of going along the rows, each column tile's share of the input read along the columns is packed (its
    padded lanes read there as zeros), the reduce is not unrolled, and nothing is stored past the output."""
    renderer = sixteen_registers(device)
    linear = lambda x, w, b: (x @ w.T + b).gelu()  # noqa: E731
    cases = [  # (build, shapes, the tile's opts: columns, rows)
        (lambda a, b: a @ b, ((30, 96), (96, 500)), (1, 0, OptOps.UPCAST, 6)),  # 500 columns -> 512
        (linear, ((20, 128), (250, 128), (250,)), (1, 0, OptOps.UPCAST, 5)),  # 250 -> 256, b's rows gathered
        (lambda a, b: a @ b.T, ((64, 64), (1020, 64)), (1, 0, OptOps.PADTO, 6)),  # 1020 -> 1024, 64 rows -> 66
        # a conv over 250-pixel rows: the pixels are the columns (250 -> 256), the output channels the rows (16 -> 18)
        (lambda x, w: x.conv2d(w, padding=1), ((1, 8, 6, 250), (16, 8, 3, 3)), (2, 0, OptOps.PADTO, 6)),
        # a 1x1 conv at 14 x 14: 196 pixels -> 208, 112 output channels in rows of 6 (114), not 7 (spilled)
        (lambda x, w: x.conv2d(w), ((1, 32, 14, 14), (112, 32, 1, 1)), (1, 0, OptOps.PADTO, 6)),
    ]
    for build, shapes, (col, row, rows, amount) in cases:
        inputs = [data(s, seed=i) for i, s in enumerate(shapes)]
        si = last_kernel(device, build, *inputs)
        reference = run_fenced(device, si, Kernel(si.ast, renderer))
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert k.applied_opts[:2] == [Opt(OptOps.PADTO, col, 16), Opt(rows, row, amount)], k.applied_opts
        assert k.applied_opts[-1].op is OptOps.PACK and OptOps.UNROLL not in {o.op for o in k.applied_opts}
        got = run_fenced(device, si, k)
        assert same(reference, got), f"{k.applied_opts} changed the result"
        want = build(*[Tensor(x, device="PYTHON") for x in inputs]).numpy()
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    # 32 registers of 16 floats (AVX-512): tiles of two such vectors, rows as a tile one vector wide takes them (at
    # most 256 lanes)
    wide = sixteen_registers(device)
    wide.vector_widths, wide.vector_registers = {**wide.vector_widths, dtypes.float32: 16}, 32
    inputs = [data((64, 64)), data((1020, 64), seed=1)]
    si = last_kernel(device, lambda a, b: a @ b.T, *inputs)
    k = Kernel(si.ast, wide)
    k.hand_coded_optimizations()
    assert k.applied_opts[:2] == [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UPCAST, 0, 8)], k.applied_opts
    np.testing.assert_allclose(
        run_fenced(device, si, k).reshape(64, 1020), inputs[0] @ inputs[1].T, rtol=1e-4, atol=1e-4
    )
    # not where the padding would add more than 1/16 of the columns (10 classes -> 16, 180 -> 192)
    for columns in (10, 180):
        k = Kernel(last_kernel(device, lambda a, b: a @ b, data((64, 96)), data((96, columns), seed=1)).ast, renderer)
        k.hand_coded_optimizations()
        assert OptOps.PADTO not in {o.op for o in k.applied_opts[:1]}, k.applied_opts


def test_padto_pads_only_where_a_padded_lane_cannot_fault() -> None:
    """PADTO pads a global axis of a CPU-style kernel whose padded lanes only compute values nothing stores: not an
    axis that UPCAST splits, a reduce axis, a GPU's grid, nor a kernel with an integer division (a padded zero would
    divide) or a gathered input (its index would be made of them)."""
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((13, 24)), data((24, 16)))
    k = Kernel(si.ast, cpu_style_python())
    shape = k.full_shape
    for bad in (Opt(OptOps.PADTO, 1, 8), Opt(OptOps.PADTO, 2, 5), Opt(OptOps.PADTO, 0, 13), Opt(OptOps.PADTO, 0, 1)):
        with pytest.raises(KernelOptError):
            k.apply_opt(bad)
        assert k.full_shape == shape and k.applied_opts == []
    with pytest.raises(KernelOptError, match="CPU-style"):
        Kernel(si.ast, Device["PYTHON"].renderer).apply_opt(Opt(OptOps.PADTO, 0, 6))
    a, b = data((13, 8), dtypes.int32), data((13, 8), dtypes.int32, seed=1)
    idiv = last_kernel("PYTHON", lambda a, b: a // (b * b + 1), a, b)
    with pytest.raises(KernelOptError, match="integer division"):
        Kernel(idiv.ast, cpu_style_python()).apply_opt(Opt(OptOps.PADTO, 0, 6))
    emb = last_kernel("PYTHON", lambda w, i: w[i], data((10, 8)), np.arange(13, dtype=np.int32) % 10)
    with pytest.raises(KernelOptError, match="gathered"):
        Kernel(emb.ast, cpu_style_python()).apply_opt(Opt(OptOps.PADTO, 0, 6))
    # 13 rows as 3 tiles of 6 (18): the same bits as the plain kernel, nothing stored past the output
    k.apply_opt(Opt(OptOps.PADTO, 0, 6))
    assert k.full_shape == (3, 16, 24, 6)
    assert same(run_fenced("PYTHON", si, Kernel(si.ast, cpu_style_python())), run_fenced("PYTHON", si, k))
    # in whole vectors (gated vector stores), and in blocks whose partial sums wait in the output (HOIST)
    renderer = sixteen_registers("PYTHON")
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((13, 24)), data((24, 64)))
    reference = run_fenced("PYTHON", si, Kernel(si.ast, renderer))
    U, P = OptOps.UPCAST, OptOps.PADTO
    hoisted = [Opt(OptOps.SPLIT, 1, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.SPLIT, 3, 12), Opt(OptOps.HOIST, 2, 1)]
    for opts in ([Opt(U, 1, 16), Opt(P, 0, 6)], [Opt(U, 1, 16), Opt(P, 0, 6), *hoisted]):
        k = Kernel(si.ast, renderer)
        k.apply_opts(opts)
        uops = to_program(k).uops
        assert any(u.op is UOps.STORE and len(u.src) == 4 and u.src[2].dtype.count == 8 for u in uops)
        assert same(reference, run_fenced("PYTHON", si, k)), opts


@pytest.mark.parametrize("lanes, registers", [(8, 16), (16, 32)])
def test_a_residual_added_after_a_conv_does_not_choose_its_vectors(
    monkeypatch: pytest.MonkeyPatch, lanes: int, registers: int
) -> None:
    """The tile's column (vector) axis is the one the reduce's loads read whole vectors along: a shortcut added to
    the conv's output (read once per output, contiguous along the output's rows) leaves the tile as it is without it."""
    monkeypatch.setattr(tensor_module, "CONV_PREPAD_CHANNELS", 0)  # (the padding's masked windows, not a padded copy)
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: lanes}
    renderer.vector_registers = registers
    x, w, r = data((2, 16, 64, 64)), data((32, 16, 3, 3)), data((2, 32, 64, 64))
    opts = []
    for build in (lambda x, w, r: x.conv2d(w, padding=1).relu(), lambda x, w, r: (x.conv2d(w, padding=1) + r).relu()):
        k = Kernel(last_kernel("PYTHON", build, x, w, r).ast, renderer)
        k.hand_coded_optimizations()
        opts.append(k.applied_opts)
    assert opts[0] == opts[1] and opts[0][0].axis == 1  # (axis 1: the output channels, whose weights are contiguous)


def test_a_convs_gathered_weights_are_packed_once_per_column_tile_or_kept_one_vector_wide() -> None:
    """A 3x3 conv over 4 x 4 maps with 32 vector registers: its tile columns are output channels, whose weights lie
    144 floats apart, so each reduce step gathers them. Where the block of one column tile (its 144 reduce steps) fits
    the scratch memory, the column tiles become the outer loop and the block is packed, two vectors wide where that
    fits too; where nothing fits, the tile stays one vector wide (a gather costs a load a lane) and reads the weights
    in place. Every variant computes the conv."""
    x, w = data((2, 16, 4, 4)), data((64, 16, 3, 3))
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.einsum("ncyxij,kcij->nkyx", np.lib.stride_tricks.sliding_window_view(xp, (3, 3), (2, 3)), w)
    block = 16 * 9 * 4  # bytes of one output channel's weights
    for scratch, columns, packed in ((32 * block, 32, True), (16 * block, 16, True), (16 * block - 4, 16, False)):
        renderer = cpu_style_python_with_scratch(scratch)
        renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 16}
        renderer.vector_registers = 32
        si = last_kernel("PYTHON", lambda x, w: x.conv2d(w, padding=1), x, w)
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert k.upcast_sizes[-1] == columns, (scratch, k.applied_opts)
        assert [ld.arg.idx for ld in k.packed] == ([2] if packed else []), (scratch, k.applied_opts)
        np.testing.assert_allclose(run("PYTHON", si, k).reshape(want.shape), want, rtol=1e-4, atol=1e-4)


def test_a_1x1_convs_weight_rows_2_kb_apart_keep_the_tile_one_vector_wide() -> None:
    """A 1x1 conv's tile columns are output channels, whose weights lie `channels` floats apart. With 512 input
    channels (2 KB: the rows share the L1 cache's sets, and the packing copy of 32 of them ran ~1.7x slower on Zen 4)
    the tile is one vector wide; with 520 two vectors. The block is packed either way."""
    for channels, columns in ((512, 16), (520, 32)):
        x, w = data((1, channels, 7, 7)), data((64, channels, 1, 1), seed=1)
        renderer = cpu_style_python_with_scratch(256 * 1024)
        renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 16}
        renderer.vector_registers = 32
        si = last_kernel("PYTHON", lambda x, w: x.conv2d(w), x, w)
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert k.upcast_sizes[-1] == columns and len(k.packed) == 1, (channels, k.applied_opts)
        if columns == 16:  # (the two-vector tile's results are checked by the 3x3 conv's test above)
            want = np.einsum("ncyx,kc->nkyx", x, w[:, :, 0, 0])
            np.testing.assert_allclose(run("PYTHON", si, k).reshape(want.shape), want, rtol=1e-4, atol=1e-4)


ROWWISE_OPTS = [
    Opt(OptOps.UPCAST, 1, 16),
    Opt(OptOps.UPCAST, 0, 4),
    Opt(OptOps.UNROLL, 0, 4),
    Opt(OptOps.SWAP, 0, 1),
    Opt(OptOps.PACK, 1, 0),
]


def test_a_pack_of_rows_in_one_cache_set_is_copied_a_cache_line_of_each_row_at_a_time() -> None:
    """x @ w.T packs w's rows for a tile of 16 columns (output features), 4 reduce steps a loop step. Rows 1024 floats
    (4 KB) apart share one L1 set: copied as the kernel reads them, each step would read 4 elements of each of the 16
    rows again; the copy takes 4 steps at a time instead, the 16 elements of a row's cache line in a row, each stored
    on its own. Rows 512 floats apart (two sets) are copied as the kernel reads them. (Their results: below.)"""
    renderer = cpu_style_python_with_scratch(256 * 1024)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 16}
    renderer.vector_registers = 32
    for size, rowwise in ((1024, True), (512, False)):
        si = last_kernel("PYTHON", lambda x, w: x @ w.T, data((8, size)), data((32, size), seed=1))
        k = Kernel(si.ast, renderer)
        k.apply_opts(ROWWISE_OPTS)
        uops = to_program(k).uops
        pack = next(u for u in uops if u.op is UOps.DEFINE_LOCAL)
        copies = [u for u in uops if u.op is UOps.STORE and u.src[0] is pack]
        # scalar stores of 16 rows x 16 elements, in a loop of size / 4 / 4 steps; else 4 vector stores
        assert len(copies) == (16 * 16 if rowwise else 4), size
        assert all(u.src[2].dtype == (dtypes.float32 if rowwise else dtypes.float32.vec(16)) for u in copies)
        assert ([u.src[1].arg for u in uops if u.op is UOps.RANGE].count(size // 16) == 1) is rowwise


@pytest.mark.parametrize("device", [d for d in CPU_DEVICES if d != "PYTHON"])
def test_a_pack_copied_row_by_row_keeps_results_on_cpu_devices(device: str) -> None:
    x, w = data((8, 1024)), data((32, 1024), seed=1)
    for k in (
        check(device, lambda x, w: x @ w.T, x, w, opts=ROWWISE_OPTS),
        check(device, lambda x, w, b: (x @ w.T + b).relu(), x, w, data((32,), seed=2), opts=ROWWISE_OPTS),
    ):
        if Device[device].renderer.vector_widths.get(dtypes.float32, 1) > 1:  # (the copy is row by row: scalars)
            uops = to_program(k).uops
            pack = next(u for u in uops if u.op is UOps.DEFINE_LOCAL)
            assert sum(1 for u in uops if u.op is UOps.STORE and u.src[0] is pack) == 16 * 16


def test_a_linear_layers_gathered_weights_go_one_vector_wide_where_two_would_not_pack() -> None:
    """x @ w.T + b with 32 vector registers: a reduce of 64 steps is too short to run in blocks, so w's block for a
    column tile (all 64 reduce steps) is packed whole: two vectors wide where that fits the scratch memory, else one
    vector (whose block fits), never two vectors gathered at every step."""
    x, w, b = data((48, 64)), data((64, 64), seed=1), data((64,), seed=2)
    for scratch, columns in ((64 * 32 * 4, 32), (64 * 16 * 4, 16)):
        renderer = cpu_style_python_with_scratch(scratch)
        renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 16}
        renderer.vector_registers = 32
        si = last_kernel("PYTHON", lambda x, w, b: x @ w.T + b, x, w, b)
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert k.upcast_sizes[-1] == columns and len(k.packed) == 1, (scratch, k.applied_opts)
        np.testing.assert_allclose(run("PYTHON", si, k).reshape(48, 64), x @ w.T + b, rtol=1e-4, atol=1e-4)


def tile_columns(k: Kernel) -> int:
    """How many columns the heuristics gave a matmul tile (their first opt: the column axis's UPCAST), which
    depends on the target's vector width and registers."""
    assert k.applied_opts[0].op is OptOps.UPCAST and k.applied_opts[0].axis == 1
    return k.applied_opts[0].amount


def test_hoist_is_refused_where_it_cannot_keep_results() -> None:
    renderer = cpu_style_python()
    # the partial sums wait in the output: it must hold the accumulator's dtype; and one reduce only
    two_reduces = lambda a, b: a.sum(1, keepdim=True) + a.max(1, keepdim=True)  # noqa: E731
    for build in (lambda a, b: (a @ b).cast(dtypes.float16), two_reduces):
        si = last_kernel("PYTHON", build, data((8, 16)), data((16, 8)))
        k = Kernel(si.ast, renderer)
        with pytest.raises(KernelOptError):
            k.apply_opt(Opt(OptOps.HOIST, 1, 1))
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((8, 16)), data((16, 8)))
    with pytest.raises(KernelOptError):  # a GPU-style kernel has no global loops to move
        Kernel(si.ast, Device["PYTHON"].renderer).apply_opt(Opt(OptOps.HOIST, 1, 1))
    k = Kernel(si.ast, renderer)
    k.apply_opt(Opt(OptOps.HOIST, 1, 1))
    with pytest.raises(KernelOptError):  # nothing after HOIST
        k.apply_opt(Opt(OptOps.UPCAST, 0, 2))


def cpu_style_python_with_scratch(scratch_max: int = 1 << 16) -> Renderer:
    r = cpu_style_python()
    r.scratch_max = scratch_max
    return r


# HOISTED's kernel is [panels, rows, tiles | reduce blocks, steps | 2 rows, 8 columns]: a's block (rows, steps, its
# two rows) and b's (tiles, steps, the columns) are each read again by the inner loop the other one follows
PACKED = [*HOISTED, Opt(OptOps.PACK, 0, 0), Opt(OptOps.PACK, 1, 0)]
GATHERED = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 1, 0)]


def test_packed_inputs_keep_results_on_python() -> None:
    renderer = cpu_style_python_with_scratch()
    x = (np.random.default_rng(3).standard_normal((8, 32)) * 10.0 ** np.arange(32) % 1e6).astype(np.float32)
    k = check("PYTHON", lambda a, b: a @ b, x, data((32, 32)), opts=PACKED, renderer=renderer)
    # without HOIST the block is copied at each step of the outermost loop: here, of w's rows (x @ w.T's columns)
    check("PYTHON", lambda a, w: a @ w.T, x, data((32, 32)), opts=GATHERED, renderer=renderer)
    assert len(k.packed) == 2 and [u.arg[1] for u in to_program(k).uops if u.op is UOps.DEFINE_LOCAL] == [64, 128]
    # padding: the block holds 0 where the input is outside its buffer, and the inner loop reads it ungated
    check("PYTHON", lambda a, b: a.pad(((0, 0), (3, 1))) @ b, data((8, 28)), data((32, 32)), opts=PACKED[:-1],
          renderer=renderer)


@pytest.mark.parametrize("device", [d for d in CPU_DEVICES if getattr(Device[d].renderer, "scratch_max", 0)])
def test_packed_inputs_keep_results_on_cpu_devices(device: str) -> None:
    check(device, lambda a, b: a @ b, data((8, 32)), data((32, 32)), opts=PACKED)
    check(device, lambda a, b: a @ b.pad(((2, 0), (0, 0))), data((8, 32)), data((30, 32)), opts=PACKED)
    # the heuristics pack the right-hand block of a blocked matmul, whose rows are a power of two apart
    k = check(device, lambda a, b: a @ b, data((64, 512)), data((512, 256)))
    assert [o for o in k.applied_opts if o.op is OptOps.PACK] == [Opt(OptOps.PACK, 1, 0)]
    # (the block: a panel of panel_tiles() tiles, BLOCK_REDUCE steps)
    assert [u.arg[1] for u in to_program(k).uops if u.op is UOps.DEFINE_LOCAL] == [
        k.panel_tiles() * BLOCK_REDUCE * tile_columns(k)
    ]
    # a @ b.T: b's block is gathered into the pack, two vectors wide where the target has the registers for such a
    # tile (32: AVX-512), and the tile's vectors run along the output; one vector wide where b's rows lie a multiple
    # of 2 KB apart (512 floats: they share the L1 cache's sets). With 16 registers (AVX2) two vectors wide over 6
    # rows, 64 padded to 66 (PADTO), either way
    renderer = Device[device].renderer
    avx2 = renderer.vector_registers < 32
    for k_size, wide in ((480, True), (512, avx2)):
        k = check(device, lambda a, b: a @ b.T, data((64, k_size)), data((256, k_size)))
        width = renderer.vector_widths[dtypes.float32] * (2 if wide else 1)
        assert k.applied_opts[0] == Opt(OptOps.UPCAST, 1, width) and k.applied_opts[-1] == Opt(OptOps.PACK, 1, 0)
    # and, in a Linear layer (x @ w.T + b), w's rows for one tile of columns, which are gathered once so
    check(device, lambda a, w: a @ w.T, data((8, 32)), data((32, 32)), opts=GATHERED)
    for dtype in (dtypes.float64, dtypes.float16, dtypes.int32):  # blocks of other element types
        check(device, lambda a, w: a @ w.T, data((8, 32), dtype), data((32, 32), dtype, seed=1), opts=GATHERED)
        if dtype != dtypes.float16:  # (a half matmul accumulates in float: nothing to HOIST)
            check(device, lambda a, b: a @ b, data((8, 32), dtype), data((32, 32), dtype, seed=1), opts=PACKED)
    k = check(device, lambda a, w, b: a @ w.T + b, data((32, 96)), data((64, 96)), data((64,)))
    assert Opt(OptOps.SWAP, 0, 1) in k.applied_opts and k.applied_opts[-1] == Opt(OptOps.PACK, 1, 0)


@pytest.mark.parametrize("device", [d for d in CPU_DEVICES if getattr(Device[d].renderer, "scratch_max", 0)])
def test_a_reduce_of_one_block_runs_over_packed_panels_without_hoist(device: str) -> None:
    """A reduce of ONE_BLOCK steps or more but too short for two blocks runs as one block: a panel of column tiles
    over its packed share of b, the accumulators kept in registers (no HOIST); a shorter one is not packed."""
    a, b = data((64, 256)), data((256, 512), seed=1)
    k = check(device, lambda a, b: a @ b, a, b)
    ops = [o.op for o in k.applied_opts]
    assert OptOps.SWAP in ops and OptOps.PACK in ops and OptOps.HOIST not in ops, k.applied_opts
    got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    # a shorter one runs in no panels; with 16 vector registers it takes the packed column tile (each column tile's
    # share of b packed, the 64 rows padded to 66: _packed_column_tile), with 32 its tile is packed nowhere
    k = check(device, lambda a, b: a @ b, data((64, ONE_BLOCK // 2)), data((ONE_BLOCK // 2, 512)))
    ops = [o.op for o in k.applied_opts]
    assert OptOps.SPLIT not in ops and OptOps.HOIST not in ops, k.applied_opts
    assert (OptOps.PACK in ops) == (Device[device].renderer.vector_registers < 32), k.applied_opts


def test_pack_is_refused_where_it_cannot_help_or_fit() -> None:
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((8, 32)), data((32, 32)))
    k = Kernel(si.ast, cpu_style_python_with_scratch())
    k.apply_opts(HOISTED)
    for bad in (Opt(OptOps.PACK, 2, 0), Opt(OptOps.PACK, 0, 4)):  # no such input; an amount
        with pytest.raises(KernelOptError, match="not an input"):
            k.apply_opt(bad)
    k.apply_opt(Opt(OptOps.PACK, 0, 0))
    with pytest.raises(KernelOptError, match="packed already"):
        k.apply_opt(Opt(OptOps.PACK, 0, 0))
    with pytest.raises(KernelOptError, match="only PACK may follow"):
        k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
    small = Kernel(si.ast, cpu_style_python_with_scratch(64 * 4 + 127 * 4))
    small.apply_opts([*HOISTED, Opt(OptOps.PACK, 0, 0)])
    with pytest.raises(KernelOptError, match="scratch"):  # b's block (128 floats) does not fit beside a's (64)
        small.apply_opt(Opt(OptOps.PACK, 1, 0))
    plain = Kernel(si.ast, cpu_style_python())
    plain.apply_opts(HOISTED)
    with pytest.raises(KernelOptError, match="scratch"):  # a renderer without scratch memory
        plain.apply_opt(Opt(OptOps.PACK, 0, 0))
    # BEAM's next steps after HOIST: the PACKs, where the renderer has scratch memory
    from tgcore.engine.search import actions

    assert actions(k) == [Opt(OptOps.PACK, 0, 0), Opt(OptOps.PACK, 1, 0)] and actions(plain) == []
    unhoisted = Kernel(si.ast, cpu_style_python_with_scratch())
    unhoisted.apply_opt(Opt(OptOps.PACK, 0, 0))  # (without HOIST: a's block at each step of the outermost loop)
    with pytest.raises(KernelOptError, match="only PACK may follow PACK"):
        unhoisted.apply_opt(Opt(OptOps.UPCAST, 0, 2))
    with pytest.raises(KernelOptError, match="again"):  # a row sum has no loop inside its rows' loop but the reduce
        row_sum = last_kernel("PYTHON", lambda a: a.sum(axis=1), data((8, 32)))
        Kernel(row_sum.ast, cpu_style_python_with_scratch()).apply_opt(Opt(OptOps.PACK, 0, 0))
    # an in-place update reads its output: never packed
    acc = Tensor(data((8, 32)), device="PYTHON").realize()
    a, b = (Tensor(data(shape, seed=seed), device="PYTHON") for shape, seed in (((8, 32), 1), ((32, 32), 2)))
    update = acc.assign(acc + a @ b)
    k = Kernel(update.schedule()[-1].ast, cpu_style_python_with_scratch())
    output_reads = [i for i, ld in enumerate(k.loads()) if ld.arg.idx == 0]
    assert output_reads
    with pytest.raises(KernelOptError, match="output"):
        k.apply_opt(Opt(OptOps.PACK, output_reads[0], 0))
    # a column sum's inner loop reads every element once: nothing to pack
    sums = [Opt(OptOps.SPLIT, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.SPLIT, 1, 8), Opt(OptOps.HOIST, 1, 1)]
    si = last_kernel("PYTHON", lambda a: a.sum(axis=0), data((32, 8)))
    k = Kernel(si.ast, cpu_style_python_with_scratch())
    k.apply_opts(sums)
    with pytest.raises(KernelOptError, match="again"):
        k.apply_opt(Opt(OptOps.PACK, 0, 0))


# ***** the caches that keep Python off the hot path: they must never change a result *****


def test_schedule_cache_tells_apart_what_changes_a_kernel() -> None:
    from tgcore.engine import schedule

    x = Tensor(np.array([-0.0, 1.5, -2.0], dtype=np.float32))
    for _ in range(2):  # the second round comes from the cache
        assert np.signbit((x + 0.0).numpy()[0]) == np.False_
        assert np.signbit((x + -0.0).numpy()[0]) == np.True_
        assert (x + 1).numpy().tolist() == [1.0, 2.5, -1.0]
        assert Tensor(np.arange(5, dtype=np.float32)).sum().item() == 10.0
        assert Tensor(np.arange(7, dtype=np.float32)).sum().item() == 21.0
        assert Tensor(np.arange(7, dtype=np.float32)).max().item() == 6.0
    a = Tensor(np.ones(4, dtype=np.float32)).realize()
    first, second = (a * 3).schedule(), (a * 3).schedule()
    assert first[0].ast is second[0].ast  # the same AST object: the runner lookup is an identity check
    assert len(schedule._schedule_cache) > 0


def test_jit_replay_launches_directly_and_counts() -> None:
    from tgcore import GlobalCounters, TinyJit
    from tgcore.engine.jit import JitError

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        return (x * 2 + y).realize()

    for i in range(5):
        x = Tensor(np.full(8, i, dtype=np.float32)).realize()
        y = Tensor(np.arange(8, dtype=np.float32)).realize()
        GlobalCounters.reset()
        out = step(x, y=y)
        assert GlobalCounters.kernel_count == 1
        assert out.numpy().tolist() == (2 * i + np.arange(8)).tolist()
    with pytest.raises(JitError):
        step(Tensor(np.zeros(9, dtype=np.float32)).realize(), y=Tensor(np.zeros(9, dtype=np.float32)).realize())


# ***** BEAM search *****


def test_beam_search_keeps_results_and_caches_its_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from tgcore.engine import search

    store: dict[str, Any] = {}
    monkeypatch.setattr(search, "diskcache_get", lambda table, key: store.get(repr(sorted(key.items()))))
    monkeypatch.setattr(
        search, "diskcache_put", lambda table, key, val: store.setdefault(repr(sorted(key.items())), val)
    )
    monkeypatch.setattr(search, "MAX_STEPS", 2)
    si = last_kernel("PYTHON", lambda a, b: a @ b, data((8, 16)), data((16, 8), seed=1))
    renderer = Device["PYTHON"].renderer
    found = search.beam_search(Kernel(si.ast, renderer), "PYTHON", 2)
    assert same(run("PYTHON", si, Kernel(si.ast, renderer)), run("PYTHON", si, found))
    assert len(store) == 1 and list(store.values())[0] == [[o.op.name, o.axis, o.amount] for o in found.applied_opts]

    def no_timing(*args: Any) -> None:
        raise AssertionError("a cached search must not time anything")

    monkeypatch.setattr(search._Timer, "time", no_timing)
    again = search.beam_search(Kernel(si.ast, renderer), "PYTHON", 2)
    assert again.applied_opts == found.applied_opts


def test_beam_drops_a_candidate_whose_result_differs() -> None:
    from tgcore.engine import search

    plus = last_kernel("PYTHON", lambda a, b: a + b, data((4, 8)), data((4, 8), seed=1))
    times = last_kernel("PYTHON", lambda a, b: a * b, data((4, 8)), data((4, 8), seed=1))
    renderer = Device["PYTHON"].renderer
    k_plus, k_times = Kernel(plus.ast, renderer), Kernel(times.ast, renderer)
    bufs = search._random_buffers(k_plus, "PYTHON")
    assert bufs is not None
    timer = search._Timer("PYTHON", bufs)
    (a, pa), (b, pb) = timer.programs([k_plus, k_times])
    assert timer.time(a, pa) is not None  # the reference
    assert timer.time(b, pb) is None  # another result: dropped


def test_beam_leaves_in_place_kernels_to_the_heuristics() -> None:
    from tgcore.engine import search

    x = Tensor(np.arange(64, dtype=np.float32)).realize()
    si = x.assign(x * 2).schedule()[-1]
    k = search.beam_search(Kernel(si.ast, Device["PYTHON"].renderer), "PYTHON", 2)
    assert k.applied_opts == get_kernel(Device["PYTHON"].renderer, si.ast).applied_opts


def test_beam_through_realize(monkeypatch: pytest.MonkeyPatch) -> None:
    from tgcore.engine import search

    store: dict[str, Any] = {}
    monkeypatch.setattr(search, "diskcache_get", lambda table, key: store.get(repr(sorted(key.items()))))
    monkeypatch.setattr(
        search, "diskcache_put", lambda table, key, val: store.setdefault(repr(sorted(key.items())), val)
    )
    monkeypatch.setattr(search, "MAX_STEPS", 1)
    a, b = data((12, 20)), data((20, 4), seed=1)
    with Context(NOOPT=1):
        reference = (Tensor(a) @ Tensor(b)).relu().numpy()
    with Context(BEAM=1):
        got = (Tensor(a) @ Tensor(b)).relu().numpy()
    assert same(reference, got) and store


def test_index_uops_are_the_address_arithmetic_only() -> None:
    # index_uops: what only computes addresses, gates and loop bounds; a value computed with the same numbers is not
    from tgcore.codegen.uops import index_uops

    t = Tensor(np.arange(6 * 7, dtype=np.int32).reshape(6, 7))
    out = (t.pad(((1, 1), (0, 0))) * 7 + t.sum(axis=0)).cast(dtypes.int32)
    uops = to_program(get_kernel(Device["PYTHON"].renderer, out.schedule()[-1].ast)).uops
    index = index_uops(uops)
    loads = [u for u in uops if u.op is UOps.LOAD]
    assert loads and all(id(u.src[1]) in index or u.src[1].op is UOps.CONST for u in loads)
    assert any(id(u) in index for u in uops if u.op in (UOps.RANGE, UOps.SPECIAL))  # loop or launch indices
    values = [u for u in uops if u.op is UOps.ALU and u.dtype == dtypes.int32 and any(s.op is UOps.LOAD for s in u.src)]
    assert values and not any(id(u) in index for u in values)
    gated = [u for u in loads if len(u.src) == 4]
    assert gated and all(id(u.src[2]) in index for u in gated)
    stored = [u.src[2] for u in uops if u.op is UOps.STORE]
    assert stored and not any(id(u) in index for u in stored)


def test_a_long_fused_expression_is_not_unrolled_into_a_huge_kernel() -> None:
    """A matmul reading a GELU's gradient carries ~80 ops a lane: its tile is bounded by Kernel._lane_budget (the
    full 32 x 8 x 4 tile was 87,000 uops and 38 s of a C compiler's time); the result is unchanged."""
    from tgcore.codegen.linearizer import Linearizer

    rng = np.random.default_rng(0)
    xn, wn, gn = (rng.standard_normal(s).astype(np.float32) for s in ((2, 8, 32), (128, 32), (2, 8, 128)))
    w = Tensor(wn, requires_grad=True)
    (Tensor(xn).linear(w.T).gelu() * Tensor(gn)).sum().backward()
    for si in w.grad.schedule():
        if si.ast.op is BufferOps.STORE:
            k = get_kernel(Device[Device.DEFAULT].renderer, si.ast)
            assert len(Linearizer(k).linearize()) < 20_000, k.applied_opts
    h = xn @ wn.T
    t = np.tanh(0.7978845608 * (h + 0.044715 * h**3))
    dgelu = 0.5 * (1 + t) + 0.5 * h * (1 - t**2) * 0.7978845608 * (1 + 3 * 0.044715 * h**2)
    ref = np.einsum("bto,bti->oi", gn * dgelu, xn)
    np.testing.assert_allclose(w.grad.numpy(), ref, rtol=2e-4, atol=2e-4)


def _silu(a: Tensor, w: Tensor) -> Tensor:
    return (a * w + 1) * (a * w + 1).sigmoid()  # a per-row (channel) scale and shift, then SiLU: ~60 ALU ops


def test_heavy_elementwise_takes_vectors_along_another_axis() -> None:
    # rows of 49 hold no vector: an arithmetic-heavy kernel takes its 8 lanes along the 16 rows instead (loads
    # gathered, stores scattered), a light one stays scalar (planned for a target of 8-float vectors on any machine)
    renderer = cpu_style_python()
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    renderer.vector_math = (UnaryOps.EXP2, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPEQ, TernaryOps.WHERE,
                            UnaryOps.BITCAST, BinaryOps.SHL)  # fmt: skip
    # (and two of them at once, the rest of the 16 rows: each vector's ops wait on each other, two vectors' overlap)
    heavy = Kernel(last_kernel("PYTHON", _silu, data((16, 49)), data((16, 1))).ast, renderer)
    heavy.hand_coded_optimizations()
    assert heavy.applied_opts == [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 0, 2)]
    light = Kernel(last_kernel("PYTHON", lambda a, w: a * w + 1, data((16, 49)), data((16, 1))).ast, renderer)
    light.hand_coded_optimizations()
    assert light.applied_opts == []
    # rows of 196 hold vectors of 4 but not of 8: the heavy kernel still takes whole vectors along the rows' axis
    # of 16, the light one the 4 lanes along the rows (EfficientNet's 14x14 maps after a depthwise conv); the heavy
    # one 4 vectors at once, along the rows
    heavy = Kernel(last_kernel("PYTHON", _silu, data((16, 196)), data((16, 1))).ast, renderer)
    heavy.hand_coded_optimizations()
    assert heavy.applied_opts == [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 4)]
    light = Kernel(last_kernel("PYTHON", lambda a, w: a * w + 1, data((16, 196)), data((16, 1))).ast, renderer)
    light.hand_coded_optimizations()
    assert light.applied_opts[0] == Opt(OptOps.UPCAST, 1, 4)


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_heavy_elementwise_vectors_keep_results(device: str) -> None:
    check(device, _silu, data((16, 49)), data((16, 1)))
    check(device, _silu, data((16, 49)), data((16, 1)), opts=[Opt(OptOps.UPCAST, 0, 8)])
    check(device, _silu, data((16, 196)), data((16, 1)))


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_long_elementwise_chains_run_several_vectors_at_once(device: str) -> None:
    # exp, sigmoid, SiLU over a contiguous array: INTERLEAVE_VECTORS whole vectors an iteration (their chains of
    # dependent ops overlap), bit for bit the unoptimized kernel's results, and numpy's within float32 rounding
    vw = Device[device].renderer.vector_widths.get(dtypes.float32, 1)
    x = data((64, 256)) * 4
    for fn, ref in ((lambda a: a.exp(), np.exp), (lambda a: a.silu(), lambda v: v / (1 + np.exp(-v)))):
        k = check(device, fn, x)
        if vw > 1 and Device[device].renderer.vector_uops:
            assert prod(k.upcast_sizes) == INTERLEAVE_VECTORS * min(vw, 16), k.applied_opts
        got = fn(Tensor(x, device=device)).numpy()
        np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=2e-6, atol=1e-30)
    light = check(device, lambda a: a + 1, x)  # (an add waits on its loads, not on its ops: one vector)
    assert prod(light.upcast_sizes) <= max(vw, 1)


def test_loads_and_broadcasts_sit_just_before_their_first_use() -> None:
    """A tile's loads (and the vectors built of them) are placed right before the first uop that reads them, never
    across a loop bound, branch or store, so a C compiler does not keep them all live at once; the kernel's results
    are those of the unsorted uops."""
    from tgcore.codegen.linearizer import _LOAD_FENCES, _SUNK, _at_first_use

    x, w = data((1, 8, 10, 10)), data((16, 8, 3, 3))
    si = last_kernel("PYTHON", lambda x, w: x.conv2d(w, padding=1), x, w)
    k = Kernel(si.ast, cpu_style_python())
    k.hand_coded_optimizations()
    uops = to_program(k).uops
    position = {id(u): i for i, u in enumerate(uops)}
    for i, u in enumerate(uops):
        if u.op not in _SUNK:
            continue
        users = [position[id(v)] for v in uops if any(s is u for s in v.src)]
        assert users, "a load nobody reads"
        first = min(users)
        between = uops[i + 1 : first]
        # right before its first reader: only other sunk uops (that reader's other sources) in between
        assert all(v.op in _SUNK for v in between), [v.op for v in between]
        assert not any(v.op in _LOAD_FENCES for v in between)
    assert _at_first_use(uops) == uops  # (already in that order: sorting again changes nothing)
    got = run("PYTHON", si, k)
    want = Tensor(x).conv2d(Tensor(w), padding=1).numpy().reshape(-1)
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-5, atol=1e-5)


def test_a_value_of_the_outer_loops_is_computed_before_the_inner_one() -> None:
    """h * sigmoid(g) with one gate per channel (a squeeze-and-excitation block): the gate's loads and its sigmoid
    come before the loop over the channel's elements, once a channel, not once an element; the results stay."""
    from tgcore.codegen.linearizer import _hoisted

    h, g = data((1, 24, 40, 40)), data((1, 24, 1, 1))
    si = last_kernel("PYTHON", lambda h, g: h * g.sigmoid(), h, g)
    k = Kernel(si.ast, cpu_style_python())
    k.hand_coded_optimizations()
    uops = to_program(k).uops
    depth, inner, at = 0, 0, {}
    for u in uops:
        depth += u.op is UOps.RANGE
        depth -= u.op is UOps.ENDRANGE
        inner = max(inner, depth)
        at[id(u)] = depth
    assert inner >= 2
    # (exp builds its powers of two with shifts: one per gate, so outside the inner loop)
    exps = [u for u in uops if u.op is UOps.ALU and u.arg is BinaryOps.SHL]
    assert exps and all(at[id(u)] < inner for u in exps)
    assert _hoisted(uops) == uops  # (already hoisted: nothing moves again)
    got = run("PYTHON", si, k).reshape(-1)
    np.testing.assert_allclose(got, (h / (1 + np.exp(-g.astype(np.float64)))).reshape(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lanes, registers", [(8, 16), (16, 32)])
def test_a_conv_weight_gradient_tile_has_enough_accumulators(lanes: int, registers: int) -> None:
    """The weight gradient's tile (its columns a vector of output channels, its rows the 3 taps of a row) gets a
    second row axis, so that it has 8 vector accumulators or more, not 3 waiting on each other's FMAs."""
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: lanes}
    renderer.vector_registers = registers
    x, g = data((4, 16, 12, 12)), data((4, 32, 12, 12))

    def weight_grad(x: Tensor, g: Tensor) -> Tensor:
        w = Tensor.zeros(32, 16, 3, 3, requires_grad=True)
        (x.conv2d(w, padding=1) * g).sum().backward()
        return w.grad

    si = last_kernel("PYTHON", weight_grad, x, g)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    tile = math.prod(s for a, s in enumerate(k.full_shape) if a >= k.first_upcast and not k.is_reduce_axis(a))
    assert tile // lanes >= 8
    got = run("PYTHON", si, k).reshape(32, 16, 3, 3)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.einsum("nkyx,ncyxij->kcij", g, np.lib.stride_tricks.sliding_window_view(xp, (3, 3), (2, 3)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lanes, registers", [(8, 16), (16, 32)])
def test_a_tile_of_one_vector_and_no_rows_goes_two_vectors_wide_with_16_registers(lanes: int, registers: int) -> None:
    """A depthwise-conv-like reduce (out[c, p] = sum_k a[c, p] * b[c, k]: no axis along which the column's loads are
    broadcast, so no rows to add): with 16 vector registers its tile goes two vectors wide (two accumulators, each
    broadcast value of b feeding two FMAs); with 32 it stays one vector."""
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: lanes}
    renderer.vector_registers = registers
    a, b = data((8, 256)), data((8, 9), seed=1)
    si = last_kernel("PYTHON", lambda a, b: (a.reshape(8, 1, 256) * b.reshape(8, 9, 1)).sum(1), a, b)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    wide = [Opt(OptOps.UPCAST, 1, lanes), Opt(OptOps.UPCAST, 1, 2)]
    assert (k.applied_opts[:2] == wide) == (registers == 16), k.applied_opts
    got = run("PYTHON", si, k).reshape(8, 256)
    np.testing.assert_allclose(got, a * b.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_a_padded_copy_takes_its_rows_whole_in_lanes(device: str) -> None:
    """A padded copy's rows (32 + 2: masked, so the view does not split into vectors) are upcast whole where at most
    PADDED_ROW_LANES long, and left as loops where longer; the copy is exact either way, zeros in the border."""
    for side, whole in ((32, True), (112, False)):
        x = data((4, side, side))
        si = last_kernel(device, lambda x: x.pad(((0, 0), (1, 1), (1, 1))).contiguous(), x)
        k = Kernel(si.ast, Device[device].renderer)
        k.hand_coded_optimizations()
        assert (k.applied_opts == [Opt(OptOps.UPCAST, 2, 0)]) == whole, k.applied_opts
        got = run_fenced(device, si, k).reshape(4, side + 2, side + 2)
        np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (1, 1), (1, 1))))


def test_a_transpose_reads_its_input_in_blocks() -> None:
    """NCHW -> NHWC: the output's vectors run along the channels, which the input holds a map apart; the map's
    contiguous axis is upcast too, so each row of the input gives 8 neighbouring elements at once."""
    renderer = cpu_style_python_with_scratch(1 << 18)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    renderer.vector_registers = 16
    x = data((2, 16, 8, 8))
    si = last_kernel("PYTHON", lambda x: x.permute(0, 2, 3, 1).contiguous(), x)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    assert [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST] == [8, 8]
    np.testing.assert_array_equal(run("PYTHON", si, k).reshape(2, 8, 8, 16), x.transpose(0, 2, 3, 1))

    # with 12 ops an element (an affine map six times over: a BatchNorm written into NHWC), the block is all: no
    # vectors interleaved on top of it
    def affine(x: Tensor) -> Tensor:
        t = x.permute(0, 2, 3, 1)
        for _ in range(6):
            t = t * 1.5 + 0.25
        return t

    si = last_kernel("PYTHON", affine, x)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    assert [o.amount for o in k.applied_opts if o.op is OptOps.UPCAST] == [8, 8], k.applied_opts
    want = x.transpose(0, 2, 3, 1).astype(np.float64)
    for _ in range(6):
        want = want * 1.5 + 0.25
    np.testing.assert_allclose(run("PYTHON", si, k).reshape(2, 8, 8, 16), want, rtol=1e-5, atol=1e-5)


def test_a_row_reduce_past_l2_reads_one_row_at_a_time() -> None:
    """A plain row sum or max of more than 1 MB, read in whole vectors, streams one row at a time (no upcast of the
    output axis); in cache, of a computed value, or narrower than a vector, its rows keep several accumulators."""
    renderer = cpu_style_python()  # (choosing as for a target with 16-float vectors and a vector MAX)
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 16}
    renderer.vector_uops = True
    renderer.vector_math = (*renderer.vector_math, BinaryOps.MAX)
    cases: list[tuple[tuple[int, int], Callable[[Tensor], Tensor], bool]] = [
        ((1024, 512), lambda x: x.sum(axis=1), False),  # 2 MB: one row at a time
        ((1024, 512), lambda x: x.max(axis=1), False),
        ((64, 512), lambda x: x.sum(axis=1), True),  # 128 KB, in cache: 4 rows at once
        ((1024, 512), lambda x: x.exp().sum(axis=1), True),  # an exp an element
        ((1024, 500), lambda x: x.sum(axis=1), True),  # rows of 500 floats: no lane reduce
    ]
    for shape, build, upcast in cases:
        k = Kernel(build(Tensor.empty(*shape, device="PYTHON")).schedule()[-1].ast, renderer)
        k.hand_coded_optimizations()
        rows_at_once = [o for o in k.applied_opts if o.op is OptOps.UPCAST and o.axis == 0]
        assert bool(rows_at_once) == upcast, (shape, k.applied_opts)


@pytest.mark.parametrize("device", [d for d in CPU_DEVICES if d != "PYTHON"])
def test_row_reduces_past_l2_agree_with_numpy_and_the_plain_kernel(device: str) -> None:
    x = data((2048, 512))
    for axis_op, ref in (("sum", x.sum(axis=1)), ("max", x.max(axis=1))):
        si = last_kernel(device, lambda t: getattr(t, axis_op)(axis=1), x)
        k = get_kernel(Device[device].renderer, si.ast, device)
        got = run(device, si, k)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
        plain = run(device, si, Kernel(si.ast, Device[device].renderer))
        assert same(got, plain), (axis_op, k.applied_opts)


def _depthwise(x: Tensor, w: Tensor, stride: int) -> Tensor:
    return x.conv2d(w, groups=x.shape[1], stride=stride, padding=1)


@pytest.mark.parametrize("device", ["PYTHON", *CPU_DEVICES])
@pytest.mark.parametrize("side, stride, lanes", [(24, 1, 24), (48, 2, 24), (80, 1, 40)])
def test_a_depthwise_conv_takes_its_output_rows_whole_in_lanes(device: str, side: int, stride: int, lanes: int) -> None:
    """A depthwise 3x3 conv over a padded (masked) input on CPU loops: its output row goes into lanes whole (up to
    PADDED_ROW_LANES, else the largest divisor of whole vectors within it: 80 -> 40) and the window's last axis is
    unrolled; the results are numpy's, nothing is written past the output."""
    renderer = cpu_style_python() if device == "PYTHON" else Device[device].renderer
    if device == "PYTHON":
        renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    vw = renderer.vector_widths.get(dtypes.float32, 1)
    x, w = data((1, 6, side, side)), data((6, 1, 3, 3), seed=1)
    si = last_kernel(device, lambda x, w: _depthwise(x, w, stride), x, w)
    k = Kernel(si.ast, renderer)
    k.hand_coded_optimizations()
    if vw > 1 and lanes % vw == 0 and lanes >= 2 * vw:
        assert k.applied_opts == [Opt(OptOps.UPCAST, 2, lanes), Opt(OptOps.UNROLL, 1, 3)], k.applied_opts
    out = side // stride
    got = (run if device == "PYTHON" else run_fenced)(device, si, k).reshape(1, 6, out, out)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::stride, ::stride]
    want = np.einsum("ncyxij,cij->ncyx", windows, w[:, 0].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_conv_over_channels_or_a_max_pool_does_not_take_whole_rows() -> None:
    """A 3x3 conv that sums over 4 channels too (36 steps: ResNet-like, its input reused along the output channels)
    and a max pool over a padded input keep their tiles: whole rows in lanes made ResNet's 3x3 convs 5-7x slower."""
    renderer = cpu_style_python()
    renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    x, w = data((1, 4, 24, 24)), data((8, 4, 3, 3), seed=1)
    conv = last_kernel("PYTHON", lambda x, w: x.conv2d(w, padding=1), x, w)
    pool = last_kernel("PYTHON", lambda x: x.pad2d((1, 1, 1, 1), value=float("-inf")).max_pool2d(3, 1), x)
    for si in (conv, pool):
        k = Kernel(si.ast, renderer)
        k.hand_coded_optimizations()
        assert not any(o.op is OptOps.UPCAST and o.amount == 24 for o in k.applied_opts), k.applied_opts


def _chain(t: Tensor) -> Tensor:
    for i in range(12):  # 36 ops, each lane the same along the rows
        t = (t * 1.0009765625 + 0.5) * (0.25 + 0.0625 * (i % 3))
    return t


@pytest.mark.parametrize("device", ["PYTHON", *CPU_DEVICES])
def test_lanes_along_an_axis_that_most_ops_share_compute_them_once(device: str) -> None:
    """An elementwise kernel whose ops, most of them, read nothing that changes along a short axis (2 rows picking
    either of two results of one long chain: how random words are drawn) takes that axis whole into lanes, so the
    linearizer computes the chain once for both; a kernel whose chain reads a different value in each row does not."""
    renderer = Device[device].renderer
    if device == "PYTHON":
        renderer = cpu_style_python()
        renderer.vector_widths = {**renderer.vector_widths, dtypes.float32: 8}
    x, rows = data((64,)), np.array([[False], [True]])
    shared = last_kernel(device, lambda x, r: r.expand(2, 64).where(_chain(x) * 3.0, _chain(x)), x, rows)
    k = Kernel(shared.ast, renderer)
    k.hand_coded_optimizations()
    assert Opt(OptOps.UPCAST, 0, 2) == k.applied_opts[0], k.applied_opts
    muls = [u for u in to_program(k).uops if u.op is UOps.ALU and u.arg is BinaryOps.MUL and u.dtype != dtypes.int32]
    lanes = prod(k.upcast_sizes) // 2  # (the lanes along the rows' axis, of each of the two rows)
    assert len(muls) <= (24 + 1) * max(lanes, 1), len(muls)  # the chain's 24 products once, then the row's * 3
    with Context(NOOPT=1):
        plain = Kernel(shared.ast, renderer)
    assert same(run(device, shared, k), run(device, shared, plain))
    ref = x.astype(np.float32)
    for i in range(12):
        scale = np.float32(0.25 + 0.0625 * (i % 3))
        ref = ((ref * np.float32(1.0009765625) + np.float32(0.5)) * scale).astype(np.float32)
    np.testing.assert_allclose(run(device, shared, k).reshape(2, 64), np.stack([ref, ref * 3]), rtol=1e-6)
    varying = last_kernel(device, lambda x: _chain(x), data((2, 64)))
    k = Kernel(varying.ast, renderer)
    k.hand_coded_optimizations()
    assert Opt(OptOps.UPCAST, 0, 2) not in k.applied_opts, k.applied_opts


@pytest.mark.parametrize("device", [d for d in CPU_DEVICES if getattr(Device[d].renderer, "vector_uops", False)])
def test_a_reduce_of_many_scalar_ops_is_no_lane_reduce(device: str) -> None:
    """A row sum whose body has a few scalar ops (bit ops on each element's bits) takes more than LANE_SCALAR_OPS of
    them in REDUCE_LANES lanes: it is no lane reduce (each lane would repeat them: randn's Box-Muller into a max
    made 270k characters of C); a plain row sum, and one with a single scalar op, stay lane reduces. Sums as numpy's."""
    x = data((8, 1024))
    plain = last_kernel(device, lambda x: x.sum(1), x)

    def bits(t: Tensor) -> Tensor:  # 6 scalar ops an element: 3 shifts, and, or, a cast from int
        u = t.bitcast(dtypes.uint32)
        return ((u >> 9) & 0xFF | (u >> 3) | (u >> 20)).cast(dtypes.float32)

    heavy = last_kernel(device, lambda x: bits(x).sum(1), x)
    light = last_kernel(device, lambda x: (x.bitcast(dtypes.uint32) >> 9).cast(dtypes.float32).sum(1), x)
    renderer = Device[device].renderer
    assert Kernel(plain.ast, renderer).reduce_lanes == 16
    assert Kernel(light.ast, renderer).reduce_lanes == 16
    assert Kernel(heavy.ast, renderer).reduce_lanes == 0
    k = Kernel(heavy.ast, renderer)
    k.hand_coded_optimizations()
    # (and few lanes: its scalar ops in them at most LANE_SCALAR_OPS, LONG_KERNEL_LANES allowed whatever they are)
    assert prod(k.upcast_sizes) <= 9, k.applied_opts
    u = x.view(np.uint32)
    want = (((u >> 9) & 0xFF | (u >> 3) | (u >> 20)).astype(np.float64)).sum(1)
    np.testing.assert_allclose(run(device, heavy, k), want, rtol=1e-6)
