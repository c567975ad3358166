"""Edge cases where tinygrad 0.9.0 strays from numpy (or torch) and tgcore follows numpy, each against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.errors import AxisError, IndexOutOfRangeError, ShapeError


def test_rsqrt_ieee_values() -> None:
    a = np.array([-0.0, -np.inf, 0.0, np.inf, 4.0, -1.0], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(Tensor(a).rsqrt().numpy(), 1 / np.sqrt(a))


def test_argmax_of_everything_keeps_the_dims() -> None:
    a = np.array([[1.0, 7.0, 3.0], [9.0, 2.0, 9.0]], np.float32)
    assert Tensor(a).argmax(keepdim=True).numpy().tolist() == np.argmax(a, keepdims=True).tolist()
    assert Tensor(a).argmin(keepdim=True).shape == (1, 1)


def test_std_gradient_of_equal_values_is_zero() -> None:
    x = Tensor.zeros(1, 3, requires_grad=True)
    x.std(1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((1, 3), np.float32))
    np.testing.assert_allclose(Tensor([[1.0, 2.0, 4.0]]).std(1).numpy(), np.std([[1, 2, 4]], 1, ddof=1), rtol=1e-6)


def test_softmax_family_over_an_empty_axis() -> None:
    e = Tensor.zeros(2, 0)
    assert e.softmax(-1).shape == (2, 0) and e.log_softmax(-1).shape == (2, 0)
    np.testing.assert_array_equal(e.logsumexp(-1).numpy(), [-np.inf, -np.inf])


def test_bool_negation_and_subtraction_raise_as_numpy() -> None:
    with pytest.raises(TypeError):
        -Tensor([True])
    with pytest.raises(TypeError):
        Tensor([True]) - Tensor([False])
    assert (~Tensor([True, False])).tolist() == [False, True]


def test_transpose_of_fewer_than_two_dims_is_itself() -> None:
    assert Tensor([1.0, 2.0]).T.tolist() == [1.0, 2.0]
    assert Tensor(3.0).T.item() == 3.0


def test_shapes_and_axes_refused() -> None:
    t = Tensor.ones(2, 3, 4)
    with pytest.raises(AxisError):
        t.flatten(2, 0)
    with pytest.raises(ShapeError):
        t.permute(0, 1)
    with pytest.raises(ShapeError):
        Tensor.ones(3).tril()
    with pytest.raises(ShapeError):
        Tensor.ones(1, 1, 2, 2).max_pool2d(kernel_size=3)
    with pytest.raises(ShapeError):
        t.reshape(-1, -1)
    with pytest.raises(TypeError, match="axis"):
        t.sum(axis=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min over an axis of size 0"):
        Tensor.zeros(0).min()


def test_index_into_an_empty_axis() -> None:
    with pytest.raises(IndexOutOfRangeError):
        Tensor.zeros(0, 3)[Tensor([0, 0])]


def test_cumsum_first_zero() -> None:
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    np.testing.assert_array_equal(Tensor(a)._cumsum(1, _first_zero=True).numpy(), np.cumsum(a, 1) - a)
    np.testing.assert_array_equal(Tensor(a)._cumsum(0).numpy(), np.cumsum(a, 0))
