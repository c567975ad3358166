"""ONNX operators of domain ai.onnx.preview.training (version 1): the optimizers Adagrad, Adam and Momentum, written
on Tensor ops from the operator specs (onnx/defs/training).

Each takes the learning rate R and the update count T (scalars), then its per-tensor groups: n tensors X, their n
gradients G, and n of each optimizer state (Adagrad: H; Adam: V, H; Momentum: V), and returns the updated tensors
followed by the updated states, group by group. Every tensor is computed in its own dtype (R is cast to it), so
float32 weights stay float32."""

from __future__ import annotations

import math

from tgcore.onnx.errors import OnnxError
from tgcore.onnx.registry import TRAINING_DOMAIN, Node, op
from tgcore.tensor import Tensor


def _scalars(n: Node) -> tuple[Tensor, Tensor]:
    """R and T, each checked to hold one value."""
    r, t = n[0], n[1]
    for name, v in (("R (the learning rate)", r), ("T (the update count)", t)):
        if v is None or v.numel() != 1:
            shape = "missing" if v is None else f"of shape {v.shape}"
            raise OnnxError(f"{n.op_type}: input {name} must be a scalar, got one {shape}")
    assert r is not None and t is not None
    return r.reshape(()), t.reshape(())


def _groups(n: Node, count: int) -> list[list[Tensor]]:
    """The inputs after R and T as `count` groups of n tensors each (X, G, then the states), each group's tensors in
    the order given; every tensor must have its X's shape."""
    rest = [v for v in n.inputs[2:] if v is not None]
    if not rest or len(rest) % count or len(rest) != len(n.inputs) - 2:
        raise OnnxError(
            f"{n.op_type}: after R and T it takes {count} groups of equally many tensors (X, G and its states), got "
            f"{len(rest)} inputs"
        )
    k = len(rest) // count
    groups = [rest[i * k : (i + 1) * k] for i in range(count)]
    for i, x in enumerate(groups[0]):
        if any(g[i].shape != x.shape for g in groups[1:]):
            raise OnnxError(f"{n.op_type}: tensor {i} and its gradient and states differ in shape: "
                            f"{[g[i].shape for g in groups]}")  # fmt: skip
    return groups


def _power(base: float, t: Tensor) -> Tensor:
    """base ** t for an integer-valued float tensor t >= 0 (a constant base: the optimizers' decay rates)."""
    if base > 0:
        return (t * math.log(base)).exp()
    if base == 0:
        return (t == 0).where(1.0, 0.0).cast(t.dtype)
    magnitude = (t * math.log(-base)).exp()
    return ((t % 2) == 1).where(-magnitude, magnitude)


def _attr(n: Node, name: str, default: object = None) -> float:
    v = n.get(name, default)
    if v is None:
        raise OnnxError(f"{n.op_type}: attribute {name!r} is required")
    return float(v)  # type: ignore[arg-type]


@op("Adagrad", 1, domain=TRAINING_DOMAIN)
def adagrad(n: Node) -> list[Tensor]:
    r, t = _scalars(n)
    decay, eps, norm = _attr(n, "decay_factor", 0.0), _attr(n, "epsilon", 0.0), _attr(n, "norm_coefficient", 0.0)
    xs, hs = [], []
    for x, g, h in zip(*_groups(n, 3)):
        dt = x.dtype
        rate = r.cast(dt) / (t.cast(dt) * decay + 1)
        grad = x * norm + g  # (the regularizer's gradient added)
        h_new = h + grad * grad
        xs.append(x - rate * grad / (h_new.sqrt() + eps))
        hs.append(h_new)
    return xs + hs


@op("Adam", 1, domain=TRAINING_DOMAIN)
def adam(n: Node) -> list[Tensor]:
    r, t = _scalars(n)
    alpha, beta, eps = _attr(n, "alpha", 0.9), _attr(n, "beta", 0.999), _attr(n, "epsilon", 0.0)
    norm, norm_post = _attr(n, "norm_coefficient", 0.0), _attr(n, "norm_coefficient_post", 0.0)
    xs, vs, hs = [], [], []
    for x, g, v, h in zip(*_groups(n, 4)):
        dt = x.dtype
        steps, rate = t.cast(dt), r.cast(dt)
        grad = x * norm + g
        v_new = v * alpha + grad * (1 - alpha)
        h_new = h * beta + grad * grad * (1 - beta)
        # bias correction of both moments from the first update on (T > 0); none before it
        corrected = rate * (1 - _power(beta, steps)).sqrt() / (1 - _power(alpha, steps))
        rate = (t > 0).where(corrected, rate)
        xs.append((x - rate * (v_new / (h_new.sqrt() + eps))) * (1 - norm_post))
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs


@op("Momentum", 1, domain=TRAINING_DOMAIN)
def momentum(n: Node) -> list[Tensor]:
    r, t = _scalars(n)
    alpha, beta, norm = _attr(n, "alpha"), _attr(n, "beta"), _attr(n, "norm_coefficient")
    mode = n.get("mode")
    if mode not in ("standard", "nesterov"):
        raise OnnxError(f"Momentum: attribute 'mode' must be 'standard' or 'nesterov', got {mode!r}")
    xs, vs = [], []
    for x, g, v in zip(*_groups(n, 3)):
        dt = x.dtype
        rate = r.cast(dt)
        grad = x * norm + g
        v_new = v * alpha + grad * (t > 0).where(beta, 1.0).cast(dt)  # (the gradient's full weight at T = 0)
        xs.append(x - rate * (v_new if mode == "standard" else grad + v_new * alpha))
        vs.append(v_new)
    return xs + vs
