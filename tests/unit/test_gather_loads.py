"""Embedding lookups, gather and integer-tensor indexing are loads at the index (IndexOps.GATHER), not one-hot
reductions over the indexed axis: results against numpy, gradients against numpy's scatter-add, the checks of the
index values, and work that does not grow with the table (PYTHON, and CLANG / LLVM where they are installed)."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Context, Device, GlobalCounters, Tensor, dtypes
from tgcore.codegen.kernel import Kernel
from tgcore.codegen.linearizer import Linearizer
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOps
from tgcore.device import Buffer
from tgcore.engine.runner import CompiledRunner
from tgcore.engine.schedule import create_schedule
from tgcore.errors import IndexOutOfRangeError
from tgcore.nn import Embedding
from tgcore.ops import BufferOps, GatherBuffer, IndexOps, ReduceOps, TernaryOps
from tgcore.runtime.python import PythonRenderer

DEVICES = ["PYTHON"] + [d for d in ("CLANG", "LLVM") if Device.status(d) is None]
INDEX_DTYPES = [np.int32, np.int64, np.int8, np.uint8, np.int16]


def _embedding(vocab: int, dim: int, device: str = "PYTHON", dtype: type = np.float32) -> tuple[Embedding, np.ndarray]:
    w = np.random.default_rng(vocab).standard_normal((vocab, dim)).astype(dtype)
    emb = Embedding(vocab, dim)
    emb.weight = Tensor(w, device=device)
    return emb, w


def _kernels(t: Tensor) -> list:
    """The kernels (ScheduleItems with a STORE) that realize `t`."""
    return [si for si in create_schedule([t.lazydata]) if si.ast.op is BufferOps.STORE]


def _gather_loads(si) -> list:
    return [n for n in si.ast.lazyops() if n.op is BufferOps.LOAD and isinstance(n.arg, GatherBuffer)]


# ***** results against numpy *****


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 3, 4), (1,)])
def test_embedding_matches_numpy(device: str, shape: tuple[int, ...]) -> None:
    emb, w = _embedding(37, 12, device)
    idx = np.random.default_rng(1).integers(0, 37, shape).astype(np.int32)
    out = emb(Tensor(idx, device=device))
    assert out.shape == (*shape, 12)
    np.testing.assert_array_equal(out.numpy(), w[idx])


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_embedding_index_dtypes(index_dtype: type) -> None:
    emb, w = _embedding(100, 8)
    idx = np.array([[0, 99, 5], [42, 42, 1]], dtype=index_dtype)
    np.testing.assert_array_equal(emb(Tensor(idx)).numpy(), w[idx])


def test_embedding_big_uint8_table_needs_no_upper_clamp() -> None:
    emb, w = _embedding(300, 4)  # every uint8 value is a row: nothing to clamp above
    idx = np.array([0, 255, 17], dtype=np.uint8)
    np.testing.assert_array_equal(emb(Tensor(idx)).numpy(), w[idx])


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.float64])
def test_embedding_table_dtypes(dtype: type) -> None:
    emb, w = _embedding(20, 5, dtype=dtype)
    idx = np.array([3, 19, 0, 3])
    out = emb(Tensor(idx))
    assert out.dtype == dtypes.from_np(np.dtype(dtype))
    np.testing.assert_array_equal(out.numpy(), w[idx])


def test_embedding_of_a_computed_table_and_index() -> None:
    emb, w = _embedding(16, 6)
    emb.weight = emb.weight * 2 + 1  # not realized: its kernel runs first
    idx = Tensor([1, 2, 3]) * 5  # computed in the lookup's own kernel
    np.testing.assert_allclose(emb(idx).numpy(), (w * 2 + 1)[[5, 10, 15]], rtol=1e-6)


def test_embedding_empty_index() -> None:
    emb, _ = _embedding(10, 3)
    out = emb(Tensor(np.zeros((0, 4), np.int32)))
    assert out.shape == (0, 4, 3) and out.numpy().shape == (0, 4, 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("shape", "dim", "index_shape"),
    [
        ((5, 4), 0, (3, 4)),
        ((5, 4), 1, (5, 7)),
        ((5, 4), -1, (2, 3)),  # smaller than the input on the other axis: numpy's take_along_axis of a slice
        ((3, 4, 6), 1, (3, 2, 6)),
        ((3, 4, 6), 2, (2, 4, 1)),
        ((7,), 0, (10,)),
    ],
)
def test_gather_matches_numpy(device: str, shape: tuple, dim: int, index_shape: tuple) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal(shape).astype(np.float32)
    d = dim % len(shape)
    idx = rng.integers(-shape[d], shape[d], index_shape)
    sliced = a[tuple(slice(0, n) if ax != d else slice(None) for ax, n in enumerate(index_shape))]
    want = np.take_along_axis(sliced, np.where(idx < 0, idx + shape[d], idx), d)
    np.testing.assert_array_equal(Tensor(a, device=device).gather(dim, Tensor(idx, device=device)).numpy(), want)


def test_gather_of_a_view() -> None:
    a = np.arange(60, dtype=np.float32).reshape(5, 12)
    t = Tensor(a)
    idx = np.array([[2, 0], [1, 1], [0, 2]])
    view = t[1:4, ::-4]  # shrunk, flipped and strided: the table is read through that view, no copy
    np.testing.assert_array_equal(view.gather(1, Tensor(idx)).numpy(), np.take_along_axis(a[1:4, ::-4], idx, 1))
    padded = t.pad(((1, 0), (0, 2)))  # a masked view: copied first, then gathered
    want = np.take_along_axis(np.pad(a, ((1, 0), (0, 2)))[:3], np.array([[13], [0], [5]]), 1)
    np.testing.assert_array_equal(padded[:3].gather(1, Tensor([[13], [0], [5]])).numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_getitem_with_tensor_indices_matches_numpy(device: str) -> None:
    a = np.arange(3 * 5 * 6, dtype=np.float32).reshape(3, 5, 6)
    t = Tensor(a, device=device)
    i = np.array([[4, -1], [0, 2]])
    j = np.array([5, 0])
    k = np.array([2, -3, 1])
    for index in [
        (k,),
        (k[:2, None], i),  # two tensors broadcast to 2-d
        (slice(None), i),
        (slice(None), slice(None), j),
        (0, i),
        (slice(None), i, j),  # two tensors, adjacent, broadcast together
        (k[:2], slice(None), j),  # not adjacent: the index axes go first
        (Ellipsis, np.array([1, 3])),
    ]:
        ours = tuple(Tensor(x, device=device) if isinstance(x, np.ndarray) else x for x in index)
        np.testing.assert_array_equal(t[ours].numpy(), a[index], err_msg=str(index))


@pytest.mark.parametrize(
    "index",
    [(np.array([2, 0, 2]),), (slice(None), np.array([[4, 1]])), (1, slice(None), np.array([3, 0])),
     (np.array([1, 0]), slice(None), np.array([5, 5])), (slice(None), np.array([4, 0]), np.array([[5], [1]]))],
)
def test_getitem_result_is_the_lookup_s_own_layout(index: tuple) -> None:
    # the lookups run in the result's axis order: the gather's kernel writes the result as it is laid out (whole
    # rows of the table in vectors, for table[ids]), not a buffer that a permuted view then reads
    a = np.arange(3 * 5 * 6, dtype=np.float32).reshape(6, 5, 3).transpose(2, 1, 0).copy()  # (3, 5, 6)
    ours = tuple(Tensor(x.astype(np.int32)) if isinstance(x, np.ndarray) else x for x in index)
    with Context(CHECK_DATA=0):
        out = Tensor(a)[ours]
    lb = out.lazydata
    assert lb.base.op is IndexOps.GATHER and lb.st.contiguous and lb.size == lb.base.size, lb
    np.testing.assert_array_equal(out.numpy(), a[index])


@pytest.mark.parametrize("lookup", ["embedding", "getitem"])
def test_a_lookup_of_whole_rows_loads_each_vector_once(lookup: str) -> None:
    # a group of lanes that shares one index and reads consecutive elements is one vector load, gated by whether the
    # index was in range (zeros where not: CHECK_DATA=0), not a select per lane; the index's own ops (getitem wraps a
    # negative index: an int compare and select) run once per row and do not keep the row's copy scalar. Run by the
    # PYTHON interpreter with a CPU's 8-lane float32 vectors
    renderer = PythonRenderer()
    renderer.global_max, renderer.vector_widths = None, {**renderer.vector_widths, dtypes.float32: 8}
    emb, w = _embedding(40, 32)
    ids = np.array([[3, 39], [41, -2]], np.int32)
    idx = Tensor(ids).realize()
    with Context(CHECK_DATA=0):
        (kernel,) = _kernels(emb(idx) if lookup == "embedding" else emb.weight[idx])
    k = Kernel(kernel.ast, renderer)
    k.hand_coded_optimizations()
    program = to_program(k)
    gathered = [u for u in program.uops if u.op is UOps.LOAD and u.dtype is not None and u.dtype.count > 1]
    assert gathered and all(len(u.src) == 4 for u in gathered), [(u.dtype, len(u.src)) for u in gathered]
    # (the index's clamp selects ints; no float lane is selected)
    assert not any(u.op is UOps.ALU and u.arg is TernaryOps.WHERE and u.dtype == dtypes.float32 for u in program.uops)
    out = Buffer("PYTHON", 2 * 2 * 32, dtypes.float32).allocate()
    CompiledRunner("PYTHON", program)([out] + [x.base.buffer for x in kernel.inputs], {})
    # (an embedding's -2 is out of range; getitem wraps it to row 38)
    want = np.stack([w[[3, 39]], np.zeros((2, 32), np.float32) if lookup == "embedding" else [np.zeros(32), w[38]]])
    np.testing.assert_array_equal(out.numpy().reshape(2, 2, 32), want)


@pytest.mark.parametrize("index_dtype", [np.int64, np.int16])
def test_getitem_index_dtypes(index_dtype: type) -> None:
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([3, -4, 1], dtype=index_dtype)
    np.testing.assert_array_equal(Tensor(a)[Tensor(idx)].numpy(), a[idx])


def test_narrow_and_unsigned_indices_are_wrapped_and_checked_exactly() -> None:
    a = np.arange(300, dtype=np.float32)
    t = Tensor(a)
    # int8 -1 wraps to 299 (not in int8), uint8 bounds are not compared where the dtype cannot reach them
    np.testing.assert_array_equal(t[Tensor(np.array([-1, 127, -128], np.int8))].numpy(), a[[-1, 127, -128]])
    np.testing.assert_array_equal(t[Tensor(np.array([0, 255], np.uint8))].numpy(), a[[0, 255]])
    np.testing.assert_array_equal(t[:4][Tensor(np.array([3, 1], np.uint8))].numpy(), a[[3, 1]])
    with pytest.raises(IndexOutOfRangeError):
        t[:4][Tensor(np.array([4], np.uint8))].numpy()
    two = Tensor(a.reshape(1, 300))
    np.testing.assert_array_equal(two.gather(1, Tensor(np.array([[-2, 5]], np.int8))).numpy(), [[298, 5]])
    emb, w = _embedding(300, 2)
    np.testing.assert_array_equal(emb(Tensor(np.array([255, 0], np.uint8))).numpy(), w[[255, 0]])
    with pytest.raises(IndexOutOfRangeError):
        emb(Tensor(np.array([-1], np.int8))).numpy()


def test_getitem_of_ints_and_bools_tables() -> None:
    a = np.arange(10, dtype=np.int64) * 3
    np.testing.assert_array_equal(Tensor(a)[Tensor([9, 0, 4])].numpy(), a[[9, 0, 4]])
    b = np.array([True, False, True])
    np.testing.assert_array_equal(Tensor(b)[Tensor([1, 2, 1])].numpy(), b[[1, 2, 1]])


def test_getitem_of_a_constant_table() -> None:
    np.testing.assert_array_equal(Tensor.full((5, 2), 7.0)[Tensor([4, 0])].numpy(), np.full((2, 2), 7.0))


# ***** out of range: raised, and never read outside the buffer *****


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_raises(device: str) -> None:
    emb, _ = _embedding(10, 3, device)
    for bad in ([10], [-1], [3, 11]):
        out = emb(Tensor(bad, device=device))
        with pytest.raises(IndexOutOfRangeError, match="Embedding index out of range for 10 rows"):
            out.numpy()
        assert out.lazydata.base.realized is None  # the lookup did not run
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    with pytest.raises(IndexOutOfRangeError, match="gather index out of bounds for axis 1 with size 3"):
        t.gather(1, Tensor([[0], [3]], device=device)).numpy()
    with pytest.raises(IndexOutOfRangeError, match="axis 0 with size 2"):
        t[Tensor([0, -3], device=device)].numpy()
    with pytest.raises(IndexOutOfRangeError, match="axis 1 with size 3"):
        t[:, Tensor([[5]], device=device)].numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_unchecked_out_of_range_reads_zeros_inside_the_buffer(device: str) -> None:
    # no check ran: the load's address is clamped into the table, and what it reads is replaced by 0
    emb, w = _embedding(10, 32, device)
    idx = np.array([10, -1, 3, 2**31 - 1, -(2**31)], np.int32)
    with Context(CHECK_DATA=0):
        out = emb(Tensor(idx, device=device)).numpy()
        four = Tensor(np.arange(4, dtype=np.float32), device=device)
        col = four[Tensor(np.array([7, 1, -9], np.int64), device=device)]
        np.testing.assert_array_equal(col.numpy(), [0.0, 1.0, 0.0])
    want = np.zeros((5, 32), np.float32)
    want[2] = w[3]
    np.testing.assert_array_equal(out, want)


def test_lazy_gather_rejects_bad_arguments() -> None:
    table, index = Tensor.ones(4, 3).lazydata, Tensor([[1, 2]]).lazydata
    with pytest.raises(ValueError, match="shape"):
        table.gather(index, 0)
    with pytest.raises(TypeError, match="integer"):
        table.gather(Tensor.ones(2, 3).lazydata, 0)
    with pytest.raises(IndexError, match="size 0"):
        Tensor.ones(0, 3).lazydata.gather(Tensor([[1, 2, 0]]).lazydata, 0)


# ***** gradients *****


def test_embedding_gradient_is_the_scatter_add_of_the_output_gradient() -> None:
    emb, w = _embedding(9, 4)
    emb.weight.requires_grad = True
    idx = np.array([[1, 8, 1], [0, 1, 8]])
    g = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    (emb(Tensor(idx)) * Tensor(g)).sum().backward()
    want = np.zeros_like(w)
    np.add.at(want, idx, g)
    np.testing.assert_allclose(emb.weight.grad.numpy(), want, rtol=1e-6, atol=1e-6)


def test_gather_gradient_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 5, 3)).astype(np.float32)
    idx = rng.integers(0, 5, (3, 6, 2))
    g = rng.standard_normal((3, 6, 2)).astype(np.float32)
    ta = torch.tensor(a, requires_grad=True)
    torch.gather(ta, 1, torch.tensor(idx)).backward(torch.tensor(g))
    x = Tensor(a, requires_grad=True)
    (x.gather(1, Tensor(idx)) * Tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ta.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_getitem_gradient_with_repeated_and_negative_indices() -> None:
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    x = Tensor(a, requires_grad=True)
    i, j = np.array([[0, -1], [3, 0]]), np.array([4, -5])
    g = np.arange(4, dtype=np.float32).reshape(2, 2) + 1
    (x[Tensor(i), Tensor(j)] * Tensor(g)).sum().backward()
    want = np.zeros_like(a)
    np.add.at(want, (i, np.broadcast_to(j, i.shape)), g)
    np.testing.assert_array_equal(x.grad.numpy(), want)


def test_gradient_of_an_inf_elsewhere_stays_out() -> None:
    emb, _ = _embedding(3, 2)
    emb.weight.requires_grad = True
    out = emb(Tensor([0, 2]))
    (out * Tensor([[1.0, 1.0], [float("inf"), 1.0]])).sum().backward()
    np.testing.assert_array_equal(emb.weight.grad.numpy(), [[1, 1], [0, 0], [np.inf, 1]])


# ***** the lookup is one kernel of loads at the index, whose work does not grow with the table *****


def test_lookup_is_one_gather_kernel() -> None:
    emb, _ = _embedding(64, 16)
    idx = Tensor(np.array([[3, 1], [0, 63]], np.int32))
    out = emb(idx)
    assert out.lazydata.base.op is IndexOps.GATHER
    with Context(CHECK_DATA=0):
        kernels = _kernels(emb(idx))
    assert len(kernels) == 1 and len(_gather_loads(kernels[0])) == 1
    assert not any(n.op in ReduceOps for n in kernels[0].ast.lazyops())


@pytest.mark.parametrize("device", DEVICES)
def test_lookup_work_does_not_grow_with_the_vocabulary(device: str) -> None:
    idx = np.random.default_rng(5).integers(0, 64, (2, 64)).astype(np.int32)
    ops, loads = [], []
    for vocab in (64, 4096, 50257):
        emb, w = _embedding(vocab, 32, device)
        index = Tensor(idx, device=device).realize()
        out = emb(index)
        (kernel,) = [si for si in _kernels(out) if _gather_loads(si)]
        lin = Linearizer(_optimized(kernel.ast, device))
        uops = lin.linearize()
        ops.append(lin.op_estimate)
        loads.append(sum(1 for u in uops if u.op is UOps.LOAD))
        GlobalCounters.reset()
        np.testing.assert_array_equal(out.numpy(), w[idx])
        ops.append(GlobalCounters.global_ops)  # (the check's kernel too: a count over the indices)
    assert ops[0::2] == [ops[0]] * 3 and ops[1::2] == [ops[1]] * 3, ops
    assert loads == [loads[0]] * 3
    assert ops[0] <= 2 * 64 * 32 * 16  # a few index ops per element (the one-hot form: 3 per row of the table)


def _optimized(ast, device: str) -> Kernel:
    k = Kernel(ast, Device[device].renderer)
    k.hand_coded_optimizations()
    return k


def test_lookup_inside_a_reduce_and_after_one() -> None:
    emb, w = _embedding(50, 8)
    idx = np.array([4, 9, 4, 0])
    np.testing.assert_allclose(emb(Tensor(idx)).sum(0).numpy(), w[idx].sum(0), rtol=1e-5)
    scores = Tensor(np.array([[0.1, 0.9, 0.3], [0.7, 0.2, 0.1]], np.float32))
    best = scores.argmax(-1)  # a reduce computed first, read as the index
    np.testing.assert_array_equal(emb(best).numpy(), w[[1, 0]])


def test_a_repeated_lookup_reads_each_call_s_indices() -> None:
    # the second call's graph comes from the schedule cache, on other buffers
    emb, w = _embedding(30, 4)
    for idx in ([1, 2, 3], [29, 0, 7], [5, 5, 5]):
        np.testing.assert_array_equal(emb(Tensor(idx)).numpy(), w[idx])


@pytest.mark.parametrize("device", DEVICES)
def test_training_steps_through_an_embedding_under_tinyjit(device: str) -> None:
    from tgcore import TinyJit
    from tgcore.nn.optim import SGD

    emb, w = _embedding(11, 3, device)
    emb.weight.requires_grad = True
    opt = SGD([emb.weight], lr=0.5)

    @TinyJit
    def step(idx: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = emb(idx).sum()
            loss.backward()
            opt.step()
        return loss

    want = w.copy()
    rng = np.random.default_rng(6)
    for _ in range(4):
        idx = rng.integers(0, 11, (2, 3)).astype(np.int32)
        loss = step(Tensor(idx, device=device))
        np.testing.assert_allclose(loss.item(), want[idx].sum(), rtol=1e-5)
        np.add.at(want, idx, -0.5 * np.ones((2, 3, 3), np.float32))
    np.testing.assert_allclose(emb.weight.numpy(), want, rtol=1e-5, atol=1e-6)
