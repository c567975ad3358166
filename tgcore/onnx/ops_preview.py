"""ONNX operators of domain ai.onnx.preview (version 1): FlexAttention, written on Tensor ops from the operator spec
(onnx/defs/preview)."""

from __future__ import annotations

import math
from typing import Any

from tgcore.dtype import dtypes
from tgcore.onnx.errors import OnnxError
from tgcore.onnx.ops import repeat_heads
from tgcore.onnx.registry import PREVIEW_DOMAIN, Node, onnx_to_dtype, op
from tgcore.tensor import Tensor


def _run_mod(n: Node, name: str, graph: Any, value: Tensor) -> Tensor:
    """A score_mod or prob_mod subgraph: one input (the whole scores or probabilities tensor), one output."""
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise OnnxError(
            f"FlexAttention: {name} must take one input and give one output, got {len(graph.input)} and "
            f"{len(graph.output)}"
        )
    assert n.run_graph is not None
    (out,) = n.run_graph(graph, {graph.input[0].name: value})
    if not isinstance(out, Tensor) or out.shape != value.shape:
        raise OnnxError(f"FlexAttention: {name} must keep the shape {value.shape}, got {getattr(out, 'shape', out)}")
    return out.cast(value.dtype)


@op("FlexAttention", 1, domain=PREVIEW_DOMAIN)
def flex_attention(n: Node) -> Tensor:
    """softmax(score_mod(Q K^T * scale)) with prob_mod applied to the probabilities, times V; K and V's heads shared
    by groups of Q's (grouped-query attention). Q and K are each scaled by sqrt(scale) before their product, in Q's
    dtype; the softmax and the product with V run in softmax_precision (default: float32 for half types, else Q's
    dtype); the result has V's dtype."""
    q, k, v = n[0], n[1], n[2]
    if q is None or k is None or v is None or q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        shapes = [None if t is None else t.shape for t in (q, k, v)]
        raise OnnxError(f"FlexAttention: Q, K and V must be 4-D (batch, heads, sequence, size), got {shapes}")
    hq, e = q.shape[1], q.shape[3]
    hkv, s = k.shape[1], k.shape[2]
    if v.shape[1] != hkv or v.shape[2] != s or k.shape[3] != e:
        raise OnnxError(
            f"FlexAttention: K and V must share heads and length, and Q and K their size; got Q {q.shape}, "
            f"K {k.shape}, V {v.shape}"
        )
    if hq != hkv:
        if hkv <= 0 or hq % hkv:
            raise OnnxError(f"FlexAttention: Q's {hq} heads must be a multiple of K and V's {hkv}")
        k, v = repeat_heads(k, hq), repeat_heads(v, hq)
    scale = n.get("scale")
    scale = 1 / math.sqrt(e) if scale is None else float(scale)
    root = math.sqrt(scale)
    precision = n.get("softmax_precision")
    if precision is not None:
        wide = onnx_to_dtype(int(precision), "FlexAttention")
        if not dtypes.is_float(wide):
            raise OnnxError(f"FlexAttention: softmax_precision must name a float type, got {wide}")
    else:
        wide = dtypes.float32 if q.dtype in (dtypes.float16, dtypes.bfloat16) else q.dtype
    scores = ((q * root) @ (k * root).transpose(-1, -2)).cast(wide)
    if (score_mod := n.get("score_mod")) is not None:
        scores = _run_mod(n, "score_mod", score_mod, scores)
    probs = scores.softmax(-1)
    if (prob_mod := n.get("prob_mod")) is not None:
        probs = _run_mod(n, "prob_mod", prob_mod, probs)
    return (probs @ v.cast(wide)).cast(v.dtype)
