"""Recent ONNX operators (tgcore/onnx/ops_recent.py) and the DFT, MaxUnpool and Scan (opset 8) readings, checked
against numpy references written here on the default device."""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tgcore.errors import IndexOutOfRangeError  # noqa: E402
from tgcore.onnx import OnnxError, UnsupportedOp, run_node  # noqa: E402

rng = np.random.default_rng(0)


def _node(op_type: str, inputs: list, outputs: int = 1, **attrs):  # noqa: ANN003, ANN201
    return helper.make_node(op_type, inputs, [f"y{i}" for i in range(outputs)], **attrs)


# ***** LinearAttention *****


def _linear_attention_ref(q, k, v, past, decay, beta, rule, hq, hkv, scale=None):  # noqa: ANN001, ANN202
    """The spec's recurrence, token by token, in float64."""
    b, t, _ = q.shape
    dk, dv = q.shape[-1] // hq, v.shape[-1] // hkv
    qs, ks, vs = q.reshape(b, t, hq, dk), k.reshape(b, t, hkv, dk), v.reshape(b, t, hkv, dv)
    state = np.zeros((b, hkv, dk, dv)) if past is None else past.astype(np.float64).copy()
    out = np.zeros((b, t, hq, dv))
    scale = scale or 1 / math.sqrt(dk)
    for bi in range(b):
        for ti in range(t):
            for h in range(hkv):
                s, kt, vt = state[bi, h], ks[bi, ti, h], vs[bi, ti, h]
                if "gated" in rule:
                    g = decay[bi, ti].reshape(hkv, -1)[h]
                    s = np.exp(g).reshape(-1, 1) * s if g.size == dk else np.exp(g[0]) * s
                if "delta" in rule:
                    bt = beta[bi, ti, h if beta.shape[-1] == hkv else 0]
                    s = s + bt * np.outer(kt, vt - s.T @ kt)
                else:
                    s = s + np.outer(kt, vt)
                state[bi, h] = s
            for h in range(hq):
                out[bi, ti, h] = scale * qs[bi, ti, h] @ state[bi, h // (hq // hkv)]
    return out.reshape(b, t, hq * dv), state


@pytest.mark.parametrize(
    "rule, hq, hkv, per_head_decay, with_past",
    [
        ("linear", 2, 2, False, False),
        ("gated", 2, 2, False, True),
        ("gated", 2, 2, True, False),
        ("delta", 2, 2, False, True),
        ("gated_delta", 4, 2, True, True),
        ("gated_delta", 4, 1, False, False),
    ],
)
def test_linear_attention_matches_the_recurrence(rule: str, hq: int, hkv: int, per_head_decay: bool, with_past: bool):
    b, t, dk, dv = 2, 3, 4, 3
    q = rng.standard_normal((b, t, hq * dk)).astype(np.float32)
    k = rng.standard_normal((b, t, hkv * dk)).astype(np.float32)
    k /= np.linalg.norm(k.reshape(b, t, hkv, dk), axis=-1).repeat(dk, -1).reshape(k.shape)
    v = rng.standard_normal((b, t, hkv * dv)).astype(np.float32)
    past = rng.standard_normal((b, hkv, dk, dv)).astype(np.float32) if with_past else None
    decay = -rng.random((b, t, hkv if per_head_decay else hkv * dk)).astype(np.float32)
    beta = rng.random((b, t, hkv)).astype(np.float32)
    names = ["q", "k", "v", "past" if with_past else "", "decay" if "gated" in rule else ""]
    names.append("beta" if "delta" in rule else "")
    feed = [q, k, v, past, decay, beta]  # (by position: an omitted input's value is not read)
    node = _node("LinearAttention", names, 2, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule)
    out, state = run_node(node, feed, opset=27)
    want_out, want_state = _linear_attention_ref(q, k, v, past, decay, beta, rule, hq, hkv)
    assert out.shape == want_out.shape and state.shape == want_state.shape
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)


def test_linear_attention_explicit_scale_and_float16() -> None:
    q, k, v = (rng.standard_normal((1, 2, 8)).astype(np.float16) for _ in range(3))
    node = _node("LinearAttention", ["q", "k", "v"], 2, q_num_heads=2, kv_num_heads=2, update_rule="linear", scale=0.5)
    out, state = run_node(node, [q, k, v], opset=27)
    assert out.dtype == np.float16 and state.dtype == np.float16
    want, want_state = _linear_attention_ref(q, k, v, None, None, None, "linear", 2, 2, scale=0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(state.astype(np.float64), want_state, rtol=2e-3, atol=2e-3)


def test_linear_attention_refuses_bad_heads_and_missing_inputs() -> None:
    q, k, v = (np.zeros((1, 1, 6), np.float32) for _ in range(3))
    with pytest.raises(OnnxError, match="positive multiple of kv_num_heads"):
        run_node(_node("LinearAttention", ["q", "k", "v"], 2, q_num_heads=3, kv_num_heads=2), [q, k, v], opset=27)
    with pytest.raises(OnnxError, match="needs the decay input"):
        run_node(_node("LinearAttention", ["q", "k", "v"], 2, q_num_heads=2, kv_num_heads=2), [q, k, v], opset=27)
    with pytest.raises(UnsupportedOp, match="update_rule 'fast'"):
        node = _node("LinearAttention", ["q", "k", "v"], 2, q_num_heads=2, kv_num_heads=2, update_rule="fast")
        run_node(node, [q, k, v], opset=27)


# ***** CausalConvWithState *****


def _causal_conv_ref(x, w, bias, past, act):  # noqa: ANN001, ANN202
    k = w.shape[-1]
    pad = np.zeros((*x.shape[:2], k - 1)) if past is None else past
    full = np.concatenate([pad, x], -1).astype(np.float64)
    out = np.stack([(full[..., i : i + k] * w[:, 0]).sum(-1) for i in range(x.shape[-1])], -1)
    out = out + (0 if bias is None else bias.reshape(1, -1, 1))
    if act != "none":
        out = out / (1 + np.exp(-out))
    return out, full[..., full.shape[-1] - (k - 1) :]


@pytest.mark.parametrize(
    "k, length, with_bias, with_past, act",
    [
        (4, 7, True, True, "silu"),
        (3, 1, False, True, "none"),
        (5, 2, False, False, "swish"),
        (1, 4, True, False, "none"),
    ],
)
def test_causal_conv_with_state_matches_numpy(k: int, length: int, with_bias: bool, with_past: bool, act: str) -> None:
    b, c = 2, 3
    x = rng.standard_normal((b, c, length)).astype(np.float32)
    w = rng.standard_normal((c, 1, k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32) if with_bias else None
    past = rng.standard_normal((b, c, k - 1)).astype(np.float32) if with_past else None
    names = ["x", "w", "bias" if with_bias else "", "past" if with_past else ""]
    feed = [x, w, bias, past]
    out, state = run_node(_node("CausalConvWithState", names, 2, activation=act), feed, opset=27)
    want_out, want_state = _causal_conv_ref(x, w, bias, past, act)
    assert out.shape == (b, c, length) and state.shape == (b, c, k - 1)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=0, atol=0)


def test_causal_conv_with_state_refuses_a_bad_weight_and_state() -> None:
    x = np.zeros((1, 3, 4), np.float32)
    with pytest.raises(OnnxError, match=r"weight has shape \(3, 2, 2\); expected \(3, 1, kernel_size\)"):
        run_node(_node("CausalConvWithState", ["x", "w"], 2), [x, np.zeros((3, 2, 2), np.float32)], opset=27)
    with pytest.raises(OnnxError, match="past_state has shape"):
        feed = [x, np.zeros((3, 1, 3), np.float32), None, np.zeros((1, 3, 1), np.float32)]
        run_node(_node("CausalConvWithState", ["x", "w", "", "p"], 2), feed, opset=27)


# ***** TensorScatter *****


def _tensor_scatter_ref(cache, update, starts, axis, circular):  # noqa: ANN001, ANN202
    out = cache.copy()
    size, seq = cache.shape[axis], update.shape[axis]
    for b in range(cache.shape[0]):
        for s in range(seq):
            pos = (starts[b] + s) % size if circular else starts[b] + s
            dst = [b] + [slice(None)] * (cache.ndim - 1)
            src = list(dst)
            dst[axis], src[axis] = pos, s
            out[tuple(dst)] = update[tuple(src)]
    return out


@pytest.mark.parametrize("axis, circular", [(-2, False), (2, True), (1, False)])
def test_tensor_scatter_matches_numpy(axis: int, circular: bool) -> None:
    cache = rng.standard_normal((3, 4, 6, 2)).astype(np.float32)
    shape = list(cache.shape)
    shape[axis] = 3
    update = rng.standard_normal(shape).astype(np.float32)
    size = cache.shape[axis]
    starts = np.array([5, 0, 4] if circular else [0, size - 3, 1], dtype=np.int64)
    node = _node("TensorScatter", ["c", "u", "i"], mode="circular" if circular else "linear", axis=axis)
    got = run_node(node, [cache, update, starts], opset=24)[0]
    np.testing.assert_array_equal(got, _tensor_scatter_ref(cache, update, starts, axis, circular))


def test_tensor_scatter_without_write_indices_writes_at_zero() -> None:
    cache, update = np.zeros((2, 5, 3), np.int32), np.arange(12, dtype=np.int32).reshape(2, 2, 3) + 1
    got = run_node(_node("TensorScatter", ["c", "u"]), [cache, update], opset=24)[0]
    np.testing.assert_array_equal(got, _tensor_scatter_ref(cache, update, [0, 0], 1, False))


def test_tensor_scatter_refuses_axis_zero_and_a_write_past_the_end() -> None:
    cache, update = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 3), np.float32)
    with pytest.raises(OnnxError, match="expected 1..rank-1"):
        run_node(_node("TensorScatter", ["c", "u"], axis=0), [cache, update], opset=24)
    with pytest.raises(IndexOutOfRangeError, match="write_indices"):
        run_node(_node("TensorScatter", ["c", "u", "i"]), [cache, update, np.array([0, 3])], opset=24)


# ***** STFT and MelWeightMatrix *****


@pytest.mark.parametrize("frame, step, windowed", [(16, 8, True), (10, 3, False)])
def test_stft_matches_numpy_rfft(frame: int, step: int, windowed: bool) -> None:
    signal = rng.standard_normal((2, 64, 1)).astype(np.float32)
    window = np.hanning(frame).astype(np.float32)
    inputs = ["s", "step", "w" if windowed else "", "len"]
    feed = [signal, np.array(step, np.int64), window, np.array(frame, np.int64)]
    got = run_node(_node("STFT", inputs), feed, opset=17)[0]
    frames = (64 - frame) // step + 1
    cut = np.stack([signal[:, f * step : f * step + frame, 0] for f in range(frames)], 1)
    want = np.fft.rfft(cut * (window if windowed else 1), axis=-1)
    assert got.shape == (2, frames, frame // 2 + 1, 2)
    np.testing.assert_allclose(got[..., 0], want.real, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[..., 1], want.imag, rtol=1e-4, atol=1e-4)


def test_stft_of_a_complex_signal_two_sided() -> None:
    z = (rng.standard_normal((1, 12)) + 1j * rng.standard_normal((1, 12))).astype(np.complex64)
    signal = np.stack([z.real, z.imag], -1).astype(np.float32)
    node = _node("STFT", ["s", "step", "", "len"], onesided=0)
    got = run_node(node, [signal, np.array(4), None, np.array(8)], opset=17)[0]
    want = np.fft.fft(np.stack([z[:, 0:8], z[:, 4:12]], 1), axis=-1)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-4, atol=1e-4)


def test_stft_refuses_a_frame_longer_than_the_signal() -> None:
    with pytest.raises(OnnxError, match="frame_length 20 for a signal of 8"):
        run_node(_node("STFT", ["s", "step", "", "len"]), [np.zeros((1, 8, 1), np.float32), np.array(2), None,
                                                           np.array(20)], opset=17)  # fmt: skip


def test_mel_weight_matrix_matches_onnx_reference_and_peaks_at_one() -> None:
    from onnx.reference import ReferenceEvaluator

    node = _node("MelWeightMatrix", ["m", "d", "r", "lo", "hi"])
    feed = [np.array(6, np.int32), np.array(64, np.int32), np.array(16000, np.int32), np.array(100.0, np.float32),
            np.array(6000.0, np.float32)]  # fmt: skip
    got = run_node(node, feed, opset=17)[0]
    want = ReferenceEvaluator(node).run(None, dict(zip(["m", "d", "r", "lo", "hi"], feed)))[0]
    assert got.shape == (33, 6) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got.max(0), np.ones(6))
    with pytest.raises(OnnxError, match="lower_edge_hertz < upper_edge_hertz"):
        run_node(node, feed[:3] + [np.array(500.0, np.float32), np.array(100.0, np.float32)], opset=17)


# ***** DFT (IRFFT), MaxUnpool with output_shape, Scan of opset 8 *****


@pytest.mark.parametrize("length", [None, 9, 6])
def test_dft_irfft_matches_numpy(length: int) -> None:
    spec = np.fft.rfft(rng.standard_normal((3, 10)), axis=-1)  # 6 bins
    x = np.stack([spec.real, spec.imag], -1).astype(np.float32)
    node = _node("DFT", ["x", "len" if length else "", "axis"], onesided=1, inverse=1)
    feed = [x, np.array(length or 0, np.int64), np.array(1, np.int64)]
    got = run_node(node, feed, opset=20)[0]
    want = np.fft.irfft(spec, n=length, axis=-1)
    assert got.shape == (*want.shape, 1)
    np.testing.assert_allclose(got[..., 0], want, rtol=1e-4, atol=1e-5)


def test_dft_refuses_onesided_complex_forward() -> None:
    with pytest.raises(UnsupportedOp, match="onesided"):
        run_node(_node("DFT", ["x"], onesided=1, axis=1), [np.zeros((1, 4, 2), np.float32)], opset=19)


def test_max_unpool_with_output_shape_pads_at_the_end() -> None:
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    idx = np.array([[[[5, 7], [13, 15]]]], np.int64)
    node = _node("MaxUnpool", ["x", "i", "s"], kernel_shape=[2, 2], strides=[2, 2])
    got = run_node(node, [x, idx, np.array([1, 1, 6, 5])], opset=11)[0]
    want = np.zeros((1, 1, 6, 5), np.float32)
    want[0, 0, 1, 1], want[0, 0, 1, 3], want[0, 0, 3, 1], want[0, 0, 3, 3] = 5, 6, 7, 8
    np.testing.assert_array_equal(got, want)
    with pytest.raises(OnnxError, match="output_shape"):
        run_node(node, [x, idx, np.array([1, 1, 3, 3])], opset=11)


def test_scan_opset8_runs_per_batch_row_with_lengths_and_directions() -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["o"])],
        "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    node = helper.make_node("Scan", ["lens", "init", "xs"], ["final", "outs"], num_scan_inputs=1, body=body,
                            directions=[1])  # fmt: skip
    init = rng.standard_normal((3, 2)).astype(np.float32)
    xs = rng.standard_normal((3, 4, 2)).astype(np.float32)
    lens = np.array([4, 2, 0], np.int64)
    final, outs = run_node(node, [lens, init, xs], opset=8)
    for b, m in enumerate(lens):
        steps = np.cumsum(xs[b, :m][::-1], 0) + init[b]
        np.testing.assert_allclose(final[b], steps[-1] if m else init[b], rtol=1e-6)
        np.testing.assert_allclose(outs[b, :m], steps, rtol=1e-6)
    assert outs.shape == (3, 4, 2)
    with pytest.raises(OnnxError, match="sequence_lens"):
        run_node(node, [np.array([5, 1, 1]), init, xs], opset=8)
