"""A GPT-2-small-shaped decoder (12 layers, dim 768, 12 heads, vocab 50257, learned positions, pre-norm blocks,
the LM head tied to the token embedding) that decodes one token a step with a KV cache.

The lazy version runs position 0 plainly and every later step under TinyJit, with the token and start_pos as
bound Variables: their rows of the embeddings are picked by a symbolic shrink, so one set of kernels serves every
position. Both versions are fed the same token sequence (not their own argmax: with random weights two near-equal
logits could pick different tokens and the runs would part), and return every step's logits."""

from __future__ import annotations

import math
from typing import Any, Union

DIM, HEADS, VOCAB, EPS = 768, 12, 50257, 1e-5
HEAD_DIM = DIM // HEADS


# ***** tinygrad-style (tgcore, tinygrad) *****


class _LazyAttention:
    def __init__(self, api: Any, max_context: int) -> None:
        self.api, self.max_context = api, max_context
        self.c_attn, self.c_proj = api.nn.Linear(DIM, 3 * DIM), api.nn.Linear(DIM, DIM)
        self.cache_kv: Any = None

    def __call__(self, x: Any, start_pos: Union[int, Any]) -> Any:
        qkv = self.c_attn(x)
        q, k, v = (qkv.shrink((None, None, (i * DIM, (i + 1) * DIM))).reshape(1, 1, HEADS, HEAD_DIM) for i in range(3))
        if self.cache_kv is None:
            shape = (2, 1, self.max_context, HEADS, HEAD_DIM)
            self.cache_kv = self.api.Tensor.zeros(*shape, device=x.device).contiguous().realize()
        # this position's key and value go into the cache in place; the earlier ones are read back from it
        new = k.unsqueeze(0).cat(v.unsqueeze(0), dim=0)
        self.cache_kv.shrink((None, None, (start_pos, start_pos + 1), None, None)).assign(new).realize()
        if isinstance(start_pos, int) and start_pos == 0:
            keys, values = k, v
        else:
            keys = self.cache_kv[0].shrink((None, (0, start_pos), None, None)).cat(k, dim=1)
            values = self.cache_kv[1].shrink((None, (0, start_pos), None, None)).cat(v, dim=1)
        q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = (q @ keys.transpose(-2, -1)) * (1 / math.sqrt(HEAD_DIM))
        return self.c_proj((scores.softmax(-1) @ values).transpose(1, 2).reshape(1, 1, DIM))


class _LazyBlock:
    def __init__(self, api: Any, max_context: int) -> None:
        nn = api.nn
        self.ln_1, self.attn = nn.LayerNorm(DIM, eps=EPS), _LazyAttention(api, max_context)
        self.ln_2, self.c_fc, self.c_proj = nn.LayerNorm(DIM, eps=EPS), nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def __call__(self, x: Any, start_pos: Union[int, Any]) -> Any:
        h = x + self.attn(self.ln_1(x), start_pos)
        return h + self.c_proj(self.c_fc(self.ln_2(h)).gelu())


class LazyGPT2:
    def __init__(self, api: Any, layers: int, max_context: int) -> None:
        self.api, self.max_context = api, max_context
        self.wte, self.wpe = api.nn.Embedding(VOCAB, DIM), api.nn.Embedding(max_context, DIM)
        self.h = [_LazyBlock(api, max_context) for _ in range(layers)]
        self.ln_f = api.nn.LayerNorm(DIM, eps=EPS)
        self.step_jit = api.TinyJit(self.forward)

    def forward(self, token: Union[int, Any], start_pos: Union[int, Any]) -> Any:
        """The logits (1, VOCAB) after `token` at `start_pos` (ints, or bound Variables), realized."""
        x = self.wte.weight.shrink(((token, token + 1), None)).reshape(1, 1, DIM)
        x = x + self.wpe.weight.shrink(((start_pos, start_pos + 1), None)).reshape(1, 1, DIM)
        for block in self.h:
            x = block(x, start_pos)
        return (self.ln_f(x).reshape(1, DIM) @ self.wte.weight.transpose()).realize()

    def step(self, token: int, start_pos: int) -> Any:
        if start_pos == 0:
            return self.forward(token, 0)
        variable = self.api.Variable
        tok = variable("token", 0, VOCAB - 1).bind(token)
        return self.step_jit(tok, variable("start_pos", 1, self.max_context - 1).bind(start_pos))


# ***** torch *****


def torch_gpt2(layers: int, max_context: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(DIM, eps=EPS), nn.LayerNorm(DIM, eps=EPS)
            self.attn = nn.Module()
            self.attn.c_attn, self.attn.c_proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
            self.c_fc, self.c_proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
            self.register_buffer("cache_kv", torch.zeros(2, 1, max_context, HEADS, HEAD_DIM), persistent=False)

        def forward(self, x: Any, start_pos: int) -> Any:
            q, k, v = self.attn.c_attn(self.ln_1(x)).reshape(1, 1, 3, HEADS, HEAD_DIM).unbind(2)
            self.cache_kv[0, :, start_pos] = k[:, 0]
            self.cache_kv[1, :, start_pos] = v[:, 0]
            keys, values = self.cache_kv[0, :, : start_pos + 1], self.cache_kv[1, :, : start_pos + 1]
            q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
            scores = (q @ keys.transpose(-2, -1)) * (1 / math.sqrt(HEAD_DIM))
            h = x + self.attn.c_proj((scores.softmax(-1) @ values).transpose(1, 2).reshape(1, 1, DIM))
            ff = torch.nn.functional.gelu(self.c_fc(self.ln_2(h)), approximate="tanh")
            return h + self.c_proj(ff)

    class GPT2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(max_context, DIM)
            self.h = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(DIM, eps=EPS)

        def step(self, token: int, start_pos: int) -> Any:
            x = (self.wte.weight[token] + self.wpe.weight[start_pos]).reshape(1, 1, DIM)
            for block in self.h:
                x = block(x, start_pos)
            return self.ln_f(x).reshape(1, DIM) @ self.wte.weight.T

    return GPT2().eval()
