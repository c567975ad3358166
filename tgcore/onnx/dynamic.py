"""Dynamic dimensions as symbolic Variables: one recording of a model's kernels serves every size of them.

An input dimension the model declares without a value (a dim_param such as "batch", or no value at all) becomes a
Variable when the model is called: the graph is walked once with symbolic shapes, its kernels take the Variable's
value as an argument, and the TinyJit recording made at one size replays at any other. Inputs that share a dim_param
share its Variable.

A Variable's bounds are a tier: 1 to the smallest power of two (16 at least, `limit` at most) not below the size.
Buffers of a symbolic size get room for the bound, so a tier keeps memory within twice what its largest size needs
(16 times a size of 1); each tier is a recording of its own, and a size above `limit` (or of 0) runs with concrete
shapes.

Whether a graph can run symbolically is decided node by node as it is walked: an operator whose implementation reads
no symbolic size as a number takes symbolic inputs under the conditions in `_RULES` (a convolution's channels and image,
a mean's or a LayerNormalization's axes stay concrete). Any other operator, a symbolic size read as a number, a host
read of a computed value or an output that is not a plain tensor raises NotSymbolic, and the model runs the call with
concrete shapes (a recording per input signature) instead; so does any other error of the symbolic run, such as the
core's refusal to index a kernel whose merged axis holds two symbolic sizes (a division by a symbolic size)."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional, Sequence

import numpy as np

from tgcore.device import Device
from tgcore.dtype import dtypes
from tgcore.engine.runner import BufferCopy
from tgcore.onnx.errors import NotSymbolic
from tgcore.onnx.registry import Node, norm_axis
from tgcore.shape.symbolic import DivNode, ModNode, MulNode, NumNode, SumNode, Variable, sint
from tgcore.shape.symbolic import Node as SymNode
from tgcore.tensor import Tensor

__all__ = [
    "NotSymbolic",
    "DEFAULT_LIMIT",
    "HOT_CALLS",
    "input_dims",
    "bind",
    "check",
    "same_size",
    "known_tensor",
    "normalize",
]

# sizes of a dynamic dimension above this run with concrete shapes (OnnxModel's dynamic_max)
DEFAULT_LIMIT = 1024
# the smallest tier: sizes 1 to 16 share one recording
_MIN_TIER = 16
# a size called more often than this gets a recording of its own shapes (OnnxModel._hot). The core optimizes the
# integer axes of a kernel around a symbolic one, so the symbolic recording runs near one of concrete shapes (one CLANG
# core, batch 4: the ResNet of tests/onnx/test_export.py at 64x64 1.1-1.4 ms a call against 0.97, the transformer
# 0.56-0.64 against 0.23-0.33), and a recording of its own costs a size's first calls ~60 ms with its kernels in the
# disk cache, ~2 s compiling them: a size that stays pays that back over about a thousand calls
HOT_CALLS = 1000


def input_dims(graph: Any, names: Sequence[str]) -> dict[str, tuple[Optional[str], ...]]:
    """For each named graph input with a declared shape: per axis, the name of its Variable where the axis is dynamic
    (one name per dim_param; an axis with neither value nor param gets a name of its own), None where it is static."""
    params: dict[str, str] = {}
    out: dict[str, tuple[Optional[str], ...]] = {}
    for inp in graph.input:
        if inp.name not in names or not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
            continue
        axes: list[Optional[str]] = []
        for i, dim in enumerate(inp.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                axes.append(None)
                continue
            key = dim.dim_param if dim.HasField("dim_param") and dim.dim_param else f"{inp.name}:{i}"
            if key not in params:  # (a C identifier: the name is rendered into the kernels)
                params[key] = f"dyn{len(params)}_{re.sub(r'[^0-9A-Za-z_]', '_', key)[:32]}"
            axes.append(params[key])
        if any(a is not None for a in axes):
            out[inp.name] = tuple(axes)
    return out


def _tier(size: int, limit: int) -> Optional[int]:
    if not 1 <= size <= limit:
        return None
    return min(limit, max(_MIN_TIER, 1 << (size - 1).bit_length()))


def bind(
    given: dict[str, Any], dims: dict[str, tuple[Optional[str], ...]], limit: int
) -> Optional[tuple[tuple[Any, ...], dict[str, Tensor], dict[Variable, int]]]:
    """(the key of the recording, the inputs reshaped to their symbolic shapes, the Variables' values) for a call, or
    None where it cannot run symbolically: no dynamic axis, a rank other than the declared one, one dim_param of two
    sizes, a size outside 1..limit, an input that is not a plain tensor."""
    sizes: dict[str, int] = {}
    for name, t in given.items():
        if type(t) is not Tensor or not all(isinstance(s, int) for s in t.shape):
            return None
        if (axes := dims.get(name)) is None:
            continue
        if len(axes) != t.ndim:
            return None
        for var, size in zip(axes, t.shape):
            if var is not None and sizes.setdefault(var, size) != size:
                return None
    if not sizes:
        return None
    tiers = {var: _tier(size, limit) for var, size in sizes.items()}
    if any(t is None for t in tiers.values()):
        return None
    variables = {var: Variable(var, 1, int(tier)) for var, tier in tiers.items()}  # type: ignore[arg-type]
    bound = {var: v.bind(sizes[var]) for var, v in variables.items()}
    symbolic: dict[str, Tensor] = {}
    signature = []
    for name, t in sorted(given.items()):
        axes = dims.get(name, (None,) * t.ndim)
        symbolic[name] = t.reshape(tuple(bound[a] if a is not None else s for a, s in zip(axes, t.shape)))
        signature.append((name, tuple(a if a is not None else s for a, s in zip(axes, t.shape)), t.dtype, t.device))
    key = ("symbolic", tuple(signature), tuple(sorted(tiers.items())))
    return key, symbolic, {variables[var]: size for var, size in sizes.items()}


# ***** which operators take symbolic shapes, and when *****


def _symbolic(v: Any, n: Node) -> bool:
    """Whether an input has a symbolic size, or is a shape that holds one."""
    if isinstance(v, list):
        return any(_symbolic(e, n) for e in v)
    if not isinstance(v, Tensor):
        return False
    if not all(isinstance(s, int) for s in v.shape):
        return True
    hv = n.known.get(id(v))
    return hv is not None and hv.dtype == object


def _static(x: Tensor, axes: Sequence[int]) -> Optional[str]:
    bad = [a for a in axes if not isinstance(x.shape[a], int)]
    return None if not bad else f"axes {bad} of shape {x.shape} are symbolic"


def _known_ints(n: Node, i: int) -> Optional[list[int]]:
    """Input i's values where they are known concrete ints on the host (None otherwise)."""
    t = n[i]
    v = None if t is None else n.known.get(id(t))
    return None if v is None or v.dtype == object else [int(e) for e in v.reshape(-1)]


def _from_1(n: Node) -> Optional[str]:
    return _static(n[0], range(1, n[0].ndim))


def _matmul(n: Node) -> Optional[str]:
    return "a 0-d operand" if n[0].ndim == 0 or n[1].ndim == 0 else None


def _maxpool(n: Node) -> Optional[str]:
    return "MaxPool's indices are computed on the host" if n.num_outputs > 1 else _from_1(n)


def _batchnorm(n: Node) -> Optional[str]:
    if n.get("training_mode", 0) or n.num_outputs > 1:
        return "training mode reduces over the batch"
    return _static(n[0], [1]) if n[0].ndim > 1 else None


def _last_axes(n: Node) -> Optional[str]:  # LayerNormalization
    x = n[0]
    return _static(x, range(norm_axis(n.get("axis", -1), x.ndim), x.ndim))


def _softmax(n: Node) -> Optional[str]:
    x = n[0]
    if n.opset < 13:  # (the input read as 2-D: its second size a division of symbolic sizes)
        return _static(x, range(norm_axis(n.get("axis", 1), x.ndim), x.ndim))
    return _static(x, [norm_axis(n.get("axis", -1), x.ndim)]) if n.op_type == "Hardmax" else None


def _axis(n: Node) -> Optional[str]:  # ArgMax, ArgMin, Split
    x = n[0]
    return _static(x, [norm_axis(n.get("axis", 0), x.ndim)])


def _reduce_since(since: int) -> Callable[[Node], Optional[str]]:
    def rule(n: Node) -> Optional[str]:
        x = n[0]
        axes = (_known_ints(n, 1) if n[1] is not None else None) if n.opset >= since else n.get("axes")
        if n.opset >= since and n[1] is not None and axes is None:
            return "its axes are computed"
        if not axes:
            return None if n.get("noop_with_empty_axes", 0) and n.opset >= since else _static(x, range(x.ndim))
        return _static(x, [norm_axis(a, x.ndim) for a in axes])

    return rule


def _squeeze(n: Node) -> Optional[str]:
    x = n[0]
    axes = (_known_ints(n, 1) if n[1] is not None else None) if n.opset >= 13 else n.get("axes")
    if axes is None:  # (a symbolic size may be 1 at some call: every axis must be concrete)
        return _static(x, range(x.ndim))
    return _static(x, [norm_axis(a, x.ndim) for a in axes])


def _concat(n: Node) -> Optional[str]:
    xs = [x for x in n.inputs if x is not None]
    if all(id(x) in n.known for x in xs):
        return None  # (computed on the host)
    return next((r for x in xs if (r := _static(x, [norm_axis(n.get("axis"), x.ndim)]))), None)


def _slice(n: Node) -> Optional[str]:
    x = n[0]
    if id(x) in n.known:
        return None
    if n.opset < 10:
        axes, starts = n.get("axes"), n.get("starts")
    else:
        axes, starts = _known_ints(n, 3), _known_ints(n, 1)
        if starts is None or (n[3] is not None and axes is None):
            return "its starts or axes are computed"
    axes = list(range(len(starts))) if axes is None else axes
    return _static(x, [norm_axis(a, x.ndim) for a in axes])


def _gather(n: Node) -> Optional[str]:
    x, idx = n[0], n[1]
    if id(x) in n.known and id(idx) in n.known:
        return None
    return _static(x, [norm_axis(n.get("axis", 0), x.ndim)])


def _prelu(n: Node) -> Optional[str]:
    x = n[0]
    return _static(x, [1, x.ndim - 1]) if x.ndim >= 2 else None


def _since_7(n: Node) -> Optional[str]:
    return None if n.opset >= 7 else "before opset 7 it broadcasts by its attributes"


def _ok(n: Node) -> Optional[str]:
    return None


# elementwise operators (broadcasting one symbolic size against another raises ShapeError: the call runs concretely)
_ELEMENTWISE = (
    "Abs Neg Exp Log Sqrt Reciprocal Floor Ceil Round Sign Sin Cos Tan Sinh Cosh Asinh Acosh Atanh Relu Sigmoid Tanh "
    "Softsign Softplus Mish HardSwish Identity Not IsNaN IsInf Erf Gelu LeakyRelu Elu Celu Selu ThresholdedRelu "
    "HardSigmoid Clip Mod Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor BitwiseAnd BitwiseOr BitwiseXor "
    "BitwiseNot BitShift Max Min Sum Mean Where Cast CastLike Dropout"
).split()

# op_type -> None where a node may take symbolic inputs, else why not
_RULES: dict[str, Callable[[Node], Optional[str]]] = {
    **{name: _ok for name in _ELEMENTWISE},
    **{name: _since_7 for name in ("Add", "Sub", "Mul", "Div", "Pow")},
    "PRelu": _prelu,
    "MatMul": _matmul,
    "Gemm": _ok,
    "Conv": _from_1,
    "MaxPool": _maxpool,
    "AveragePool": _from_1,
    "GlobalAveragePool": _from_1,
    "GlobalMaxPool": _from_1,
    "BatchNormalization": _batchnorm,
    "LayerNormalization": _last_axes,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "Hardmax": _softmax,
    "ArgMax": _axis,
    "ArgMin": _axis,
    "Split": _axis,
    **{name: _reduce_since(18) for name in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1",
                                            "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
    "ReduceSum": _reduce_since(13),
    # shapes: Shape and Size give symbolic sizes on the host, which these read (Node.sints) or compute with
    "Shape": _ok,
    "Size": _ok,
    "Reshape": _ok,
    "Expand": _ok,
    "ConstantOfShape": _ok,
    "Flatten": _ok,
    "Transpose": _ok,
    "Unsqueeze": _ok,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Gather": _gather,
    "Trilu": _ok,
    "Range": _ok,
}  # fmt: skip


def check(n: Node) -> None:
    """Raise NotSymbolic unless node `n` can run with the symbolic inputs it has (a node without any always can)."""
    if not any(_symbolic(v, n) for v in n.inputs):
        return
    rule = _RULES.get(n.op_type)
    if rule is None:
        raise NotSymbolic(f"{n.op_type} is not known to run with symbolic sizes")
    if (why := rule(n)) is not None:
        raise NotSymbolic(f"{n.op_type}: {why}")


def same_size(n: Node, x: Tensor, out: Tensor) -> Tensor:
    """`out` (a reshape of `x`), checked to hold as many elements as `x` for every value of the Variables: a size
    inferred by a floor division (-1 beside a symbolic size) may match only at the bound value."""
    a, b = math.prod(x.shape), math.prod(out.shape)
    if isinstance(a, int) and isinstance(b, int):
        return out
    d = a - b
    if not (d == 0 if isinstance(d, int) else isinstance(d, NumNode) and d.b == 0):
        raise NotSymbolic(f"{n.op_type} of {x.shape} to {out.shape}: the sizes may differ at another size")
    return out


def _monomial(s: sint) -> Optional[tuple[int, list[Variable]]]:
    """A size as a number times Variables (with repeats), or None where it is not such a product."""
    if isinstance(s, (int, NumNode)):
        return int(s), []
    if isinstance(s, Variable):
        return 1, [s]
    if isinstance(s, MulNode):
        a, b = _monomial(s.a), _monomial(s.b)
        return None if a is None or b is None else (a[0] * b[0], a[1] + b[1])
    return None


def infer_size(n: Node, x: Tensor, shape: list[sint]) -> list[sint]:
    """A Reshape's shape with its -1 resolved where sizes are symbolic: x's size over the others', divided as products
    of Variables (the core's floor division of one symbolic size by another gives up on products)."""
    if -1 not in shape or all(isinstance(s, int) for s in (*x.shape, *shape)):
        return shape
    total, known = (
        _monomial(math.prod(x.shape)),
        _monomial(math.prod([s for s in shape if not isinstance(s, int) or s != -1])),
    )
    if total is None or known is None or known[0] == 0 or total[0] % known[0]:
        raise NotSymbolic(f"Reshape of {x.shape} to {shape}: -1 is no whole product")
    rest = list(total[1])
    for v in known[1]:
        if v not in rest:
            raise NotSymbolic(f"Reshape of {x.shape} to {shape}: -1 is no whole product")
        rest.remove(v)
    size: sint = total[0] // known[0]
    for v in rest:
        size = size * v
    return [size if isinstance(s, int) and s == -1 else s for s in shape]


# ***** host copies of shapes that hold symbolic sizes *****


def normalize(value: np.ndarray) -> np.ndarray:
    """A host copy that holds symbolic sizes with its other elements as Python ints (what a symbolic size computes
    with); as int64 where every element is a number (a symbolic size that folded to one)."""
    if value.dtype != object:
        return value
    flat = [e if isinstance(e, SymNode) and not isinstance(e, NumNode) else int(e) for e in value.reshape(-1)]
    if not any(isinstance(e, SymNode) for e in flat):
        return np.array(flat, dtype=np.int64).reshape(value.shape)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(value.shape)


def _node_tensor(s: sint, device: str) -> Tensor:
    """A 0-d int64 tensor of a symbolic size's value, computed on the device from its Variables."""
    if isinstance(s, (int, NumNode)):
        return Tensor(int(s), dtype=dtypes.int64, device=device)
    if isinstance(s, Variable):
        return Tensor(s, dtype=dtypes.int64, device=device)
    if isinstance(s, MulNode):
        b = s.b if isinstance(s.b, int) else _node_tensor(s.b, device)
        return _node_tensor(s.a, device) * b
    if isinstance(s, SumNode):
        out = _node_tensor(s.nodes[0], device)
        for e in s.nodes[1:]:
            out = out + _node_tensor(e, device)
        return out
    if isinstance(s, (DivNode, ModNode)) and s.a.min >= 0:  # (floor and C's truncation agree on non-negatives)
        a = _node_tensor(s.a, device)
        return a.div(s.b, upcast=False) if isinstance(s, DivNode) else a - a.div(s.b, upcast=False) * s.b
    raise NotSymbolic(f"the symbolic size {s} has no tensor form here")


def known_tensor(value: np.ndarray, device: str, dtype: Any = None) -> Tensor:
    """The device tensor of a host copy that holds symbolic sizes (each element computed from the Variables)."""
    parts = [_node_tensor(e, device) for e in value.reshape(-1)]
    out = Tensor.stack(*parts) if len(parts) > 1 else parts[0].reshape(1)
    out = out.reshape(value.shape)
    return out if dtype is None or out.dtype == dtype else out.cast(dtype)


def arange(size: sint, device: str, dtype: Any) -> Tensor:
    """0, 1, ..., size - 1; for a symbolic size, the first `size` of a range as long as its bound."""
    if isinstance(size, int):
        return Tensor.arange(size, device=device, dtype=dtype)
    return Tensor.arange(size.max, device=device, dtype=dtype).shrink(((0, size),))


# ***** outputs *****


def concrete(t: Tensor, var_vals: dict[Variable, int]) -> Tensor:
    """A realized output of symbolic shape as a tensor of its shape at these values, in memory of its own (the
    recording's buffers are written again by the next call). The bytes are copied without a kernel: a kernel of each
    concrete shape would be compiled again for every new size."""
    if all(isinstance(s, int) for s in t.shape):
        return t.clone().realize()
    shape = tuple(s if isinstance(s, int) else s.evaluate(var_vals) for s in t.shape)
    lb = t.lazydata
    src = lb.base.realized
    if src is None or not lb.st.contiguous:  # (offset 0, no mask: its values are the buffer's first ones)
        raise NotSymbolic(f"an output of shape {t.shape} is not its own contiguous buffer")
    out = Tensor.empty(*shape, dtype=t.dtype, device=t.device).realize()
    dest = out.lazydata.base.realized
    assert dest is not None
    if dest.size:
        if Device[src.device].allocator.supports_offset:
            BufferCopy()([dest, src.view(dest.size, dest.dtype, 0)], {})
        else:
            dest.copyin(src.as_buffer()[: dest.nbytes])
    return out
