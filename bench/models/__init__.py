"""Whole models for bench workload h, each written twice: once in tinygrad 0.9.0's API (run by tgcore and by
tinygrad, whose `nn` and Tensor are handed in) and once for torch, with the same attribute names, so that one set
of named numpy weights loads into both and their outputs can be compared.

One file per family: resnet (ResNet-18, ResNet-50), efficientnet (EfficientNet-B0), bert (a BERT-base-shaped
encoder stack), gpt2 (GPT-2-small-shaped decoding with a KV cache), cnn (a small ResNet-like CNN for a training step).
"""

from __future__ import annotations

import importlib
import math
import types
from typing import Any

import numpy as np

Weights = dict[str, np.ndarray]


def lazy_api(framework: str) -> types.SimpleNamespace:
    """tgcore's or tinygrad's Tensor, nn, TinyJit, Variable and SGD: what the lazy models are written with."""
    top = importlib.import_module(framework)
    return types.SimpleNamespace(
        Tensor=top.Tensor,
        nn=importlib.import_module(f"{framework}.nn"),
        TinyJit=top.TinyJit,
        Variable=top.Variable,
        SGD=importlib.import_module(f"{framework}.nn.optim").SGD,
    )


def make_weights(torch_model: Any, seed: int) -> Weights:
    """Weights for every entry of the torch model's state dict, by name and shape, drawn so that activations keep
    their size through a deep stack: a matrix or kernel ~ N(0, 1/fan_in); a norm's scale ~ 1 + N(0, 0.1); a bias
    ~ N(0, 0.05); BatchNorm's running mean ~ N(0, 0.1) and running variance ~ U(0.5, 1.5), so that an inference
    BatchNorm is no identity. Counters (num_batches_tracked) are left out: they are not weights."""
    rng = np.random.default_rng(seed)
    out: Weights = {}
    for name, tensor in torch_model.state_dict().items():
        shape = tuple(tensor.shape)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "num_batches_tracked":
            continue
        if leaf == "running_mean":
            value = rng.standard_normal(shape) * 0.1
        elif leaf == "running_var":
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) >= 2:
            value = rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))
        elif leaf == "weight":
            value = 1 + rng.standard_normal(shape) * 0.1
        else:
            value = rng.standard_normal(shape) * 0.05
        out[name] = value.astype(np.float32)
    return out


def load_lazy(model: Any, weights: Weights, tensor: Any, device: str) -> None:
    """Put each array of `weights` on `device` as the lazy model's tensor of that name ("layer1.0.conv1.weight");
    a tensor that is not trained (requires_grad False: running statistics) stays untrained. Every name must exist."""
    for name, value in weights.items():
        *path, leaf = name.split(".")
        owner = model
        for part in path:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        old = getattr(owner, leaf)  # AttributeError here: the two definitions of the model disagree
        if tuple(old.shape) != value.shape:
            raise ValueError(f"{name}: the lazy model has shape {tuple(old.shape)}, the weights {value.shape}")
        setattr(owner, leaf, tensor(value, device=device, requires_grad=old.requires_grad).realize())


def load_torch(model: Any, weights: Weights) -> None:
    """The same weights into the torch model (strict, but for BatchNorm's counters)."""
    import torch

    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ValueError(f"torch model and weights disagree: missing {missing}, unexpected {unexpected}")
