"""GridSample, DeformConv, RoiAlign, Col2Im and Det (tgcore/onnx/ops_spatial.py) on shapes and attributes beyond the
backend suite's cases, checked against onnx's reference evaluator, torch and numpy run here; and their bad inputs."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tgcore.errors import IndexOutOfRangeError  # noqa: E402
from tgcore.onnx import OnnxModel, UnsupportedOp  # noqa: E402


def _model(op_type: str, inputs: dict[str, np.ndarray], opset: int, consts: Optional[dict] = None, **attrs: Any):  # noqa: ANN202
    """A one-node model: `inputs` are graph inputs, `consts` initializers (values an op reads on the host)."""
    consts = consts or {}
    names = [*inputs, *consts]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()
    ]
    y = helper.make_tensor_value_info("y", 0, None)
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph([node], "g", graph_inputs, [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return OnnxModel(model, check=False)(**inputs)["y"].numpy()


def _reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return ReferenceEvaluator(model).run(None, inputs)[0]


def _check(op_type: str, inputs: dict, opset: int, consts: Optional[dict] = None, tol: float = 1e-5, **attrs: Any):  # noqa: ANN202
    model = _model(op_type, inputs, opset, consts, **attrs)
    got, want = _run(model, inputs), _reference(model, inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return got


# ***** GridSample *****


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d_matches_torch_and_reference(mode: str, padding: str, align: int) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    grid = rng.uniform(-2.6, 2.6, (2, 3, 7, 2)).astype(np.float32)  # far outside too: reflected more than once
    grid[0, 0, :3] = [[-1, -1], [1, 1], [0.25, -0.75]]  # the corners, and points between pixel centers
    inputs = {"x": x, "grid": grid}
    model = _model("GridSample", inputs, 20, mode=mode, padding_mode=padding, align_corners=align)
    got = _run(model, inputs)
    torch_mode = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
    want = torch.nn.functional.grid_sample(
        torch.from_numpy(x), torch.from_numpy(grid), torch_mode, padding, align_corners=bool(align)
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if (mode, padding) != ("cubic", "border"):  # (onnx's reference clamps the point, not each tap: see below)
        np.testing.assert_allclose(got, _reference(model, inputs), rtol=1e-5, atol=1e-5)


def test_grid_sample_cubic_border_clamps_each_tap_as_onnxruntime_does() -> None:
    """Beyond the edge, cubic with border padding reads each of the 16 taps clamped into the image (torch and
    onnxruntime); onnx's reference evaluator clamps the point first, which differs there."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(9)
    inputs = {"x": rng.standard_normal((1, 2, 4, 5)).astype(np.float32),
              "grid": rng.uniform(-1.8, 1.8, (1, 3, 6, 2)).astype(np.float32)}  # fmt: skip
    for align in (0, 1):
        model = _model("GridSample", inputs, 20, mode="cubic", padding_mode="border", align_corners=align)
        model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(_run(model, inputs), session.run(None, inputs)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_3d_matches_reference(mode: str, padding: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.5, 1.5, (1, 2, 3, 4, 3)).astype(np.float32)
    _check("GridSample", {"x": x, "grid": grid}, 20, mode=mode, padding_mode=padding)


def test_grid_sample_nearest_rounds_half_to_even() -> None:
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 1, 5)
    # align_corners=1 on width 5: x = (g + 1) * 2, so g = -0.75, -0.25, 0.25 fall on 0.5, 1.5, 2.5
    grid = np.array([[[[-0.75, 0], [-0.25, 0], [0.25, 0]]]], np.float32)
    model = _model("GridSample", {"x": x, "grid": grid}, 20, mode="nearest", align_corners=1)
    np.testing.assert_array_equal(_run(model, {"x": x, "grid": grid}), [[[[0, 2, 2]]]])


def test_grid_sample_opset_16_names_and_float64_match_torch() -> None:
    """Opset 16 names the modes bilinear and bicubic (onnx's reference evaluator knows only the later names)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, grid = rng.standard_normal((1, 2, 4, 3)), rng.uniform(-1.2, 1.2, (1, 5, 2, 2))
    for mode in ("bilinear", "bicubic", "nearest"):
        got = _run(
            _model("GridSample", {"x": x, "grid": grid}, 16, mode=mode, padding_mode="border"), {"x": x, "grid": grid}
        )
        want = torch.nn.functional.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), mode, "border", False)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)


def test_grid_sample_of_integers_rounds_the_interpolation() -> None:
    rng = np.random.default_rng(11)
    x = rng.integers(-50, 50, (1, 2, 4, 5)).astype(np.int32)
    grid = rng.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    as_float = {"x": x.astype(np.float32), "grid": grid}
    want = np.round(_run(_model("GridSample", as_float, 20), as_float))
    got = _run(_model("GridSample", {"x": x, "grid": grid}, 20), {"x": x, "grid": grid})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_grid_sample_bad_inputs_are_clear_errors() -> None:
    x, grid = np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32)
    with pytest.raises(UnsupportedOp, match="mode 'bilinear'"):  # (opset 20 renamed it linear)
        _run(_model("GridSample", {"x": x, "grid": grid}, 20, mode="bilinear"), {"x": x, "grid": grid})
    with pytest.raises(UnsupportedOp, match="padding_mode 'wrap'"):
        _run(_model("GridSample", {"x": x, "grid": grid}, 20, padding_mode="wrap"), {"x": x, "grid": grid})
    bad = np.zeros((1, 2, 2, 3), np.float32)  # 3 components for 2 spatial axes
    with pytest.raises(UnsupportedOp, match=r"grid \(N, \*out, 2\)"):
        _run(_model("GridSample", {"x": x, "grid": bad}, 20), {"x": x, "grid": bad})
    x5, g5 = np.zeros((1, 1, 2, 2, 2), np.float32), np.zeros((1, 1, 1, 1, 3), np.float32)
    with pytest.raises(UnsupportedOp, match="only 4-D"):
        _run(_model("GridSample", {"x": x5, "grid": g5}, 16), {"x": x5, "grid": g5})


# ***** DeformConv *****


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]},
        {"group": 2, "offset_group": 2, "pads": [1, 1, 1, 1]},
        {"group": 2, "offset_group": 4, "strides": [1, 2]},
    ],
)
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv_matches_reference(attrs: dict, with_mask: bool) -> None:
    rng = np.random.default_rng(4)
    n, c, oc, h, w, kernel = 2, 4, 6, 6, 5, (3, 2)
    group, offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)
    st, pads, dils = attrs.get("strides", [1, 1]), attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    out = [(s + pads[i] + pads[i + 2] - d * (k - 1) - 1) // t + 1 for i, (s, k, t, d) in
           enumerate(zip((h, w), kernel, st, dils))]  # fmt: skip
    inputs = {
        "x": rng.standard_normal((n, c, h, w)).astype(np.float32),
        "w": rng.standard_normal((oc, c // group, *kernel)).astype(np.float32),
        "offset": rng.uniform(-2.5, 2.5, (n, offset_group * 6 * 2, *out)).astype(np.float32),
        "b": rng.standard_normal(oc).astype(np.float32),
    }
    if with_mask:
        inputs["mask"] = rng.uniform(0, 1, (n, offset_group * 6, *out)).astype(np.float32)
    _check("DeformConv", inputs, 19, tol=1e-4, kernel_shape=list(kernel), **attrs)


def test_deform_conv_1d_without_offsets_is_a_convolution() -> None:
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((1, 2, 7)).astype(np.float32), rng.standard_normal((3, 2, 3)).astype(np.float32)
    offset = np.zeros((1, 3, 5), np.float32)
    got = _run(_model("DeformConv", {"x": x, "w": w, "offset": offset}, 19), {"x": x, "w": w, "offset": offset})
    want = np.stack([np.einsum("ck,ock->o", x[0, :, i : i + 3], w) for i in range(5)], -1)[None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_deform_conv_bad_offset_shape_is_a_clear_error() -> None:
    inputs = {"x": np.zeros((1, 2, 4, 4), np.float32), "w": np.zeros((1, 2, 2, 2), np.float32),
              "offset": np.zeros((1, 6, 3, 3), np.float32)}  # fmt: skip
    with pytest.raises(UnsupportedOp, match=r"offset of shape \(1, 6, 3, 3\): expected \(1, 8, 3, 3\)"):
        _run(_model("DeformConv", inputs, 19), inputs)
    inputs["offset"] = np.zeros((1, 8, 3, 3), np.float32)
    with pytest.raises(UnsupportedOp, match="divisible by group"):
        _run(_model("DeformConv", inputs, 19, group=2), inputs)


# ***** RoiAlign *****


_ROIS = np.array(
    [[0, 0, 20, 16], [3.3, 1.7, 9.9, 14.2], [-4, -3, 6, 5], [15, 12, 26, 24], [5, 5, 5.4, 5.2]], np.float32
)
# (with spatial_scale 0.5: the whole map, inside, over the top-left edge, past the bottom-right, a sliver)


@pytest.mark.parametrize("opset,coord", [(10, None), (16, "half_pixel"), (16, "output_half_pixel")])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ratio", [0, 3])
def test_roi_align_matches_reference(opset: int, coord: Optional[str], mode: str, ratio: int) -> None:
    x = np.random.default_rng(6).standard_normal((2, 3, 9, 11)).astype(np.float32)
    inputs = {"x": x, "rois": _ROIS, "idx": np.array([0, 1, 1, 0, 1], np.int64)}
    attrs = {"mode": mode, "output_height": 3, "output_width": 4, "sampling_ratio": ratio, "spatial_scale": 0.5}
    got = _run(
        _model("RoiAlign", inputs, opset, **attrs, **({"coordinate_transformation_mode": coord} if coord else {})),
        inputs,
    )
    # opset 10 has no pixel shift (output_half_pixel); onnx's reference evaluator reads it as opset 16's default
    spec = _model("RoiAlign", inputs, 16, coordinate_transformation_mode=coord or "output_half_pixel", **attrs)
    np.testing.assert_allclose(got, _reference(spec, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_opset_10_matches_onnxruntime(mode: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(10).standard_normal((2, 2, 8, 7)).astype(np.float32)
    inputs = {"x": x, "rois": _ROIS * 0.6, "idx": np.array([1, 0, 1, 1, 0], np.int64)}
    model = _model("RoiAlign", inputs, 10, mode=mode, output_height=2, output_width=3, sampling_ratio=2)
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    options = ort.SessionOptions()
    options.log_severity_level = 3  # (its warning about max mode and sampling ratios above 1 is about older versions)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_run(model, inputs), session.run(None, inputs)[0], rtol=1e-5, atol=1e-5)


def test_roi_align_bad_inputs_are_clear_errors() -> None:
    inputs = {"x": np.zeros((1, 1, 4, 4), np.float32), "rois": np.zeros((2, 3), np.float32),
              "idx": np.zeros(2, np.int64)}  # fmt: skip
    with pytest.raises(UnsupportedOp, match=r"rois \(num_rois, 4\)"):
        _run(_model("RoiAlign", inputs, 16), inputs)
    inputs["rois"] = np.zeros((2, 4), np.float32)
    with pytest.raises(UnsupportedOp, match="mode 'sum'"):
        _run(_model("RoiAlign", inputs, 16, mode="sum"), inputs)
    inputs["idx"] = np.array([0, 1], np.int64)  # X holds one image
    with pytest.raises(IndexOutOfRangeError, match=r"batch_indices value is outside \[0, 1\)"):
        _run(_model("RoiAlign", inputs, 16), inputs)


# ***** Col2Im *****


def _fold(x: np.ndarray, image: list, block: list, strides: list, dils: list, pads: list) -> np.ndarray:
    """Col2Im by its definition: each column's block added into the padded image at its place, the pads cut off."""
    nd = len(image)
    padded = [s + pads[i] + pads[i + nd] for i, s in enumerate(image)]
    grid = [(p - d * (k - 1) - 1) // t + 1 for p, k, t, d in zip(padded, block, strides, dils)]
    n, c = x.shape[0], x.shape[1] // int(np.prod(block))
    cols = x.reshape(n, c, *block, *grid)
    out = np.zeros((n, c, *padded), x.dtype)
    for where in np.ndindex(*block):
        for at in np.ndindex(*grid):
            pos = tuple(a * t + w * d for a, t, w, d in zip(at, strides, where, dils))
            out[(slice(None), slice(None), *pos)] += cols[(slice(None), slice(None), *where, *at)]
    return out[(slice(None), slice(None), *[slice(pads[i], pads[i] + s) for i, s in enumerate(image)])]


@pytest.mark.parametrize(
    "image,block,attrs",
    [
        ([7, 8], [3, 2], {}),
        ([7, 8], [3, 2], {"strides": [2, 3]}),
        ([7, 8], [3, 2], {"pads": [1, 0, 2, 1]}),
        ([7, 8], [3, 2], {"dilations": [2, 1], "strides": [1, 2], "pads": [1, 1, 1, 1]}),
        ([4, 5, 3], [2, 3, 2], {"strides": [2, 1, 1], "pads": [0, 1, 1, 1, 0, 0]}),
    ],
)
def test_col2im_matches_definition_and_reference(image: list, block: list, attrs: dict) -> None:
    nd = len(image)
    st, dils = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * (2 * nd))
    grid = [(s + pads[i] + pads[i + nd] - d * (k - 1) - 1) // t + 1 for i, (s, k, t, d) in
            enumerate(zip(image, block, st, dils))]  # fmt: skip
    x = np.random.default_rng(7).standard_normal((2, 3 * int(np.prod(block)), int(np.prod(grid)))).astype(np.float32)
    consts = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    got = _check("Col2Im", {"x": x}, 18, consts, **attrs)
    np.testing.assert_allclose(got, _fold(x, image, block, st, dils, pads), rtol=1e-5, atol=1e-5)
    if nd == 2 and pads[:2] == pads[2:]:  # (torch's fold pads both ends of an axis alike)
        torch = pytest.importorskip("torch")
        t = torch.nn.functional.fold(torch.from_numpy(x), image, block, dilation=dils, padding=pads[:2], stride=st)
        np.testing.assert_allclose(got, t.numpy(), rtol=1e-5, atol=1e-5)


def test_col2im_integers_are_exact() -> None:
    x = np.arange(2 * 4 * 9, dtype=np.int32).reshape(1, 8, 9) - 30
    consts = {"image": np.array([4, 4], np.int64), "block": np.array([2, 2], np.int64)}
    got = _run(_model("Col2Im", {"x": x}, 18, consts), {"x": x})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _fold(x, [4, 4], [2, 2], [1, 1], [1, 1], [0, 0, 0, 0]))


def test_col2im_wrong_block_count_is_a_clear_error() -> None:
    x = np.zeros((1, 4, 10), np.float32)  # a 5 x 5 image in 2 x 2 blocks has 16 of them
    consts = {"image": np.array([5, 5], np.int64), "block": np.array([2, 2], np.int64)}
    with pytest.raises(UnsupportedOp, match=r"expected \(N, C \* 4, 16\)"):
        _run(_model("Col2Im", {"x": x}, 18, consts), {"x": x})


# ***** Det *****


def test_det_matches_numpy() -> None:
    rng = np.random.default_rng(8)
    for shape in [(1, 1), (3, 3), (2, 3, 5, 5), (4, 8, 8)]:
        x = rng.standard_normal(shape).astype(np.float32)
        got = _run(_model("Det", {"x": x}, 11), {"x": x})
        assert got.shape == shape[:-2] and got.dtype == np.float32
        np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-4, atol=1e-5)
    x = rng.standard_normal((6, 6))
    np.testing.assert_allclose(_run(_model("Det", {"x": x}, 22), {"x": x}), np.linalg.det(x), rtol=1e-12)


def test_det_of_singular_and_permuted_matrices() -> None:
    singular = np.array([[1, 2, 3], [2, 4, 6], [0, 1, 1]], np.float32)  # two rows alike: its first pivot step
    zero_column = np.array([[0, 1, 2], [0, 3, 4], [0, 5, 7]], np.float32)  # leaves a zero column
    swap = np.eye(4, dtype=np.float32)[[1, 0, 2, 3]] * 2  # one row swap: -(2^4)
    x = np.stack([singular, zero_column, np.zeros((3, 3), np.float32), np.eye(3) * 3])
    got = _run(_model("Det", {"x": x.astype(np.float32)}, 11), {"x": x.astype(np.float32)})
    np.testing.assert_allclose(got, [0, 0, 0, 27], atol=1e-6)
    np.testing.assert_allclose(_run(_model("Det", {"x": swap}, 11), {"x": swap}), -16.0, rtol=1e-6)


def test_det_of_non_square_input_is_a_clear_error() -> None:
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(UnsupportedOp, match=r"expected square matrices \(\*, M, M\)"):
        _run(_model("Det", {"x": x}, 11), {"x": x})
