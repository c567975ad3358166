"""ONNX-ML's Binarizer and ArrayFeatureExtractor (tgcore/onnx/ops_ml.py) against numpy, with their edge cases and
errors, through run_node."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from tgcore.errors import IndexOutOfRangeError  # noqa: E402
from tgcore.onnx import OnnxError, run_node  # noqa: E402

rng = np.random.default_rng(0)


def _node(op_type: str, inputs: list[str], **attrs):  # noqa: ANN003, ANN201
    return helper.make_node(op_type, inputs, ["y"], domain="ai.onnx.ml", **attrs)


@pytest.mark.parametrize("threshold", [None, 0.5, -1.0, float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_binarizer(threshold: float, dtype: type) -> None:
    x = (rng.standard_normal((3, 4)) * 3).astype(dtype)
    attrs = {} if threshold is None else {"threshold": threshold}
    (got,) = run_node(_node("Binarizer", ["x"], **attrs), [x])
    want = (x > (0.0 if threshold is None else threshold)).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_binarizer_of_big_integers_is_exact() -> None:
    x = np.array([2**53 + 1, 2**53, 2**53 - 1, -(2**62)], np.int64)  # (float32 or float64 would round these)
    (got,) = run_node(_node("Binarizer", ["x"], threshold=float(2**53)), [x])
    np.testing.assert_array_equal(got, [1, 0, 0, 0])


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("indices", [[4, 0], [[1, 3, 3]], [[0, 1], [2, 4]], [-1]])
def test_array_feature_extractor(shape: tuple[int, ...], indices: list) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    idx = np.array(indices, np.int64)
    (got,) = run_node(_node("ArrayFeatureExtractor", ["x", "i"]), [x, idx])
    flat = idx.ravel()
    want = x[..., flat].reshape((1, flat.size) if len(shape) == 1 else (*shape[:-1], flat.size))
    np.testing.assert_array_equal(got, want)


def test_array_feature_extractor_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(IndexOutOfRangeError):
        run_node(_node("ArrayFeatureExtractor", ["x", "i"]), [x, np.array([3], np.int64)])
    with pytest.raises(OnnxError, match="must hold int64 indices"):
        run_node(_node("ArrayFeatureExtractor", ["x", "i"]), [x, np.array([1.0], np.float32)])
    with pytest.raises(OnnxError, match="at least one axis"):
        run_node(_node("ArrayFeatureExtractor", ["x", "i"]), [np.float32(1.0), np.array([0], np.int64)])
