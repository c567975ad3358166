"""ONNX operators of recent opsets: LinearAttention and CausalConvWithState (27), TensorScatter (24), STFT and
MelWeightMatrix (17), written on Tensor ops from the operator specs (onnx/defs) like those of ops.py.

Half-precision inputs are computed in float32 and rounded once at the end, as numpy-based references do."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tgcore.dtype import DType, dtypes
from tgcore.onnx.errors import OnnxError
from tgcore.onnx.registry import Node, norm_axis, onnx_to_dtype, op, to_tensor, wide_float
from tgcore.tensor import Tensor, _with_check

_HALF = (dtypes.float16, dtypes.bfloat16)


def _wide(dt: DType) -> DType:
    """The dtype to compute a float op in: float32 for the half types, the dtype itself otherwise."""
    return dtypes.float32 if dt in _HALF else dt


def _scalar(n: Node, i: int, what: str) -> Optional[int]:
    """Input i as one integer read on the host (None when omitted), or an error naming `what` it should be."""
    v = n.host(i)
    if v is None:
        return None
    if v.size != 1:
        raise OnnxError(f"{n.op_type}: {what} must be a scalar, got shape {v.shape}")
    return int(v.reshape(-1)[0])


# ***** LinearAttention: a recurrent state (B, H_kv, d_k, d_v) updated token by token *****

_RULES = ("linear", "gated", "delta", "gated_delta")


def _packed_heads(x: Tensor, heads: int, what: str) -> Tensor:
    """(B, T, heads * size) as (B, heads, T, size)."""
    if x.ndim != 3 or x.shape[-1] % heads:
        raise OnnxError(f"LinearAttention: {what} has shape {x.shape}; expected (B, T, {heads} * head_size)")
    b, t, _ = x.shape
    return x.reshape(b, t, heads, x.shape[-1] // heads).transpose(1, 2)


@op("LinearAttention", 27)
def _linear_attention(n: Node) -> tuple:
    q, k, v, past, decay, beta = (n[i] for i in range(6))
    rule = n.get("update_rule", "gated_delta")
    if rule not in _RULES:
        raise n.unsupported(f"update_rule {rule!r}: expected one of {', '.join(_RULES)}")
    hq, hkv = n.get("q_num_heads"), n.get("kv_num_heads")
    if not hq or not hkv or hq % hkv:
        raise OnnxError(f"LinearAttention: q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    if "gated" in rule and decay is None:
        raise OnnxError(f"LinearAttention: update_rule {rule!r} needs the decay input")
    if "delta" in rule and beta is None:
        raise OnnxError(f"LinearAttention: update_rule {rule!r} needs the beta input")
    wide = _wide(q.dtype)
    qh = _packed_heads(q, hq, "query").cast(wide)
    kh, vh = _packed_heads(k, hkv, "key").cast(wide), _packed_heads(v, hkv, "value").cast(wide)
    batch, steps, dk, dv = qh.shape[0], qh.shape[2], qh.shape[3], vh.shape[3]
    if kh.shape != (batch, hkv, steps, dk) or vh.shape[:3] != (batch, hkv, steps):
        raise OnnxError(
            f"LinearAttention: query {q.shape}, key {k.shape} and value {v.shape} disagree; expected the same B and T, "
            f"and key's head size {dk} as query's"
        )
    want_state = (batch, hkv, dk, dv)
    if past is not None and past.shape != want_state:
        raise OnnxError(f"LinearAttention: past_state has shape {past.shape}; expected {want_state}")
    gate = None
    if "gated" in rule:  # log-decay per key dimension (B, H_kv, T, d_k) or per head (B, H_kv, T, 1)
        if decay.shape not in ((batch, steps, hkv * dk), (batch, steps, hkv)):
            raise OnnxError(
                f"LinearAttention: decay has shape {decay.shape}; expected {(batch, steps, hkv * dk)} or "
                f"{(batch, steps, hkv)}"
            )
        gate = _packed_heads(decay, hkv, "decay").cast(wide).exp()
    rate = None
    if "delta" in rule:  # (B, H_kv or 1, T, 1)
        if beta.shape not in ((batch, steps, hkv), (batch, steps, 1)):
            raise OnnxError(
                f"LinearAttention: beta has shape {beta.shape}; expected {(batch, steps, hkv)} or {(batch, steps, 1)}"
            )
        rate = beta.cast(wide).transpose(1, 2).unsqueeze(-1)
    scale = n.get("scale", 0.0) or 1 / math.sqrt(dk)
    group = hq // hkv  # query head h reads key/value head h // group
    queries = qh.reshape(batch, hkv, group, steps, dk)
    state = Tensor.zeros(*want_state, dtype=wide, device=n.device) if past is None else past.cast(wide)
    outs = []
    for t in range(steps):
        kt, vt = kh[:, :, t].unsqueeze(-1), vh[:, :, t].unsqueeze(-2)  # (B, H_kv, d_k, 1), (B, H_kv, 1, d_v)
        if gate is not None:
            state = state * gate[:, :, t].unsqueeze(-1)
        if rate is None:
            state = state + kt * vt
        else:  # the delta rule: the value minus what the (decayed) state already recalls for this key
            recalled = (state * kt).sum(-2, keepdim=True)
            state = state + rate[:, :, t].unsqueeze(-1) * kt * (vt - recalled)
        state = state.contiguous()  # (one buffer per step: the next step and this output both read it)
        qt = queries[:, :, :, t].unsqueeze(-1)  # (B, H_kv, group, d_k, 1)
        outs.append((qt * state.unsqueeze(2)).sum(-2) * scale)  # (B, H_kv, group, d_v)
    out = Tensor.stack(*outs, dim=3).reshape(batch, hq, steps, dv).transpose(1, 2).reshape(batch, steps, hq * dv)
    return out.cast(q.dtype), state.cast(q.dtype if past is None else past.dtype)


# ***** CausalConvWithState: a depthwise causal conv1d whose left context is carried between calls *****


@op("CausalConvWithState", 27)
def _causal_conv_with_state(n: Node) -> tuple:
    x, w, bias, past = n[0], n[1], n[2], n[3]
    act = n.get("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise n.unsupported(f"activation {act!r}: expected none, silu or swish")
    if x.ndim != 3:
        raise OnnxError(f"CausalConvWithState: input has shape {x.shape}; expected (batch, channels, length)")
    batch, chans, length = x.shape
    if w.ndim != 3 or w.shape[:2] != (chans, 1) or w.shape[2] < 1:
        raise OnnxError(f"CausalConvWithState: weight has shape {w.shape}; expected ({chans}, 1, kernel_size)")
    k = w.shape[2]
    if bias is not None and bias.shape != (chans,):
        raise OnnxError(f"CausalConvWithState: bias has shape {bias.shape}; expected ({chans},)")
    if past is not None and past.shape != (batch, chans, k - 1):
        raise OnnxError(f"CausalConvWithState: past_state has shape {past.shape}; expected {(batch, chans, k - 1)}")
    wide = _wide(x.dtype)
    if k == 1:
        padded = x
    elif past is None:
        padded = x.pad(((0, 0), (0, 0), (k - 1, 0)))
    else:
        padded = past.cat(x, dim=2)
    windows = padded.cast(wide)._pool((k,))  # (B, C, length, k): each output's k inputs, oldest first
    out = (windows * w.cast(wide).reshape(1, chans, 1, k)).sum(-1)
    if bias is not None:
        out = out + bias.cast(wide).reshape(1, chans, 1)
    if act != "none":  # SiLU of the convolution rounded to the input's dtype, in float32 for half types
        out = out.cast(x.dtype).cast(wide)
        out = out * out.sigmoid()
    present = padded.shrink(((0, batch), (0, chans), (length, length + k - 1)))
    return out.cast(x.dtype), present


# ***** TensorScatter: a KV cache with each batch row's update written at its own position *****


@op("TensorScatter", 24)
def _tensor_scatter(n: Node) -> Tensor:
    cache, update, where_at = n[0], n[1], n[2]
    mode = n.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise n.unsupported(f"mode {mode!r}: expected linear or circular")
    axis = norm_axis(n.get("axis", -2), cache.ndim)
    if not 0 < axis < cache.ndim:
        raise OnnxError(f"TensorScatter: axis {n.get('axis', -2)} of a rank-{cache.ndim} cache; expected 1..rank-1")
    size, seq = cache.shape[axis], update.shape[axis] if update.ndim == cache.ndim else -1
    others = lambda s: s[:axis] + s[axis + 1 :]  # noqa: E731
    if update.ndim != cache.ndim or others(update.shape) != others(cache.shape) or seq > size:
        raise OnnxError(
            f"TensorScatter: update has shape {update.shape}; expected past_cache's {cache.shape} with at most "
            f"{size} along axis {axis}"
        )
    if seq == 0:  # (nothing to write)
        return cache
    batch = cache.shape[0]
    if where_at is None:
        start = Tensor.zeros(batch, 1, dtype=dtypes.int64, device=n.device)
    elif where_at.shape != (batch,):
        raise OnnxError(f"TensorScatter: write_indices has shape {where_at.shape}; expected ({batch},)")
    else:
        start = where_at.cast(dtypes.int64).reshape(batch, 1)
    pos = Tensor.arange(size, dtype=dtypes.int64, device=n.device).reshape(1, size)
    src = pos - start  # (B, size): which update row lands at each cache position
    if mode == "circular":
        src = src % size
        bad = (start < 0).expand(batch, size)
    else:
        bad = ((start < 0) | (start + seq > size)).expand(batch, size)
    hit = (src >= 0) & (src < seq)
    shape = [batch] + [1] * (cache.ndim - 1)
    shape[axis] = size
    hit, src = hit.reshape(shape), hit.where(src, 0).reshape(shape)
    gathered = update.gather(axis, src.expand(*cache.shape[:axis], size, *cache.shape[axis + 1 :]))
    out = hit.where(gathered, cache)
    limit = "a write index below 0" if mode == "circular" else f"write_indices + {seq} above {size} (or below 0)"
    return _with_check(out, bad, f"TensorScatter ({mode}): {limit}, past the cache's sequence axis")


# ***** STFT and MelWeightMatrix *****


@op("STFT", 17)
def _stft(n: Node) -> Tensor:
    signal, window = n[0], n[2]
    if signal.ndim != 3 or signal.shape[-1] not in (1, 2):
        raise OnnxError(f"STFT: signal has shape {signal.shape}; expected (batch, length, 1 or 2)")
    step, given = _scalar(n, 1, "frame_step"), _scalar(n, 3, "frame_length")
    length = signal.shape[1]
    if window is not None and (window.ndim != 1 or (given is not None and window.shape[0] != given)):
        raise OnnxError(f"STFT: window has shape {window.shape}; expected ({given or 'frame_length'},)")
    frame = given if given is not None else window.shape[0] if window is not None else length
    if step is None or step < 1 or not 1 <= frame <= length:
        raise OnnxError(
            f"STFT: frame_step {step} and frame_length {frame} for a signal of {length}; expected frame_step >= 1 "
            f"and 1 <= frame_length <= {length}"
        )
    onesided, complex_in = bool(n.get("onesided", 1)), signal.shape[-1] == 2
    if onesided and complex_in:
        raise n.unsupported("onesided output of a complex signal (it has no conjugate symmetry); set onesided=0")
    wide = wide_float(signal.dtype)
    bins = frame // 2 + 1 if onesided else frame
    j, k = np.arange(frame).reshape(-1, 1), np.arange(bins).reshape(1, -1)
    angle = -2 * np.pi * ((j * k) % frame) / frame
    cos_t, sin_t = (Tensor(f(angle).astype(wide.np), device=n.device) for f in (np.cos, np.sin))

    def frames(part: Tensor) -> Tensor:  # (batch, length) -> (batch, frames, frame), windowed
        out = part.cast(wide)._pool((frame,), step)
        return out if window is None else out * window.cast(wide)

    re = frames(signal[..., 0])
    yr, yi = re.matmul(cos_t), re.matmul(sin_t)
    if complex_in:
        im = frames(signal[..., 1])
        yr, yi = yr - im.matmul(sin_t), yi + im.matmul(cos_t)
    return yr.unsqueeze(-1).cat(yi.unsqueeze(-1), dim=-1).cast(signal.dtype)


def _mel(hz: np.ndarray) -> np.ndarray:
    return 2595 * np.log10(1 + hz / 700)


def _hz(mel: np.ndarray) -> np.ndarray:
    return 700 * (10 ** (mel / 2595) - 1)


@op("MelWeightMatrix", 17)
def _mel_weight_matrix(n: Node) -> Tensor:
    """On the host (its inputs are scalars, its output a table): triangles of peak 1, spaced evenly in mels."""
    mels, dft, rate = (_scalar(n, i, name) for i, name in enumerate(("num_mel_bins", "dft_length", "sample_rate")))
    low, high = (float(n.host(i).reshape(-1)[0]) for i in (3, 4))
    if mels is None or dft is None or rate is None or mels < 1 or dft < 1 or rate < 1 or not 0 <= low < high:
        raise OnnxError(
            f"MelWeightMatrix: num_mel_bins {mels}, dft_length {dft}, sample_rate {rate}, edges [{low}, {high}] Hz; "
            "expected positive counts and rate and 0 <= lower_edge_hertz < upper_edge_hertz"
        )
    spectrum = dft // 2 + 1
    # num_mel_bins + 2 edges a (mel_high - mel_low) / (num_mel_bins + 2) step apart from lower_edge_hertz (so the
    # last edge falls a step short of upper_edge_hertz, as onnx's own test data has it), each at the bin it falls in
    lo_mel, step = _mel(np.float64(low)), (_mel(np.float64(high)) - _mel(np.float64(low))) / (mels + 2)
    edges_hz = _hz(lo_mel + step * np.arange(mels + 2))
    edges = np.floor((dft + 1) * edges_hz / rate).astype(np.int64)
    table = np.zeros((spectrum, mels), dtype=np.float64)
    bins = np.arange(spectrum)
    for m in range(mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        rise = (bins - lo) / (mid - lo) if mid > lo else np.zeros(spectrum)
        fall = (hi - bins) / (hi - mid) if hi > mid else np.zeros(spectrum)
        col = np.where((bins >= lo) & (bins < mid), rise, 0) + np.where((bins >= mid) & (bins < hi), fall, 0)
        table[:, m] = np.where(bins == mid, 1.0, col)  # (the peak is 1 even where a side has no width)
    out_dt = onnx_to_dtype(n.get("output_datatype", 1), n.op_type, n.opset)
    if out_dt == dtypes.bfloat16:
        import ml_dtypes  # (onnx depends on it)

        arr = table.astype(ml_dtypes.bfloat16)
    else:
        arr = table.astype(out_dt.np)
    return n.known.put(to_tensor(arr, n.device), arr)
