"""sparse_categorical_crossentropy's label work on LazyBuffers (tensor.py, _label_masks) and broadcasting as one
Function (function.py, BroadcastTo): the values and gradients against numpy, for every label dtype and shape the
fast paths take and for those that take the Tensor ops instead."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.errors import IndexOutOfRangeError
from tgcore.lazy import LazyBuffer
from tgcore.tensor import _ARANGES


def _np_loss(logits: np.ndarray, y: np.ndarray, ignore: int = -1, smoothing: float = 0.0) -> tuple[float, np.ndarray]:
    """The mean cross-entropy over the counted labels, and its gradient with respect to the logits (float64)."""
    x = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    labels = y.astype(np.int64).reshape(-1)
    keep = labels != ignore
    shifted = x - x.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    rows = np.flatnonzero(keep)
    picked = log_probs[rows, labels[rows]].sum()
    smooth = (log_probs.mean(-1) * keep).sum()
    count = keep.sum()
    loss = -((1 - smoothing) * picked + smoothing * smooth) / count
    target = np.zeros_like(x)
    target[rows, labels[rows]] = 1 - smoothing
    target += smoothing / x.shape[-1] * keep[:, None]
    grad = (np.exp(log_probs) * target.sum(-1, keepdims=True) - target) / count
    return loss, grad.reshape(logits.shape)


CASES = [
    ("int32", (7,), 5, -1),
    ("int64", (7,), 5, -1),
    ("int8", (6,), 4, 2),  # ignore_index inside the classes
    ("uint8", (6,), 300, -1),  # more classes than the label dtype holds: compared as int32
    ("int32", (2, 3), 6, -1),  # a language model's (batch, tokens) labels
    ("float32", (5,), 4, -1),  # float labels: the Tensor ops' path
]


@pytest.mark.parametrize("dtype,shape,classes,ignore", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_loss_and_gradient_match_numpy(dtype: str, shape: tuple, classes: int, ignore: int, smoothing: float) -> None:
    rng = np.random.default_rng(sum(shape) + classes)
    logits = rng.standard_normal((*shape, classes)).astype(np.float32)
    y = rng.integers(0, min(classes, 256 if dtype == "uint8" else 128), shape)
    if dtype == "uint8":
        y.flat[0] = 255  # the largest uint8 label: counted (it is not ignore_index -1)
    if dtype != "uint8":  # (ignored at the last label; uint8 cannot hold -1)
        y.flat[-1] = ignore
    y = y.astype(dtype)
    x = Tensor(logits, requires_grad=True)
    loss = x.sparse_categorical_crossentropy(Tensor(y), ignore_index=ignore, label_smoothing=smoothing)
    loss.backward()
    want, want_grad = _np_loss(logits, y, ignore, smoothing)
    np.testing.assert_allclose(loss.numpy(), want, rtol=2e-6)
    assert x.grad is not None
    # (float32 sums over up to 300 classes: a few ulps of the largest terms, 1e-3 here)
    np.testing.assert_allclose(x.grad.numpy(), want_grad, rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("bad_label", [-3, 5, 9])
def test_a_label_out_of_range_raises(bad_label: int) -> None:
    y = np.int32([0, 1, bad_label, 2])
    loss = Tensor(np.zeros((4, 5), np.float32)).sparse_categorical_crossentropy(Tensor(y))
    with pytest.raises(IndexOutOfRangeError, match="out of range for 5 classes"):
        loss.realize()


def test_an_ignored_label_is_not_checked_and_not_counted() -> None:
    logits = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    y = np.int64([1, -1, 3])
    got = Tensor(logits).sparse_categorical_crossentropy(Tensor(y)).item()
    np.testing.assert_allclose(got, _np_loss(logits, y)[0], rtol=2e-6)


def test_the_class_numbers_are_made_once_per_classes_dtype_and_device() -> None:
    _ARANGES.clear()
    logits = Tensor(np.zeros((4, 3), np.float32))
    for _ in range(3):
        logits.sparse_categorical_crossentropy(Tensor(np.int32([0, 1, 2, 1]))).realize()
    logits.sparse_categorical_crossentropy(Tensor(np.int64([0, 1, 2, 1]))).realize()  # int64: its own numbers
    assert sorted(key[1].name for key in _ARANGES) == ["int", "long"]
    assert all(lb.realized is not None and lb.shape == (3,) for lb in _ARANGES.values())


BROADCASTS = [
    ((3,), (2, 3)),
    ((1, 3), (4, 3)),
    ((), (2, 2)),
    ((2, 1, 3), (2, 4, 3)),
    ((3, 1), (3, 0)),
    ((0, 1), (2, 0, 5)),
]


@pytest.mark.parametrize("src,dst", BROADCASTS, ids=[f"{s}->{d}" for s, d in BROADCASTS])
def test_broadcast_is_one_view_with_numpy_values_and_summed_gradient(src: tuple, dst: tuple) -> None:
    a = np.arange(1, 1 + int(np.prod(src)), dtype=np.float32).reshape(src)
    x = Tensor(a, requires_grad=True)
    y = x._broadcast_to(dst)
    lb = y.lazydata
    assert isinstance(lb, LazyBuffer)
    if np.prod(dst) and np.prod(src):  # (an empty view is an empty buffer of its own)
        assert (
            lb.base is x.lazydata.base
            and lb.st == x.lazydata.reshape((1,) * (len(dst) - len(src)) + src).expand(dst).st
        )
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(a, dst))
    weights = np.arange(int(np.prod(dst)), dtype=np.float32).reshape(dst)
    (y * Tensor(weights)).sum().backward()
    assert x.grad is not None
    want = weights.sum(axis=tuple(range(len(dst) - len(src))))  # the added axes, then the expanded ones
    want = want.sum(axis=tuple(i for i, s in enumerate(src) if s == 1), keepdims=True)
    np.testing.assert_array_equal(x.grad.numpy(), want.reshape(src))
    assert x.grad.dtype == dtypes.float32


def test_broadcast_to_a_shape_it_cannot_reach_raises() -> None:
    with pytest.raises(Exception, match="cannot broadcast shape"):
        Tensor(np.zeros((2, 3), np.float32))._broadcast_to((4, 3))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float32"])
def test_one_hot_matches_numpy_for_every_label_dtype(dtype: str) -> None:
    y = np.array([[0, 3, 1], [2, 2, 4]], dtype=dtype)
    got = Tensor(y).one_hot(5)
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), np.eye(5, dtype=np.int32)[y.astype(np.int64)])


@pytest.mark.parametrize("values", [[0, 5], [-1, 2], [0.5, 1.0]], ids=["too-large", "negative", "not-whole"])
def test_one_hot_of_a_value_out_of_its_classes_raises(values: list) -> None:
    y = np.array(values, dtype=np.float32 if isinstance(values[0], float) else np.int32)
    with pytest.raises(IndexOutOfRangeError, match="one_hot class values"):
        Tensor(y).one_hot(5).realize()
