"""The scheduler's fusion: how many kernels a graph becomes, and that fusing never changes the result."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tgcore import GlobalCounters, Tensor, dtypes
from tgcore.ops import BufferOps, LoadOps


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(np.float32)


def kernels(t: Tensor) -> tuple[np.ndarray, int]:
    """Realize `t` and return its value and how many kernels that ran."""
    GlobalCounters.reset()
    t.realize()
    count = GlobalCounters.kernel_count
    return t.numpy(), count


def store_items(t: Tensor) -> int:
    return sum(1 for si in t.schedule() if si.ast.op is BufferOps.STORE)


def test_five_elementwise_ops_are_one_kernel() -> None:
    a_np, b_np = data(3, 5), data(3, 5, seed=1)
    a, b = Tensor(a_np), Tensor(b_np)
    out = ((a + b) * 2.0 - a).relu().sqrt()
    assert len(out.schedule()) == 1
    got, n = kernels(out)
    assert n == 1
    np.testing.assert_allclose(got, np.sqrt(np.maximum((a_np + b_np) * 2 - a_np, 0)), rtol=1e-6)


def test_elementwise_chain_through_views_is_one_kernel() -> None:
    a_np = data(4, 6)
    a = Tensor(a_np)
    out = ((a * 3).permute(1, 0).reshape(2, 12) + 1).exp().flip(0)
    got, n = kernels(out)
    assert n == 1
    np.testing.assert_allclose(got, np.exp((a_np * 3).T.reshape(2, 12) + 1)[::-1], rtol=1e-5)


def test_elementwise_into_reduce_is_one_kernel() -> None:
    a_np, b_np = data(5, 7), data(5, 7, seed=1)
    a, b = Tensor(a_np), Tensor(b_np)
    out = (a * b + 1).exp().sum(axis=1, keepdim=True)
    assert len(out.schedule()) == 1
    got, n = kernels(out)
    assert n == 1
    np.testing.assert_allclose(got, np.exp(a_np * b_np + 1).sum(axis=1, keepdims=True), rtol=1e-5)


def test_full_reduce_of_elementwise_is_one_kernel() -> None:
    a_np = data(3, 4, 5)
    out = (Tensor(a_np) * 2).max(axis=(0, 2), keepdim=True)
    got, n = kernels(out)
    assert n == 1
    np.testing.assert_allclose(got, (a_np * 2).max(axis=(0, 2), keepdims=True))


def test_reduce_read_through_expand_is_two_kernels() -> None:
    a_np = data(4, 6)
    a = Tensor(a_np)
    out = a - a.sum(axis=1, keepdim=True)
    assert len(out.schedule()) == 2
    got, n = kernels(out)
    assert n == 2
    np.testing.assert_allclose(got, a_np - a_np.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_reduce_then_elementwise_same_shape_is_one_kernel() -> None:
    a_np = np.abs(data(4, 6))
    out = (Tensor(a_np).sum(axis=1, keepdim=True) * 2 + 1).sqrt()
    got, n = kernels(out)
    assert n == 1
    np.testing.assert_allclose(got, np.sqrt(a_np.sum(axis=1, keepdims=True) * 2 + 1), rtol=1e-5)


def test_two_reduces_of_one_input() -> None:
    a_np = data(3, 8)
    a = Tensor(a_np)
    out = a.softmax(-1)
    got, n = kernels(out)
    assert n <= 3
    e = np.exp(a_np - a_np.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_realized_inputs_are_not_recomputed() -> None:
    a_np = data(3, 4)
    a = Tensor(a_np)
    mid = (a * 2 + 1).exp()
    _, n1 = kernels(mid)
    assert n1 == 1 and mid.lazydata.is_realized
    assert mid.schedule() == []
    out = mid - 3
    assert len(out.schedule()) == 1
    got, n2 = kernels(out)
    assert n2 == 1
    np.testing.assert_allclose(got, np.exp(a_np * 2 + 1) - 3, rtol=1e-5)
    GlobalCounters.reset()
    mid.realize()
    out.realize()
    np.testing.assert_allclose(mid.numpy(), np.exp(a_np * 2 + 1), rtol=1e-5)
    assert GlobalCounters.kernel_count == 0


def test_from_numpy_needs_no_kernel() -> None:
    t = Tensor(data(2, 3))
    assert t.schedule() == []
    _, n = kernels(t)
    assert n == 0


def test_shared_subexpression_two_outputs() -> None:
    a_np = data(6)
    a = Tensor(a_np)
    shared = a.exp()
    x, y = shared + 1, shared * 2
    GlobalCounters.reset()
    x.realize(y)
    assert GlobalCounters.kernel_count <= 3
    np.testing.assert_allclose(x.numpy(), np.exp(a_np) + 1, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), np.exp(a_np) * 2, rtol=1e-6)


def test_contiguous_makes_a_kernel_boundary() -> None:
    a_np = data(3, 4)
    out = (Tensor(a_np) + 1).contiguous() * 2
    items = out.schedule()
    assert len(items) == 2 and all(si.ast.op is BufferOps.STORE for si in items)
    got, n = kernels(out)
    assert n == 2
    np.testing.assert_allclose(got, (a_np + 1) * 2, rtol=1e-6)


# ***** pad: the padding is zero whatever op was fused under it *****


@pytest.mark.parametrize(
    "fn,np_fn",
    [
        (lambda t: t.exp(), np.exp),
        (lambda t: t.log(), lambda x: np.log(x)),
        (lambda t: 1.0 / t, lambda x: 1.0 / x),
        (lambda t: t + 1, lambda x: x + 1),
        (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
        (lambda t: (t == t).cast(dtypes.float32), lambda x: np.ones_like(x)),
        (lambda t: t.cos(), np.cos),
    ],
    ids=["exp", "log", "reciprocal", "add1", "sigmoid", "eq", "cos"],
)
def test_pad_of_unsafe_op_is_zero(fn, np_fn) -> None:
    a_np = np.abs(data(3, 4)) + 0.5
    out = fn(Tensor(a_np)).pad(((1, 2), (2, 0)))
    expect = np.pad(np_fn(a_np), ((1, 2), (2, 0)))
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-5, atol=1e-6)


def test_pad_of_exp_fused_further() -> None:
    a_np = data(5)
    out = Tensor(a_np).exp().pad(((2, 1),)) + 1
    np.testing.assert_allclose(out.numpy(), np.pad(np.exp(a_np), (2, 1)) + 1, rtol=1e-6)
    out2 = Tensor(a_np).exp().pad(((1, 1),)).sum()
    np.testing.assert_allclose(out2.numpy(), np.exp(a_np).sum(), rtol=1e-5)


def test_pad_of_const_exp() -> None:
    out = Tensor.zeros(3).exp().pad(((1, 1),))
    np.testing.assert_array_equal(out.numpy(), [0, 1, 1, 1, 0])
    out2 = Tensor.full((2,), 2.0).log().pad(((0, 2),))
    np.testing.assert_allclose(out2.numpy(), [np.log(2), np.log(2), 0, 0], rtol=1e-6)


def test_pad_of_safe_op_stays_fused() -> None:
    a_np = data(3, 3)
    out = (Tensor(a_np) * 2 - 1).pad(((1, 1), (1, 1)))
    got, n = kernels(out)
    assert n == 1
    np.testing.assert_allclose(got, np.pad(a_np * 2 - 1, 1), rtol=1e-6)


def test_pad_of_exp_result_correct_count() -> None:
    a_np = data(4)
    out = Tensor(a_np).exp().pad(((1, 1),))
    got, n = kernels(out)
    assert 1 <= n <= 2
    np.testing.assert_allclose(got, np.pad(np.exp(a_np), 1), rtol=1e-6)


def test_schedule_items_are_kernels_or_loadops() -> None:
    a = Tensor(data(2, 2))
    for si in (a.exp().sum() + Tensor.empty(1).reshape(())).schedule():
        assert si.ast.op is BufferOps.STORE or si.ast.op in LoadOps


def test_contiguous_of_a_view_is_a_kernel() -> None:
    a_np = data(3, 4)
    out = (Tensor(a_np) + 1).permute(1, 0).contiguous() * 2
    got, n = kernels(out)
    assert n == 2
    np.testing.assert_allclose(got, (a_np + 1).T * 2, rtol=1e-6)


def test_broadcast_operand_of_a_reduce_is_realized_once() -> None:
    # a matmul reads each operand through an expand: an elementwise operand (here a ReLU) is one kernel of its own
    # instead of being recomputed for every output column
    a_np, w_np = data(6, 5), data(5, 4, seed=1)
    a, w = Tensor(a_np), Tensor(w_np)
    out = (a + 1).relu() @ w
    got, n = kernels(out)
    assert n == 2
    np.testing.assert_allclose(got, np.maximum(a_np + 1, 0) @ w_np, rtol=1e-5, atol=1e-6)
    # the same elementwise op read without a broadcast still joins the reduce
    got, n = kernels(((a + 1).relu() * a).sum(axis=1))
    assert n == 1
    np.testing.assert_allclose(got, (np.maximum(a_np + 1, 0) * a_np).sum(axis=1), rtol=1e-5, atol=1e-6)
    # and a broadcast into an elementwise kernel (no reduce) stays fused
    got, n = kernels((a + 1).relu()[:, :1] * w[:1, :])
    assert n == 1
    np.testing.assert_allclose(got, np.maximum(a_np + 1, 0)[:, :1] * w_np[:1, :], rtol=1e-6)


def test_an_epilogue_a_pool_reads_in_windows_joins_the_reduce_before_it() -> None:
    # relu(x @ w + b) read by a max pool's overlapping windows (padded with -inf): the bias and ReLU run once per
    # element, in the matmul's kernel, and the pool's kernel reads that one buffer; before, the pool recomputed them for
    # every window and read the matmul's raw output and the bias
    x_np, w_np, b_np = data(2, 6, 5), data(5, 8, seed=1), data(8, seed=2)
    x, w, b = Tensor(x_np), Tensor(w_np), Tensor(b_np)
    h = (x @ w + b).relu()
    pooled = h.reshape(2, 1, 6, 8).pad2d((1, 1, 1, 1), value=float("-inf")).max_pool2d(3, 2)
    schedule = [si for si in pooled.schedule() if si.ast.op is BufferOps.STORE]
    assert len(schedule) == 2
    assert len([b for b in schedule[-1].bufs if b is not None]) == 2  # the pool's output and the epilogue's
    got, n = kernels(pooled)
    assert n == 2
    hp = np.pad(np.maximum(x_np @ w_np + b_np, 0), ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.lib.stride_tricks.sliding_window_view(hp, (3, 3), axis=(1, 2))[:, ::2, ::2].max(axis=(-2, -1))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    # an epilogue read unmoved (a sum along its rows) still joins the reduce that reads it
    got, n = kernels((x @ w + b).relu().sum(axis=2))
    assert n == 2
    np.testing.assert_allclose(got, np.maximum(x_np @ w_np + b_np, 0).sum(axis=2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1 << 15, 33333, 40000])
def test_big_full_reduce_runs_in_two_stages(n: int) -> None:
    # a reduce of everything is split (parallel partial results, then their reduce); sizes that no block divides
    # are padded with zeros for a sum, and a max keeps NaN and the exact extreme
    a_np = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    a = Tensor(a_np)
    got, k = kernels(a.sum())
    assert k == 2
    assert abs(float(got) - a_np.astype(np.float64).sum()) <= 1e-6 * np.abs(a_np).sum()
    got, _ = kernels((a.exp() - 1).sum())  # exp(0) - 1 is 0, but exp is not pad-safe: still exact padding
    ref = (np.exp(a_np.astype(np.float64)) - 1).sum()
    assert abs(float(got) - ref) <= 1e-6 * np.abs(np.exp(a_np.astype(np.float64)) - 1).sum()
    assert a.max().numpy() == a_np.max() and a.min().numpy() == a_np.min()
    with_nan = a_np.copy()
    with_nan[n // 3] = np.nan
    assert np.isnan(Tensor(with_nan).max().numpy())
    ints = np.random.default_rng(1).integers(-(2**31), 2**31 - 1, n, dtype=np.int64).astype(np.int32)
    assert Tensor(ints).sum().numpy() == ints.sum(dtype=np.int32)  # wraps like numpy's int32 sum (exact)


# ***** the schedule cache's flat-graph key and the cached constant operands *****


def _generic_graph_key(bases: list) -> object:
    """_graph_key through the generic walk alone."""
    from tgcore.engine import schedule

    flat = schedule._flat_graph_key
    schedule._flat_graph_key = lambda b: schedule._NOT_FLAT
    try:
        return schedule._graph_key(bases)
    finally:
        schedule._flat_graph_key = flat


def test_flat_graph_key_is_the_generic_key() -> None:
    from tgcore.engine import schedule

    x = Tensor(data(16)).realize()
    y = Tensor(data(4, 4, seed=1)).realize()
    graphs = [
        x + 1,
        x * x,
        x + x.reshape(4, 4).permute(1, 0).reshape(16),
        x.reshape(4, 4) + y,
        x + (-0.0),
        x + 0.0,
        x < 3,
        x.cast(dtypes.int32),
        Tensor(3.0) + 1,
        Tensor(2.0),
        y.T + 1,
        (x + 1) * 2,  # not flat: an unrealized elementwise source
        y.sum(1),
    ]
    for t in graphs:
        bases = [t.lazydata.base]
        flat, generic = schedule._graph_key(bases), _generic_graph_key(bases)
        assert (flat is None) == (generic is None)
        if flat is not None:
            assert flat[0] == generic[0] and flat[1] == generic[1] and flat[2] == generic[2]


def test_schedule_cache_hit_on_another_flat_graph_gives_its_numbers() -> None:
    a_np, b_np = data(16), data(16, seed=1)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    for _ in range(3):  # the later rounds come from the cache
        np.testing.assert_allclose((a + 1).numpy(), a_np + 1, rtol=1e-6)
        np.testing.assert_allclose((b + 1).numpy(), b_np + 1, rtol=1e-6)
        np.testing.assert_allclose((a + 2).numpy(), a_np + 2, rtol=1e-6)
        np.testing.assert_allclose((a + b).numpy(), a_np + b_np, rtol=1e-6)
        np.testing.assert_allclose((b + a).numpy(), b_np + a_np, rtol=1e-6)
        np.testing.assert_allclose((a - b).numpy(), a_np - b_np, rtol=1e-6)
        np.testing.assert_allclose((b - a).numpy(), b_np - a_np, rtol=1e-6)
        np.testing.assert_allclose((a * a).numpy(), a_np * a_np, rtol=1e-6)
        np.testing.assert_allclose((a + a.flip(0)).numpy(), a_np + a_np[::-1], rtol=1e-6)
        np.testing.assert_allclose((a.flip(0) + 1).numpy(), a_np[::-1] + 1, rtol=1e-6)
        assert (a + 1).cast(dtypes.int32).numpy().tolist() == (a_np + 1).astype(np.int32).tolist()
        assert (a < 0.5).numpy().tolist() == (a_np < 0.5).tolist()


def test_a_loop_of_ops_gives_its_numbers_and_frees_its_buffers() -> None:
    x = Tensor(np.zeros(16, dtype=np.float32)).realize()
    x = (x + 1).realize()
    gc.collect()  # what earlier tests left in reference cycles
    used = GlobalCounters.mem_used
    for _ in range(200):
        x = (x + 1).realize()
    gc.collect()
    assert GlobalCounters.mem_used == used  # each op's old buffer is freed when its tensor goes
    assert x.numpy().tolist() == [201.0] * 16


def test_cached_constants_tell_apart_values_types_and_dtypes() -> None:
    f = Tensor(np.array([1.5, -2.0, 0.0], dtype=np.float32)).realize()
    i = Tensor(np.array([3, -4, 0], dtype=np.int32)).realize()
    b = Tensor(np.array([True, False, True])).realize()
    for _ in range(2):
        assert np.signbit((f * 0.0).numpy()).tolist() == [False, True, False]
        assert np.signbit((f * -0.0).numpy()).tolist() == [True, False, True]
        assert (i + 1).numpy().tolist() == [4, -3, 1]
        assert (i + True).numpy().tolist() == [4, -3, 1]
        assert (b + True).numpy().tolist() == [True, True, True]
        assert (b * False).numpy().tolist() == [False, False, False]
        assert (f + 1).numpy().tolist() == [2.5, -1.0, 1.0]
        assert (i * 2.5).numpy().tolist() == [7.5, -10.0, 0.0]
        assert np.isnan((f + float("nan")).numpy()).all()
        assert (f.reshape(3, 1) + 1).numpy().tolist() == [[2.5], [-1.0], [1.0]]
        assert (f.cast(dtypes.float16) + 0.1).numpy().tolist() == (
            np.array([1.5, -2.0, 0.0], np.float16) + np.float16(0.1)
        ).tolist()


def test_a_cached_constant_realized_by_someone_is_not_handed_out_again() -> None:
    x = Tensor(data(4)).realize()
    const = x.lazydata.const(7.0)
    assert x.lazydata.const(7.0) is const  # one node for the same constant at the same shape
    Tensor(const).realize()  # its base gets a buffer of its own
    again = x.lazydata.const(7.0)
    assert again is not const and again.base.realized is None
    assert Tensor(const).numpy().tolist() == [7.0] * 4
    np.testing.assert_allclose((x + 7.0).numpy(), x.numpy() + 7.0, rtol=1e-6)


def _adam_run(steps: int, clear_cache: bool) -> tuple[list[np.ndarray], list[int]]:
    """The weights after `steps` plain Adam steps of a small MLP, and the schedule cache's size after each step."""
    from tgcore.engine import schedule
    from tgcore.nn import Linear
    from tgcore.nn.optim import Adam

    rng = np.random.default_rng(3)
    layers = [Linear(6, 5), Linear(5, 3)]
    for layer in layers:
        layer.weight = Tensor(rng.standard_normal(layer.weight.shape).astype(np.float32))
        layer.bias = Tensor(rng.standard_normal(layer.bias.shape).astype(np.float32))
    opt = Adam([t for layer in layers for t in (layer.weight, layer.bias)], lr=0.05)
    x, y = Tensor(rng.standard_normal((4, 6)).astype(np.float32)), Tensor(np.array([0, 2, 1, 2], np.int32))
    before, sizes = Tensor.training, []
    Tensor.training = True
    try:
        for _ in range(steps):
            if clear_cache:
                schedule._schedule_cache.clear()
            opt.zero_grad()
            loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            Tensor.realize(loss, *opt.schedule_step())
            sizes.append(len(schedule._schedule_cache))
    finally:
        Tensor.training = before
    return [t.numpy() for layer in layers for t in (layer.weight, layer.bias)], sizes


def test_a_training_step_with_assigns_is_scheduled_once_and_keeps_its_numbers() -> None:
    fresh, _ = _adam_run(6, clear_cache=True)
    cached, sizes = _adam_run(6, clear_cache=False)
    assert sizes[-1] == sizes[-2] == sizes[-3]  # the later steps find their schedule in the cache
    for a, b in zip(fresh, cached):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(fresh[0], _adam_run(1, clear_cache=True)[0][0])  # the steps did move the weights


def test_schedule_cache_keeps_apart_an_assign_that_reads_its_target_through_another_tensor() -> None:
    # `old` is a second realized tensor on a's memory: the assign's kernel reads it through its own output. The same
    # graph over a tensor on other memory must not get that kernel from the cache (it would read the wrong buffer)
    a = Tensor(np.array([1.0, 2.0, 3.0], np.float32)).realize()
    old = Tensor(a.lazydata)
    a.assign(a + 1).realize()  # a's lazydata is now the assign, realized in old's memory
    assert a.lazydata.base is not old.lazydata.base and a.lazydata.base.buffer is old.lazydata.base.buffer
    a.assign(old * 2 + a).realize()
    np.testing.assert_array_equal(a.numpy(), [6.0, 9.0, 12.0])
    c = Tensor(np.array([1.0, 2.0, 3.0], np.float32)).realize()
    c.assign(c + 1).realize()
    d = Tensor(np.array([10.0, 20.0, 30.0], np.float32)).realize()
    c.assign(d * 2 + c).realize()
    np.testing.assert_array_equal(c.numpy(), [22.0, 43.0, 64.0])


def _residual_stack(layers: int, x_np: np.ndarray, ws: list[np.ndarray]) -> tuple[Tensor, np.ndarray]:
    """x + f(layernorm(x)), `layers` times: a transformer's residual stream, in tgcore and in numpy."""
    x, ref = Tensor(x_np), x_np.astype(np.float64)
    for w in ws[:layers]:
        x = x + (x.layernorm() @ Tensor(w)).relu()
        centred = ref - ref.mean(-1, keepdims=True)
        ref = ref + np.maximum((centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)) @ w, 0)
    return x, ref


def test_a_residual_stream_read_by_a_reduce_is_realized_so_every_layer_has_the_same_kernels() -> None:
    # inlined, layer n's LayerNorm would read n + 1 buffers (a kernel of its own to compile for every layer)
    x_np, ws = data(4, 32), [data(32, 32, seed=i + 1) / 4 for i in range(8)]
    distinct = []
    for layers in (4, 8):
        out, ref = _residual_stack(layers, x_np, ws)
        asts = [si.ast for si in out.schedule()]
        distinct.append(len(set(asts)))
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)
    assert distinct[0] == distinct[1]  # the same few kernels whatever the depth
    # a small expression read by a reduce and another kernel stays inlined: the softmax of a scaled input is as
    # many kernels as the softmax of a buffer
    scaled = Tensor(data(4, 32)) * 0.5
    assert len(scaled.softmax(-1).schedule()) == len(Tensor(data(4, 32)).realize().softmax(-1).schedule())
    value, _ = kernels(scaled.softmax(-1))
    e = np.exp(data(4, 32) * 0.5 - (data(4, 32) * 0.5).max(-1, keepdims=True))
    np.testing.assert_allclose(value, e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_a_realized_graph_frees_its_buffers_without_the_garbage_collector() -> None:
    """Scheduling leaves no reference cycle: the buffers of a graph are freed as soon as its tensors are dropped, not
    when the garbage collector next runs (a cycle through the schedule once held every buffer of every new graph)."""
    gc.collect()
    gc.disable()
    try:
        before = GlobalCounters.mem_used
        x = Tensor(np.arange(1237, dtype=np.float32))
        a = (x + 1).contiguous()
        b = (a * 2 + x).contiguous()
        out = (b.sum() + a.max()).realize()
        assert out.item() == float(np.sum((np.arange(1237) + 1) * 2 + np.arange(1237)) + 1237)
        assert GlobalCounters.mem_used > before
        del x, a, b, out
        assert GlobalCounters.mem_used == before
    finally:
        gc.enable()


def test_scheduling_and_compiling_new_kernels_leave_nothing_to_the_garbage_collector() -> None:
    """No reference cycles per schedule or compile (recursive closures were: each held its ASTs, uops or buffers
    until the collector ran)."""
    x = Tensor(np.arange(1531, dtype=np.float32)).realize()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        out = ((x * 3 + 1).sum() + (x - 2).max()).realize()
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert out.item() == float(np.sum(np.arange(1531) * 3 + 1) + 1528)
    assert left == []
