"""ONNX text operators: TfIdfVectorizer (9), written on Tensor ops from the operator spec (onnx/defs) like those of
ops.py.

The n-gram pool is an attribute, so its tables (the pool's n-grams by length, and the matrix that places and weighs
each n-gram's count in the output) are built on the host; the input's n-grams are matched against the pool and
counted on the device, so its values are never read to the host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgcore.dtype import dtypes
from tgcore.onnx.errors import OnnxError
from tgcore.onnx.registry import Node, op
from tgcore.tensor import Tensor

_MODES = ("TF", "IDF", "TFIDF")


@dataclass(frozen=True)
class _Pool:
    """The pool's n-grams of one length: their values (count, length) and their positions in the pool's n-gram list."""

    length: int
    grams: np.ndarray  # (count, length) int64
    first: int  # the index (in ngram_indexes) of the first of them


def _pool_by_length(pool: np.ndarray, starts: list[int]) -> list[_Pool]:
    """The pool cut into its n-gram lengths by ngram_counts (the start of the 1-grams, the 2-grams, ... in the pool)."""
    if not starts or starts[0] != 0:
        raise OnnxError(f"TfIdfVectorizer: ngram_counts {starts} must start with 0, where the pool's 1-grams start")
    bounds = [*starts, pool.size]
    out, first = [], 0
    for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
        length = i + 1
        if not start <= end <= pool.size or (end - start) % length:
            raise OnnxError(
                f"TfIdfVectorizer: ngram_counts {starts} does not cut the pool of {pool.size} values into n-grams: "
                f"the {length}-grams span [{start}, {end}); expected non-decreasing starts within the pool, each span "
                f"a multiple of its n-gram length"
            )
        count = (end - start) // length
        grams = pool[start:end].reshape(count, length)
        if np.unique(grams, axis=0).shape[0] != count:  # (which of the two would count it is ambiguous)
            raise OnnxError(f"TfIdfVectorizer: the pool holds a {length}-gram twice; expected each n-gram once")
        out.append(_Pool(length, grams, first))
        first += count
    return out


def _windows(x: Tensor, length: int, max_skip: int) -> list[Tensor]:
    """The input's n-grams of `length` items, skip counts 0..max_skip, as one (rows, windows) tensor per item.

    Item k of the n-gram that starts at column i with skip s is column i + k * (s + 1); a 1-gram is the same for every
    skip, so it is taken once."""
    columns = x.shape[1]
    skips = range(max_skip + 1) if length > 1 else range(1)
    per_item: list[list[Tensor]] = [[] for _ in range(length)]
    for skip in skips:
        step = skip + 1
        count = columns - (length - 1) * step  # windows that fit in the row
        if count <= 0:
            break
        for k in range(length):
            per_item[k].append(x[:, k * step : k * step + count])
    return [parts[0].cat(*parts[1:], dim=1) for parts in per_item if parts]


@op("TfIdfVectorizer", 9)
def _tfidf_vectorizer(n: Node) -> Tensor:
    x = n[0]
    if n.get("pool_strings") is not None:
        raise n.unsupported("pool_strings: string n-grams need string tensors, which tgcore has no dtype for")
    if n.get("pool_int64s") is None:
        raise OnnxError("TfIdfVectorizer: the pool_int64s attribute is missing; expected the pool of integer n-grams")
    if x.dtype not in (dtypes.int32, dtypes.int64):
        raise OnnxError(f"TfIdfVectorizer: input X has dtype {x.dtype.name}; expected int32 or int64 (integer tokens)")
    if x.ndim not in (1, 2):
        raise OnnxError(f"TfIdfVectorizer: input X has shape {x.shape}; expected 1-D (C) or 2-D (N, C)")
    mode = n.get("mode")
    if mode not in _MODES:
        raise OnnxError(f"TfIdfVectorizer: mode {mode!r}; expected one of {', '.join(_MODES)}")
    low, high, max_skip = n.get("min_gram_length"), n.get("max_gram_length"), n.get("max_skip_count")
    if low is None or high is None or max_skip is None:
        raise OnnxError("TfIdfVectorizer: min_gram_length, max_gram_length and max_skip_count are required attributes")
    if not 1 <= low <= high:
        raise OnnxError(
            f"TfIdfVectorizer: gram lengths [{low}, {high}]; expected 1 <= min_gram_length <= max_gram_length"
        )
    if max_skip < 0:
        raise OnnxError(f"TfIdfVectorizer: max_skip_count {max_skip}; expected 0 or more")
    pool = np.asarray(n.get("pool_int64s"), dtype=np.int64).reshape(-1)
    pools = _pool_by_length(pool, [int(c) for c in n.get("ngram_counts", [])])
    indexes = np.asarray(n.get("ngram_indexes", []), dtype=np.int64).reshape(-1)
    total = sum(p.grams.shape[0] for p in pools)
    if indexes.size != total or indexes.size == 0:
        raise OnnxError(
            f"TfIdfVectorizer: ngram_indexes has {indexes.size} entries; expected one per n-gram of the pool ({total})"
        )
    if indexes.min() < 0:  # (two n-grams may share a coordinate: their counts add up there)
        raise OnnxError(f"TfIdfVectorizer: ngram_indexes {indexes.tolist()} must be non-negative output coordinates")
    weights = n.get("weights")
    weights = np.ones(total, np.float32) if weights is None else np.asarray(weights, np.float32).reshape(-1)
    if weights.size != total:
        raise OnnxError(f"TfIdfVectorizer: weights has {weights.size} entries; expected one per pool n-gram ({total})")
    if mode == "TF":  # (TF counts; the weights scale IDF and TFIDF only)
        weights = np.ones(total, np.float32)
    width = int(indexes.max()) + 1

    rows = x.reshape(1, -1) if x.ndim == 1 else x
    lo, hi = np.iinfo(x.dtype.np).min, np.iinfo(x.dtype.np).max
    counts, places = [], []
    for p in pools:
        if not low <= p.length <= high or p.grams.shape[0] == 0:
            continue
        items = _windows(rows, p.length, max_skip)
        if not items:  # (the rows are shorter than the n-grams)
            continue
        # an n-gram holding a value the input's dtype cannot hold never matches: it leaves the tables
        fits = np.all((p.grams >= lo) & (p.grams <= hi), axis=1)
        grams, where = p.grams[fits], np.arange(p.first, p.first + p.grams.shape[0])[fits]
        if grams.shape[0] == 0:
            continue
        # (rows, windows, pool n-grams): whether each window holds each pool n-gram, item by item
        match = items[0].unsqueeze(-1) == n.const(grams[:, 0], x.dtype)
        for k in range(1, p.length):
            match = match & (items[k].unsqueeze(-1) == n.const(grams[:, k], x.dtype))
        counts.append(match.sum(axis=1))
        places.append(where)
    if not counts or rows.shape[0] == 0:
        out = Tensor.zeros(rows.shape[0], width, dtype=dtypes.float32, device=n.device)
        return out.reshape(width) if x.ndim == 1 else out
    found = counts[0].cat(*counts[1:], dim=1).cast(dtypes.float32)  # (rows, counted pool n-grams)
    if mode == "IDF":  # (presence, not frequency)
        found = found.minimum(1.0)
    order = np.concatenate(places)
    # each counted n-gram's count goes to its output coordinate, scaled by its weight: one nonzero per row, exact
    place = np.zeros((order.size, width), np.float32)
    place[np.arange(order.size), indexes[order]] = weights[order]
    out = found.matmul(n.const(place, dtypes.float32))
    return out.reshape(width) if x.ndim == 1 else out
