"""What the level-6 programs must compute, in plain numpy (float64), forward and backward written out by hand.

Nothing here uses tgcore: each layer is a pair of functions, `*_forward` returning the output and what the
backward needs, `*_backward` taking the upstream gradient and returning the gradients of the inputs and weights.
Weights are dicts of float32 arrays keyed like the tgcore models' state dicts; the references compute on them in
float64, so a device's float32 result is compared with (nearly) the exact one.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

Weights = dict[str, np.ndarray]
Grads = dict[str, np.ndarray]
Batches = list[tuple[np.ndarray, np.ndarray]]  # (inputs, integer labels) per step

GELU_C = math.sqrt(2 / math.pi)  # GELU in its tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))


def f64(w: Weights) -> Weights:
    """The weights in float64."""
    return {k: v.astype(np.float64) for k, v in w.items()}


# ***** layers: forward and backward *****

def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x @ w.T + b, w of shape (out, in) as nn.Linear keeps it."""
    y = x @ w.T
    return y if b is None else y + b


def linear_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db) of y = x @ w.T + b for any leading axes."""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy @ w, dy2.T @ x2, dy2.sum(0)


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx of max(x, 0)."""
    return dy * (x > 0)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its tanh form."""
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x**3)))


def gelu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx of gelu(x)."""
    t = np.tanh(GELU_C * (x + 0.044715 * x**3))
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_C * (1 + 3 * 0.044715 * x * x))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x / (1 + np.exp(-x))


def layernorm_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """Normalized over the last axis, then scaled and shifted."""
    mu = x.mean(-1, keepdims=True)
    invstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) * invstd
    return xhat * w + b, (xhat, invstd, w)


def layernorm_backward(cache: tuple, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db) of layernorm_forward."""
    xhat, invstd, w = cache
    axes = tuple(range(dy.ndim - 1))
    dw, db = (dy * xhat).sum(axes), dy.sum(axes)
    g = dy * w
    dx = invstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, dw, db


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_backward(p: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """The gradient of softmax's input, from its output p and the gradient dp of p."""
    return p * (dp - (dp * p).sum(-1, keepdims=True))


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of (N, C) logits against integer labels, and its gradient with respect to the logits."""
    p = softmax(logits)
    n = len(labels)
    loss = -np.log(p[np.arange(n), labels]).mean()
    d = p.copy()
    d[np.arange(n), labels] -= 1
    return float(loss), d / n


def causal_mask(t_q: int, t_k: int) -> np.ndarray:
    """True where query i (the last t_q of t_k positions) may not see key j."""
    return np.arange(t_k)[None, :] > np.arange(t_k - t_q, t_k)[:, None]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v over (..., T, d) heads, the last q rows against every key."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), -np.inf, s)
    return softmax(s) @ v


def conv2d_forward(x: np.ndarray, w: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Stride-1 convolution (no bias) of (N, C, H, W) with (F, C, K, K) weights; returns the output and the
    patches."""
    n, c, h, wd = x.shape
    k = w.shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - k + 1, wd + 2 * pad - k + 1
    # patches[n, i, j, c, a, b] = xp[n, c, i + a, j + b]
    patches = np.empty((n, oh, ow, c, k, k))
    for a in range(k):
        for bb in range(k):
            patches[..., a, bb] = xp[:, :, a:a + oh, bb:bb + ow].transpose(0, 2, 3, 1)
    return np.einsum("nijcab,fcab->nfij", patches, w), patches


def conv2d_backward(x_shape: tuple[int, ...], patches: np.ndarray, w: np.ndarray, pad: int,
                    dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dw) of conv2d_forward."""
    n, c, h, wd = x_shape
    k = w.shape[-1]
    oh, ow = dy.shape[2:]
    dw = np.einsum("nfij,nijcab->fcab", dy, patches)
    dpatches = np.einsum("nfij,fcab->nijcab", dy, w)
    dxp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    for a in range(k):
        for bb in range(k):
            dxp[:, :, a:a + oh, bb:bb + ow] += dpatches[..., a, bb].transpose(0, 3, 1, 2)
    return dxp[:, :, pad:pad + h, pad:pad + wd], dw


def batchnorm_train_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """Batch normalization of (N, C, H, W) with the batch's statistics per channel; also returns mean and var."""
    axes = (0, 2, 3)
    mean = x.mean(axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axes, keepdims=True)
    invstd = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * invstd
    shape = (1, -1, 1, 1)
    return xhat * w.reshape(shape) + b.reshape(shape), (xhat, invstd, w, mean.ravel(), var.ravel())


def batchnorm_train_backward(cache: tuple, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db) of batchnorm_train_forward (the batch statistics depend on x too)."""
    xhat, invstd, w = cache[:3]
    axes = (0, 2, 3)
    dw, db = (dy * xhat).sum(axes), dy.sum(axes)
    g = dy * w.reshape(1, -1, 1, 1)
    dx = invstd * (g - g.mean(axes, keepdims=True) - xhat * (g * xhat).mean(axes, keepdims=True))
    return dx, dw, db


def maxpool2_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2 max-pool with stride 2; also the one-hot of each window's maximum (inputs have no ties that matter)."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2)
    out = win.max((3, 5))
    hit = win == out[:, :, :, None, :, None]
    return out, hit


def maxpool2_backward(hit: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx of maxpool2_forward."""
    # a window of equal values (zeros after a ReLU) shares the gradient, as tgcore's max does; a ReLU before the
    # pool makes that gradient 0 again, so how ties are split does not change the result
    share = hit / hit.sum((3, 5), keepdims=True)
    n, c, h2, _, w2, _ = hit.shape
    return (share * dy[:, :, :, None, :, None]).reshape(n, c, h2 * 2, w2 * 2)


# ***** optimizers *****

class SGDState:
    """SGD with momentum and weight decay: b = mu b + (g + wd p); p -= lr b."""

    def __init__(self, lr: float, momentum: float, weight_decay: float) -> None:
        self.lr, self.momentum, self.wd = lr, momentum, weight_decay
        self.b: Grads = {}

    def step(self, params: Weights, grads: Grads) -> None:
        for k, g in grads.items():
            g = g + self.wd * params[k]
            self.b[k] = self.momentum * self.b.get(k, 0) + g
            params[k] = params[k] - self.lr * self.b[k]


class AdamState:
    """Adam with bias-corrected moments: p -= lr m_hat / (sqrt(v_hat) + eps)."""

    def __init__(self, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m: Grads = {}
        self.v: Grads = {}

    def step(self, params: Weights, grads: Grads) -> None:
        self.t += 1
        for k, g in grads.items():
            self.m[k] = self.b1 * self.m.get(k, 0) + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v.get(k, 0) + (1 - self.b2) * g * g
            m_hat = self.m[k] / (1 - self.b1**self.t)
            v_hat = self.v[k] / (1 - self.b2**self.t)
            params[k] = params[k] - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


# ***** the programs *****

def mlp_loss_and_grads(p: Weights, x: np.ndarray, y: np.ndarray) -> tuple[float, Grads]:
    """Linear -> ReLU -> Linear, mean cross-entropy."""
    h = linear_forward(x, p["l1.weight"], p["l1.bias"])
    a = np.maximum(h, 0)
    logits = linear_forward(a, p["l2.weight"], p["l2.bias"])
    loss, dlogits = cross_entropy(logits, y)
    da, dw2, db2 = linear_backward(a, p["l2.weight"], dlogits)
    _, dw1, db1 = linear_backward(x, p["l1.weight"], relu_backward(h, da))
    return loss, {"l1.weight": dw1, "l1.bias": db1, "l2.weight": dw2, "l2.bias": db2}


def cnn_loss_and_grads(p: Weights, x: np.ndarray, y: np.ndarray, eps: float) -> tuple[float, Grads, tuple]:
    """Conv2d 3x3 (padding 1, no bias) -> BatchNorm2d (batch statistics) -> ReLU -> 2x2 max-pool -> Linear,
    cross-entropy.

    Also returns the batch mean and (biased) variance of the BatchNorm's input."""
    c, patches = conv2d_forward(x, p["conv.weight"], 1)
    bn, bn_cache = batchnorm_train_forward(c, p["bn.weight"], p["bn.bias"], eps)
    r = np.maximum(bn, 0)
    pooled, hit = maxpool2_forward(r)
    flat = pooled.reshape(len(x), -1)
    logits = linear_forward(flat, p["head.weight"], p["head.bias"])
    loss, dlogits = cross_entropy(logits, y)
    dflat, dwh, dbh = linear_backward(flat, p["head.weight"], dlogits)
    dr = maxpool2_backward(hit, dflat.reshape(pooled.shape))
    dc, dwbn, dbbn = batchnorm_train_backward(bn_cache, relu_backward(bn, dr))
    _, dwc = conv2d_backward(x.shape, patches, p["conv.weight"], 1, dc)
    grads = {"conv.weight": dwc, "bn.weight": dwbn, "bn.bias": dbbn, "head.weight": dwh,
             "head.bias": dbh}
    return loss, grads, (bn_cache[3], bn_cache[4])


def block_forward_backward(p: Weights, x: np.ndarray, n_heads: int, dout: np.ndarray,
                           eps: float = 1e-5) -> tuple[np.ndarray, Grads]:
    """A pre-norm transformer block: h = x + proj(causal MHA(ln_1 x)); out = h + fc2(gelu(fc1(ln_2 h))).

    Returns the output and the gradient of sum(out * dout) with respect to x ("x") and to every weight."""
    bsz, t, d = x.shape
    hd = d // n_heads
    g: Grads = {}
    # forward
    a_in, ln1 = layernorm_forward(x, p["ln_1.weight"], p["ln_1.bias"], eps)
    qkv = linear_forward(a_in, p["attn.qkv.weight"], p["attn.qkv.bias"])

    def heads(z: np.ndarray) -> np.ndarray:
        return z.reshape(bsz, t, n_heads, hd).transpose(0, 2, 1, 3)

    q, k, v = (heads(qkv[..., i * d:(i + 1) * d]) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    s = np.where(causal_mask(t, t), -np.inf, s)
    prob = softmax(s)
    o = prob @ v
    o_flat = o.transpose(0, 2, 1, 3).reshape(bsz, t, d)
    h = x + linear_forward(o_flat, p["attn.proj.weight"], p["attn.proj.bias"])
    m_in, ln2 = layernorm_forward(h, p["ln_2.weight"], p["ln_2.bias"], eps)
    f1 = linear_forward(m_in, p["mlp.fc1.weight"], p["mlp.fc1.bias"])
    out = h + linear_forward(gelu(f1), p["mlp.fc2.weight"], p["mlp.fc2.bias"])
    # backward
    dh = dout.copy()
    dact, g["mlp.fc2.weight"], g["mlp.fc2.bias"] = linear_backward(gelu(f1), p["mlp.fc2.weight"], dout)
    dm_in, g["mlp.fc1.weight"], g["mlp.fc1.bias"] = linear_backward(m_in, p["mlp.fc1.weight"],
                                                                    gelu_backward(f1, dact))
    dh_ln, g["ln_2.weight"], g["ln_2.bias"] = layernorm_backward(ln2, dm_in)
    dh += dh_ln
    do_flat, g["attn.proj.weight"], g["attn.proj.bias"] = linear_backward(o_flat, p["attn.proj.weight"], dh)
    do = heads(do_flat)
    dprob, dv = do @ v.transpose(0, 1, 3, 2), prob.transpose(0, 1, 3, 2) @ do
    ds = softmax_backward(prob, dprob) / math.sqrt(hd)
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    dqkv = np.concatenate([z.transpose(0, 2, 1, 3).reshape(bsz, t, d) for z in (dq, dk, dv)], -1)
    da_in, g["attn.qkv.weight"], g["attn.qkv.bias"] = linear_backward(a_in, p["attn.qkv.weight"], dqkv)
    dx_ln, g["ln_1.weight"], g["ln_1.bias"] = layernorm_backward(ln1, da_in)
    g["x"] = dh + dx_ln
    return out, g


def gpt2_logits(p: Weights, cfg: Any, tokens: list[int]) -> np.ndarray:
    """The GPT-2-style decoder's logits at every position of `tokens` (no cache): learned token and position
    embeddings, pre-norm blocks of causal multi-head attention and a GELU MLP, a final LayerNorm, an LM head."""
    t, d, nh = len(tokens), cfg.dim, cfg.n_heads
    hd = d // nh
    h = p["wte.weight"][tokens] + p["wpe.weight"][:t]
    for i in range(cfg.n_layers):
        pre = f"h.{i}."
        a, _ = layernorm_forward(h, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], cfg.norm_eps)
        qkv = linear_forward(a, p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"])
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(t, nh, hd).transpose(1, 0, 2) for j in range(3))
        o = attention(q, k, v, causal=True).transpose(1, 0, 2).reshape(t, d)
        h = h + linear_forward(o, p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"])
        m, _ = layernorm_forward(h, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], cfg.norm_eps)
        f = gelu(linear_forward(m, p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"]))
        h = h + linear_forward(f, p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"])
    h, _ = layernorm_forward(h, p["ln_f.weight"], p["ln_f.bias"], cfg.norm_eps)
    return linear_forward(h, p["lm_head.weight"], None)


def rotary(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate each consecutive pair (x[2i], x[2i+1]) of the last axis of (T, H, D) by position * theta^(-2i/D)."""
    d = x.shape[-1]
    angle = positions[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]  # (T, D/2)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def llama_logits(p: Weights, cfg: Any, tokens: list[int]) -> np.ndarray:
    """The LLaMA-style decoder's logits at every position (no cache): RMSNorm, rotary position embeddings,
    grouped-query causal attention (each key/value head shared by n_heads / n_kv_heads query heads), a SiLU-gated
    FFN, a final RMSNorm and an output projection."""
    t, d, nh, nkv = len(tokens), cfg.dim, cfg.n_heads, cfg.n_kv_heads
    hd = d // nh
    pos = np.arange(t, dtype=np.float64)
    h = p["tok_embeddings.weight"][tokens]
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        a = rmsnorm(h, p[pre + "attention_norm.weight"], cfg.norm_eps)
        q = rotary(linear_forward(a, p[pre + "attention.wq.weight"], None).reshape(t, nh, hd), pos, cfg.rope_theta)
        k = rotary(linear_forward(a, p[pre + "attention.wk.weight"], None).reshape(t, nkv, hd), pos, cfg.rope_theta)
        v = linear_forward(a, p[pre + "attention.wv.weight"], None).reshape(t, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)  # query head j reads kv head j // n_rep
        o = attention(q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2), causal=True)
        h = h + linear_forward(o.transpose(1, 0, 2).reshape(t, d), p[pre + "attention.wo.weight"], None)
        f = rmsnorm(h, p[pre + "ffn_norm.weight"], cfg.norm_eps)
        gated = silu(linear_forward(f, p[pre + "feed_forward.w1.weight"], None)) * linear_forward(
            f, p[pre + "feed_forward.w3.weight"], None)
        h = h + linear_forward(gated, p[pre + "feed_forward.w2.weight"], None)
    return linear_forward(rmsnorm(h, p["norm.weight"], cfg.norm_eps), p["output.weight"], None)


def greedy(logits_fn: Callable[[list[int]], np.ndarray], prompt: list[int],
           n_new: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy generation by recomputing the whole sequence each step: the new tokens and each step's last logits."""
    tokens, new, logits = list(prompt), [], []
    for _ in range(n_new):
        last = logits_fn(tokens)[-1]
        tok = int(last.argmax())
        tokens.append(tok)
        new.append(tok)
        logits.append(last)
    return new, logits


def top2_margin(logits: np.ndarray) -> float:
    """How far the largest logit is above the second largest."""
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def train_mlp(weights: Weights, batches: Batches, opt: SGDState | AdamState) -> tuple[list[float], Weights]:
    """Each batch's loss (before its update) and the parameters after the last step."""
    p, losses = f64(weights), []
    for x, y in batches:
        loss, grads = mlp_loss_and_grads(p, x.astype(np.float64), y)
        opt.step(p, grads)
        losses.append(loss)
    return losses, p


def train_cnn(weights: Weights, batches: Batches, opt: AdamState, momentum: float,
              eps: float) -> tuple[list[float], Weights]:
    """Each batch's loss and the parameters and BatchNorm running statistics after the last step (the running
    variance is updated with the unbiased batch variance)."""
    p, losses = f64(weights), []
    trained = [k for k in p if not k.startswith("bn.running") and k != "bn.num_batches_tracked"]
    for x, y in batches:
        loss, grads, (mean, var) = cnn_loss_and_grads(p, x.astype(np.float64), y, eps)
        opt.step(p, {k: grads[k] for k in trained})
        m = x.shape[0] * x.shape[2] * x.shape[3]
        p["bn.running_mean"] = (1 - momentum) * p["bn.running_mean"] + momentum * mean
        p["bn.running_var"] = (1 - momentum) * p["bn.running_var"] + momentum * var * m / (m - 1)
        p["bn.num_batches_tracked"] = p["bn.num_batches_tracked"] + 1
        losses.append(loss)
    return losses, p
