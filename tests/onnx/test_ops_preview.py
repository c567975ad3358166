"""FlexAttention of domain ai.onnx.preview (tgcore/onnx/ops_preview.py) against numpy: grouped heads, a scale,
score_mod and prob_mod subgraphs, half inputs, and errors for bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tgcore.onnx import OnnxError, OnnxModel, run_node  # noqa: E402

DOMAIN = "ai.onnx.preview"
rng = np.random.default_rng(0)


def _softcap_graph(cap: float) -> onnx.GraphProto:
    """score_mod: cap * tanh(s / cap), a subgraph of one input and one output."""
    f = TensorProto.FLOAT
    c = helper.make_tensor("cap", f, [], [cap])
    nodes = [helper.make_node("Div", ["s", "cap"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
             helper.make_node("Mul", ["t", "cap"], ["out"])]  # fmt: skip
    return helper.make_graph(nodes, "softcap", [helper.make_tensor_value_info("s", f, None)],
                             [helper.make_tensor_value_info("out", f, None)], [c])  # fmt: skip


def _scale_graph(factor: float) -> onnx.GraphProto:
    f = TensorProto.FLOAT
    c = helper.make_tensor("factor", f, [], [factor])
    return helper.make_graph([helper.make_node("Mul", ["p", "factor"], ["out"])], "scale",
                             [helper.make_tensor_value_info("p", f, None)],
                             [helper.make_tensor_value_info("out", f, None)], [c])  # fmt: skip


def _reference(q, k, v, scale=None, cap=None, factor=None):  # noqa: ANN001, ANN202
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k64, v64 = np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q64 @ np.swapaxes(k64, -1, -2) * scale
    if cap is not None:
        s = cap * np.tanh(s / cap)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if factor is not None:
        p = p * factor
    return p @ v64


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_flex_attention(dtype: type, heads: tuple[int, int]) -> None:
    hq, hkv = heads
    q = rng.standard_normal((2, hq, 5, 8)).astype(dtype)
    k, v = rng.standard_normal((2, hkv, 7, 8)).astype(dtype), rng.standard_normal((2, hkv, 7, 3)).astype(dtype)
    attrs = dict(scale=0.3)
    if dtype == np.float32:  # (the subgraphs compute in float32: the softmax precision of float32 and half inputs)
        attrs.update(score_mod=_softcap_graph(2.0), prob_mod=_scale_graph(0.5))
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=DOMAIN, **attrs)
    (got,) = run_node(node, [q, k, v])
    want = _reference(q, k, v, 0.3, 2.0 if dtype == np.float32 else None, 0.5 if dtype == np.float32 else None)
    assert got.dtype == dtype and got.shape == (2, hq, 5, 3)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_flex_attention_in_a_model() -> None:
    f = TensorProto.FLOAT
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=DOMAIN, score_mod=_softcap_graph(1.5))
    graph = helper.make_graph([node], "flex", [helper.make_tensor_value_info(x, f, [1, 2, 4, 8]) for x in "qkv"],
                              [helper.make_tensor_value_info("y", f, [1, 2, 4, 8])])  # fmt: skip
    imports = [helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    model = OnnxModel(helper.make_model(graph, opset_imports=imports))
    q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
    for _ in range(3):  # (the third call replays the recorded kernels)
        out = model(q=q, k=k, v=v)["y"].numpy()
    np.testing.assert_allclose(out, _reference(q, k, v, cap=1.5), rtol=1e-5, atol=1e-6)


def test_flex_attention_errors() -> None:
    q = np.zeros((1, 3, 4, 8), np.float32)
    kv = np.zeros((1, 2, 4, 8), np.float32)
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=DOMAIN)
    with pytest.raises(OnnxError, match="must be a multiple of K and V's 2"):
        run_node(node, [q, kv, kv])
    with pytest.raises(OnnxError, match="must be 4-D"):
        run_node(node, [q[0], kv, kv])
    with pytest.raises(OnnxError, match="share heads and length"):
        run_node(node, [kv, kv, np.zeros((1, 2, 5, 8), np.float32)])
    two = _softcap_graph(1.0)
    two.input.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    bad = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=DOMAIN, score_mod=two)
    with pytest.raises(OnnxError, match="score_mod must take one input and give one output"):
        run_node(bad, [kv, kv, kv])
