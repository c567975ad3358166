"""Kernels of a symbolic size (a bound Variable's: a dynamic batch, a KV cache's length) are optimized along their
integer axes, the symbolic one left a plain loop, and one compiled kernel gives every value of the Variable the same
result as the unoptimized kernel (bit for bit) and as numpy.

Each case builds its tensors with the Variable bound to several values: the schedule's ASTs are the same for each (the
Variable unbound), so each kernel is optimized and compiled once, for a CPU-style vector renderer (PYTHON with CPU
loops and 8-float vectors, the abilities of a CPU plugin) and for every device that works here, and run at each value.
TinyJit then replays one recording at every value on each device.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np
import pytest

from tgcore import Device, GlobalCounters, Tensor, TinyJit, Variable, dtypes
from tgcore.codegen.kernel import Kernel, OptOps
from tgcore.codegen.program import to_program
from tgcore.device import Buffer
from tgcore.engine.realize import CompiledRunner, get_kernel, run_schedule
from tgcore.ops import BinaryOps, BufferOps, LazyOp, TernaryOps, UnaryOps
from tgcore.renderer import Renderer
from tgcore.runtime.python import PythonRenderer
from tgcore.shape.symbolic import Node, sym_infer

DEVICES = ["PYTHON"] + sorted(d for d in Device.available() if d != "PYTHON")
BATCHES = (3, 1, 16, 7)  # values of the batch Variable (1 to 16)
CONV_BATCHES = (2, 1, 5)  # (fewer: the PYTHON interpreter runs a conv's or a sequence's unoptimized kernel too)
LENGTHS = (5, 1, 32, 19)  # values of the KV cache's length (1 to 32)
HEADS, HEAD_DIM = 4, 16


class WorkgroupRenderer(PythonRenderer):
    """PYTHON with workgroups and shared memory (a GPU's abilities, that the interpreter runs)."""

    has_local = True
    has_shared = True
    local_max = (64, 64, 64)
    shared_max = 8192


def vector_cpu(scratch_max: int = 1 << 16) -> Renderer:
    """PYTHON with CPU-style kernels (global loops), 8-float vectors, vector math and scratch memory: a CPU plugin's
    abilities (the interpreter runs vectors as one more numpy axis; it has no vector BITCAST, which exp uses)."""
    r = PythonRenderer()
    r.global_max = None
    r.vector_widths = {dtypes.float32: 8}
    r.vector_math = (UnaryOps.EXP2, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPEQ, TernaryOps.WHERE)
    r.scratch_max = scratch_max
    return r


def data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b)))


def read(t: Tensor, shape: tuple[int, ...]) -> np.ndarray:
    """The realized tensor `t`, of a symbolic shape that is `shape` at its Variables' values (its buffer has room for
    their upper bounds)."""
    buffer = t.realize().lazydata.base.realized
    assert buffer is not None and t.lazydata.st.contiguous
    return buffer.numpy()[: math.prod(shape)].reshape(shape)


def is_symbolic(ast: LazyOp) -> bool:
    return any(not isinstance(s, int) for x in ast.lazyops() if x.op in BufferOps for s in x.arg.st.shape)


# ***** the cases: each value of the Variable gives the arguments (tensors of a symbolic size, or the bound Variable)
# of one build function, and numpy's result *****

_W_CONV = data((8, 2, 3, 3), 1)
_W_MATMUL = data((64, 48), 2)
_BIAS = data((48,), 3)
_W_SEQUENCE = data((32, 16), 7)
_CACHE_K, _CACHE_V = data((HEADS, 32, HEAD_DIM), 4), data((HEADS, 32, HEAD_DIM), 5)
Args = tuple[Any, ...]


@functools.cache
def weights(device: str) -> dict[str, Tensor]:
    arrays = {"conv": _W_CONV, "matmul": _W_MATMUL, "bias": _BIAS, "sequence": _W_SEQUENCE}
    arrays.update(keys=_CACHE_K, values=_CACHE_V)
    return {name: Tensor(x, device=device).realize() for name, x in arrays.items()}


def _batch(x: np.ndarray, device: str) -> Tensor:
    return Tensor(x, device=device).reshape(Variable("batch", 1, 16).bind(x.shape[0]), *x.shape[1:])


def _conv(n: int, device: str) -> tuple[Args, np.ndarray]:
    x = data((n, 2, 5, 5), n)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
    return (_batch(x, device),), np.maximum(np.einsum("nchwij,ocij->nohw", windows, _W_CONV), 0)


def _build_conv(x: Tensor) -> Tensor:
    return x.conv2d(weights(x.device)["conv"], padding=1).relu()


def _matmul(n: int, device: str) -> tuple[Args, np.ndarray]:
    x = data((n, 64), n)
    return (_batch(x, device),), x @ _W_MATMUL + _BIAS


def _build_matmul(x: Tensor) -> Tensor:
    return x @ weights(x.device)["matmul"] + weights(x.device)["bias"]


def _sequence(n: int, device: str) -> tuple[Args, np.ndarray]:
    x = data((n, 16, 32), n)
    return (_batch(x, device),), x.reshape(n * 16, 32) @ _W_SEQUENCE


def _build_sequence(x: Tensor) -> Tensor:
    """A Linear layer over a batch of sequences, flattened to rows: one axis of symbolic size batch * 16."""
    return x.reshape(x.shape[0] * 16, 32) @ weights(x.device)["sequence"]


def _elementwise(n: int, device: str) -> tuple[Args, np.ndarray]:
    x = data((n, 3, 40), n)
    return (_batch(x, device),), (x * 3 + 1) * x - x / 2


def _build_elementwise(x: Tensor) -> Tensor:
    return (x * 3 + 1) * x - x / 2


def _reduce(n: int, device: str) -> tuple[Args, np.ndarray]:
    x = data((n, 256), n)
    return (_batch(x, device),), x.sum(axis=1) + (x * 2).max(axis=1)


def _build_reduce(x: Tensor) -> Tensor:
    return x.sum(axis=1) + (x * 2).max(axis=1)


def _attention(n: int, device: str) -> tuple[Args, np.ndarray]:
    """One decoding step's attention over the first n positions of a KV cache (n: the symbolic length)."""
    q = data((HEADS, 1, HEAD_DIM), n)
    s = q @ _CACHE_K[:, :n].transpose(0, 2, 1) / math.sqrt(HEAD_DIM)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ _CACHE_V[:, :n]
    return (Tensor(q, device=device), Variable("length", 1, 32).bind(n)), want


def _build_attention(q: Tensor, length: Variable) -> Tensor:
    cache = weights(q.device)
    keys, values = (cache[name].shrink((None, (0, length), None)) for name in ("keys", "values"))
    return ((q @ keys.transpose(1, 2)) * (1 / math.sqrt(HEAD_DIM))).softmax(-1) @ values


CASES: dict[str, tuple[Callable[[int, str], tuple[Args, np.ndarray]], Callable[..., Tensor], tuple[int, ...]]] = {
    "conv": (_conv, _build_conv, CONV_BATCHES),
    "matmul": (_matmul, _build_matmul, BATCHES),
    "sequence": (_sequence, _build_sequence, CONV_BATCHES),
    "elementwise": (_elementwise, _build_elementwise, BATCHES),
    "reduce": (_reduce, _build_reduce, BATCHES),
    "attention": (_attention, _build_attention, LENGTHS),
}


def run_case(case: str, device: str, renderer: Renderer, kernels: dict[LazyOp, tuple[Kernel, CompiledRunner]]) -> None:
    """Run the case's schedule at each value of its Variable, each symbolic kernel optimized for `renderer` once (in
    `kernels`, by AST) and checked bit for bit against the unoptimized kernel; the result against numpy."""
    make, build, values = CASES[case]
    for n in values:
        args, want = make(n, device)
        out = build(*args)
        for si in out.schedule():
            if si.ast.op is not BufferOps.STORE or not is_symbolic(si.ast):
                run_schedule([si])
                continue
            bufs = [b if b.is_allocated() else b.allocate() for b in si.bufs]
            if si.ast not in kernels:
                k = get_kernel(renderer, si.ast)
                kernels[si.ast] = (k, CompiledRunner(device, to_program(k)))
            reference = Buffer(device, bufs[0].size, bufs[0].dtype).allocate()
            CompiledRunner(device, to_program(Kernel(si.ast, renderer)))([reference, *bufs[1:]], si.var_vals)
            kernels[si.ast][1](bufs, si.var_vals)
            size = math.prod(sym_infer(s, si.var_vals) for s in si.outputs[0].shape)  # (the buffer has room for more)
            got, expected = bufs[0].numpy()[:size], reference.numpy()[:size]
            assert same(got, expected), f"{kernels[si.ast][0].applied_opts} at {n}: {np.abs(got - expected).max()}"
            for lb in si.outputs:
                lb.realized, lb.srcs = lb.buffer, ()
        np.testing.assert_allclose(read(out, want.shape), want, rtol=1e-4, atol=1e-5)


def vectorizable(k: Kernel) -> bool:
    """Whether the kernel is a reduce, or elementwise of ops the renderer has vectors for (else it is left scalar)."""
    alu = [x for x in k.ast.lazyops() if isinstance(x.op, (UnaryOps, BinaryOps, TernaryOps))]
    return bool(k.reduceops) or all(map(k._vector_op, alu))


def symbolic_sizes(k: Kernel) -> list[Node]:
    return [s for s in k.full_shape if not isinstance(s, int)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_kernels_are_optimized_along_their_integer_axes(case: str) -> None:
    kernels: dict[LazyOp, tuple[Kernel, CompiledRunner]] = {}
    run_case(case, "PYTHON", vector_cpu(), kernels)
    assert kernels, "the case has no kernel of a symbolic size"
    for k, runner in kernels.values():
        assert k.applied_opts or not vectorizable(k), f"{k.name} was left unoptimized"
        # the symbolic axis is still a loop of its own, never upcast, unrolled or split
        sizes = symbolic_sizes(k)
        assert sizes and all(s in k.full_shape[: k.first_upcast] for s in sizes)
        assert all(isinstance(s, int) for s in k.full_shape[k.first_upcast :])
    # (a MAX reduce's lanes stay scalars: the softmax's max over the cache upcasts the heads, without vectors)
    assert any(u.dtype is not None and u.dtype.count > 1 for _, runner in kernels.values() for u in runner.p.uops)


def _kernel_of(case: str, n: int, reduce_axis_symbolic: bool) -> Kernel:
    """The case's last kernel whose symbolic axis is a reduce axis (True) or a global one (False), optimized for the
    vector CPU renderer."""
    make, build, _ = CASES[case]
    for si in reversed(build(*make(n, "PYTHON")[0]).schedule()):
        if si.ast.op is BufferOps.STORE and is_symbolic(si.ast):
            k = get_kernel(vector_cpu(), si.ast)
            reduced = [a for a in range(k.shape_len) if k.is_reduce_axis(a) and not k.is_concrete(a)]
            if bool(reduced) == reduce_axis_symbolic:
                return k
    raise AssertionError(f"no kernel of {case} with a symbolic {'reduce' if reduce_axis_symbolic else 'global'} axis")


def test_a_symbolic_batch_keeps_the_tiles_of_its_integer_axes() -> None:
    """A conv with a dynamic batch tiles its output channels (vectors) and positions (rows) and unrolls its reduce as
    a concrete batch would: the batch is the outer loop of the same tiles (a concrete one may also be upcast for
    more accumulators)."""
    k = _kernel_of("conv", 3, reduce_axis_symbolic=False)
    concrete = get_kernel(vector_cpu(), _build_conv(Tensor(data((3, 2, 5, 5), 0))).schedule()[-1].ast)
    tiles = [o for o in k.applied_opts if o.op is OptOps.UPCAST]
    assert len(tiles) == 2 and tiles == [o for o in concrete.applied_opts if o.op is OptOps.UPCAST][:2]
    assert [o for o in k.applied_opts if o.op is OptOps.UNROLL] == [
        o for o in concrete.applied_opts if o.op is OptOps.UNROLL
    ]
    matmul = _kernel_of("matmul", 3, reduce_axis_symbolic=False)
    assert matmul.upcast_sizes[-1] in (8, 16) and any(o.op is OptOps.UNROLL for o in matmul.applied_opts)


def test_attention_over_a_symbolic_cache_length_vectorizes_its_head_dimension() -> None:
    """The weighted sum of the values over a cache of symbolic length (the reduce) takes vectors along the head
    dimension, and more of them along the heads (it cannot unroll its reduce); the scores, a contraction whose only
    reuse is along the symbolic length, sum each head's row in vector lanes instead of tiling."""
    k = _kernel_of("attention", 5, reduce_axis_symbolic=True)
    assert k.upcast_sizes == (4, 16) and not k.is_reduce_axis(k.shape_len - 1)
    assert not k.is_concrete(k.first_upcast - 1)  # the symbolic reduce is the (innermost) loop, not unrolled
    q = Tensor(data((HEADS, 1, 64), 0))
    keys = Tensor(data((HEADS, 32, 64), 1)).shrink((None, (0, Variable("length", 1, 32).bind(5)), None))
    scores = q @ keys.transpose(1, 2)
    k = get_kernel(vector_cpu(), scores.schedule()[-1].ast)
    assert k.reduce_lanes and k.applied_opts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_kernels_keep_results_on_every_device(device: str, case: str) -> None:
    kernels: dict[LazyOp, tuple[Kernel, CompiledRunner]] = {}
    run_case(case, device, Device[device].renderer, kernels)
    if Device[device].renderer.global_max is None and Device[device].renderer.vector_widths.get(dtypes.float32, 1) > 1:
        assert all(k.applied_opts for k, _ in kernels.values())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_jit_recording_serves_every_value(device: str, case: str) -> None:
    make, build, values = CASES[case]
    step = TinyJit(lambda *args: build(*args).realize())
    counts = set()
    for n in (*values, *values):
        args, want = make(n, device)
        GlobalCounters.reset()
        got = read(step(*args), want.shape)
        counts.add(GlobalCounters.kernel_count)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert step.cnt == 2 and len(counts) == 1  # one recording replays at every value


def test_a_symbolic_product_of_a_batch_and_a_length_tiles_the_length() -> None:
    """An axis of size batch * 16 (a sequence flattened into rows) is split into the batch (a loop) and 16 rows that
    the tile takes, as a concrete batch's rows would be."""
    k = _kernel_of("sequence", 3, reduce_axis_symbolic=False)
    assert [str(s) for s in symbolic_sizes(k)] == [str(Variable("batch", 1, 16))]
    rows = [o for o in k.applied_opts if o.op is OptOps.UPCAST][1]
    assert rows.amount in (8, 16) and k.upcast_sizes[-1] in (8, 16)


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_kernels_in_workgroups_keep_results(case: str) -> None:
    """GPU-style kernels: the integer axes become workgroups (and inputs go through shared memory) around a symbolic
    grid axis or reduce loop."""
    kernels: dict[LazyOp, tuple[Kernel, CompiledRunner]] = {}
    run_case(case, "PYTHON", WorkgroupRenderer(), kernels)
    opts = {o.op for k, _ in kernels.values() for o in k.applied_opts}
    if case in ("matmul", "sequence"):
        assert {OptOps.LOCAL, OptOps.STAGE} <= opts
    if case == "attention":
        assert OptOps.LOCAL in opts
    # (the conv's 5 x 5 positions and the row sum's batch hold no workgroup of two)


THREADED = [d for d in DEVICES if Device[d].renderer.threads]


@pytest.mark.skipif(not THREADED, reason="no device here splits a kernel's loop across threads")
@pytest.mark.parametrize("device", THREADED)
def test_a_symbolic_outer_loop_is_split_across_threads(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A big kernel whose outermost loop is a dynamic batch runs in parts of range(the batch's bound), each part its
    share of the batch at run time: every value, also below the number of threads, gets each row once."""
    monkeypatch.setenv("TGCORE_THREADS", "3")
    renderer = Device[device].renderer  # (LLVM's threads start at 4M units of work: this kernel has 442K elements)
    monkeypatch.setattr(renderer, "thread_min_work", min(renderer.thread_min_work, 1 << 16))
    step = TinyJit(lambda x: _build_elementwise(x).realize())
    for n in (16, 1, 5, 2, 16, 7, 1):
        x = data((n, 3, 96, 96), n)
        got = read(step(_batch(x, device)), x.shape)
        np.testing.assert_allclose(got, (x * 3 + 1) * x - x / 2, rtol=1e-6, atol=1e-6)
    programs = [ei.prg.p for ei in step.jit_cache if isinstance(ei.prg, CompiledRunner)]
    assert [p.thread_extent for p in programs] == [16]


def test_keys_joined_at_a_symbolic_position_keep_the_scores_kernel_to_its_lanes() -> None:
    """A decoder's keys are its cache up to start_pos and the new entry after it, joined: their masks have a symbolic
    bound, so every lane of them is a scalar load and a select. The scores kernel keeps the lane reduce's lanes and
    neither upcasts the heads nor unrolls further (4 x 4 x 16 lanes of selects took gcc 2 s to build), and its results
    stay right; the same scores over a plain cache (no symbolic mask) still take more lanes."""
    start = Variable("start_pos", 0, 31).bind(5)
    q = Tensor(data((HEADS, 1, 64), 0))
    cache, new = Tensor(data((HEADS, 32, 64), 1)), Tensor(data((HEADS, 1, 64), 2))
    keys = cache.shrink((None, (0, start), None)).cat(new, dim=1)
    k = get_kernel(vector_cpu(), (q @ keys.transpose(1, 2)).schedule()[-1].ast)
    assert k.reduce_lanes and math.prod(k.upcast_sizes) == k.reduce_lanes
    assert not any(o.op is OptOps.UNROLL for o in k.applied_opts)
    plain = cache.shrink((None, (0, Variable("length", 1, 32).bind(6)), None))
    k = get_kernel(vector_cpu(), (q @ plain.transpose(1, 2)).schedule()[-1].ast)
    assert math.prod(k.upcast_sizes) > k.reduce_lanes
    qn, cn, nn = data((HEADS, 1, 64), 0), data((HEADS, 32, 64), 1), data((HEADS, 1, 64), 2)
    want = qn @ np.concatenate([cn[:, :5], nn], axis=1).transpose(0, 2, 1)
    np.testing.assert_allclose(read(q @ keys.transpose(1, 2), want.shape), want, rtol=1e-5, atol=1e-5)
