"""ONNX-ML operators (domain ai.onnx.ml) that work on numbers and map onto Tensor ops: Binarizer and
ArrayFeatureExtractor, from the operator specs (onnx/defs/traditionalml). The domain's others (string encoders,
tree ensembles, linear and SVM models) are refused naming the ones that run."""

from __future__ import annotations

import math

from tgcore.dtype import dtypes
from tgcore.onnx.errors import OnnxError
from tgcore.onnx.registry import ML_DOMAIN, Node, op
from tgcore.tensor import Tensor


@op("Binarizer", 1, domain=ML_DOMAIN)
def binarizer(n: Node) -> Tensor:
    """1 where the input is above `threshold` (default 0), else 0, in the input's dtype."""
    x, threshold = n[0], float(n.get("threshold", 0.0))
    assert x is not None
    if math.isnan(threshold):
        return x.zeros_like()  # (nothing is above NaN)
    if not dtypes.is_float(x.dtype):  # an integer x is above t exactly where it is above floor(t): no rounding
        if math.isinf(threshold):
            return x.zeros_like() if threshold > 0 else x.ones_like()
        return (x > math.floor(threshold)).cast(x.dtype)
    return (x > threshold).cast(x.dtype)


@op("ArrayFeatureExtractor", 1, domain=ML_DOMAIN)
def array_feature_extractor(n: Node) -> Tensor:
    """The elements of the last axis at the given indices (all of them, flattened, in order): shape
    X.shape[:-1] + (count,), and (1, count) for a vector X, as onnxruntime gives them. An index past the axis fails."""
    x, indices = n[0], n[1]
    assert x is not None
    if indices is None or not dtypes.is_int(indices.dtype):
        got = getattr(indices, "dtype", None)
        raise OnnxError(f"ArrayFeatureExtractor: input Y must hold int64 indices, got {got}")
    if x.ndim == 0:
        raise OnnxError("ArrayFeatureExtractor: input X must have at least one axis, got a scalar")
    if x.ndim == 1:
        x = x.reshape(1, -1)
    flat = indices.flatten()
    index = flat.reshape(*(1,) * (x.ndim - 1), flat.shape[0]).expand(*x.shape[:-1], flat.shape[0])
    return x.gather(-1, index)
