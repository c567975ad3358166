"""Dynamic dimensions as symbolic Variables: a model whose inputs declare a dim_param ("batch") walks its graph and
records its kernels once, and that recording serves every batch size; graphs that need concrete sizes fall back to a
recording per input shape, with the same right answers. Results are checked against onnx's reference evaluator or
numpy at several sizes, and the graph walks are counted (a walk is what a replay saves)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tgcore import Tensor  # noqa: E402
from tgcore.onnx import OnnxModel  # noqa: E402


def _model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], opset: int = 17) -> Any:
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, shape: list, elem: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _counted(model: OnnxModel) -> list[int]:
    """A counter of the model's graph walks (plain runs and recordings; a replay walks nothing)."""
    walks = [0]
    run = model._run

    def counting(*args: Any, **kwargs: Any) -> Any:
        walks[0] += 1
        return run(*args, **kwargs)

    model._run = counting  # type: ignore[method-assign]
    return walks


def _symbolic(model: OnnxModel) -> list:
    return [k for k, r in model._replays.items() if k[0] == "symbolic" and r is not None]


def _check(
    proto: Any, sizes: list[int], make: Callable[[int], dict[str, np.ndarray]], **kwargs: Any
) -> tuple[OnnxModel, list[int]]:
    """Run the model at each size against onnx's reference evaluator; returns it and its walk counter."""
    ref = ReferenceEvaluator(proto)
    model = OnnxModel(proto, **kwargs)
    walks = _counted(model)
    for n in sizes:
        feed = make(n)
        got = model(**feed)
        for name, want in zip(model.output_names, ref.run(None, feed)):
            assert got[name].shape == want.shape, (n, name)
            np.testing.assert_allclose(got[name].numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"size {n}, {name}")
    return model, walks


rng = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _mlp() -> Any:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b2"], ["y"]),
    ]
    inits = {"w1": _f32(4, 8), "b1": _f32(8), "w2": _f32(8, 3), "b2": _f32(3)}
    return _model(nodes, [_vi("x", ["batch", 4])], [_vi("y", ["batch", 3])], inits)


def test_an_mlp_is_recorded_once_for_every_batch_size() -> None:
    """Batch 1, 2, 5, 3, 16, 7: the first call walks the graph, the second records it, the rest replay that one
    recording with the batch size as the kernels' argument."""
    proto = _mlp()
    model, walks = _check(proto, [1, 2, 5, 3, 1, 16, 7, 5], lambda n: {"x": _f32(n, 4)})
    assert walks[0] == 2 and len(model._replays) == 1 and len(_symbolic(model)) == 1
    assert model.symbolic_fallback is None


def test_outputs_of_earlier_calls_stay_as_they_were() -> None:
    """Each output is copied out of the recording's buffers at its own size: later calls do not overwrite it."""
    model = OnnxModel(_mlp())
    ref = ReferenceEvaluator(model.proto)
    xs = [_f32(n, 4) for n in (3, 1, 6, 2, 6)]
    outs = [model(x=x)["y"] for x in xs]
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out.numpy(), ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert len(_symbolic(model)) == 1


def test_tensor_inputs_run_symbolically_too() -> None:
    model = OnnxModel(_mlp())
    ref = ReferenceEvaluator(model.proto)
    walks = _counted(model)
    for n in (2, 4, 1, 3):
        x = _f32(n, 4)
        np.testing.assert_allclose(model(x=Tensor(x))["y"].numpy(), ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert walks[0] == 2


def test_a_conv_net_is_recorded_once_for_every_batch_size() -> None:
    """Conv, BatchNormalization, Relu, MaxPool, GlobalAveragePool, Flatten and Gemm over a dynamic batch."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["p"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["ap"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = {"w": _f32(6, 3, 3, 3), "cb": _f32(6), "scale": _f32(6), "bias": _f32(6), "mean": _f32(6),
             "var": np.abs(_f32(6)) + 0.5, "fw": _f32(5, 6), "fb": _f32(5)}  # fmt: skip
    proto = _model(nodes, [_vi("x", ["N", 3, 8, 8])], [_vi("y", ["N", 5])], inits)
    model, walks = _check(proto, [2, 1, 5, 3, 5], lambda n: {"x": _f32(n, 3, 8, 8)})
    assert walks[0] == 2 and len(_symbolic(model)) == 1, model.symbolic_fallback


def _shape_chain() -> Any:
    """torch's exporter's way of a view(x.shape[0], -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape; then the
    batch size times 2 by Mul for a ConstantOfShape, the output's Shape for an Expand, and the Shape as an output."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        helper.make_node("Concat", ["bu", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["h"]),
        helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
        helper.make_node("Mul", ["c", "two"], ["c2"]),
        helper.make_node("Div", ["c2", "two"], ["c1"]),
        helper.make_node("Cast", ["c1"], ["c1i"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["c1i", "ax0"], ["cu"]),
        helper.make_node("Concat", ["bu", "cu", "two1"], ["shape2"], axis=0),
        helper.make_node("ConstantOfShape", ["shape2"], ["k"], value=numpy_helper.from_array(np.array([0.5], "f4"))),
        helper.make_node("ReduceSum", ["k", "ax1"], ["ks"], keepdims=0),
        helper.make_node("Add", ["h", "ks"], ["hk"]),
        helper.make_node("Shape", ["hk"], ["hs"]),
        helper.make_node("Expand", ["bias", "hs"], ["e"]),
        helper.make_node("Add", ["hk", "e"], ["y"]),
    ]
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "ax0": np.array([0], np.int64),
             "ax1": np.array([1], np.int64), "minus1": np.array([-1], np.int64), "two": np.array(2, np.int64),
             "two1": np.array([2], np.int64), "w": _f32(12, 2), "bias": _f32(1, 2)}  # fmt: skip
    outputs = [_vi("y", ["batch", 2]), _vi("s", [3], TensorProto.INT64)]
    return _model(nodes, [_vi("x", ["batch", 3, 4])], outputs, inits)


def test_a_shape_read_from_a_symbolic_tensor_reshapes_symbolically() -> None:
    """Shape gives the batch size as a symbolic size on the host: Gather, Unsqueeze, Concat, Mul, Div and Cast keep it
    there, Reshape, ConstantOfShape and Expand take it, and Shape's own output holds each call's sizes."""
    model, walks = _check(_shape_chain(), [1, 2, 5, 3, 5, 4], lambda n: {"x": _f32(n, 3, 4)})
    assert walks[0] == 2 and len(_symbolic(model)) == 1, model.symbolic_fallback


def test_inputs_sharing_a_dim_param_share_its_variable() -> None:
    """x and y are both ["batch", 4]: one Variable, one recording; sizes that disagree (which broadcast, 1 against 3)
    run with concrete shapes, rightly."""
    nodes = [helper.make_node("Mul", ["x", "y"], ["p"]), helper.make_node("Softmax", ["p"], ["z"], axis=-1)]
    proto = _model(nodes, [_vi("x", ["batch", 4]), _vi("y", ["batch", 4])], [_vi("z", ["batch", 4])], {})
    model, walks = _check(proto, [1, 4, 2, 3], lambda n: {"x": _f32(n, 4), "y": _f32(n, 4)})
    assert walks[0] == 2 and len(_symbolic(model)) == 1
    (key,) = _symbolic(model)
    assert [s for _, s, _, _ in key[1]] == [("dyn0_batch", 4)] * 2
    ref = ReferenceEvaluator(proto)
    x, y = _f32(3, 4), _f32(1, 4)
    np.testing.assert_allclose(model(x=x, y=y)["z"].numpy(), ref.run(None, {"x": x, "y": y})[0], rtol=1e-5)
    assert walks[0] == 3 and len(model._replays) == 2  # (a recording of that signature of its own)


def test_a_size_called_again_and_again_gets_kernels_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past dynamic.HOT_CALLS calls (3 here) a size is recorded with its concrete shapes (kernels made for its sizes run
    a little faster than the symbolic ones); the symbolic recording still serves the other sizes, without a walk."""
    from tgcore.onnx import dynamic

    monkeypatch.setattr(dynamic, "HOT_CALLS", 3)
    sizes = [4] * (dynamic.HOT_CALLS + 3) + [2, 7, 4, 1]
    model, walks = _check(_mlp(), sizes, lambda n: {"x": _f32(n, 4)})
    concrete = [k for k, r in model._replays.items() if k[0] != "symbolic" and r is not None]
    assert len(_symbolic(model)) == 1 and [k[0][1] for k in concrete] == [(4, 4)]
    assert walks[0] == 4  # (the symbolic recording: 2; size 4's own: 2)


def test_a_size_past_the_bound_runs_with_concrete_shapes() -> None:
    """dynamic_max=4: sizes 1 to 4 share one recording, 6 gets a recording of its own shape."""
    model, walks = _check(_mlp(), [1, 3, 4, 2, 6, 6, 6, 2], lambda n: {"x": _f32(n, 4)}, dynamic_max=4)
    assert len(_symbolic(model)) == 1 and len(model._replays) == 2
    assert walks[0] == 4  # (2 for the symbolic recording, 2 for the one of shape (6, 4))


def test_each_tier_of_sizes_is_a_recording() -> None:
    """Sizes 1-16 share a Variable bounded by 16, 17-32 one bounded by 32: buffers get room for the bound."""
    model, walks = _check(_mlp(), [3, 16, 17, 30, 1, 32], lambda n: {"x": _f32(n, 4)})
    assert sorted(k[2] for k in _symbolic(model)) == [(("dyn0_batch", 16),), (("dyn0_batch", 32),)]
    assert walks[0] == 4


def test_dynamic_max_0_records_each_shape() -> None:
    model, walks = _check(_mlp(), [1, 2, 2, 2], lambda n: {"x": _f32(n, 4)}, dynamic_max=0)
    assert not _symbolic(model) and len(model._replays) == 2 and walks[0] == 3


def test_an_unnamed_dynamic_dimension_and_an_odd_dim_param_are_variables() -> None:
    """A dimension with neither value nor name is a Variable of its own; a dim_param that is no C name still
    renders (the Variables' names are made of it)."""
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Neg", ["s"], ["z"])]
    proto = _model(nodes, [_vi("x", ["batch size", None, 2]), _vi("y", [1, 1, 2])], [_vi("z", [None, None, 2])], {})
    model, walks = _check(proto, [1, 3, 2, 4], lambda n: {"x": _f32(n, 5 - n, 2), "y": _f32(1, 1, 2)})
    assert walks[0] == 2 and len(_symbolic(model)) == 1
    (key,) = _symbolic(model)
    assert key[1][0][1] == ("dyn0_batch_size", "dyn1_x_1", 2)


def test_more_operators_take_a_symbolic_batch() -> None:
    """An embedding Gather, Slice, Split, Transpose, Concat, Softmax, LayerNormalization, ReduceMean and ArgMax over
    static axes, Where, Squeeze and Unsqueeze with axes, Trilu, and an Expand of a device tensor: one recording."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),  # (batch, 4, 6)
        helper.make_node("Slice", ["emb", "starts", "ends", "axes"], ["sl"]),  # (batch, 4, 4)
        helper.make_node("Split", ["sl", "halves"], ["a", "b"], axis=2),  # 2 x (batch, 4, 2)
        helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),  # (batch, 2, 4)
        helper.make_node("MatMul", ["b", "at"], ["att"]),  # (batch, 4, 4)
        helper.make_node("Trilu", ["att"], ["low"], upper=0),
        helper.make_node("Softmax", ["low"], ["sm"], axis=-1),
        helper.make_node("Concat", ["sm", "sl"], ["cat"], axis=2),  # (batch, 4, 8)
        helper.make_node("LayerNormalization", ["cat", "gamma", "beta"], ["ln"], axis=-1),
        helper.make_node("ReduceMean", ["ln", "ax2"], ["mean"], keepdims=1),  # (batch, 4, 1)
        helper.make_node("Squeeze", ["mean", "ax2"], ["sq"]),  # (batch, 4)
        helper.make_node("Unsqueeze", ["sq", "ax1"], ["un"]),  # (batch, 1, 4)
        helper.make_node("Shape", ["un"], ["us"]),
        helper.make_node("Expand", ["un", "us"], ["ex"]),
        helper.make_node("ArgMax", ["cat"], ["am"], axis=2, keepdims=0),  # (batch, 4) int64
        helper.make_node("Greater", ["sq", "zero"], ["pos"]),
        helper.make_node("Where", ["pos", "sq", "zero"], ["y"]),
    ]
    ints = {"starts": [1], "ends": [5], "axes": [2], "halves": [2, 2], "ax1": [1], "ax2": [2]}
    inits = {"table": _f32(10, 6), "gamma": _f32(8), "beta": _f32(8), "zero": np.array(0, np.float32)}
    inits.update({k: np.array(v, np.int64) for k, v in ints.items()})
    outputs = [_vi("y", ["batch", 4]), _vi("ex", ["batch", 1, 4]), _vi("am", ["batch", 4], TensorProto.INT64)]
    proto = _model(nodes, [_vi("ids", ["batch", 4], TensorProto.INT64)], outputs, inits, opset=18)
    model, walks = _check(proto, [2, 1, 5, 3, 5], lambda n: {"ids": rng.integers(0, 10, (n, 4)).astype(np.int64)})
    assert walks[0] == 2 and len(_symbolic(model)) == 1, model.symbolic_fallback


def test_a_range_of_the_batch_size_and_a_causal_mask_are_symbolic() -> None:
    """Range(0, batch) has a symbolic length; Trilu over symbolic rows and columns, a Softmax over the symbolic axis
    and a MatMul whose inner size is symbolic reduce over it."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Range", ["zero", "b", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["rf", "ax1"], ["ru"]),
        helper.make_node("Mul", ["x", "ru"], ["xr"]),  # (batch, 3): row i times i
        helper.make_node("Transpose", ["xr"], ["xt"]),
        helper.make_node("MatMul", ["xr", "xt"], ["g"]),  # (batch, batch)
        helper.make_node("Trilu", ["g"], ["low"], upper=0),
        helper.make_node("Softmax", ["low"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "xr"], ["y"]),  # (batch, 3): an inner size of batch
    ]
    inits = {"i0": np.array(0, np.int64), "zero": np.array(0, np.int64), "one": np.array(1, np.int64),
             "ax1": np.array([1], np.int64)}  # fmt: skip
    proto = _model(
        nodes, [_vi("x", ["batch", 3])], [_vi("y", ["batch", 3]), _vi("r", ["batch"], TensorProto.INT64)], inits
    )
    model, walks = _check(proto, [2, 3, 1, 5, 3], lambda n: {"x": _f32(n, 3)})
    assert walks[0] == 2 and len(_symbolic(model)) == 1, model.symbolic_fallback


# ***** what falls back, rightly *****


def test_an_operator_not_known_to_take_symbolic_sizes_falls_back() -> None:
    """Tile is not among the operators that take symbolic sizes: each batch size is recorded on its own, each right."""
    nodes = [helper.make_node("Tile", ["x", "reps"], ["t"]), helper.make_node("Neg", ["t"], ["y"])]
    proto = _model(nodes, [_vi("x", ["batch", 3])], [_vi("y", [None, 6])], {"reps": np.array([1, 2], np.int64)})
    model, walks = _check(proto, [2, 3, 2, 2, 5], lambda n: {"x": _f32(n, 3)})
    assert "Tile" in str(model.symbolic_fallback) and not _symbolic(model)
    # (the symbolic walk that meets Tile; then 2, 3: walked; 2: recorded; 2: replayed; 5: walked)
    assert len(model._replays) == 3 and walks[0] == 5


def test_a_symbolic_size_read_as_a_number_falls_back() -> None:
    """Slice's ends read on the host as ints: a symbolic size there is a number only at one size."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["b"]),
        helper.make_node("Slice", ["x", "zero", "b", "one"], ["y"]),  # x[:, :batch]
    ]
    inits = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64)}
    proto = _model(nodes, [_vi("x", ["batch", 8])], [_vi("y", ["batch", None])], inits)
    model, _ = _check(proto, [2, 5, 2, 2, 3], lambda n: {"x": _f32(n, 8)})
    assert "Slice reads a symbolic size as a number" in str(model.symbolic_fallback) and not _symbolic(model)


def test_a_size_inferred_by_a_floor_division_falls_back() -> None:
    """Reshape of ["batch", 6] to (-1, 4): -1 is batch * 6 // 4, right at one size only; concrete shapes instead."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    proto = _model(nodes, [_vi("x", ["batch", 6])], [_vi("y", [None, 4])], {"shape": np.array([-1, 4], np.int64)})
    model, _ = _check(proto, [2, 4, 6, 2], lambda n: {"x": _f32(n, 6)})
    assert "Reshape" in str(model.symbolic_fallback) and not _symbolic(model)


def test_squeeze_without_axes_of_a_symbolic_size_falls_back() -> None:
    """Squeeze drops the batch axis where its size is 1: that differs by size, so it runs with concrete shapes."""
    nodes = [helper.make_node("Squeeze", ["x"], ["y"])]
    proto = _model(nodes, [_vi("x", ["batch", 1, 3])], [_vi("y", [None, 3])], {}, opset=13)
    model, _ = _check(proto, [1, 3, 1], lambda n: {"x": _f32(n, 1, 3)})
    assert "Squeeze" in str(model.symbolic_fallback)


def test_a_reduction_over_the_symbolic_axis_falls_back() -> None:
    nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=0)]
    proto = _model(nodes, [_vi("x", ["batch", 3])], [_vi("y", [3])], {}, opset=13)
    model, _ = _check(proto, [2, 5, 2, 2], lambda n: {"x": _f32(n, 3)})
    assert "ReduceMean" in str(model.symbolic_fallback) and not _symbolic(model)


def test_an_output_that_is_the_input_falls_back() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Neg", ["x"], ["neg"])]
    proto = _model(nodes, [_vi("x", ["batch", 2])], [_vi("same", ["batch", 2]), _vi("neg", ["batch", 2])], {})
    model, _ = _check(proto, [1, 2, 3, 3, 3, 1], lambda n: {"x": _f32(n, 2)})
    assert "input" in str(model.symbolic_fallback)


def test_two_symbolic_sizes_in_one_reduction_are_right() -> None:
    """A LayerNormalization over (batch, seq, 8): whether the core runs it symbolically or not (a kernel whose merged
    axis holds both sizes needs a division by a symbolic size), each call is right, and one that fails symbolically
    is not tried symbolically again."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)]
    proto = _model(
        nodes, [_vi("x", ["batch", "seq", 8])], [_vi("y", ["batch", "seq", 8])], {"g": _f32(8), "b": _f32(8)}
    )
    model, walks = _check(proto, [1, 2, 3, 2, 2], lambda n: {"x": _f32(n, 5 - n, 8)})
    assert walks[0] <= 6  # (symbolically: 2; else the failed symbolic walk, 1, 2, 3 walked, 2 recorded, 2 replayed)


def test_an_index_out_of_range_at_a_replay_raises_and_the_recording_stays() -> None:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    outputs = [_vi("y", ["batch", 3, 4])]
    proto = _model(nodes, [_vi("ids", ["batch", 3], TensorProto.INT64)], outputs, {"table": _f32(10, 4)})
    model, walks = _check(proto, [2, 3, 4], lambda n: {"ids": rng.integers(0, 10, (n, 3)).astype(np.int64)})
    with pytest.raises(IndexError, match="out of bounds"):
        model(ids=np.array([[1, 2, 30]], np.int64))
    assert len(_symbolic(model)) == 1 and not model._not_symbolic
    before = walks[0]
    ids = np.array([[1, 2, 3]], np.int64)
    np.testing.assert_array_equal(model(ids=ids)["y"].numpy(), ReferenceEvaluator(proto).run(None, {"ids": ids})[0])
    assert walks[0] == before  # (replayed)
