"""ONNX operators of domain ai.onnx.preview.training (version 1): the optimizers Adagrad, Adam and Momentum, and
Gradient, written on Tensor ops from the operator specs (onnx/defs/training).

Each takes the learning rate R and the update count T (scalars), then its per-tensor groups: n tensors X, their n
gradients G, and n of each optimizer state (Adagrad: H; Adam: V, H; Momentum: V), and returns the updated tensors
followed by the updated states, group by group. Every tensor is computed in its own dtype (R is cast to it), so
float32 weights stay float32."""

from __future__ import annotations

from tgcore.dtype import dtypes
from tgcore.onnx.errors import NotSymbolic, OnnxError
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
        corrected = rate * (1 - beta**steps).sqrt() / (1 - alpha**steps)
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


@op("Gradient", 1, domain=TRAINING_DOMAIN)
def gradient(n: Node) -> list[Tensor]:
    """The derivatives of the value named `y` with respect to those named `xs` (of y's sum, where y is not a scalar),
    the node's inputs being the values of xs, then of zs. The nodes before it that depend on xs run again on copies of
    the xs that record their graph (Node.rerun), and y is differentiated through them by tgcore's autograd; a y that
    does not depend on an x has a zero derivative by it."""
    xs, y, zs = list(n.get("xs", [])), n.get("y"), list(n.get("zs", []))
    if not xs or not isinstance(y, str) or len(n.inputs) != len(xs) + len(zs):
        raise OnnxError(
            f"Gradient: needs attributes xs (names) and y (a name), and one input per name of xs and zs; got xs "
            f"{xs}, y {y!r}, zs {zs} and {len(n.inputs)} inputs"
        )
    if n.known.symbolic:
        raise NotSymbolic("Gradient differentiates the graph")
    if any(v is None for v in n.inputs):
        raise OnnxError("Gradient: every input (the values of xs and zs) must be given")
    assert n.rerun is not None
    values = {name: v.detach() for name, v in zip(xs + zs, n.inputs) if v is not None}
    leaves = [values[name] for name in xs]
    for name, leaf in zip(xs, leaves):
        if not dtypes.is_float(leaf.dtype):
            raise OnnxError(f"Gradient: {name!r} is {leaf.dtype}: only a float tensor has a derivative")
        leaf.requires_grad = True
    no_grad, Tensor.no_grad = Tensor.no_grad, False
    try:
        env, changed = n.rerun(values)
        if y not in env:
            raise OnnxError(f"Gradient: y {y!r} is no value computed before it")
        if y in changed:
            env[y].sum().backward()
    finally:
        Tensor.no_grad = no_grad
    return [leaf.grad if leaf.grad is not None else leaf.zeros_like() for leaf in leaves]
