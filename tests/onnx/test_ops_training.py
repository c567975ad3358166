"""The optimizers of domain ai.onnx.preview.training (tgcore/onnx/ops_training.py), checked against the update rules
written here in float64 numpy, through run_node and through a whole model that imports that domain alone; and the
errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tgcore.onnx import OnnxError, OnnxModel, UnsupportedOp, run_node  # noqa: E402

DOMAIN = "ai.onnx.preview.training"
rng = np.random.default_rng(0)


def _node(op_type: str, inputs: list[str], outputs: int, **attrs):  # noqa: ANN003, ANN201
    return helper.make_node(op_type, inputs, [f"y{i}" for i in range(outputs)], domain=DOMAIN, **attrs)


def _tensors(count: int, shape: tuple[int, ...], dtype: type = np.float32) -> list[np.ndarray]:
    return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]


def _positive(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    return rng.uniform(0.1, 2.0, shape).astype(dtype)


def _feed(r: float, t: int, groups: list[list[np.ndarray]], r_dtype: type = np.float32) -> list[np.ndarray]:
    return [np.array(r, r_dtype), np.array(t, np.int64), *[a for group in groups for a in group]]


def _names(groups: int, n: int) -> list[str]:
    return ["R", "T", *[f"in{g}_{i}" for g in range(groups) for i in range(n)]]


@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_with_every_attribute(t: int, dtype: type) -> None:
    n, shape = 2, (3, 4)
    xs, gs, vs = _tensors(n, shape, dtype), _tensors(n, shape, dtype), _tensors(n, shape, dtype)
    hs = [_positive(shape, dtype) for _ in range(n)]
    attrs = dict(alpha=0.8, beta=0.95, epsilon=1e-3, norm_coefficient=0.01, norm_coefficient_post=0.02)
    got = run_node(_node("Adam", _names(4, n), 3 * n, **attrs), _feed(0.1, t, [xs, gs, vs, hs]))
    for i in range(n):
        x, g, v, h = (a[i].astype(np.float64) for a in (xs, gs, vs, hs))
        g = 0.01 * x + g
        v_new, h_new = 0.8 * v + 0.2 * g, 0.95 * h + 0.05 * g * g
        r = 0.1 * np.sqrt(1 - 0.95**t) / (1 - 0.8**t) if t > 0 else 0.1
        x_new = (x - r * v_new / (np.sqrt(h_new) + 1e-3)) * 0.98
        for out, want in zip((got[i], got[n + i], got[2 * n + i]), (x_new, v_new, h_new)):
            assert out.dtype == dtype and out.shape == shape
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_adam_defaults() -> None:
    x, g, v = _tensors(3, (5,))
    h = _positive((5,))
    got = run_node(_node("Adam", ["R", "T", "x", "g", "v", "h"], 3), _feed(0.01, 1, [[x], [g], [v], [h]]))
    v_new, h_new = 0.9 * v + 0.1 * g, 0.999 * h + 0.001 * g.astype(np.float64) ** 2
    x_new = x - 0.01 * np.sqrt(1 - 0.999) / (1 - 0.9) * v_new / np.sqrt(h_new)
    np.testing.assert_allclose(got[0], x_new, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("t", [0, 5])
def test_adagrad(t: int) -> None:
    n, shape = 3, (2, 3)
    xs, gs = _tensors(n, shape), _tensors(n, shape)
    hs = [_positive(shape) for _ in range(n)]
    node = _node("Adagrad", _names(3, n), 2 * n, decay_factor=0.1, epsilon=1e-2, norm_coefficient=0.05)
    got = run_node(node, _feed(0.2, t, [xs, gs, hs]))
    for i in range(n):
        x, g, h = (a[i].astype(np.float64) for a in (xs, gs, hs))
        g = 0.05 * x + g
        h_new = h + g * g
        x_new = x - 0.2 / (1 + t * 0.1) * g / (np.sqrt(h_new) + 1e-2)
        np.testing.assert_allclose(got[i], x_new, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[n + i], h_new, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum(mode: str, t: int) -> None:
    xs, gs, vs = _tensors(2, (4,)), _tensors(2, (4,)), _tensors(2, (4,))
    node = _node("Momentum", _names(3, 2), 4, alpha=0.7, beta=0.3, mode=mode, norm_coefficient=0.1)
    got = run_node(node, _feed(0.5, t, [xs, gs, vs]))
    for i in range(2):
        x, g, v = (a[i].astype(np.float64) for a in (xs, gs, vs))
        g = 0.1 * x + g
        v_new = 0.7 * v + (0.3 if t > 0 else 1.0) * g  # (the gradient at full weight on the first update)
        x_new = x - 0.5 * (v_new if mode == "standard" else g + 0.7 * v_new)
        np.testing.assert_allclose(got[i], x_new, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2 + i], v_new, rtol=1e-5, atol=1e-6)


def _training_model(steps_domain: bool = True) -> onnx.ModelProto:
    """Two Momentum steps in a row on one tensor, a model that imports the training domain only (or, with
    steps_domain False, imports nothing of it)."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X1", "V1"], domain=DOMAIN, alpha=0.9, beta=1.0,
                         mode="standard", norm_coefficient=0.0),
        helper.make_node("Momentum", ["R", "T", "X1", "G", "V1"], ["X2", "V2"], domain=DOMAIN, alpha=0.9, beta=1.0,
                         mode="standard", norm_coefficient=0.0),
    ]  # fmt: skip
    inputs = [helper.make_tensor_value_info("R", f, []), helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [helper.make_tensor_value_info(name, f, [3]) for name in ("X", "G", "V")]
    outputs = [helper.make_tensor_value_info(name, f, [3]) for name in ("X2", "V2")]
    graph = helper.make_graph(nodes, "steps", inputs, outputs)
    imports = [helper.make_opsetid(DOMAIN, 1)] if steps_domain else [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=imports)


def test_a_model_of_the_training_domain_alone() -> None:
    model = OnnxModel(_training_model())
    x, g, v = (np.array(a, np.float32) for a in ([1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 0.0, 0.0]))
    for _ in range(3):  # (the third call replays the recorded kernels)
        out = model(R=np.array(0.1, np.float32), T=np.array(1, np.int64), X=x, G=g, V=v)
    v1 = g
    x1 = x - 0.1 * v1
    v2 = 0.9 * v1 + g
    np.testing.assert_allclose(out["X2"].numpy(), x1 - 0.1 * v2, rtol=1e-6)
    np.testing.assert_allclose(out["V2"].numpy(), v2, rtol=1e-6)


def test_a_node_of_a_domain_the_model_does_not_import() -> None:
    model = OnnxModel(_training_model(steps_domain=False), check=False)
    feed = dict(R=np.array(0.1, np.float32), T=np.array(1, np.int64), X=np.zeros(3, np.float32))
    with pytest.raises(UnsupportedOp, match="does not import domain 'ai.onnx.preview.training'"):
        model(**feed, G=np.zeros(3, np.float32), V=np.zeros(3, np.float32))


def test_bad_input_is_refused() -> None:
    x = np.zeros(3, np.float32)
    feed = _feed(0.1, 1, [[x], [x], [x]])
    with pytest.raises(OnnxError, match="'mode' must be 'standard' or 'nesterov'"):
        run_node(_node("Momentum", ["R", "T", "x", "g", "v"], 2, alpha=0.9, beta=0.1, mode="heavy",
                       norm_coefficient=0.0), feed)  # fmt: skip
    with pytest.raises(OnnxError, match="attribute 'alpha' is required"):
        run_node(_node("Momentum", ["R", "T", "x", "g", "v"], 2, beta=0.1, mode="standard", norm_coefficient=0.0), feed)
    with pytest.raises(OnnxError, match="R \\(the learning rate\\) must be a scalar"):
        run_node(_node("Adagrad", ["R", "T", "x", "g", "h"], 2), [np.zeros(2, np.float32), *feed[1:]])
    with pytest.raises(OnnxError, match="takes 4 groups of equally many tensors"):
        run_node(_node("Adam", ["R", "T", "x", "g", "v"], 3), feed)
    with pytest.raises(OnnxError, match="differ in shape"):
        run_node(_node("Adagrad", ["R", "T", "x", "g", "h"], 2), [*feed[:3], np.zeros(4, np.float32), x])
    with pytest.raises(UnsupportedOp, match="not an operator of domain 'ai.onnx.preview.training'"):
        run_node(_node("Lamb", ["R", "T", "x", "g", "v"], 2), feed)


@pytest.mark.parametrize("alpha, beta, t", [(0.0, 0.0, 2), (-0.5, 0.5, 3), (0.0, 0.9, 0)])
def test_adam_bias_correction_for_any_decay_rate(alpha: float, beta: float, t: int) -> None:
    """alpha ** T and beta ** T for rates of 0 and below 0, as numpy's powers give them."""
    x, g, v = _tensors(3, (6,))
    h = _positive((6,))
    node = _node("Adam", ["R", "T", "x", "g", "v", "h"], 3, alpha=alpha, beta=beta, epsilon=1e-4)
    got = run_node(node, _feed(0.05, t, [[x], [g], [v], [h]]))
    x, g, v, h = (a.astype(np.float64) for a in (x, g, v, h))
    v_new, h_new = alpha * v + (1 - alpha) * g, beta * h + (1 - beta) * g * g
    r = 0.05 * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else 0.05
    np.testing.assert_allclose(got[0], x - r * v_new / (np.sqrt(h_new) + 1e-4), rtol=1e-5, atol=1e-6)


# ***** Gradient: the graph differentiated *****


def _gradient_model(xs: list[str], zs: list[str], y: str) -> onnx.ModelProto:
    """u = x * x; v = Relu(u - z); y = v * w: Gradient(xs, zs) of `y`, with all of y, u and the derivatives out."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["u"]),
        helper.make_node("Sub", ["u", "z"], ["t"]),
        helper.make_node("Relu", ["t"], ["v"]),
        helper.make_node("Mul", ["v", "w"], ["y"]),
        helper.make_node(
            "Gradient", xs + zs, [f"d_{x}" for x in xs], domain=DOMAIN, xs=xs, y=y, **({"zs": zs} if zs else {})
        ),
    ]
    inputs = [helper.make_tensor_value_info(name, f, [4]) for name in ("x", "z", "w")]
    outputs = [helper.make_tensor_value_info(name, f, [4]) for name in ("y", *[f"d_{x}" for x in xs])]
    graph = helper.make_graph(nodes, "grad", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def test_gradient_of_a_graph() -> None:
    x, z, w = (np.array(a, np.float32) for a in ([1.0, -2.0, 0.5, 3.0], [0.5, 5.0, 0.0, 1.0], [2.0, 3.0, -1.0, 0.5]))
    model = OnnxModel(_gradient_model(["x", "w"], ["z"], "y"))
    for _ in range(3):  # (the third call replays the recorded kernels)
        out = model(x=x, z=z, w=w)
    on = (x * x - z) > 0
    np.testing.assert_allclose(out["y"].numpy(), np.where(on, x * x - z, 0) * w)
    np.testing.assert_allclose(out["d_x"].numpy(), np.where(on, 2 * x * w, 0))  # (of y's sum: per element here)
    np.testing.assert_allclose(out["d_w"].numpy(), np.where(on, x * x - z, 0))
    # a value that y does not depend on has a zero derivative; u depends on x only
    model = OnnxModel(_gradient_model(["x", "w"], [], "u"), check=False)
    out = model(x=x, z=z, w=w)
    np.testing.assert_allclose(out["d_x"].numpy(), 2 * x)
    np.testing.assert_array_equal(out["d_w"].numpy(), np.zeros(4, np.float32))


def test_gradient_errors() -> None:
    x = np.ones(4, np.float32)
    with pytest.raises(OnnxError, match="needs attributes xs"):
        bad = _gradient_model(["x"], [], "y")
        del bad.graph.node[-1].attribute[:]
        OnnxModel(bad, check=False)(x=x, z=x, w=x)
    with pytest.raises(OnnxError, match="is no value computed before it"):
        OnnxModel(_gradient_model(["x"], [], "nothing"), check=False)(x=x, z=x, w=x)
