"""What can only be checked on the data is checked on the device, before any kernel reads the invalid data, and raised
when the result is realized: index tensors out of range, class labels past the classes, bad multinomial weights."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Context, Tensor, TinyJit
from tgcore.errors import IndexOutOfRangeError, InvalidValueError
from tgcore.nn import Embedding


def test_the_errors_are_numpys_and_torchs() -> None:
    assert issubclass(IndexOutOfRangeError, IndexError) and issubclass(IndexOutOfRangeError, RuntimeError)
    assert issubclass(InvalidValueError, ValueError) and issubclass(InvalidValueError, RuntimeError)


@pytest.mark.parametrize("bad", [[5], [-4], [0, 3], [2, -9]])
def test_tensor_index_out_of_range(bad: list[int]) -> None:
    t = Tensor([1.0, 2.0, 3.0])
    out = t[Tensor(bad)]
    with pytest.raises(IndexOutOfRangeError, match="axis 0 with size 3"):
        out.numpy()
    assert out.lazydata.base.realized is None  # nothing was computed from the invalid index
    with pytest.raises(IndexOutOfRangeError):  # and it stays invalid
        out.numpy()


def test_tensor_index_in_range_wraps_negatives_as_numpy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[-1, 0], [2, -3]])
    np.testing.assert_array_equal(Tensor(a)[Tensor(idx)].numpy(), a[idx])
    np.testing.assert_array_equal(Tensor(a)[:, Tensor([3, -4])].numpy(), a[:, [3, -4]])


def test_an_index_computed_in_the_same_graph_is_checked() -> None:
    t = Tensor(np.arange(4, dtype=np.float32))
    idx = Tensor([0, 1, 2]) * 2  # 0, 2, 4: the last is out of range
    with pytest.raises(IndexOutOfRangeError):
        (t[idx] + 1).numpy()


def test_gather_out_of_range() -> None:
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(IndexOutOfRangeError, match="gather"):
        t.gather(1, Tensor([[0, 3], [1, 1]])).numpy()
    np.testing.assert_array_equal(t.gather(1, Tensor([[2, -1], [0, 1]])).numpy(), [[2, 2], [3, 4]])


def test_cross_entropy_label_past_the_classes() -> None:
    logits = Tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    with pytest.raises(IndexOutOfRangeError, match="3 classes"):
        logits.sparse_categorical_crossentropy(Tensor([3, 0])).numpy()
    with pytest.raises(IndexOutOfRangeError):
        logits.sparse_categorical_crossentropy(Tensor([-2, 0])).numpy()
    ok = logits.sparse_categorical_crossentropy(Tensor([-1, 1])).item()  # -1: the ignored index
    np.testing.assert_allclose(ok, np.log(3), rtol=1e-6)


def test_multinomial_weights() -> None:
    for bad in ([1.0, -1.0, 2.0], [0.0, 0.0], [1.0, float("nan")], [float("inf"), 1.0]):
        with pytest.raises(InvalidValueError, match="multinomial"):
            Tensor(bad).multinomial().numpy()
    assert Tensor([0.0, 1.0, 0.0]).multinomial().item() == 1


def test_one_hot_and_embedding_out_of_range() -> None:
    with pytest.raises(IndexOutOfRangeError, match="one_hot"):
        Tensor([0, 3]).one_hot(3).numpy()
    emb = Embedding(4, 2)
    with pytest.raises(IndexOutOfRangeError, match="Embedding"):
        emb(Tensor([[1, 4]])).numpy()
    np.testing.assert_array_equal(emb(Tensor([[3, 0]])).numpy()[0], emb.weight.numpy()[[3, 0]])


def test_checks_under_tinyjit() -> None:
    x = Tensor(np.arange(4, dtype=np.float32)).realize()

    @TinyJit
    def pick(i: Tensor) -> Tensor:
        return (x[i] * 10).realize()

    for k in range(4):
        np.testing.assert_array_equal(pick(Tensor([k])).numpy(), [k * 10])
    with pytest.raises(IndexOutOfRangeError):
        pick(Tensor([4]))
    np.testing.assert_array_equal(pick(Tensor([2])).numpy(), [20])


def test_checks_can_be_turned_off() -> None:
    with Context(CHECK_DATA=0):
        np.testing.assert_array_equal(Tensor([1.0, 2.0])[Tensor([5])].numpy(), [0.0])  # the unchecked one-hot answer


def test_a_cached_schedule_keeps_its_checks() -> None:
    """The second time a graph is seen its schedule comes from the cache: the check must come with it."""
    t = Tensor(np.arange(5, dtype=np.float32)).realize()
    for k in (0, 3, 4, 1):
        np.testing.assert_array_equal((t[Tensor([k]).realize()] + 1).numpy(), [k + 1])
    with pytest.raises(IndexOutOfRangeError):
        (t[Tensor([7]).realize()] + 1).numpy()
