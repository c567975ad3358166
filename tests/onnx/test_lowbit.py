"""The low-bit ONNX element types (tgcore/onnx/lowbit.py): float8, float4, int4 and int2 values in a tgcore dtype.

Rounding into each type is checked against ml_dtypes' own conversion (and numpy for E8M0's round modes) on many values:
ties, subnormals, NaN, inf, out of range with and without saturate; then whole models with these types at their inputs,
initializers and outputs, against ml_dtypes and onnx's reference evaluator; then bad inputs."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tgcore.onnx import OnnxError, OnnxModel, UnsupportedOp, lowbit  # noqa: E402
from tgcore.onnx.registry import to_numpy, to_tensor  # noqa: E402
from tgcore.tensor import Tensor  # noqa: E402

FLOAT8 = ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"]
INTS = ["INT4", "UINT4", "INT2", "UINT2"]


def _kind(name: str) -> lowbit.LowBitType:
    return lowbit.LOWBIT[getattr(TensorProto, name)]


def _cast(x: np.ndarray, name: str, **kw: Any) -> np.ndarray:
    out = lowbit.cast_to(Tensor(x), _kind(name), **kw)
    assert isinstance(out, lowbit.LowBitTensor) and out.kind.name == name
    return to_numpy(out)


def _quiet_astype(x: np.ndarray, dtype: Any) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x.astype(dtype)


def _every_value(kind: lowbit.LowBitType) -> np.ndarray:
    """Every value of a type: all its bit patterns (ml_dtypes holds a 4- or 2-bit value in a byte's low bits)."""
    width = 8 if kind.name.startswith("FLOAT8") else 4 if kind.name == "FLOAT4E2M1" else kind.bits
    return np.arange(2**width, dtype=np.uint8).view(kind.np_dtype)


def _probe_values(kind: lowbit.LowBitType) -> np.ndarray:
    """float32 values around everything rounding must get right: each representable value, the ties between
    neighbours and one float32 ulp either side of them, float32 subnormals, random values at many scales, specials."""
    finite = np.unique(_every_value(kind).astype(np.float32))
    finite = finite[np.isfinite(finite)]
    ties = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    rng = np.random.default_rng(0)
    scales = 2.0 ** np.arange(-20, 20, 3)
    rand = (rng.standard_normal((len(scales), 64)) * scales[:, None]).astype(np.float32).ravel()
    top = np.float32(kind.max_value)
    specials = np.array(
        [0, np.nan, np.inf, 1e-40, 1e-45, 1e38, 3.4e38, top * 1.01, top * 1.5, top * 2, np.nextafter(top, np.inf)],
        np.float32,
    )
    pos = np.concatenate([finite, ties, near, rand, specials]).astype(np.float32)
    return np.concatenate([pos, -pos])


def _assert_same(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> None:
    """Equal bits, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan_got, nan_want = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    same = (got.view(np.uint8) == want.view(np.uint8)) | (nan_got & nan_want)
    assert same.all(), f"x={x[~same][:8]} got={got[~same][:8]} want={want[~same][:8]}"


@pytest.mark.parametrize("name", FLOAT8)
def test_float8_without_saturate_rounds_as_ml_dtypes(name: str) -> None:
    kind = _kind(name)
    x = _probe_values(kind)
    _assert_same(_cast(x, name, saturate=False), _quiet_astype(x, kind.np_dtype), x)


@pytest.mark.parametrize("name", FLOAT8)
def test_float8_with_saturate_clamps_to_the_largest_value(name: str) -> None:
    kind = _kind(name)
    x = _probe_values(kind)
    want = _quiet_astype(np.clip(x, -kind.max_value, kind.max_value), kind.np_dtype)  # (NaN stays NaN)
    _assert_same(_cast(x, name, saturate=True), want, x)
    got = _cast(np.array([np.inf, -np.inf, 1e30, -1e30], np.float32), name).astype(np.float32)
    np.testing.assert_array_equal(got, [kind.max_value, -kind.max_value, kind.max_value, -kind.max_value])


def test_float8_special_values_follow_each_variant() -> None:
    x = np.array([-0.0, np.inf, -np.inf, 1e6, -1e-30], np.float32)
    e4 = _cast(x, "FLOAT8E4M3FN", saturate=False).view(np.uint8)
    np.testing.assert_array_equal(e4, [0x80, 0x7F, 0xFF, 0x7F, 0x80])  # -0 kept; inf and overflow: NaN, signed
    fnuz = _cast(x, "FLOAT8E4M3FNUZ", saturate=False).view(np.uint8)
    np.testing.assert_array_equal(fnuz, [0, 0x80, 0x80, 0x80, 0])  # no -0; the one NaN
    e5 = _cast(x, "FLOAT8E5M2", saturate=False).astype(np.float32)
    np.testing.assert_array_equal(e5, [-0.0, np.inf, -np.inf, np.inf, -0.0])
    assert np.signbit(e5[0]) and np.signbit(e5[4])


def test_float4_always_saturates_and_has_no_nan() -> None:
    kind = _kind("FLOAT4E2M1")
    x = _probe_values(kind)
    finite = ~np.isnan(x)
    got = _cast(x, "FLOAT4E2M1", saturate=False)  # (no effect: float4 has nothing to overflow to)
    _assert_same(got[finite], _quiet_astype(x[finite], kind.np_dtype), x[finite])
    np.testing.assert_array_equal(got[~finite].astype(np.float32), 0.0)  # NaN: a zero, as ml_dtypes gives
    np.testing.assert_array_equal(_cast(np.array([0.25, 0.75, 2.5, 5, 7, -100], np.float32), "FLOAT4E2M1").astype(
        np.float32), [0, 1, 2, 4, 6, -6])  # fmt: skip


@pytest.mark.parametrize("name", ["FLOAT8E4M3FN", "FLOAT8E5M2FNUZ", "FLOAT4E2M1"])
def test_float16_and_float64_inputs_round_once(name: str) -> None:
    kind = _kind(name)
    x16 = _quiet_astype(_probe_values(kind), np.float16)
    x16 = x16[np.abs(x16.astype(np.float32)) <= kind.max_value]  # (in range: saturate plays no part)
    _assert_same(_cast(x16, name), _quiet_astype(x16.astype(np.float32), kind.np_dtype), x16)
    # just above a tie between 1 and the next value: float32 would round it onto the tie (then to even, 1.0)
    step = 2.0 ** -kind.mantissa
    x64 = np.array([1 + step / 2 + 2.0**-40, -(1 + step / 2 + 2.0**-40)], np.float64)
    np.testing.assert_array_equal(_cast(x64, name).astype(np.float32), [1 + step, -(1 + step)])


def _e8m0_expected(x: np.ndarray, mode: str, saturate: bool) -> np.ndarray:
    """E8M0 by the spec, in numpy: 2^k for positive x, k from frexp, rounded by mode, out of range per saturate."""
    out = np.full(x.shape, np.nan, np.float32)
    for i, v in enumerate(x.astype(np.float64)):
        if np.isnan(v) or v < 0:
            continue
        if v == 0 or np.isinf(v):
            k = -1000 if v == 0 else 1000
        else:
            m, e = np.frexp(v)  # v = m 2^e, m in [0.5, 1)
            k, frac = int(e) - 1, 2 * m - 1  # v = (1 + frac) 2^k
            k += {"up": frac > 0, "down": False, "nearest": frac >= 0.5}[mode]
        if -127 <= k <= 127:
            out[i] = np.ldexp(np.float64(1), k)
        elif saturate:
            out[i] = np.ldexp(np.float64(1), max(-127, min(127, k)))
    return out


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_rounds_to_powers_of_two(mode: str, saturate: bool) -> None:
    rng = np.random.default_rng(1)
    powers = np.ldexp(np.float32(1), np.arange(-127, 128))
    x = _quiet_astype(np.concatenate([
        powers, powers * 1.5, powers * 1.25, powers * 1.75, np.nextafter(powers, np.float32(0)),
        np.exp2(rng.uniform(-140, 130, 300)), [0, -0.0, np.inf, -2, np.nan, 1e-45, 3.4e38],
    ]), np.float32)  # fmt: skip
    got = _cast(x, "FLOAT8E8M0", saturate=saturate, round_mode=mode).astype(np.float32)
    np.testing.assert_array_equal(got, _e8m0_expected(x, mode, saturate))
    if mode == "nearest" and not saturate:  # ml_dtypes' own conversion is this one, in range
        inside = (x >= 2.0**-127) & (x <= 2.0**127)
        np.testing.assert_array_equal(got[inside], x[inside].astype(ml_dtypes.float8_e8m0fnu).astype(np.float32))


@pytest.mark.parametrize("name", INTS)
def test_integers_wrap_and_floats_truncate(name: str) -> None:
    kind = _kind(name)
    ints = np.arange(-300, 300, dtype=np.int32)
    np.testing.assert_array_equal(_cast(ints, name), ints.astype(kind.np_dtype))  # (ml_dtypes wraps, as the spec)
    big = ints.astype(np.int64) + 2**40  # (the same low bits)
    np.testing.assert_array_equal(_cast(big, name), ints.astype(kind.np_dtype))
    np.testing.assert_array_equal(_cast(np.array([True, False]), name).astype(np.int32), [1, 0])
    x = np.concatenate([np.arange(-20, 20, 0.25), [np.nan, np.inf, -np.inf, 1e30, -0.9, 0.9]]).astype(np.float32)
    np.testing.assert_array_equal(_cast(x, name), _quiet_astype(x, kind.np_dtype))  # (out of range: 0)
    np.testing.assert_array_equal(_cast(_quiet_astype(x, np.float16), name), _quiet_astype(x, kind.np_dtype))


@pytest.mark.parametrize("name", [*FLOAT8, "FLOAT8E8M0", "FLOAT4E2M1", *INTS])
def test_every_value_travels_exactly(name: str) -> None:
    kind = _kind(name)
    values = _every_value(kind)
    t = to_tensor(values, Tensor(0).device)
    assert isinstance(t, lowbit.LowBitTensor) and t.dtype == kind.carrier
    _assert_same(to_numpy(t), values, values)
    _assert_same(to_numpy(t.clone()), values, values)  # (a copy keeps its type)
    back = _cast(values.astype(np.float32), name, saturate=False)  # (every value rounds to itself; inf too)
    _assert_same(back, values, values)
    assert not isinstance(t + 0, lowbit.LowBitTensor)  # (a computed value is a plain carrier tensor)


# ***** models *****


def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (), opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, elem: int, shape: Any = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _run(model: onnx.ModelProto, **inputs: Any) -> list[np.ndarray]:
    outs = OnnxModel(model)(inputs)
    return [to_numpy(outs[o.name]) for o in model.graph.output]


def test_data_movement_keeps_the_type_and_outputs_come_back_as_ml_dtypes() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Identity", ["r"], ["y"]),
        helper.make_node("Cast", ["y"], ["f"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["f"], ["e"], to=TensorProto.FLOAT8E5M2),
        helper.make_node("Squeeze", ["e"], ["z"]),
    ]
    shape = numpy_helper.from_array(np.array([6], np.int64), "shape")
    x = np.array([[1, -2, 448], [0.5, np.nan, -0.0]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    inputs = [_vi("x", TensorProto.FLOAT8E4M3FN, [2, 3])]
    moved = OnnxModel(_model(nodes[:3], inputs, [_vi("y", TensorProto.FLOAT8E4M3FN, [6])], (shape,)))
    computed = OnnxModel(
        _model(nodes, inputs, [_vi("f", TensorProto.FLOAT16, [6]), _vi("z", TensorProto.FLOAT8E5M2, [6])], (shape,))
    )
    want = x.T.reshape(6)
    for _ in range(3):  # (a model with kernels runs plainly, then is recorded, then replayed)
        _assert_same(to_numpy(moved(x=x)["y"]), want, x)
        outs = computed(x=x)
        f, z = to_numpy(outs["f"]), to_numpy(outs["z"])
        assert f.dtype == np.float16
        np.testing.assert_array_equal(f, want.astype(np.float16))
        _assert_same(z, want.astype(np.float32).astype(ml_dtypes.float8_e5m2), x)


def test_quantize_blocked_int4_and_dequantize_a_packed_initializer() -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 6)) * 20).astype(np.float32)
    scale = np.array([[1.5, 2.0, 3.0], [0.5, 4.0, 2.5]], np.float32)
    zp = np.array([[1, -2, 0], [3, 0, -8]], np.int8).astype(ml_dtypes.int4)
    q_node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1, block_size=2)
    inits = (numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z"))  # (int4: packed two a byte)
    model = _model([q_node], [_vi("x", TensorProto.FLOAT, [2, 6])], [_vi("q", TensorProto.INT4, [2, 6])], inits)
    (got,) = _run(model, x=x)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.dtype == ml_dtypes.int4
    np.testing.assert_array_equal(got.astype(np.int8), want.astype(np.int8))
    wide = np.repeat(scale, 2, axis=1)
    np.testing.assert_array_equal(
        got.astype(np.int8), np.clip(np.round(x / wide) + np.repeat(zp.astype(np.int8), 2, axis=1), -8, 7)
    )
    w = np.array([[7, -8, 3], [0, 1, -1]], np.int8).astype(ml_dtypes.int4)
    dq = helper.make_node("DequantizeLinear", ["w", "ws"], ["y"], axis=0)
    ws = np.array([0.5, 3.0], np.float32)
    inits = (numpy_helper.from_array(w, "w"), numpy_helper.from_array(ws, "ws"))
    (y,) = _run(_model([dq], [], [_vi("y", TensorProto.FLOAT, [2, 3])], inits))
    np.testing.assert_array_equal(y, w.astype(np.float32) * ws[:, None])


@pytest.mark.parametrize("name", FLOAT8 + ["FLOAT4E2M1"])
def test_quantize_to_a_float_type_with_output_dtype_and_saturate(name: str) -> None:
    kind = _kind(name)
    x = (np.random.default_rng(3).standard_normal((3, 4)) * kind.max_value).astype(np.float32)
    x[0, 0], x[0, 1] = 1e30, -np.inf
    scale = np.array([2.0, 0.5, 1.0], np.float16)  # (a half scale: the quotient is rounded to float16 first)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["q"], axis=0, output_dtype=kind.elem_type, saturate=0)
    model = _model([node], [_vi("x", TensorProto.FLOAT, [3, 4]), _vi("s", TensorProto.FLOAT16, [3])],
                   [_vi("q", kind.elem_type, [3, 4])])  # fmt: skip
    (got,) = _run(model, x=x, s=scale)
    quotient = _quiet_astype(x / scale.astype(np.float32)[:, None], np.float16).astype(np.float32)
    if name == "FLOAT4E2M1":
        quotient = np.clip(quotient, -kind.max_value, kind.max_value)
    _assert_same(got, _quiet_astype(quotient, kind.np_dtype), x)
    dq_node = helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=0)
    dq = _model([dq_node], [_vi("q", kind.elem_type, [3, 4]), _vi("s", TensorProto.FLOAT16, [3])],
                [_vi("y", TensorProto.FLOAT16, [3, 4])])  # fmt: skip
    (y,) = _run(dq, q=got, s=scale)
    want = (got.astype(np.float32) * scale.astype(np.float32)[:, None]).astype(np.float16)
    np.testing.assert_array_equal(y, want)


# ***** bad input *****


def test_an_input_of_the_wrong_dtype_is_refused() -> None:
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [_vi("x", TensorProto.FLOAT8E4M3FN, [2])],
                   [_vi("y", TensorProto.FLOAT8E4M3FN, [2])])  # fmt: skip
    with pytest.raises(OnnxError, match=r"input 'x' is declared FLOAT8E4M3FN: pass a numpy array of .*float8_e4m3fn"):
        OnnxModel(model)(x=np.array([1.0, 2.0], np.float32))


def test_a_bad_round_mode_and_a_wrong_carrier_are_named() -> None:
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0, round_mode="sideways")
    model = _model([node], [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT8E8M0, [2])], opset=24)
    with pytest.raises(UnsupportedOp, match=r"round_mode 'sideways': expected one of up, down, nearest"):
        OnnxModel(model, check=False)(x=np.ones(2, np.float32))
    with pytest.raises(TypeError, match=r"INT4 value is carried as .*int8, got a tensor of .*int32"):
        lowbit.LowBitTensor.of(Tensor(np.zeros(2, np.int32)), _kind("INT4"))
    with pytest.raises(TypeError, match=r"LowBitTensor\.of"):
        lowbit.LowBitTensor(Tensor(np.zeros(2, np.int8)))
