"""A small GPT-2-like causal language model in torch, for export to ONNX (bench workload o): learned token and
position embeddings, pre-norm blocks of causal self-attention (torch's scaled_dot_product_attention, is_causal) and a
GELU feed-forward (4x wide; the erf form, torch's default, which the exporter writes as one Gelu node), a final
LayerNorm and an LM head tied to the token embedding. It reads int64 token ids (batch, sequence) and returns logits
(batch, sequence, vocab): the whole sequence in one pass, no KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EPS = 1e-5


@dataclass(frozen=True)
class LMShape:
    """The model's size: blocks, model width, attention heads, vocabulary and the longest sequence it reads."""

    layers: int
    dim: int
    heads: int
    vocab: int
    context: int


def torch_lm(shape: LMShape) -> Any:
    """The torch model of `shape`, in eval mode (its weights as torch initializes them: load others with load_torch)."""
    import torch
    from torch import nn

    if shape.dim % shape.heads:
        raise ValueError(f"dim {shape.dim} is not a multiple of heads {shape.heads}: pick a dim that the heads divide")
    head_dim = shape.dim // shape.heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(shape.dim, eps=EPS), nn.LayerNorm(shape.dim, eps=EPS)
            self.c_attn, self.attn_proj = nn.Linear(shape.dim, 3 * shape.dim), nn.Linear(shape.dim, shape.dim)
            self.c_fc, self.c_proj = nn.Linear(shape.dim, 4 * shape.dim), nn.Linear(4 * shape.dim, shape.dim)

        def forward(self, x: Any) -> Any:
            batch, seq, dim = x.shape
            qkv = self.c_attn(self.ln_1(x)).reshape(batch, seq, 3, shape.heads, head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, heads, seq, head_dim)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(a.transpose(1, 2).reshape(batch, seq, dim))
            return x + self.c_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x))))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(shape.vocab, shape.dim), nn.Embedding(shape.context, shape.dim)
            self.h = nn.ModuleList([Block() for _ in range(shape.layers)])
            self.ln_f = nn.LayerNorm(shape.dim, eps=EPS)

        def forward(self, ids: Any) -> Any:
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(positions)
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.T  # the head is the token embedding (tied), so no extra weight

    return LM().eval()
