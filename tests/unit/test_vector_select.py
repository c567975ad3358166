"""Comparisons and selects on whole vectors (a renderer's `vector_math` holding CMPLT, CMPEQ and WHERE: float32
masks, codegen/uops.py): the same bits as numpy on every device, with NaNs, signed zeros and infinities, and the
kernels of ReLU's gradient, a where and a clamp stay vector code where the renderer declares them."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import VECTOR_SELECT, UOps
from tgcore.device import Device
from tgcore.engine.realize import get_kernel
from tgcore.ops import BinaryOps, TernaryOps

DEVICES = ["PYTHON"] + sorted(d for d in Device.available() if d != "PYTHON")
SPECIAL = [np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 3.5, -2.25, 1e-45]


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((16, 64)).astype(np.float32)
    # every pair of the special values somewhere in the first rows, the rest random
    pairs = np.array([(x, y) for x in SPECIAL for y in SPECIAL], np.float32)
    a.reshape(-1)[: len(pairs)], b.reshape(-1)[: len(pairs)] = pairs[:, 0], pairs[:, 1]
    b[5, :8] = a[5, :8]  # equal values (CMPEQ true)
    return a, b


CASES: dict[str, tuple[Callable, Callable]] = {
    "less": (lambda x, y: x < y, lambda a, b: a < b),
    "equal": (lambda x, y: x == y, lambda a, b: a == b),
    "not_equal_as_float": (lambda x, y: (x != y).float(), lambda a, b: (a != b).astype(np.float32)),
    "where": (lambda x, y: (x < y).where(x, y), lambda a, b: np.where(a < b, a, b)),
    "where_scalars": (lambda x, y: (x < 0).where(0.5, y), lambda a, b: np.where(a < 0, np.float32(0.5), b)),
    "relu_gradient": (lambda x, y: (x > 0).float() * (y + 1), lambda a, b: (a > 0).astype(np.float32) * (b + 1)),
    "clip": (lambda x, y: x.clip(-1.0, 2.0) * y, lambda a, b: np.clip(a, np.float32(-1), np.float32(2)) * b),
}


def _bits_equal(got: np.ndarray, expect: np.ndarray) -> None:
    assert got.dtype == expect.dtype and got.shape == expect.shape
    np.testing.assert_array_equal(got.view(np.uint8), expect.view(np.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_selects_match_numpy_bit_for_bit(device: str, name: str) -> None:
    a, b = _inputs()
    ours, ref = CASES[name]
    got = ours(Tensor(a, device=device), Tensor(b, device=device)).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        _bits_equal(got, ref(a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_a_sum_of_selected_values_is_the_sum_of_numpys_selection(device: str) -> None:
    # the select fused into a reduce's loop: the same bits as the same reduce over numpy's selection
    a, b = _inputs()
    got = (Tensor(a, device=device) < Tensor(b, device=device)).where(Tensor(b, device=device), 0.0).sum(axis=1)
    expect = Tensor(np.where(a < b, b, np.float32(0)), device=device).sum(axis=1).numpy()
    _bits_equal(got.numpy(), expect)
    np.testing.assert_allclose(expect, np.where(a < b, b, 0).astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-6)


def _vector_ops(t: Tensor) -> set:
    """The ALU ops the kernel computing `t` runs on whole vectors, on its device's renderer."""
    ast = t.schedule()[-1].ast
    renderer = Device[t.device].renderer
    uops = to_program(get_kernel(renderer, ast, t.device)).uops
    return {u.arg for u in uops if u.op is UOps.ALU and u.dtype is not None and u.dtype.count > 1}


@pytest.mark.parametrize("device", DEVICES)
def test_masks_stay_vectors_where_the_renderer_has_them(device: str) -> None:
    renderer = Device[device].renderer
    if not all(op in renderer.vector_math for op in VECTOR_SELECT):
        # the kernels are scalar there: nothing in them is a vector comparison
        a, b = (Tensor(v, device=device) for v in _inputs())
        assert not _vector_ops((a > 0).float() * b) & set(VECTOR_SELECT)
        return
    a, b = (Tensor(v, device=device) for v in _inputs())
    # ReLU's gradient: the comparison a mask, its cast to float a select between 1.0 and 0.0
    assert {BinaryOps.CMPLT, TernaryOps.WHERE} <= _vector_ops((a > 0).float() * b)
    assert {BinaryOps.CMPEQ, TernaryOps.WHERE} <= _vector_ops((a == b).where(a, b))
    # tanh (and so the tanh GELU) in float32: the Taylor series below 0.55, exp above (its powers of two built by
    # shifting a float's bits), a select between them
    assert {BinaryOps.SHL, BinaryOps.CMPLT, TernaryOps.WHERE} <= _vector_ops(a.gelu())
    with np.errstate(over="ignore"):
        expect = np.tanh(_inputs()[0].astype(np.float64))
    np.testing.assert_allclose(a.tanh().numpy(), expect, rtol=3e-7, atol=1e-45)
    # a comparison of float64 values, or of ints, stays scalar (masks are of float32 lanes)
    assert not _vector_ops((a.cast(dtypes.float64) > 0).where(1.0, 2.0)) & set(VECTOR_SELECT)
    assert not _vector_ops((a.cast(dtypes.int32) > 0).where(a, b)) & set(VECTOR_SELECT)
    # a mask stored as bools is stored lane by lane, and reads back right
    mask = (a < b).numpy()
    np.testing.assert_array_equal(mask, _inputs()[0] < _inputs()[1])
