"""Writes through views: a reshape, permute, shrink, flip or slice of a tensor shares its memory, as in numpy and torch.
A pad or an expand makes a new tensor. Every result is checked against numpy doing the same writes."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Tensor, TinyJit, Variable, dtypes


def arange(*shape: int) -> tuple[Tensor, np.ndarray]:
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return Tensor(a).realize(), a.copy()


def test_setitem_through_a_transpose_writes_the_base() -> None:
    t, a = arange(2, 3)
    v, w = t.T, a.T
    v[0] = 9
    w[0] = 9
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(v.numpy(), w)


def test_assign_through_a_permute_writes_the_base() -> None:
    t, a = arange(2, 3)
    x = np.full((3, 2), 7, np.float32) + np.arange(6, dtype=np.float32).reshape(3, 2)
    t.permute(1, 0).assign(Tensor(x))
    np.testing.assert_array_equal(t.numpy(), x.T)


def test_every_view_of_the_memory_sees_the_write() -> None:
    t, a = arange(4, 5)
    row, col, flat = t[1], t[:, 2], t.reshape(20)
    t[1, 2] = -1
    a[1, 2] = -1
    np.testing.assert_array_equal(row.numpy(), a[1])
    np.testing.assert_array_equal(col.numpy(), a[:, 2])
    np.testing.assert_array_equal(flat.numpy(), a.reshape(20))


@pytest.mark.parametrize(
    "index",
    [
        (slice(None, None, 2),),
        (slice(None, None, -1),),
        (1, slice(1, 4)),
        (Ellipsis, 3),
        (slice(1, 3), slice(None, None, 3)),
    ],
    ids=["step2", "reversed", "row-slice", "ellipsis", "two-slices"],
)
def test_views_of_slices_write_through(index: tuple) -> None:
    t, a = arange(4, 6)
    v, w = t[index], a[index]
    v[...] = Tensor(np.full(w.shape, 100, np.float32) + np.arange(w.size, dtype=np.float32).reshape(w.shape))
    w[...] = np.full(w.shape, 100, np.float32) + np.arange(w.size, dtype=np.float32).reshape(w.shape)
    np.testing.assert_array_equal(t.numpy(), a)


def test_a_view_of_a_view_writes_the_first_base() -> None:
    t, a = arange(3, 4)
    v = t.reshape(2, 6).T[1:4]
    w = a.reshape(2, 6).T[1:4]
    v[0, 1] = 50
    w[0, 1] = 50
    np.testing.assert_array_equal(t.numpy(), a)


def test_flip_is_a_view_as_in_numpy() -> None:
    t, a = arange(5)
    t.flip(0)[0] = 42
    np.flip(a)[0] = 42
    np.testing.assert_array_equal(t.numpy(), a)


def test_unrealized_base_is_computed_then_written() -> None:
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = x * 2 + 1  # not computed yet
    view = y[1]
    view[0] = -5
    ref = np.arange(6, dtype=np.float32).reshape(2, 3) * 2 + 1
    ref[1, 0] = -5
    np.testing.assert_array_equal(y.numpy(), ref)
    np.testing.assert_array_equal(view.numpy(), ref[1])


def test_zeros_with_a_view_sees_setitem() -> None:
    z = Tensor.zeros(3, 4)
    row = z[1]
    z[1, 2] = 5
    ref = np.zeros((3, 4), np.float32)
    ref[1, 2] = 5
    np.testing.assert_array_equal(row.numpy(), ref[1])
    np.testing.assert_array_equal(z.numpy(), ref)


def test_setitem_on_zeros_in_a_loop() -> None:
    z = Tensor.zeros(6, 3, dtype=dtypes.int32)
    ref = np.zeros((6, 3), np.int32)
    for i in range(6):
        z[i] = Tensor([i, 2 * i, -i], dtype=dtypes.int32)
        ref[i] = [i, 2 * i, -i]
    np.testing.assert_array_equal(z.numpy(), ref)


def test_overlapping_value_reads_the_old_contents() -> None:
    t, a = arange(8)
    t[1:] = t[:-1]
    a[1:] = a[:-1].copy()
    np.testing.assert_array_equal(t.numpy(), a)
    t2, a2 = arange(3, 3)
    t2.T[...] = t2  # transpose in place
    np.testing.assert_array_equal(t2.numpy(), a2.T)


def test_value_reading_the_same_positions() -> None:
    t, a = arange(4, 4)
    v = t[1:3]
    v.assign(v * 10)
    a[1:3] *= 10
    np.testing.assert_array_equal(t.numpy(), a)


def test_pad_is_a_new_tensor() -> None:
    t, a = arange(3)
    p = t.pad(((1, 1),))
    p[0] = 9
    np.testing.assert_array_equal(t.numpy(), a)  # the padded copy alone changed
    np.testing.assert_array_equal(p.numpy(), [9, 0, 1, 2, 0])


def test_expand_is_a_new_tensor() -> None:
    t, a = arange(1, 3)
    e = t.expand(2, 3)
    e[0, 0] = 7
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(e.numpy(), [[7, 1, 2], [0, 1, 2]])


def test_constant_operands_are_not_written() -> None:
    """A constant that the engine shares between graphs (x + 1's 1) is never the memory a write lands in."""
    x = Tensor.ones(4).contiguous().realize()
    y = x * 0 + 1  # its constants come from the shared constant table
    s = (x + 1).realize()
    y[2] = 5
    np.testing.assert_array_equal(y.numpy(), [1, 1, 5, 1])
    np.testing.assert_array_equal((x + 1).numpy(), [2, 2, 2, 2])
    np.testing.assert_array_equal(s.numpy(), [2, 2, 2, 2])


def test_kv_cache_shrink_assign_with_a_bound_variable() -> None:
    """The KV-cache write of a decoder: a shrink at a symbolic position of a realized cache, assigned and realized."""
    cache = Tensor.zeros(2, 1, 8, 2, 3).contiguous().realize()
    ref = np.zeros((2, 1, 8, 2, 3), np.float32)
    for pos in range(6):
        x = np.full((2, 1, 1, 2, 3), pos + 1, np.float32) * np.arange(1, 7, dtype=np.float32).reshape(1, 1, 1, 2, 3)
        start = Variable("start_pos", 1, 8).bind(pos) if pos else 0
        cache.shrink((None, None, (start, start + 1), None, None)).assign(Tensor(x)).realize()
        ref[:, :, pos : pos + 1] = x
        np.testing.assert_array_equal(cache.numpy(), ref)


def test_kv_cache_write_under_tinyjit() -> None:
    cache = Tensor.zeros(1, 10, 4).contiguous().realize()
    ref = np.zeros((1, 10, 4), np.float32)

    @TinyJit
    def step(x: Tensor, pos: Variable) -> Tensor:
        cache.shrink((None, (pos, pos + 1), None)).assign(x * 2).realize()
        return cache.shrink((None, (0, pos + 1), None)).sum(1).realize()

    for p in range(1, 9):
        x = np.arange(4, dtype=np.float32).reshape(1, 1, 4) + p
        out = step(Tensor(x), Variable("pos", 1, 9).bind(p))
        ref[:, p : p + 1] = x * 2
        np.testing.assert_allclose(out.numpy(), ref[:, : p + 1].sum(1), rtol=1e-6)
    np.testing.assert_array_equal(cache.numpy(), ref)


def test_assign_into_a_view_checks_the_shape() -> None:
    t, _ = arange(4, 4)
    with pytest.raises(ValueError, match="same shape"):
        t[1:3].assign(Tensor.ones(3, 4))


def test_a_graph_built_before_an_assign_reads_the_old_values() -> None:
    a = Tensor([1.0, 2.0]).realize()
    b = a * 2  # not computed yet
    s = (a * 3).sum()
    a.assign(a + 10).realize()
    np.testing.assert_array_equal(b.numpy(), [2.0, 4.0])
    assert s.item() == 9.0
    np.testing.assert_array_equal(a.numpy(), [11.0, 12.0])


def test_a_graph_built_before_a_write_through_a_view_reads_the_old_values() -> None:
    z = Tensor.zeros(3)
    y = z + 1
    z[0] = 5
    np.testing.assert_array_equal(y.numpy(), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(z.numpy(), [5.0, 0.0, 0.0])


def test_the_loss_of_a_training_step_is_the_loss_before_the_step() -> None:
    from tgcore.nn import Linear
    from tgcore.nn.optim import SGD

    for realized in (False, True):
        Tensor.manual_seed(0)
        layer = Linear(4, 3)
        opt = SGD([layer.weight, layer.bias], lr=0.5)
        if realized:
            Tensor.realize(layer.weight, layer.bias)
        x, y = Tensor.randn(5, 4).realize(), Tensor([0, 1, 2, 0, 1])
        with Tensor.train():
            opt.zero_grad()
            loss = layer(x).sparse_categorical_crossentropy(y)
            loss.backward()
            before = layer(x).sparse_categorical_crossentropy(y).item()
            opt.step()
            after = layer(x).sparse_categorical_crossentropy(y).item()
        assert loss.item() == before != after
