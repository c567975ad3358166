"""A BERT-base-shaped encoder stack for inference: post-norm layers of 12-head self-attention (no mask) and a
GELU feed-forward (dim 768, hidden 3072), on hidden states that stand for the embeddings' output. GELU is the tanh
form in both frameworks (tinygrad's gelu is that form; torch's default is the erf form)."""

from __future__ import annotations

import math
from typing import Any

DIM, HEADS, HIDDEN, EPS = 768, 12, 3072, 1e-12


def _attention(q: Any, k: Any, v: Any, batch: int, seq: int) -> Any:
    """softmax(q k^T / sqrt(d)) v over heads; the same code for both frameworks (reshape, transpose, matmul)."""
    head = DIM // HEADS
    q, k, v = (t.reshape(batch, seq, HEADS, head).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(head))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, DIM)


# ***** tinygrad-style (tgcore, tinygrad) *****


class _LazyLayer:
    def __init__(self, api: Any) -> None:
        nn = api.nn
        self.query, self.key, self.value = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.attn_out, self.attn_norm = nn.Linear(DIM, DIM), nn.LayerNorm(DIM, eps=EPS)
        self.ffn_in, self.ffn_out = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)
        self.ffn_norm = nn.LayerNorm(DIM, eps=EPS)

    def __call__(self, x: Any) -> Any:
        batch, seq = x.shape[0], x.shape[1]
        a = _attention(self.query(x), self.key(x), self.value(x), batch, seq)
        x = self.attn_norm(x + self.attn_out(a))
        return self.ffn_norm(x + self.ffn_out(self.ffn_in(x).gelu()))


class LazyBertEncoder:
    def __init__(self, api: Any, layers: int) -> None:
        self.layer = [_LazyLayer(api) for _ in range(layers)]

    def __call__(self, x: Any) -> Any:
        for layer in self.layer:
            x = layer(x)
        return x


# ***** torch *****


def torch_bert_encoder(layers: int) -> Any:
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
            self.attn_out, self.attn_norm = nn.Linear(DIM, DIM), nn.LayerNorm(DIM, eps=EPS)
            self.ffn_in, self.ffn_out = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)
            self.ffn_norm = nn.LayerNorm(DIM, eps=EPS)

        def forward(self, x: Any) -> Any:
            batch, seq = x.shape[0], x.shape[1]
            a = _attention(self.query(x), self.key(x), self.value(x), batch, seq)
            x = self.attn_norm(x + self.attn_out(a))
            gelu = torch.nn.functional.gelu(self.ffn_in(x), approximate="tanh")
            return self.ffn_norm(x + self.ffn_out(gelu))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.ModuleList([Layer() for _ in range(layers)])

        def forward(self, x: Any) -> Any:
            for layer in self.layer:
                x = layer(x)
            return x

    return Encoder().eval()
