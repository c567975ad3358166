"""The level-6 programs, written on tgcore the way a user writes them: an MLP and a CNN trained for a few steps, a
transformer block run forward and backward, and two small decoders that generate greedily with a KV cache under
TinyJit with a symbolic `start_pos`.

Every program takes its weights from seeded numpy (`*_weights`), so `tg_conformance.program_reference` can compute
what it must give. The decoders' weights are scaled so that each greedy token wins by a clear margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from tgcore import Tensor, TinyJit, Variable, nn
from tgcore.nn.optim import SGD, Adam, Optimizer
from tgcore.nn.state import get_parameters, get_state_dict

Weights = dict[str, np.ndarray]
Batches = list[tuple[np.ndarray, np.ndarray]]  # (inputs, integer labels) per step
StartPos = Union[int, Variable]


def load_weights(model: Any, weights: Weights, device: str) -> None:
    """Put each array of `weights` on `device` as the model's tensor of that name ("h.0.attn.c_attn.weight").

    A tensor that is not trained (requires_grad False, e.g. BatchNorm's running statistics) stays untrained."""
    for name, value in weights.items():
        *path, leaf = name.split(".")
        owner = model
        for part in path:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        old = getattr(owner, leaf)
        setattr(owner, leaf, Tensor(value, device=device, requires_grad=old.requires_grad))


def state_numpy(model: Any, names: Any) -> Weights:
    """The model's tensors named `names`, as numpy arrays."""
    state = get_state_dict(model)
    return {k: state[k].numpy() for k in names}


def _normal(rng: np.random.Generator, *shape: int, std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _linear(rng: np.random.Generator, w: Weights, name: str, fan_in: int, fan_out: int, bias: bool = True,
            gain: float = 1.0) -> None:
    w[f"{name}.weight"] = _normal(rng, fan_out, fan_in, std=gain / math.sqrt(fan_in))
    if bias:
        w[f"{name}.bias"] = _normal(rng, fan_out, std=0.1)


# ***** training: an MLP (SGD, Adam) and a CNN with BatchNorm (Adam) *****

MLP_SHAPE = (12, 32, 5)  # inputs, hidden, classes
MLP_BATCH, MLP_STEPS = 16, 4
SGD_ARGS = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}
ADAM_ARGS = {"lr": 0.01}


class MLP:
    """Linear -> ReLU -> Linear."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int) -> None:
        self.l1, self.l2 = nn.Linear(n_in, n_hidden), nn.Linear(n_hidden, n_out)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def mlp_weights(seed: int) -> Weights:
    """The MLP's weights, seeded."""
    rng = np.random.default_rng(seed)
    w: Weights = {}
    _linear(rng, w, "l1", MLP_SHAPE[0], MLP_SHAPE[1])
    _linear(rng, w, "l2", MLP_SHAPE[1], MLP_SHAPE[2])
    return w


def classification_batches(seed: int, steps: int, shape: tuple[int, ...], classes: int) -> Batches:
    """`steps` batches of standard normal inputs of `shape` and random labels."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, shape[0]).astype(np.int32))
            for _ in range(steps)]


def make_optimizer(name: str, params: list[Tensor]) -> Optimizer:
    """The optimizer named `name` ("sgd" or "adam") with the level's settings."""
    return SGD(params, **SGD_ARGS) if name == "sgd" else Adam(params, **ADAM_ARGS)


def train_mlp(device: str, optimizer: str, weights: Weights, batches: Batches) -> tuple[list[float], Weights]:
    """One TinyJit'd training step per batch (the first runs, the second records, the rest replay); returns each
    step's loss (before its update) and the parameters after the last step."""
    model = MLP(*MLP_SHAPE)
    load_weights(model, weights, device)
    opt = make_optimizer(optimizer, get_parameters(model))

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        # realized in the schedule of the update, so that it is computed from the weights before the update
        return loss.realize(*opt.schedule_step())

    losses = []
    with Tensor.train():
        for x, y in batches:
            losses.append(float(step(Tensor(x, device=device), Tensor(y, device=device)).item()))
    return losses, state_numpy(model, weights)


CNN_INPUT = (8, 2, 8, 8)  # N, C, H, W
CNN_CHANNELS, CNN_CLASSES, CNN_STEPS, BN_EPS, BN_MOMENTUM = 4, 3, 3, 1e-5, 0.1


class CNN:
    """Conv2d 3x3 (padding 1, no bias: the BatchNorm after it would cancel one) -> BatchNorm2d -> ReLU -> 2x2
    max-pool -> Linear."""

    def __init__(self) -> None:
        c, h, w = CNN_INPUT[1:]
        self.conv = nn.Conv2d(c, CNN_CHANNELS, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(CNN_CHANNELS, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.head = nn.Linear(CNN_CHANNELS * (h // 2) * (w // 2), CNN_CLASSES)

    def __call__(self, x: Tensor) -> Tensor:
        return self.head(self.bn(self.conv(x)).relu().max_pool2d((2, 2)).flatten(1))


def cnn_weights(seed: int) -> Weights:
    """The CNN's weights and BatchNorm statistics (running mean 0, variance 1, no batch seen), seeded."""
    rng = np.random.default_rng(seed)
    c, h, w = CNN_INPUT[1:]
    out: Weights = {"conv.weight": _normal(rng, CNN_CHANNELS, c, 3, 3, std=1 / math.sqrt(c * 9)),
                    "bn.weight": (1 + _normal(rng, CNN_CHANNELS, std=0.1)).astype(np.float32),
                    "bn.bias": _normal(rng, CNN_CHANNELS, std=0.1),
                    "bn.running_mean": np.zeros(CNN_CHANNELS, np.float32),
                    "bn.running_var": np.ones(CNN_CHANNELS, np.float32),
                    "bn.num_batches_tracked": np.zeros(1, np.float32)}
    _linear(rng, out, "head", CNN_CHANNELS * (h // 2) * (w // 2), CNN_CLASSES)
    return out


def train_cnn(device: str, weights: Weights, batches: Batches) -> tuple[list[float], Weights]:
    """Adam steps in training mode (BatchNorm on batch statistics, running statistics updated), not jitted."""
    model = CNN()
    load_weights(model, weights, device)
    opt = make_optimizer("adam", get_parameters(model))
    losses = []
    with Tensor.train():
        for x, y in batches:
            opt.zero_grad()
            loss = model(Tensor(x, device=device)).sparse_categorical_crossentropy(Tensor(y, device=device))
            loss.backward()
            losses.append(float(loss.item()))  # before the step, which overwrites the weights it is computed from
            opt.step()
    return losses, state_numpy(model, weights)


# ***** a transformer block, forward and backward *****

BLOCK_SHAPE = (2, 8, 32)  # batch, sequence, dim
BLOCK_HEADS = 4


class BlockAttention:
    """Multi-head causal self-attention with one qkv projection."""

    def __init__(self, dim: int, n_heads: int) -> None:
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.n_heads, self.dim = n_heads, dim

    def __call__(self, x: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        q, k, v = (t.reshape(bsz, seqlen, self.n_heads, self.dim // self.n_heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=2))
        out = q.scaled_dot_product_attention(k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(bsz, seqlen, self.dim))


class BlockMLP:
    """Linear -> GELU -> Linear, four times wider inside."""

    def __init__(self, dim: int) -> None:
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc2(self.fc1(x).gelu())


class Block:
    """Pre-norm transformer block: LayerNorm, causal attention, residual; LayerNorm, GELU MLP, residual."""

    def __init__(self, dim: int, n_heads: int) -> None:
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = BlockAttention(dim, n_heads), BlockMLP(dim)

    def __call__(self, x: Tensor) -> Tensor:
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


def block_weights(seed: int) -> tuple[Weights, np.ndarray, np.ndarray]:
    """The block's weights, an input x and the upstream gradient of the output."""
    rng = np.random.default_rng(seed)
    d = BLOCK_SHAPE[2]
    w: Weights = {}
    for ln in ("ln_1", "ln_2"):
        w[f"{ln}.weight"] = (1 + _normal(rng, d, std=0.1)).astype(np.float32)
        w[f"{ln}.bias"] = _normal(rng, d, std=0.1)
    _linear(rng, w, "attn.qkv", d, 3 * d)
    _linear(rng, w, "attn.proj", d, d)
    _linear(rng, w, "mlp.fc1", d, 4 * d)
    _linear(rng, w, "mlp.fc2", 4 * d, d)
    return w, _normal(rng, *BLOCK_SHAPE, std=1.0), _normal(rng, *BLOCK_SHAPE, std=1.0)


def block_forward_backward(device: str, weights: Weights, x: np.ndarray,
                           dout: np.ndarray) -> tuple[np.ndarray, Weights]:
    """The block's output and the gradients of sum(out * dout) for every weight and for x ("x")."""
    model = Block(BLOCK_SHAPE[2], BLOCK_HEADS)
    load_weights(model, weights, device)
    params = get_state_dict(model)
    for p in params.values():
        p.requires_grad = True
    xt = Tensor(x, device=device, requires_grad=True)
    out = model(xt)
    (out * Tensor(dout, device=device)).sum().backward()
    grads = {k: p.grad.numpy() for k, p in params.items() if p.grad is not None}
    assert xt.grad is not None, "x got no gradient"
    grads["x"] = xt.grad.numpy()
    return out.numpy(), grads


# ***** decoders that generate with a KV cache *****

@dataclass(frozen=True)
class DecoderConfig:
    """The sizes of a decoder (n_kv_heads and rope_theta are read by the LLaMA-style one only)."""

    dim: int = 32
    n_heads: int = 4
    n_kv_heads: int = 4
    n_layers: int = 2
    vocab_size: int = 64
    max_context: int = 32
    hidden_dim: int = 128
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


GPT2_CONFIG = DecoderConfig()
LLAMA_CONFIG = DecoderConfig(n_kv_heads=2, hidden_dim=96)
NEW_TOKENS = 16


class GPT2Attention:
    """Causal multi-head self-attention reading and writing a KV cache of max_context positions."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.c_attn, self.c_proj = nn.Linear(cfg.dim, 3 * cfg.dim), nn.Linear(cfg.dim, cfg.dim)
        self.dim, self.n_heads, self.head_dim, self.max_context = (cfg.dim, cfg.n_heads, cfg.dim // cfg.n_heads,
                                                                   cfg.max_context)
        self.cache_kv: Optional[Tensor] = None

    def __call__(self, x: Tensor, start_pos: StartPos, mask: Optional[Tensor]) -> Tensor:
        bsz, seqlen = x.shape[0], x.shape[1]
        xqkv = self.c_attn(x)
        xq, xk, xv = (xqkv.shrink((None, None, (i * self.dim, (i + 1) * self.dim)))
                      .reshape(bsz, seqlen, self.n_heads, self.head_dim) for i in range(3))
        if self.cache_kv is None:
            self.cache_kv = Tensor.zeros(2, bsz, self.max_context, self.n_heads, self.head_dim,
                                         device=x.device).contiguous().realize()
        # the new keys and values go into the cache, in place
        self.cache_kv.shrink((None, None, (start_pos, start_pos + seqlen), None, None)).assign(
            Tensor.stack(xk, xv)).realize()
        if isinstance(start_pos, int) and start_pos == 0:
            keys, values = xk, xv
        else:  # the cached positions before this one, then this one
            keys = self.cache_kv[0].shrink((None, (0, start_pos), None, None)).cat(xk, dim=1)
            values = self.cache_kv[1].shrink((None, (0, start_pos), None, None)).cat(xv, dim=1)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        out = xq.scaled_dot_product_attention(keys, values, mask).transpose(1, 2)
        return self.c_proj(out.reshape(bsz, seqlen, self.dim))


class GPT2FeedForward:
    """Linear -> GELU -> Linear."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.c_fc, self.c_proj = nn.Linear(cfg.dim, cfg.hidden_dim), nn.Linear(cfg.hidden_dim, cfg.dim)

    def __call__(self, x: Tensor) -> Tensor:
        return self.c_proj(self.c_fc(x).gelu())


class GPT2Block:
    """Pre-norm block: LayerNorm, attention, residual; LayerNorm, feed-forward, residual."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.attn, self.mlp = GPT2Attention(cfg), GPT2FeedForward(cfg)
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.dim, cfg.norm_eps), nn.LayerNorm(cfg.dim, cfg.norm_eps)

    def __call__(self, x: Tensor, start_pos: StartPos, mask: Optional[Tensor]) -> Tensor:
        h = x + self.attn(self.ln_1(x), start_pos, mask)
        return h + self.mlp(self.ln_2(h))


class GPT2:
    """A GPT-2-style decoder: learned token and position embeddings, pre-norm blocks, a final LayerNorm, an LM head.

    Called with a (1, T) token tensor and start_pos 0 it runs the prompt; called with a bound Variable token and a
    bound Variable start_pos it runs one decode step under TinyJit. Either way it returns the last position's logits
    and their argmax."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.cfg = cfg
        self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.dim), nn.Embedding(cfg.max_context, cfg.dim)
        self.h = [GPT2Block(cfg) for _ in range(cfg.n_layers)]
        self.ln_f = nn.LayerNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.allpos: Optional[Tensor] = None
        self.forward_jit = TinyJit(self.forward)

    def sequence_logits(self, tokens: Union[Tensor, Variable], start_pos: StartPos) -> Tensor:
        """The logits at every position of `tokens`, which start at `start_pos` (bsz, seqlen, vocab_size)."""
        device = self.wte.weight.device
        if self.allpos is None:
            self.allpos = Tensor.arange(0, self.cfg.max_context, device=device).reshape(1, -1).realize()
        if isinstance(tokens, Variable):  # one token, its row picked by a symbolic shrink
            seqlen = 1
            tok_emb = self.wte.weight.shrink(((tokens, tokens + 1), None)).reshape(1, 1, self.cfg.dim)
        else:
            seqlen = tokens.shape[1]
            tok_emb = self.wte(tokens)
        h = tok_emb + self.wpe(self.allpos.shrink((None, (start_pos, start_pos + seqlen))))
        # a prompt starts at 0: each position sees itself and the ones before
        mask = Tensor.full((1, 1, seqlen, seqlen), float("-inf"), device=device).triu(1) if seqlen > 1 else None
        for block in self.h:
            h = block(h, start_pos, mask)
        return self.lm_head(self.ln_f(h))

    def forward(self, tokens: Union[Tensor, Variable], start_pos: StartPos) -> tuple[Tensor, Tensor]:
        logits = self.sequence_logits(tokens, start_pos)[:, -1, :]
        token = logits.argmax(-1)
        return logits.realize(token), token

    def __call__(self, tokens: Union[Tensor, Variable], start_pos: StartPos) -> tuple[Tensor, Tensor]:
        return self.forward_jit(tokens, start_pos) if isinstance(tokens, Variable) else self.forward(tokens, start_pos)


def precompute_freqs_cis(head_dim: int, end: int, theta: float, device: str) -> Tensor:
    """cos and sin of position * theta^(-2i/head_dim) for every position < end and pair i: (1, end, 1, hd/2, 2)."""
    freqs = 1.0 / (theta ** (Tensor.arange(0, head_dim, 2, device=device) / head_dim))
    angles = Tensor.arange(end, device=device).unsqueeze(1) * freqs.unsqueeze(0)
    return Tensor.stack(angles.cos(), angles.sin(), dim=-1).reshape(1, end, 1, head_dim // 2, 2)


def complex_mult(pairs: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """(a + ib)(cos + i sin) for each (a, b) pair along the last axis."""
    a, b = pairs[..., 0:1], pairs[..., 1:2]
    return (a * cos - b * sin).cat(a * sin + b * cos, dim=-1)


def apply_rotary_emb(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate consecutive pairs of xq and xk (bsz, seqlen, heads, head_dim) by their positions' angles."""
    cos, sin = freqs_cis[..., 0:1], freqs_cis[..., 1:2]
    rotated = (complex_mult(x.reshape(*x.shape[:-1], -1, 2), cos, sin) for x in (xq, xk))
    return tuple(r.flatten(3) for r in rotated)  # type: ignore[return-value]


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Each of x's kv heads (bsz, seqlen, n_kv_heads, head_dim) repeated n_rep times, next to each other."""
    bsz, seqlen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x.repeat((1, 1, 1, n_rep)).reshape(bsz, seqlen, n_kv_heads * n_rep, head_dim)


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""

    def __init__(self, dim: int, eps: float) -> None:
        self.eps, self.weight = eps, Tensor.ones(dim)

    def __call__(self, x: Tensor) -> Tensor:
        return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


class LlamaAttention:
    """Grouped-query causal attention with rotary embeddings, reading and writing a KV cache."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.dim // cfg.n_heads
        self.n_rep, self.max_context = cfg.n_heads // cfg.n_kv_heads, cfg.max_context
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        self.cache_kv: Optional[Tensor] = None

    def __call__(self, x: Tensor, start_pos: StartPos, freqs_cis: Tensor, mask: Optional[Tensor]) -> Tensor:
        bsz, seqlen = x.shape[0], x.shape[1]
        xq = self.wq(x).reshape(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).reshape(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).reshape(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        if self.cache_kv is None:
            self.cache_kv = Tensor.zeros(2, bsz, self.max_context, self.n_kv_heads, self.head_dim,
                                         device=x.device).contiguous().realize()
        self.cache_kv.shrink((None, None, (start_pos, start_pos + seqlen), None, None)).assign(
            Tensor.stack(xk, xv)).realize()
        if isinstance(start_pos, int) and start_pos == 0:
            keys, values = xk, xv
        else:  # every cached position up to and including this one
            keys = self.cache_kv[0].shrink((None, (0, start_pos + seqlen), None, None))
            values = self.cache_kv[1].shrink((None, (0, start_pos + seqlen), None, None))
        keys, values = repeat_kv(keys, self.n_rep), repeat_kv(values, self.n_rep)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        out = xq.scaled_dot_product_attention(keys, values, mask).transpose(1, 2)
        return self.wo(out.reshape(bsz, seqlen, -1))


class LlamaFeedForward:
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # the gate

    def __call__(self, x: Tensor) -> Tensor:
        return self.w2(self.w1(x).silu() * self.w3(x))


class LlamaBlock:
    """Pre-norm block with RMSNorm, realized at its end as a whole."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.attention, self.feed_forward = LlamaAttention(cfg), LlamaFeedForward(cfg)
        self.attention_norm, self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps), RMSNorm(cfg.dim, cfg.norm_eps)

    def __call__(self, x: Tensor, start_pos: StartPos, freqs_cis: Tensor, mask: Optional[Tensor]) -> Tensor:
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        return (h + self.feed_forward(self.ffn_norm(h))).realize()


class Llama:
    """A LLaMA-style decoder: RMSNorm, rotary embeddings, grouped-query attention, a SiLU-gated FFN.

    Called with a (1, T) token tensor and start_pos 0 it runs the prompt; with a (1, 1) tensor and a bound Variable
    start_pos, one decode step under TinyJit. Either way it returns the last position's logits and their argmax."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.cfg = cfg
        self.layers = [LlamaBlock(cfg) for _ in range(cfg.n_layers)]
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.freqs_cis: Optional[Tensor] = None
        self.forward_jit = TinyJit(self.forward)

    def sequence_logits(self, tokens: Tensor, start_pos: StartPos) -> Tensor:
        """The logits at every position of `tokens`, which start at `start_pos` (bsz, seqlen, vocab_size)."""
        device = self.tok_embeddings.weight.device
        if self.freqs_cis is None:  # left lazy: each step's kernels compute the cos and sin of its shrunk positions
            self.freqs_cis = precompute_freqs_cis(self.cfg.dim // self.cfg.n_heads, self.cfg.max_context,
                                                  self.cfg.rope_theta, device)
        seqlen = tokens.shape[1]
        freqs_cis = self.freqs_cis.shrink((None, (start_pos, start_pos + seqlen), None, None, None))
        h = self.tok_embeddings(tokens)
        mask = Tensor.full((1, 1, seqlen, seqlen), float("-inf"), device=device).triu(1) if seqlen > 1 else None
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        return self.output(self.norm(h))

    def forward(self, tokens: Tensor, start_pos: StartPos) -> tuple[Tensor, Tensor]:
        logits = self.sequence_logits(tokens, start_pos)[:, -1, :]
        token = logits.argmax(-1)
        return logits.realize(token), token

    def __call__(self, tokens: Tensor, start_pos: StartPos) -> tuple[Tensor, Tensor]:
        if isinstance(start_pos, Variable):
            return self.forward_jit(tokens, start_pos)
        return self.forward(tokens, start_pos)


def gpt2_weights(seed: int, cfg: DecoderConfig = GPT2_CONFIG) -> Weights:
    """The GPT-2-style decoder's weights, seeded; queries and keys and the LM head scaled up for decisive logits."""
    rng = np.random.default_rng(seed)
    w: Weights = {"wte.weight": _normal(rng, cfg.vocab_size, cfg.dim, std=1.0),
                  "wpe.weight": _normal(rng, cfg.max_context, cfg.dim, std=0.5)}
    for i in range(cfg.n_layers):
        pre = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[f"{pre}{ln}.weight"] = (1 + _normal(rng, cfg.dim, std=0.1)).astype(np.float32)
            w[f"{pre}{ln}.bias"] = _normal(rng, cfg.dim, std=0.1)
        _linear(rng, w, pre + "attn.c_attn", cfg.dim, 3 * cfg.dim, gain=1.5)
        _linear(rng, w, pre + "attn.c_proj", cfg.dim, cfg.dim)
        _linear(rng, w, pre + "mlp.c_fc", cfg.dim, cfg.hidden_dim)
        _linear(rng, w, pre + "mlp.c_proj", cfg.hidden_dim, cfg.dim)
    w["ln_f.weight"] = (1 + _normal(rng, cfg.dim, std=0.1)).astype(np.float32)
    w["ln_f.bias"] = _normal(rng, cfg.dim, std=0.1)
    _linear(rng, w, "lm_head", cfg.dim, cfg.vocab_size, bias=False, gain=3.0)
    return w


def llama_weights(seed: int, cfg: DecoderConfig = LLAMA_CONFIG) -> Weights:
    """The LLaMA-style decoder's weights, seeded; queries and keys and the output scaled up for decisive logits."""
    rng = np.random.default_rng(seed)
    hd = cfg.dim // cfg.n_heads
    w: Weights = {"tok_embeddings.weight": _normal(rng, cfg.vocab_size, cfg.dim, std=1.0)}
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        w[pre + "attention_norm.weight"] = (1 + _normal(rng, cfg.dim, std=0.1)).astype(np.float32)
        w[pre + "ffn_norm.weight"] = (1 + _normal(rng, cfg.dim, std=0.1)).astype(np.float32)
        _linear(rng, w, pre + "attention.wq", cfg.dim, cfg.n_heads * hd, bias=False, gain=1.5)
        _linear(rng, w, pre + "attention.wk", cfg.dim, cfg.n_kv_heads * hd, bias=False, gain=1.5)
        _linear(rng, w, pre + "attention.wv", cfg.dim, cfg.n_kv_heads * hd, bias=False)
        _linear(rng, w, pre + "attention.wo", cfg.n_heads * hd, cfg.dim, bias=False)
        _linear(rng, w, pre + "feed_forward.w1", cfg.dim, cfg.hidden_dim, bias=False)
        _linear(rng, w, pre + "feed_forward.w2", cfg.hidden_dim, cfg.dim, bias=False)
        _linear(rng, w, pre + "feed_forward.w3", cfg.dim, cfg.hidden_dim, bias=False)
    w["norm.weight"] = (1 + _normal(rng, cfg.dim, std=0.1)).astype(np.float32)
    _linear(rng, w, "output", cfg.dim, cfg.vocab_size, bias=False, gain=3.0)
    return w


@dataclass
class Generation:
    """What a decoder generated: each new token and the logits it was picked from, per step, and how many kernels
    its TinyJit recorded for a decode step."""

    tokens: list[int]
    logits: list[np.ndarray]
    jit_kernels: int = 0


def _step_result(logits: Tensor, token: Tensor, gen: Generation) -> int:
    tok = int(token.numpy().reshape(-1)[0])
    gen.tokens.append(tok)
    gen.logits.append(logits.numpy().reshape(-1))
    return tok


def generate_gpt2(device: str, weights: Weights, prompt: list[int], n_new: int = NEW_TOKENS,
                  cfg: DecoderConfig = GPT2_CONFIG) -> Generation:
    """The prompt un-jitted, then n_new - 1 jitted decode steps on the KV cache."""
    model = GPT2(cfg)
    load_weights(model, weights, device)
    gen = Generation([], [])
    with Tensor.inference_mode():
        tok = _step_result(*model(Tensor([prompt], device=device), 0), gen)
        for pos in range(len(prompt), len(prompt) + n_new - 1):
            token = Variable("tok", 0, cfg.vocab_size - 1).bind(tok)
            tok = _step_result(*model(token, Variable("start_pos", 1, cfg.max_context).bind(pos)), gen)
    gen.jit_kernels = len(model.forward_jit.jit_cache)
    return gen


def generate_llama(device: str, weights: Weights, prompt: list[int], n_new: int = NEW_TOKENS,
                   cfg: DecoderConfig = LLAMA_CONFIG) -> Generation:
    """The prompt un-jitted, then n_new - 1 jitted decode steps on the KV cache."""
    model = Llama(cfg)
    load_weights(model, weights, device)
    gen = Generation([], [])
    with Tensor.inference_mode():
        tok = _step_result(*model(Tensor([prompt], device=device), 0), gen)
        for pos in range(len(prompt), len(prompt) + n_new - 1):
            step = Variable("start_pos", 1, cfg.max_context).bind(pos)
            tok = _step_result(*model(Tensor([[tok]], device=device), step), gen)
    gen.jit_kernels = len(model.forward_jit.jit_cache)
    return gen


def recompute_logits(model_cls: Any, cfg: DecoderConfig, device: str, weights: Weights,
                     tokens: list[int]) -> np.ndarray:
    """The logits at every position of `tokens`, computed whole from position 0 by a fresh model (no cache read,
    no jit): with causal attention, row i is what the prefix tokens[:i + 1] gives."""
    model = model_cls(cfg)
    load_weights(model, weights, device)
    with Tensor.inference_mode():
        return model.sequence_logits(Tensor([tokens], device=device), 0).numpy()[0]
