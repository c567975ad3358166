"""ONNX-ML's Binarizer and ArrayFeatureExtractor (tgcore/onnx/ops_ml.py) against numpy, with their edge cases and
errors, through run_node."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from tgcore.errors import IndexOutOfRangeError  # noqa: E402
from tgcore.onnx import OnnxError, UnsupportedOp, run_node  # noqa: E402

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


# ***** TreeEnsemble *****


def _random_ensemble(trees: int, features: int, targets: int, seed: int) -> dict:
    """A random ensemble of trees up to 3 levels deep, every mode used, as TreeEnsemble's attributes (and the same
    structure as lists for the reference walk)."""
    r = np.random.default_rng(seed)
    nodes: list[dict] = []  # feature, split, mode, missing, (true is leaf, id), (false is leaf, id), members
    leaves: list[tuple[float, int]] = []

    def grow(level: int) -> tuple[bool, int]:
        if level == 3 or (level > 0 and r.random() < 0.3):
            leaves.append((float(r.standard_normal()), int(r.integers(targets))))
            return True, len(leaves) - 1
        i = len(nodes)
        mode = int(r.integers(7))
        nodes.append(dict(feature=int(r.integers(features)), split=float(r.integers(-2, 3) / 2), mode=mode,
                          missing=int(r.integers(2)), members=sorted({float(v) for v in r.integers(-2, 3, 3) / 2})))
        nodes[i]["true"], nodes[i]["false"] = grow(level + 1), grow(level + 1)
        return False, i

    roots = [grow(0)[1] for _ in range(trees)]
    members = [v for nd in nodes if nd["mode"] == 6 for v in [*nd["members"], float("nan")]]
    attrs = dict(
        nodes_featureids=[nd["feature"] for nd in nodes],
        nodes_splits=helper.make_tensor("s", onnx.TensorProto.DOUBLE, [len(nodes)], [nd["split"] for nd in nodes]),
        nodes_modes=helper.make_tensor("m", onnx.TensorProto.UINT8, [len(nodes)], [nd["mode"] for nd in nodes]),
        nodes_truenodeids=[nd["true"][1] for nd in nodes], nodes_trueleafs=[int(nd["true"][0]) for nd in nodes],
        nodes_falsenodeids=[nd["false"][1] for nd in nodes], nodes_falseleafs=[int(nd["false"][0]) for nd in nodes],
        nodes_missing_value_tracks_true=[nd["missing"] for nd in nodes],
        leaf_weights=helper.make_tensor("w", onnx.TensorProto.DOUBLE, [len(leaves)], [w for w, _ in leaves]),
        leaf_targetids=[t for _, t in leaves], tree_roots=roots, n_targets=targets,
    )  # fmt: skip
    if members:
        attrs["membership_values"] = helper.make_tensor("mv", onnx.TensorProto.DOUBLE, [len(members)], members)
    return dict(attrs=attrs, nodes=nodes, leaves=leaves, roots=roots)


def _walk(ens: dict, row: np.ndarray) -> list[tuple[float, int]]:
    """Each tree's (weight, target) for one row, walked node by node in float64."""
    out = []
    for root in ens["roots"]:
        leaf, i = False, root
        while not leaf:
            nd = ens["nodes"][i]
            v, s = float(row[nd["feature"]]), nd["split"]
            cond = [v <= s, v < s, v >= s, v > s, v == s, v != s, v in nd["members"]][nd["mode"]]
            cond = cond or (bool(nd["missing"]) and np.isnan(v))
            leaf, i = nd["true"] if cond else nd["false"]
        out.append(ens["leaves"][i])
    return out


def _ensemble_ref(ens: dict, x: np.ndarray, targets: int, aggregate: int, post: int) -> np.ndarray:
    big = np.finfo(x.dtype if x.dtype != np.float16 else np.float32).max
    start = 0.0 if aggregate in (0, 1) else big if aggregate == 2 else -big  # (SUM/AVERAGE, MIN, MAX)
    y = np.full((len(x), targets), start)
    for r, row in enumerate(x):
        for w, t in _walk(ens, row):
            if aggregate in (0, 1):
                y[r, t] += w / (len(ens["roots"]) if aggregate == 0 else 1)
            else:
                y[r, t] = min(y[r, t], w) if aggregate == 2 else max(y[r, t], w)
    if post == 2:
        with np.errstate(over="ignore"):  # (a target no tree votes for holds -max: its logistic is 0)
            y = 1 / (1 + np.exp(-y))
    elif post in (1, 3):
        e = np.exp(y - y.max(-1, keepdims=True))
        e = np.where(y != 0, e, 0) if post == 3 else e
        y = e / e.sum(-1, keepdims=True)
    return y


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("post", [0, 2, 1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_ensemble_against_a_walk(aggregate: int, post: int, dtype: type) -> None:
    ens = _random_ensemble(trees=5, features=3, targets=3, seed=aggregate * 7 + post)
    # values on the splits' grid (halves), so ==, != and set membership are hit; and NaNs for missing-value routing
    x = (rng.integers(-3, 4, (40, 3)) / 2).astype(dtype)
    x[rng.random((40, 3)) < 0.1] = np.nan
    node = _node("TreeEnsemble", ["x"], aggregate_function=aggregate, post_transform=post, **ens["attrs"])
    (got,) = run_node(node, [x])
    assert got.dtype == dtype and got.shape == (40, 3)
    want = _ensemble_ref(ens, x, 3, aggregate, post)
    if post == 0 and aggregate in (2, 3):  # (a target no tree votes for: the dtype's extreme, compared exactly)
        np.testing.assert_array_equal(np.abs(got) == np.finfo(dtype).max, np.abs(want) == np.finfo(dtype).max)
        unvoted = np.abs(want) == np.finfo(dtype).max
        got, want = np.where(unvoted, 0, got), np.where(unvoted, 0, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tree_ensemble_of_float16_and_a_single_leaf_tree() -> None:
    # one tree whose root sends both ways to leaf 0 (a tree that is a leaf), one real split, summed
    attrs = dict(
        nodes_featureids=[0, 1], nodes_splits=helper.make_tensor("s", onnx.TensorProto.FLOAT, [2], [0.0, 1.0]),
        nodes_modes=helper.make_tensor("m", onnx.TensorProto.UINT8, [2], [0, 3]),
        nodes_truenodeids=[0, 1], nodes_trueleafs=[1, 1], nodes_falsenodeids=[0, 2], nodes_falseleafs=[1, 1],
        leaf_weights=helper.make_tensor("w", onnx.TensorProto.FLOAT, [3], [0.5, 2.0, -1.0]),
        leaf_targetids=[0, 0, 0], tree_roots=[0, 1], n_targets=1,
    )  # fmt: skip
    x = np.array([[5.0, 3.0], [-1.0, 0.5], [0.0, 1.0]], np.float16)
    (got,) = run_node(_node("TreeEnsemble", ["x"], **attrs), [x])
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.array([[2.5], [-0.5], [-0.5]], np.float16))


def test_tree_ensemble_refuses_bad_attributes() -> None:
    ens = _random_ensemble(trees=2, features=2, targets=2, seed=1)
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(UnsupportedOp, match="PROBIT"):
        run_node(_node("TreeEnsemble", ["x"], post_transform=4, **ens["attrs"]), [x])
    far = {**ens["attrs"], "nodes_featureids": [2] * len(ens["nodes"])}
    with pytest.raises(OnnxError, match="below X's 2 features"):
        run_node(_node("TreeEnsemble", ["x"], **far), [x])
    bad = {**ens["attrs"], "leaf_targetids": [5] * len(ens["leaves"])}
    with pytest.raises(OnnxError, match="leaf_targetids must be below n_targets"):
        run_node(_node("TreeEnsemble", ["x"], **bad), [x])
    cycle = {**ens["attrs"], "nodes_truenodeids": [0] * len(ens["nodes"]), "nodes_trueleafs": [0] * len(ens["nodes"])}
    with pytest.raises(OnnxError, match="make a cycle"):
        run_node(_node("TreeEnsemble", ["x"], **cycle), [x])
    with pytest.raises(OnnxError, match="2-D float tensor"):
        run_node(_node("TreeEnsemble", ["x"], **ens["attrs"]), [np.zeros(2, np.float32)])
