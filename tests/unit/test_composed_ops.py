"""ComposedOps: exp, tanh, sigmoid, ... are one node each in the lazy graph, and the kernel that computes one is the
kernel of its composition written out (lazymath.py), with the same fusion decisions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.engine.schedule import MAX_FUSED_DEPTH, _composed_traits, create_schedule
from tgcore.lazymath import COMPOSITIONS
from tgcore.ops import ComposedOps, LazyOp, LoadOps

X = np.array([-30.0, -2.5, -0.3, 0.0, 1e-5, 0.7, 3.0, 20.0], dtype=np.float32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


REFERENCES = {
    ComposedOps.EXP: np.exp,
    ComposedOps.EXPM1: np.expm1,
    ComposedOps.LOG1P: lambda x: np.log1p(np.abs(x)),  # (log1p runs on |x|: its domain)
    ComposedOps.COS: np.cos,
    ComposedOps.TANH: np.tanh,
    ComposedOps.SINH: np.sinh,
    ComposedOps.COSH: np.cosh,
    ComposedOps.SOFTPLUS: _softplus,
    ComposedOps.SIGMOID: _sigmoid,
}


def _same_tree(a: LazyOp, b: LazyOp) -> bool:
    """Whether two kernel ASTs are the same tree (LazyOp compares by identity)."""
    return a.op is b.op and a.arg == b.arg and len(a.src) == len(b.src) and all(map(_same_tree, a.src, b.src))


def _operand(op: ComposedOps) -> np.ndarray:
    return np.abs(X) if op is ComposedOps.LOG1P else X


@pytest.mark.parametrize("op", list(ComposedOps), ids=lambda op: op.name)
def test_a_composed_function_is_one_node_and_its_kernel_is_its_composition(op: ComposedOps) -> None:
    x = Tensor(_operand(op)).realize()
    node = x.lazydata.composed(op)
    assert node.op is op and node.srcs == (x.lazydata,)
    (kernel,) = create_schedule([node])
    (written_out,) = create_schedule([COMPOSITIONS[op](x.lazydata)])
    assert _same_tree(kernel.ast, written_out.ast)
    assert kernel.ast.op is written_out.ast.op and not any(isinstance(u.op, ComposedOps) for u in _walk(kernel.ast))
    expected = REFERENCES[op](_operand(op).astype(np.float64))
    np.testing.assert_allclose(Tensor(node).numpy(), expected.astype(np.float32), rtol=2e-6, atol=1e-37)


def _walk(ast: LazyOp) -> list[LazyOp]:
    out, stack = [], [ast]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.src)
    return out


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float64], ids=lambda d: d.name)
def test_a_composed_function_of_other_floats_keeps_their_dtype(dtype: Any) -> None:
    x = Tensor(X).cast(dtype)
    y = x.tanh()
    assert y.lazydata.base.op is ComposedOps.TANH and y.dtype == dtype
    np.testing.assert_allclose(y.numpy().astype(np.float64), np.tanh(X.astype(dtype.np)), rtol=1e-3, atol=1e-7)
    g = Tensor(X, requires_grad=True)
    g.cast(dtype).sigmoid().sum().backward()
    s = _sigmoid(X.astype(np.float64))
    np.testing.assert_allclose(g.grad.numpy(), s * (1 - s), rtol=5e-3, atol=1e-7)


def test_a_composed_function_of_a_constant_is_written_out_and_folds() -> None:
    y = Tensor(0.5).exp()  # (a scalar Tensor is a constant: its ops fold where they can)
    assert not isinstance(y.lazydata.base.op, ComposedOps)
    assert y.item() == pytest.approx(math.exp(0.5), rel=2e-7)
    z = Tensor.full((3,), -2.0).abs().sqrt()
    assert z.lazydata.base.op is LoadOps.CONST
    assert not isinstance(Tensor.full((3,), 2.0).sigmoid().lazydata.base.op, ComposedOps)
    np.testing.assert_allclose(Tensor.full((3,), 2.0).sigmoid().numpy(), [_sigmoid(np.float64(2.0))] * 3, rtol=1e-6)


def test_a_composed_function_needs_a_float() -> None:
    with pytest.raises(TypeError, match="exp needs a float operand, got dtypes.int32"):
        Tensor([1, 2], dtype=dtypes.int32).lazydata.composed(ComposedOps.EXP)


def test_a_chain_of_composed_functions_is_split_by_the_depth_they_stand_for() -> None:
    x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32)).realize()
    y, ref = x, np.linspace(-1, 1, 8, dtype=np.float32).astype(np.float64)
    for _ in range(12):
        y, ref = y.tanh(), np.tanh(ref)
    depth = _composed_traits(y.lazydata)[0]
    kernels = create_schedule([y.lazydata])
    assert len(kernels) >= -(-12 * depth // MAX_FUSED_DEPTH) > 1  # as if the 12 compositions were written out
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5)


def test_a_pad_of_a_composed_function_is_fused_only_where_zeros_map_to_zero() -> None:
    x_np = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    x = Tensor(x_np).realize()
    # exp's composition maps the zeros a pad reads to 0 (its constants are read through the pad too): one kernel;
    # sigmoid's does not (its division): computed apart, then padded
    assert _composed_traits(x.exp().lazydata)[1] and not _composed_traits(x.sigmoid().lazydata)[1]
    for fn, ref, kernels in ((Tensor.exp, np.exp, 1), (Tensor.sigmoid, _sigmoid, 2)):
        y = fn(x).pad(((1, 0), (0, 2))).contiguous()
        assert len(create_schedule([y.lazydata])) == kernels
        np.testing.assert_allclose(y.numpy(), np.pad(ref(x_np.astype(np.float64)), ((1, 0), (0, 2))), rtol=2e-6)
