"""OnnxModel, the per-opset registry and the CLI on small models built here, checked against numpy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tgcore.onnx import OnnxModel, UnsupportedOp  # noqa: E402
from tgcore.onnx.registry import REGISTRY, lookup  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=13):  # noqa: ANN001, ANN202
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_gemm_relu_softmax_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model = OnnxModel(_model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 3])], inits))
    assert model.input_names == ["x"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    h = np.maximum(x @ w + b, 0)
    want = np.exp(h - h.max(-1, keepdims=True))
    np.testing.assert_allclose(model(x=x)["y"].numpy(), want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_conv_and_maxpool_match_numpy() -> None:
    x = np.arange(2 * 1 * 5 * 5, dtype=np.float32).reshape(2, 1, 5, 5)
    w = np.ones((1, 1, 3, 3), np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    model = OnnxModel(
        _model(nodes, [_vi("x", [2, 1, 5, 5])], [_vi("y", [2, 1, 2, 2])], [numpy_helper.from_array(w, "w")])
    )
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((2, 1, 5, 5), np.float32)
    for i in range(5):
        for j in range(5):
            conv[:, :, i, j] = xp[:, :, i : i + 3, j : j + 3].sum((2, 3))
    want = conv[:, :, :4, :4].reshape(2, 1, 2, 2, 2, 2).max((3, 5))
    np.testing.assert_array_equal(model(x=x)["y"].numpy(), want)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_reads_axes_from_an_attribute_then_an_input(opset: int) -> None:
    if opset < 13:
        nodes = [helper.make_node("Squeeze", ["x"], ["y"], axes=[1])]
        inits = []
    else:
        nodes = [helper.make_node("Squeeze", ["x", "axes"], ["y"])]
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    model = OnnxModel(_model(nodes, [_vi("x", [3, 1, 2])], [_vi("y", [3, 2])], inits, opset=opset))
    x = np.arange(6, dtype=np.float32).reshape(3, 1, 2)
    np.testing.assert_array_equal(model(x=x)["y"].numpy(), x[:, 0])


def test_registry_picks_the_newest_version_not_after_the_opset() -> None:
    assert sorted(REGISTRY["ReduceSum"]) == [1, 13]  # axes became an input in 13
    assert lookup("Softmax", 12) is REGISTRY["Softmax"][1] and lookup("Softmax", 28) is REGISTRY["Softmax"][13]
    with pytest.raises(UnsupportedOp, match=r"Celu \(opset 11\).*only from opset 12"):
        lookup("Celu", 11)


def test_unsupported_op_names_op_and_opset() -> None:
    model = _model([helper.make_node("StringNormalizer", ["x"], ["y"])], [_vi("x", [1])], [_vi("y", [1])], opset=17)
    with pytest.raises(UnsupportedOp, match=r"StringNormalizer \(opset 17\).*string tensors"):
        OnnxModel(model, check=False)(x=np.zeros(1, np.float32))


def test_every_default_domain_operator_runs_or_is_refused_with_its_reason() -> None:
    from tgcore.onnx.registry import REFUSED

    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    assert sorted(names - set(REGISTRY)) == sorted(REFUSED)  # nothing left unexplained
    model = _model([helper.make_node("ImageDecoder", ["x"], ["y"])], [_vi("x", [1])], [_vi("y", [1])], opset=20)
    with pytest.raises(UnsupportedOp, match=r"ImageDecoder \(opset 20\).*image codec"):
        OnnxModel(model, check=False)(x=np.zeros(1, np.float32))


def test_a_model_of_other_domains_only_names_them() -> None:
    node = helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [_vi("x", [2])], [_vi("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(Exception, match=r"imports 'com.microsoft' version 1\); its nodes use com.microsoft.FusedGemm"):
        OnnxModel(model, check=False)
    # a domain tgcore runs some of (ai.onnx.ml): an operator of it that it does not run is named with those it does
    node = helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml")
    graph = helper.make_graph([node], "g", [_vi("x", [2])], [_vi("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    with pytest.raises(UnsupportedOp, match=r"Normalizer.*not an operator of domain 'ai.onnx.ml' that tgcore runs "
                       r"\(it runs ArrayFeatureExtractor, Binarizer, TreeEnsemble\)"):  # fmt: skip
        OnnxModel(model, check=False)(x=np.zeros(2, np.float32))


def test_missing_input_is_a_clear_error() -> None:
    model = OnnxModel(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])]))
    with pytest.raises(Exception, match=r"missing inputs \['x'\]"):
        model()


def test_cli_runs_a_model_file(tmp_path) -> None:  # noqa: ANN001
    path, xs = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(_model([helper.make_node("Neg", ["x"], ["y"])], [_vi("x", [3])], [_vi("y", [3])]), path)
    np.save(xs, np.array([1.0, -2.0, 3.0], np.float32))
    out = subprocess.run(
        [sys.executable, "-m", "tgcore.onnx", str(path), "--input", f"x={xs}", "--bench", "2"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "y: shape (3,) float32 [-1.  2. -3.]" in out and "2 runs" in out


def test_loop_slices_by_its_iteration_number() -> None:
    """A body that slices by the iteration count: each iteration's host-known values are its own."""
    x = np.arange(5, dtype=np.float32)
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    body = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["i", "zero"], ["start"]),
            helper.make_node("Add", ["start", "one"], ["end"]),
            helper.make_node("Slice", ["x", "start", "end"], ["piece"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _vi("piece", [1])],
        initializer=[one, helper.make_tensor("zero", TensorProto.INT64, [1], [0])],
    )
    nodes = [helper.make_node("Loop", ["trip", ""], ["pieces"], body=body)]
    trip = numpy_helper.from_array(np.array(5, np.int64), "trip")
    model = OnnxModel(_model(nodes, [_vi("x", [5])], [_vi("pieces", [5, 1])], [trip]), check=False)
    np.testing.assert_array_equal(model(x=x)["pieces"].numpy(), x.reshape(5, 1))


def test_sequences_in_and_out() -> None:
    seq_type = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("SequenceInsert", ["s", "x"], ["s2"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=0),
        helper.make_node("SequenceLength", ["s2"], ["n"]),
    ]
    outs = [_vi("y", [None]), helper.make_tensor_value_info("n", TensorProto.INT64, [])]
    model = OnnxModel(_model(nodes, [seq_type, _vi("x", [2])], outs, opset=13))
    a, b, x = np.ones(3, np.float32), np.zeros(1, np.float32), np.array([5, 6], np.float32)
    out = model(s=[a, b], x=x)
    np.testing.assert_array_equal(out["y"].numpy(), np.concatenate([a, b, x]))
    assert int(out["n"].numpy()) == 3


def test_topk_and_scatter_elements_match_numpy() -> None:
    rng = np.random.default_rng(1)
    x = rng.permutation(24).astype(np.float32).reshape(4, 6)
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
        helper.make_node("ScatterElements", ["x", "i", "v"], ["s"], axis=1, reduction="add"),
    ]
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    outs = [_vi("v", [4, 3]), helper.make_tensor_value_info("i", TensorProto.INT64, [4, 3]), _vi("s", [4, 6])]
    out = OnnxModel(_model(nodes, [_vi("x", [4, 6])], outs, [k], opset=18))(x=x)
    order = np.argsort(-x, axis=1)[:, :3]
    np.testing.assert_array_equal(out["i"].numpy(), order)
    np.testing.assert_array_equal(out["v"].numpy(), np.take_along_axis(x, order, 1))
    want = x.copy()
    np.put_along_axis(want, order, 2 * np.take_along_axis(x, order, 1), 1)
    np.testing.assert_array_equal(out["s"].numpy(), want)


def test_a_dtype_the_device_lacks_names_the_op_or_initializer(monkeypatch) -> None:  # noqa: ANN001
    """As on a device without float64: the Cast node, or the initializer, that needs it is named, with the opset."""
    import tgcore.lazy as lazy
    from tgcore import Device, dtypes

    dev = Device.DEFAULT
    lacking = frozenset(d for d in Device[dev].spec.dtypes if d != dtypes.float64)
    monkeypatch.setitem(lazy._DEVICE_DTYPES, dev, lacking)
    monkeypatch.setitem(lazy._SUPPORTED, dev, {})
    cast = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE, name="to_double")
    out = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])
    model = OnnxModel(_model([cast], [_vi("x", [2])], [out]), device=dev)
    with pytest.raises(UnsupportedOp, match=r"Cast \(opset 13\) is not supported: node 'to_double' needs a dtype"):
        model(x=np.ones(2, np.float32))
    init = numpy_helper.from_array(np.ones(2, np.float64), "w")
    add = helper.make_node("Add", ["x", "w"], ["y"])
    with pytest.raises(UnsupportedOp, match=r"initializer 'w': device .* does not support"):
        OnnxModel(_model([add], [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])], [out], [init]), dev)


def _gemm_relu(rng: np.random.Generator, **kwargs: int) -> tuple[OnnxModel, np.ndarray, np.ndarray]:
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    return OnnxModel(_model(nodes, [_vi("x", ["n", 4])], [_vi("y", ["n", 3])], inits), **kwargs), w, b


def test_repeated_calls_replay_the_recorded_kernels_with_new_values() -> None:
    """From the third call of one input signature the graph's recorded kernels run again: each call's outputs are
    its own inputs' results, and outputs of earlier calls stay as they were (they are copies, not the recording's
    buffers). With dynamic dimensions off (dynamic_max=0), another batch size gets a recording of its own (with them
    on, one recording serves every batch size: tests/onnx/test_dynamic.py)."""
    from tgcore.helpers import GlobalCounters

    rng = np.random.default_rng(1)
    model, w, b = _gemm_relu(rng, dynamic_max=0)
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(5)]
    outs = [model(x=x)["y"] for x in xs]
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out.numpy(), np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
    replay = next(iter(model._replays.values()))
    assert replay is not None and replay.static and replay.jit.cnt == 2  # (recorded: the last calls replayed)
    before = GlobalCounters.kernel_count
    x5 = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(model(x=x5)["y"].numpy(), np.maximum(x5 @ w + b, 0), rtol=1e-5, atol=1e-6)
    assert GlobalCounters.kernel_count > before and len(model._replays) == 2


def test_a_graph_that_reads_computed_values_is_not_replayed() -> None:
    """NonZero's output shape depends on the values: every call walks the graph again, so each is right."""
    nodes = [helper.make_node("NonZero", ["x"], ["idx"]), helper.make_node("Identity", ["x"], ["same"])]
    outs = [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, None]), _vi("same", [4])]
    model = OnnxModel(_model(nodes, [_vi("x", [4])], outs))
    for x in ([0, 1, 0, 2], [3, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 5]):
        arr = np.array(x, np.float32)
        out = model(x=arr)
        np.testing.assert_array_equal(out["idx"].numpy(), np.array(np.nonzero(arr)))
        np.testing.assert_array_equal(out["same"].numpy(), arr)
    assert list(model._replays.values()) == [None]


def test_an_output_that_is_an_input_is_the_new_input() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Neg", ["x"], ["neg"])]
    model = OnnxModel(_model(nodes, [_vi("x", [3])], [_vi("same", [3]), _vi("neg", [3])]))
    for k in range(4):
        x = np.full(3, k, np.float32)
        out = model(x=x)
        np.testing.assert_array_equal(out["same"].numpy(), x)
        np.testing.assert_array_equal(out["neg"].numpy(), -x)
