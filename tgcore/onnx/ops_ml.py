"""ONNX-ML operators (domain ai.onnx.ml) that work on numbers and map onto Tensor ops: Binarizer,
ArrayFeatureExtractor and TreeEnsemble (version 5), from the operator specs (onnx/defs/traditionalml). The domain's
others (string encoders, the older tree ensemble classifier and regressor, linear and SVM models) are refused naming
the ones that run."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from tgcore.dtype import dtypes
from tgcore.onnx.errors import OnnxError, UnsupportedOp
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


# ***** TreeEnsemble (version 5): every tree walked on the device, one level a step *****

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_SUM, _AVERAGE, _MIN, _MAX = 1, 0, 2, 3
_AGGREGATES = {_AVERAGE: "AVERAGE", _SUM: "SUM", _MIN: "MIN", _MAX: "MAX"}
_POST = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}


def _tensor_attr(n: Node, name: str) -> Optional[np.ndarray]:
    from onnx import numpy_helper

    v = n.get(name)
    return None if v is None else numpy_helper.to_array(v).reshape(-1)


def _tree_depth(roots: list[int], true_ids: np.ndarray, false_ids: np.ndarray, true_leaf: np.ndarray,
                false_leaf: np.ndarray) -> int:  # fmt: skip
    """The most internal nodes on any path from a root to a leaf; a cycle is an error."""
    depth, level = 0, set(roots)
    while level:
        depth += 1
        if depth > len(true_ids):  # (a path longer than there are nodes goes round)
            raise OnnxError("TreeEnsemble: its nodes' true and false ids make a cycle, not trees")
        level = {int(ids[i]) for i in level for ids, leaf in ((true_ids, true_leaf), (false_ids, false_leaf))
                 if not leaf[i]}  # fmt: skip
    return depth


@op("TreeEnsemble", 5, domain=ML_DOMAIN)
def tree_ensemble(n: Node) -> Tensor:
    """The ensemble's per-target values for each row of X (N, F): each tree is walked from its root, comparing one
    feature with a node's split (mode: <=, <, >=, >, ==, !=, or membership of a set) until a leaf; the leaves' weights
    are aggregated per target (SUM, AVERAGE, MIN or MAX over the trees), then post-transformed (NONE, LOGISTIC,
    SOFTMAX, SOFTMAX_ZERO). Computed in X's dtype (float32 for float16)."""
    x = n[0]
    if x is None or x.ndim != 2 or not dtypes.is_float(x.dtype):
        raise OnnxError(
            f"TreeEnsemble: X must be a 2-D float tensor (rows, features), got {None if x is None else x.shape}"
        )
    names = ["nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs"]
    names += ["leaf_targetids", "tree_roots", "nodes_missing_value_tracks_true"]
    ints = {k: np.array(n.get(k, []), np.int64) for k in names}
    splits, modes = _tensor_attr(n, "nodes_splits"), _tensor_attr(n, "nodes_modes")
    weights, members = _tensor_attr(n, "leaf_weights"), _tensor_attr(n, "membership_values")
    n_targets = int(n.get("n_targets", 0))
    aggregate, post = int(n.get("aggregate_function", _SUM)), int(n.get("post_transform", 0))
    count, leaves = len(ints["nodes_featureids"]), 0 if weights is None else len(weights)
    if splits is None or modes is None or weights is None:
        raise OnnxError("TreeEnsemble: attributes nodes_splits, nodes_modes and leaf_weights are required")
    per_node = ("nodes_truenodeids", "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs")
    if count == 0 or any(len(ints[k]) != count for k in per_node) or len(splits) != count or len(modes) != count:
        raise OnnxError(f"TreeEnsemble: every nodes_* attribute must have one entry per node ({count} feature ids)")
    missing = ints["nodes_missing_value_tracks_true"]
    missing = np.zeros(count, np.int64) if missing.size == 0 else missing
    if len(ints["leaf_targetids"]) != leaves or len(missing) != count:
        raise OnnxError("TreeEnsemble: leaf_targetids needs one entry per leaf weight, and "
                        "nodes_missing_value_tracks_true one per node")  # fmt: skip
    if aggregate not in _AGGREGATES or post not in _POST:
        raise OnnxError(
            f"TreeEnsemble: aggregate_function {aggregate} or post_transform {post} is not one of the spec's"
        )
    if post == 4:
        raise UnsupportedOp("TreeEnsemble", 5, "post_transform PROBIT (an inverse error function) is not implemented")
    true_leaf, false_leaf = ints["nodes_trueleafs"] != 0, ints["nodes_falseleafs"] != 0
    roots = [int(r) for r in ints["tree_roots"]]
    features = x.shape[1]
    ids = [(i, leaf) for k, leafs in (("nodes_truenodeids", true_leaf), ("nodes_falsenodeids", false_leaf))
           for i, leaf in zip(ints[k], leafs)]  # fmt: skip
    checks = [
        (bool(roots) and all(0 <= r < count for r in roots), "tree_roots must name nodes"),
        (n_targets > 0 and all(0 <= t < n_targets for t in ints["leaf_targetids"]), "leaf_targetids must be below "
         "n_targets"),
        (not isinstance(features, int) or all(0 <= f < features for f in ints["nodes_featureids"]),
         f"nodes_featureids must be below X's {features} features"),
        (all(0 <= i < (leaves if leaf else count) for i, leaf in ids), "a true or false id names no node or leaf"),
        (set(modes.tolist()) <= set(range(7)), f"nodes_modes must be 0-6, got {sorted(set(modes.tolist()))}"),
    ]  # fmt: skip
    for ok, what in checks:
        if not ok:
            raise OnnxError(f"TreeEnsemble: {what}")
    # the members of each MEMBER node's set, in node order, each set ended by a NaN: a table padded with NaN
    member_nodes = [i for i in range(count) if modes[i] == _MEMBER]
    sets: list[list[float]] = []
    if member_nodes:
        if members is None or int(np.isnan(members).sum()) != len(member_nodes):
            raise OnnxError("TreeEnsemble: membership_values needs one NaN-ended set per MEMBER node")
        current: list[float] = []
        for v in members.tolist():
            if math.isnan(v):
                sets.append(current)
                current = []
            else:
                current.append(v)
    width = max([len(s) for s in sets] + [1])
    table = np.full((count, width), np.nan)
    for i, s in zip(member_nodes, sets):
        table[i, : len(s)] = s
    depth = _tree_depth(roots, ints["nodes_truenodeids"], ints["nodes_falsenodeids"], true_leaf, false_leaf)

    dt = dtypes.float32 if x.dtype in (dtypes.float16, dtypes.bfloat16) else x.dtype
    xs, dev = x.cast(dt), x.device

    def table_of(values: np.ndarray, dtype: Any) -> Tensor:
        return Tensor(np.ascontiguousarray(values), device=dev).cast(dtype)

    feat_t, split_t, mode_t = (
        table_of(ints["nodes_featureids"], dtypes.int32),
        table_of(splits, dt),
        table_of(modes, dtypes.int32),
    )
    true_t, false_t = (
        table_of(ints["nodes_truenodeids"], dtypes.int32),
        table_of(ints["nodes_falsenodeids"], dtypes.int32),
    )
    tleaf_t, fleaf_t, miss_t = (
        table_of(true_leaf, dtypes.bool),
        table_of(false_leaf, dtypes.bool),
        table_of(missing != 0, dtypes.bool),
    )
    members_t = table_of(table, dt)
    rows, trees = x.shape[0], len(roots)
    index = Tensor(np.array(roots, np.int32), device=dev).reshape(1, trees).expand(rows, trees)
    at_leaf = Tensor.zeros(rows, trees, dtype=dtypes.bool, device=dev)
    for _ in range(depth):
        node = at_leaf.where(0, index)  # (a finished walk's index is a leaf's: any node does for its lookups)
        value = xs.gather(1, feat_t[node])
        split, mode = split_t[node], mode_t[node]
        tests = [(value <= split, _LEQ), (value < split, _LT), (value >= split, _GTE), (value > split, _GT),
                 (value == split, _EQ), (value != split, _NEQ)]  # fmt: skip
        if member_nodes:
            tests.append(((value.unsqueeze(-1) == members_t[node]).cast(dtypes.int32).sum(-1) > 0, _MEMBER))
        cond = (value != value) & miss_t[node]  # (a NaN feature goes the true way where the node says so)
        for test, m in tests:
            cond = cond | (test & (mode == m))
        index = at_leaf.where(index, cond.where(true_t[node], false_t[node]))
        at_leaf = at_leaf | cond.where(tleaf_t[node], fleaf_t[node])
    weight, target = table_of(weights, dt)[index], table_of(ints["leaf_targetids"], dtypes.int32)[index]
    hit = target.unsqueeze(-1) == Tensor.arange(n_targets, device=dev).reshape(1, 1, n_targets)
    w = weight.unsqueeze(-1)
    if aggregate in (_SUM, _AVERAGE):
        y = hit.where(w, 0.0).sum(1) / (trees if aggregate == _AVERAGE else 1)
    else:
        # (a target no tree votes for keeps the dtype's extreme, where the reference starts)
        big = float(np.finfo(np.float16 if x.dtype == dtypes.float16 else np.float64 if dt == dtypes.float64 else
                             np.float32).max)  # fmt: skip
        y = hit.where(w, big).min(1) if aggregate == _MIN else hit.where(w, -big).max(1)
    if post == 2:
        y = y.sigmoid()
    elif post == 1:
        y = y.softmax(-1)
    elif post == 3:  # (softmax over the non-zero values; a zero stays zero)
        e = (y != 0).where((y - y.max(-1, keepdim=True)).exp(), 0.0)
        y = e / e.sum(-1, keepdim=True)
    return y.cast(x.dtype)
