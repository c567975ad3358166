"""Graphs deeper than Python's recursion limit: long chains of unrealized ops, cats and sums of thousands of tensors.
The scheduler walks graphs with loops and splits a chain into kernels of bounded depth."""

from __future__ import annotations

import numpy as np

from tgcore import Tensor
from tgcore.engine.schedule import MAX_FUSED_DEPTH, MAX_KERNEL_INPUTS, create_schedule


def test_ten_thousand_chained_ops() -> None:
    x = Tensor([1.0, -2.0])
    for _ in range(10_000):
        x = x + 1
    np.testing.assert_array_equal(x.numpy(), [10_001.0, 9_998.0])


def test_a_chain_is_split_into_kernels_of_bounded_depth() -> None:
    x = Tensor([1.0]).realize()
    for _ in range(1_000):
        x = x * 1.0
    kernels = create_schedule([x.lazydata])
    assert -(-1_000 // MAX_FUSED_DEPTH) <= len(kernels) <= 2 * -(-1_000 // MAX_FUSED_DEPTH)


def test_backward_through_ten_thousand_ops() -> None:
    x = Tensor([1.0], requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0001 + 0.001
    y.sum().backward()
    ref = np.float32(1.0)
    for _ in range(10_000):
        ref = ref * np.float32(1.0001)
    np.testing.assert_allclose(x.grad.numpy(), [ref], rtol=1e-4)


def test_assign_of_a_deep_graph() -> None:
    t = Tensor([0.0, 1.0]).realize()
    y = t
    for _ in range(5_000):
        y = y + 2
    t.assign(y).realize()
    np.testing.assert_array_equal(t.numpy(), [10_000.0, 10_001.0])


def test_cat_and_stack_of_five_thousand_tensors() -> None:
    parts = [Tensor(np.array([i, -i], np.float32)) for i in range(5_000)]
    ref = np.stack([np.array([i, -i], np.float32) for i in range(5_000)])
    np.testing.assert_array_equal(Tensor.cat(*parts).numpy(), ref.reshape(-1))
    np.testing.assert_array_equal(Tensor.stack(*parts).numpy(), ref)


def test_cat_of_many_keeps_the_gradient() -> None:
    x = Tensor(np.arange(600, dtype=np.float32).reshape(300, 2), requires_grad=True)
    out = Tensor.cat(*[x[i : i + 1] * (i + 1) for i in range(300)])
    out.sum().backward()
    ref = np.arange(600, dtype=np.float32).reshape(300, 2) * np.arange(1, 301)[:, None]
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(x.grad.numpy(), np.repeat(np.arange(1, 301, dtype=np.float32)[:, None], 2, 1))


def test_sum_of_many_tensors_reads_a_bounded_number_per_kernel() -> None:
    parts = [Tensor([float(i)]).realize() for i in range(500)]
    total = sum(parts)
    kernels = create_schedule([total.lazydata])
    assert all(len(k.inputs) <= MAX_KERNEL_INPUTS for k in kernels)
    assert total.item() == sum(range(500))
