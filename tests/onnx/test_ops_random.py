"""The random operators (tgcore/onnx/ops_random.py: RandomUniform, RandomNormal, their -Like forms, Bernoulli,
Multinomial; Dropout in training mode) and the pooling ones the backend suite has no case for (GlobalLpPool,
MaxRoiPool): shapes, dtypes, the distributions' moments on many draws, fresh draws on every run of a model (its
recorded kernels replayed), seeds, and bad inputs. MaxRoiPool and GlobalLpPool against numpy, written from the
operators' definitions."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tgcore import Tensor  # noqa: E402
from tgcore.errors import IndexOutOfRangeError  # noqa: E402
from tgcore.onnx import OnnxModel, UnsupportedOp  # noqa: E402

N = 1 << 16  # draws for the moments: a mean of N uniform values is within 0.005 of 1/2 with near certainty


def _model(op_type: str, inputs: dict[str, np.ndarray], consts: Optional[dict] = None, outputs: int = 1,
           opset: int = 22, **attrs: Any) -> onnx.ModelProto:  # fmt: skip
    consts = consts or {}
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, [*inputs, *consts], names, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()
    ]
    outs = [helper.make_tensor_value_info(k, 0, None) for k in names]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph([node], "g", graph_inputs, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _runs(model: onnx.ModelProto, inputs: dict[str, np.ndarray], times: int = 1) -> list[np.ndarray]:
    """Output y0 of `times` runs of one OnnxModel (from the third on, its recorded kernels are replayed)."""
    m = OnnxModel(model, check=False)
    return [m(**inputs)["y0"].numpy() for _ in range(times)]


# ***** uniform and normal *****


@pytest.mark.parametrize("dtype, np_dtype", [(None, np.float32), (TensorProto.DOUBLE, np.float64),
                                             (TensorProto.FLOAT16, np.float16)])  # fmt: skip
def test_random_uniform_values_and_dtype(dtype: Optional[int], np_dtype: type) -> None:
    attrs = {"shape": [N // 256, 256], "low": -2.0, "high": 3.0, **({} if dtype is None else {"dtype": dtype})}
    (y,) = _runs(_model("RandomUniform", {}, **attrs), {})
    assert y.shape == (N // 256, 256) and y.dtype == np_dtype
    assert y.min() >= -2.0 and y.max() <= 3.0 and abs(float(y.astype(np.float64).mean()) - 0.5) < 0.05
    assert len(np.unique(y)) > 100


def test_random_normal_moments() -> None:
    (y,) = _runs(_model("RandomNormal", {}, shape=[N], mean=1.5, scale=0.5), {})
    assert y.dtype == np.float32 and abs(y.mean() - 1.5) < 0.02 and abs(y.std() - 0.5) < 0.02


def test_like_forms_take_the_input_shape_and_dtype_or_the_attribute() -> None:
    x = np.zeros((3, 4, 5), np.float64)
    (u,) = _runs(_model("RandomUniformLike", {"x": x}), {"x": x})
    assert u.shape == x.shape and u.dtype == np.float64 and 0 <= u.min() and u.max() < 1
    (z,) = _runs(_model("RandomNormalLike", {"x": x}, dtype=TensorProto.FLOAT), {"x": x})
    assert z.shape == x.shape and z.dtype == np.float32 and z.std() > 0.3


def test_every_run_draws_fresh_numbers() -> None:
    # the third and later runs replay the recorded kernels: the generator's counter still moves
    draws = _runs(_model("RandomUniform", {}, shape=[64]), {}, times=5)
    assert len({d.tobytes() for d in draws}) == 5


def test_a_seed_picks_a_stream() -> None:
    def draw(seed: Optional[float]) -> np.ndarray:
        Tensor.manual_seed(7)
        return _runs(_model("RandomNormal", {}, shape=[32], **({} if seed is None else {"seed": seed})), {})[0]

    a, b, c, plain = draw(1.0), draw(1.0), draw(2.0), draw(None)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, plain)


def test_a_non_float_dtype_or_bad_bounds_are_refused() -> None:
    with pytest.raises(UnsupportedOp, match="expected a float type"):
        _runs(_model("RandomUniform", {}, shape=[2], dtype=TensorProto.INT32), {})
    with pytest.raises(UnsupportedOp, match="low <= high"):
        _runs(_model("RandomUniform", {}, shape=[2], low=1.0, high=0.0), {})


# ***** Bernoulli and Multinomial *****


def test_bernoulli_draws_ones_with_the_given_probability() -> None:
    p = np.concatenate([np.zeros(100), np.ones(100), np.full(N, 0.3)]).astype(np.float32)
    (y,) = _runs(_model("Bernoulli", {"p": p}, opset=15), {"p": p})
    assert y.dtype == np.float32 and set(np.unique(y)) <= {0.0, 1.0}
    assert not y[:100].any() and y[100:200].all() and abs(y[200:].mean() - 0.3) < 0.01
    (b,) = _runs(_model("Bernoulli", {"p": p}, dtype=TensorProto.BOOL), {"p": p})
    assert b.dtype == np.bool_ and b[100:200].all()


def test_bernoulli_refuses_a_probability_outside_0_1() -> None:
    p = np.array([0.5, 1.5], np.float32)
    with pytest.raises(ValueError, match="outside"):
        _runs(_model("Bernoulli", {"p": p}), {"p": p})


def test_multinomial_frequencies_follow_the_softmax() -> None:
    logits = np.log(np.array([[0.1, 0.0, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0]], np.float32))  # (-inf: never drawn)
    (y,) = _runs(_model("Multinomial", {"x": logits}, sample_size=N, dtype=TensorProto.INT64), {"x": logits})
    assert y.shape == (2, N) and y.dtype == np.int64 and y.min() >= 0 and y.max() <= 3
    freq = np.stack([np.bincount(row, minlength=4) / N for row in y])
    np.testing.assert_allclose(freq[0], [0.1, 0.0, 0.6, 0.3], atol=0.01)
    np.testing.assert_array_equal(freq[1], [1, 0, 0, 0])
    (d,) = _runs(_model("Multinomial", {"x": logits}), {"x": logits})
    assert d.shape == (2, 1) and d.dtype == np.int32


@pytest.mark.parametrize("bad", [math.nan, math.inf, "row of -inf"])
def test_multinomial_refuses_what_is_no_distribution(bad: Any) -> None:
    logits = np.zeros((2, 3), np.float32)
    if bad == "row of -inf":
        logits[1] = -np.inf
    else:
        logits[0, 1] = bad
    with pytest.raises(ValueError, match="Multinomial"):
        _runs(_model("Multinomial", {"x": logits}), {"x": logits})


# ***** Dropout in training mode *****


def test_training_dropout_drops_and_scales() -> None:
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    consts = {"ratio": np.array(0.25, np.float32), "training_mode": np.array(True)}
    m = OnnxModel(_model("Dropout", {"x": x}, consts, outputs=2, opset=13), check=False)
    outs = [m(x=x) for _ in range(3)]
    for out in outs:
        y, keep = out["y0"].numpy(), out["y1"].numpy()
        assert keep.dtype == np.bool_ and abs(keep.mean() - 0.75) < 0.01
        np.testing.assert_allclose(y, np.where(keep, x / 0.75, 0), rtol=1e-6)
    assert not np.array_equal(outs[1]["y1"].numpy(), outs[2]["y1"].numpy())
    bad = {"ratio": np.array(1.0, np.float32), "training_mode": np.array(True)}
    with pytest.raises(UnsupportedOp, match=r"\[0, 1\)"):
        OnnxModel(_model("Dropout", {"x": x}, bad, opset=13), check=False)(x=x)


# ***** GlobalLpPool and MaxRoiPool *****


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p: int) -> None:
    x = np.random.default_rng(p).standard_normal((2, 3, 4, 5)).astype(np.float32)
    (y,) = _runs(_model("GlobalLpPool", {"x": x}, opset=2, p=p), {"x": x})
    want = (np.abs(x.astype(np.float64)) ** p).sum((2, 3), keepdims=True) ** (1 / p)
    np.testing.assert_allclose(y, want, rtol=1e-5)


def _max_roi_pool_reference(x: np.ndarray, rois: np.ndarray, pooled: tuple[int, int], scale: float) -> np.ndarray:
    """Fast R-CNN's ROI pooling, as the operator defines it (C's round, whole-pixel bins, 0 for an empty bin)."""
    ph, pw = pooled
    out = np.zeros((len(rois), x.shape[1], ph, pw), x.dtype)
    height, width = x.shape[2:]
    for r, (b, *corner) in enumerate(rois):
        x1, y1, x2, y2 = (math.copysign(math.floor(abs(c * scale) + 0.5), c) for c in corner)
        bh, bw = max(y2 - y1 + 1, 1) / ph, max(x2 - x1 + 1, 1) / pw
        for i in range(ph):
            hs = min(max(math.floor(i * bh) + y1, 0), height)
            he = min(max(math.ceil((i + 1) * bh) + y1, 0), height)
            for j in range(pw):
                ws = min(max(math.floor(j * bw) + x1, 0), width)
                we = min(max(math.ceil((j + 1) * bw) + x1, 0), width)
                if he > hs and we > ws:
                    out[r, :, i, j] = x[int(b), :, int(hs) : int(he), int(ws) : int(we)].max((1, 2))
    return out


def test_max_roi_pool_matches_its_definition() -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array(
        [[0, 0, 0, 11, 9], [1, 2.4, 1.5, 7.6, 6.5], [1, 8, 6, 30, 40], [0, -6, -6, -2, -2], [1, 4, 4, 4, 4]],
        np.float32,
    )  # the whole map, fractional corners, past the map's edge, wholly outside it (empty bins: 0), one pixel
    for pooled, scale in (((2, 3), 1.0), ((3, 3), 0.5)):
        (y,) = _runs(_model("MaxRoiPool", {"x": x, "rois": rois}, pooled_shape=list(pooled), spatial_scale=scale),
                     {"x": x, "rois": rois})  # fmt: skip
        np.testing.assert_array_equal(y, _max_roi_pool_reference(x, rois, pooled, scale))


def test_max_roi_pool_checks_the_batch_index() -> None:
    x = np.zeros((1, 1, 4, 4), np.float32)
    rois = np.array([[1, 0, 0, 2, 2]], np.float32)
    with pytest.raises(IndexOutOfRangeError):
        _runs(_model("MaxRoiPool", {"x": x, "rois": rois}, pooled_shape=[2, 2]), {"x": x, "rois": rois})
