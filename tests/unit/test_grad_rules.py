"""Which ops pass a gradient and what it is, against torch's rules: comparisons pass none (a loss of them alone cannot
be differentiated), a copy to another device passes it back, and powers follow torch's derivatives, NaN included."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Device, Tensor
from tgcore.errors import AxisError, ShapeError


def test_comparisons_do_not_require_grad() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    for out in (x < 2, x == 2, x >= 2, x != 1, (x > 1) & (x < 3)):
        assert out.requires_grad is False
    with pytest.raises(RuntimeError, match="does not require grad"):
        (x < 2).sum().backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        (x == 2).float().mean().backward()


def test_a_mask_from_a_comparison_still_passes_the_other_operands_gradient() -> None:
    x = Tensor([-1.0, 2.0, 3.0], requires_grad=True)
    ((x > 0) * x * x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 4.0, 6.0])


def test_backward_of_a_tensor_that_requires_no_grad() -> None:
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0, 2.0], requires_grad=False).sum().backward()
    # requires_grad not set either way (None, as a model's weights before an optimizer takes them): nothing to do,
    # as in tinygrad
    w = Tensor([1.0, 2.0])
    (w * 2).sum().backward()
    assert w.grad is None


def test_gradient_flows_through_a_copy_to_another_device() -> None:
    other = "PYTHON:1"
    x = Tensor([[1.0, 2.0]], requires_grad=True)
    y = Tensor([[3.0], [5.0]])
    out = x.matmul(y).to(other)
    assert out.device == Device.canonicalize(other) and out.requires_grad
    (out * 2).sum().backward()
    assert x.grad is not None and x.grad.device == x.device
    np.testing.assert_array_equal(x.grad.numpy(), [[6.0, 10.0]])


BASES = np.array([-2.0, -0.5, 0.0, 0.5, 2.0, 3.0], np.float32)
# d/dx x**y from torch 2.13 (y x^(y-1); 0 for y == 0; NaN for a negative x to a non-integer y)
POWER_GRADS = {
    0.5: [np.nan, np.nan, np.inf, 0.70710677, 0.35355338, 0.28867513],
    2.0: [-4.0, -1.0, 0.0, 1.0, 4.0, 6.0],
    3.0: [12.0, 0.75, 0.0, 0.75, 12.0, 27.0],
    0.0: [0.0] * 6,
    -1.0: [-0.25, -4.0, -np.inf, -4.0, -0.25, -0.11111111],
    2.5: [np.nan, np.nan, 0.0, 0.88388348, 7.0710678, 12.990381],
}


@pytest.mark.parametrize("y", sorted(POWER_GRADS), ids=str)
def test_power_gradient_of_the_base(y: float) -> None:
    x = Tensor(BASES, requires_grad=True)
    (x**y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), POWER_GRADS[y], rtol=2e-6, equal_nan=True)


def test_power_gradient_of_the_exponent() -> None:
    x = Tensor(BASES, requires_grad=True)
    e = Tensor([0.5, 2.0, -1.0, 0.0, 1.5, 2.0], requires_grad=True)
    (x**e).sum().backward()
    # torch: d/dx = e x^(e-1), d/de = x^e log x (0 where x == 0 and e >= 0)
    np.testing.assert_allclose(x.grad.numpy(), [np.nan, -1.0, -np.inf, 0.0, 2.1213202, 6.0], rtol=2e-6, equal_nan=True)
    np.testing.assert_allclose(
        e.grad.numpy(), [np.nan, np.nan, -np.inf, -0.6931472, 1.9605162, 9.88751], rtol=2e-6, equal_nan=True
    )


def test_small_integer_powers_are_exact_products() -> None:
    a = np.array([1.1, -3.3, 7.7e3, np.nan, np.inf, 0.0], np.float32)
    np.testing.assert_array_equal(Tensor(a).pow(2).numpy(), a * a)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(Tensor(a).pow(-1).numpy(), np.float32(1) / a)
    np.testing.assert_array_equal(Tensor(a).pow(0).numpy(), np.ones(6, np.float32))  # NaN ** 0 is 1, as numpy


def test_error_types_are_numpys_and_torchs() -> None:
    assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RuntimeError)
    assert issubclass(AxisError, ValueError) and issubclass(AxisError, IndexError)
    a, b = Tensor.ones(2, 3), Tensor.ones(4, 5)
    for bad in (lambda: a + b, lambda: a @ b, lambda: a.reshape(4, 2), lambda: a.assign(b), lambda: a.cat(b)):
        with pytest.raises(ShapeError):
            bad()
    for bad in (lambda: a.sum(2), lambda: a.permute(0, 0), lambda: a.sum((1, 1)), lambda: a.transpose(0, 5)):
        with pytest.raises(AxisError):
            bad()
    with pytest.raises(TypeError):
        a.reshape(2.0, 3)
    with pytest.raises(TypeError):
        Tensor.zeros(2.5)
