"""TfIdfVectorizer (tgcore/onnx/ops_text.py) against a numpy reference written here from the operator spec, and
against onnxruntime where it is installed, on the default device."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tgcore.onnx import OnnxError, OnnxModel, UnsupportedOp, run_node  # noqa: E402

rng = np.random.default_rng(0)


def _tfidf_ref(x, mode, low, high, max_skip, counts, indexes, pool, weights=None):  # noqa: ANN001, ANN202
    """The spec read plainly: every n-gram of each row (lengths low..high, skips 0..max_skip, a 1-gram once), counted
    where the pool holds it, then weighed by mode and placed at its ngram_indexes coordinate."""
    rows = np.atleast_2d(np.asarray(x, np.int64))
    bounds = [*counts, len(pool)]
    where: dict[tuple, int] = {}  # pool n-gram -> its position in the pool's n-gram list
    for length, (start, end) in enumerate(zip(bounds, bounds[1:]), 1):
        for s in range(start, end, length):
            where[tuple(pool[s : s + length])] = len(where)
    w = np.ones(len(indexes)) if weights is None or mode == "TF" else np.asarray(weights, np.float64)
    out = np.zeros((rows.shape[0], max(indexes) + 1), np.float32)
    for r, row in enumerate(rows):
        found = np.zeros(len(indexes))
        for length in range(low, high + 1):
            for skip in range(max_skip + 1 if length > 1 else 1):
                step = skip + 1
                for i in range(len(row) - (length - 1) * step):
                    gram = tuple(int(v) for v in row[i : i + (length - 1) * step + 1 : step])
                    if gram in where:
                        found[where[gram]] += 1
        if mode == "IDF":
            found = np.minimum(found, 1)
        for i, idx in enumerate(indexes):
            out[r, idx] += np.float32(found[i] * w[i])
    return out.reshape(-1) if np.ndim(x) == 1 else out


def _node(**attrs):  # noqa: ANN003, ANN202
    return helper.make_node("TfIdfVectorizer", ["X"], ["Y"], **attrs)


def _ort(x: np.ndarray, **attrs) -> np.ndarray:  # noqa: ANN003
    ort = pytest.importorskip("onnxruntime")
    elem = TensorProto.INT64 if x.dtype == np.int64 else TensorProto.INT32
    graph = helper.make_graph(
        [_node(**attrs)],
        "tfidf",
        [helper.make_tensor_value_info("X", elem, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]


def _random_pool(vocab: int, high: int, per_length: int) -> tuple[list[int], list[int]]:
    """Distinct random n-grams of each length 1..high over tokens 0..vocab-1: (ngram_counts, pool_int64s)."""
    counts, pool = [], []
    for length in range(1, high + 1):
        counts.append(len(pool))
        grams = {tuple(int(v) for v in rng.integers(0, vocab, length)) for _ in range(per_length)}
        pool += [v for g in sorted(grams) for v in g]
    return counts, pool


@pytest.mark.parametrize(
    "mode, low, high, max_skip, shape, dtype",
    [
        ("TF", 1, 1, 0, (20,), np.int64),
        ("TF", 1, 3, 2, (3, 15), np.int32),
        ("IDF", 2, 3, 1, (17,), np.int64),
        ("IDF", 1, 2, 4, (4, 9), np.int32),
        ("TFIDF", 1, 2, 0, (2, 12), np.int64),
        ("TFIDF", 2, 4, 3, (25,), np.int32),
        ("TFIDF", 3, 3, 6, (2, 8), np.int64),  # (skips past the row: only the short ones fit)
    ],
)
def test_tfidf_vectorizer(mode: str, low: int, high: int, max_skip: int, shape: tuple, dtype: type) -> None:
    vocab = 4  # (few tokens: n-grams repeat, so counts above 1 and skip-grams occur)
    counts, pool = _random_pool(vocab, high, per_length=6)
    total = sum((end - start) // length for length, (start, end) in enumerate(zip(counts, [*counts[1:], len(pool)]), 1))
    indexes = [int(i) for i in rng.permutation(total + 3)[:total]]  # (scattered, with unused coordinates)
    weights = [float(w) for w in rng.uniform(0.1, 3.0, total).astype(np.float32)]
    x = rng.integers(0, vocab, shape).astype(dtype)
    attrs = dict(mode=mode, min_gram_length=low, max_gram_length=high, max_skip_count=max_skip, ngram_counts=counts,
                 ngram_indexes=indexes, pool_int64s=pool, weights=weights)  # fmt: skip
    (got,) = run_node(_node(**attrs), [x])
    want = _tfidf_ref(x, mode, low, high, max_skip, counts, indexes, pool, weights)
    assert got.dtype == np.float32 and got.shape == want.shape == (*shape[:-1], max(indexes) + 1)
    assert want.any()  # (the case matches something)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, _ort(x, **attrs), rtol=1e-6)


def test_tfidf_vectorizer_spec_example() -> None:
    """The spec's example: pool [94, 17, 17, 36] as two 2-grams placed at [1, 0]; with 2 skips [94, 12] and [17, 28]
    are the 2-grams, with 0 skips [94, 17] is one."""
    x = np.array([94, 17, 36, 12, 28, 17, 36], np.int64)
    attrs = dict(mode="TF", min_gram_length=2, max_gram_length=2, ngram_counts=[0, 0], ngram_indexes=[1, 0],
                 pool_int64s=[94, 17, 17, 36])  # fmt: skip
    np.testing.assert_array_equal(run_node(_node(max_skip_count=0, **attrs), [x])[0], [2.0, 1.0])
    # skips up to 4 (steps 1..5): [17, 36] at columns (1, 2), (5, 6), (1, 6); [94, 17] at (0, 1), (0, 5)
    np.testing.assert_array_equal(run_node(_node(max_skip_count=4, **attrs), [x])[0], [3.0, 2.0])


def test_tfidf_vectorizer_idf_without_weights_and_shared_coordinates() -> None:
    """IDF without weights is presence (1 or 0); two n-grams placed at one coordinate add up there."""
    x = np.array([[5, 5, 5, 6], [6, 7, 7, 7]], np.int32)
    attrs = dict(min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[0, 1, 1],
                 pool_int64s=[5, 6, 7])  # fmt: skip
    np.testing.assert_array_equal(run_node(_node(mode="IDF", **attrs), [x])[0], [[1, 1], [0, 2]])
    np.testing.assert_array_equal(run_node(_node(mode="TF", **attrs), [x])[0], [[3, 1], [0, 4]])


def test_tfidf_vectorizer_pool_values_past_int32() -> None:
    """A pool value an int32 input cannot hold never matches (it must not wrap onto a small token)."""
    x = np.array([3, 3, 4], np.int32)
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=[0],
                 ngram_indexes=[0, 1], pool_int64s=[2**32 + 3, 4])  # fmt: skip
    np.testing.assert_array_equal(run_node(_node(**attrs), [x])[0], [0.0, 1.0])
    np.testing.assert_array_equal(run_node(_node(**attrs), [x.astype(np.int64) + 2**32])[0], [2.0, 0.0])


@pytest.mark.parametrize("shape", [(0,), (2, 0), (2, 1), (0, 5)])
def test_tfidf_vectorizer_short_rows(shape: tuple) -> None:
    """Rows shorter than the n-grams (or no rows) count nothing: zeros of the output's shape."""
    x = np.ones(shape, np.int64)
    attrs = dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=3, ngram_counts=[0, 0],
                 ngram_indexes=[0], pool_int64s=[1, 1])  # fmt: skip
    (got,) = run_node(_node(**attrs), [x])
    np.testing.assert_array_equal(got, np.zeros((*shape[:-1], 1), np.float32))


def test_tfidf_vectorizer_reads_no_input_to_host() -> None:
    """The matching runs on the device: the model's kernels are recorded and replayed for new input values."""
    attrs = dict(mode="TFIDF", min_gram_length=1, max_gram_length=2, max_skip_count=1, ngram_counts=[0, 2],
                 ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 2], weights=[0.5, 1.0, 2.0])  # fmt: skip
    graph = helper.make_graph(
        [_node(**attrs)],
        "tfidf",
        [helper.make_tensor_value_info("X", TensorProto.INT64, [2, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    model = OnnxModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)]))
    for _ in range(4):
        x = rng.integers(0, 3, (2, 6)).astype(np.int64)
        want = _tfidf_ref(x, "TFIDF", 1, 2, 1, [0, 2], [0, 1, 2], [1, 2, 1, 2], [0.5, 1.0, 2.0])
        np.testing.assert_allclose(model(X=x)["Y"].numpy(), want, rtol=1e-6)
    assert all(r is not None and r.static for r in model._replays.values())


_GOOD = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 2],
             ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 2])  # fmt: skip


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(mode="BM25"), "mode 'BM25'"),
        (dict(min_gram_length=3), "min_gram_length <= max_gram_length"),
        (dict(min_gram_length=0), "min_gram_length <= max_gram_length"),
        (dict(max_skip_count=-1), "max_skip_count -1"),
        (dict(ngram_counts=[0, 1]), "does not cut the pool"),
        (dict(ngram_counts=[1, 2]), "must start with 0"),
        (dict(ngram_indexes=[0, 1]), "ngram_indexes has 2 entries; expected one per n-gram of the pool \\(3\\)"),
        (dict(ngram_indexes=[0, -1, 2]), "must be non-negative"),
        (dict(weights=[1.0, 2.0]), "weights has 2 entries"),
        (dict(pool_int64s=[1, 1, 1, 2]), "holds a 1-gram twice"),
    ],
)
def test_tfidf_vectorizer_bad_attributes(change: dict, match: str) -> None:
    with pytest.raises(OnnxError, match=match):
        run_node(_node(**{**_GOOD, **change}), [np.array([1, 2, 1], np.int64)])


def test_tfidf_vectorizer_bad_inputs() -> None:
    with pytest.raises(OnnxError, match="dtype float.*expected int32 or int64"):
        run_node(_node(**_GOOD), [np.array([1.0, 2.0], np.float32)])
    with pytest.raises(OnnxError, match=r"shape \(1, 2, 2\); expected 1-D \(C\) or 2-D \(N, C\)"):
        run_node(_node(**_GOOD), [np.ones((1, 2, 2), np.int64)])
    strings = {k: v for k, v in _GOOD.items() if k != "pool_int64s"}
    with pytest.raises(UnsupportedOp, match="pool_strings: string n-grams"):
        run_node(_node(pool_strings=["a", "b", "a", "b"], **strings), [np.array([1, 2], np.int64)])
