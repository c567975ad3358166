"""ONNX operators of the default domain, written on Tensor ops from the operator specs (onnx/defs).

Each implementation takes a Node and returns a Tensor or a tuple of them (None for an output not produced).
It is registered with @op(op_type, since_version, ...): a version is listed where the op's semantics changed
(an attribute became an input, a default changed), so each opset gets its own reading."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tgcore.dtype import DType, dtypes, least_upper_dtype, sum_acc_dtype
from tgcore.onnx import dynamic
from tgcore.onnx.errors import NotSymbolic, OnnxError
from tgcore.onnx.ops_random import seed_key
from tgcore.onnx.registry import Node, Result, ceil_div, norm_axis, onnx_to_dtype, op, to_tensor, wide_float
from tgcore.shape.symbolic import Node as SymNode
from tgcore.tensor import Tensor

# ***** elementwise: unary math *****

_UNARY = {
    "Abs": Tensor.abs,
    "Neg": Tensor.neg,
    "Exp": Tensor.exp,
    "Log": Tensor.log,
    "Sqrt": Tensor.sqrt,
    "Reciprocal": Tensor.reciprocal,
    "Floor": Tensor.floor,
    "Ceil": Tensor.ceil,
    "Round": Tensor.round,
    "Sign": Tensor.sign,
    "Sin": Tensor.sin,
    "Cos": Tensor.cos,
    "Tan": Tensor.tan,
    "Sinh": Tensor.sinh,
    "Cosh": Tensor.cosh,
    "Asinh": Tensor.asinh,
    "Acosh": Tensor.acosh,
    "Atanh": Tensor.atanh,
    "Relu": Tensor.relu,
    "Sigmoid": Tensor.sigmoid,
    "Tanh": Tensor.tanh,
    "Softsign": Tensor.softsign,
    "Softplus": Tensor.softplus,
    "Mish": Tensor.mish,
    "HardSwish": Tensor.hardswish,
}


def _unary(fn):  # noqa: ANN001, ANN202 (a closure per op)
    return lambda n: fn(n[0])


for _name, _fn in _UNARY.items():
    op(_name, 1)(_unary(_fn))


@op("Identity", 1)
def _identity(n: Node) -> tuple:
    return (n[0],)  # (a sequence too: one output)


@op("Not", 1)
def _not(n: Node) -> Tensor:
    return n[0].logical_not()


@op("IsNaN", 9)
def _isnan(n: Node) -> Tensor:
    x = n[0]
    return x != x


@op("IsInf", 10)
def _isinf(n: Node) -> Tensor:
    x = n[0]
    pos, neg = (x == math.inf), (x == -math.inf)
    if not n.get("detect_positive", 1):
        pos = pos & False
    if not n.get("detect_negative", 1):
        neg = neg & False
    return pos | neg


def _erf(x: Tensor) -> Tensor:
    """erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7), odd in x."""
    a = x.abs()
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return x.sign() * (1.0 - poly * (-a * a).exp())


@op("Erf", 9)
def _erf_op(n: Node) -> Tensor:
    return _erf(n[0])


@op("Gelu", 20)
def _gelu(n: Node) -> Tensor:
    x = n[0]
    if n.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    return 0.5 * x * (1 + _erf(x * (1 / math.sqrt(2))))


@op("LeakyRelu", 1)
def _leaky(n: Node) -> Tensor:
    x = n[0]
    return (x < 0).where(x * n.get("alpha", 0.01), x)


@op("Elu", 1)
def _elu(n: Node) -> Tensor:
    x, alpha = n[0], n.get("alpha", 1.0)
    return (x < 0).where(alpha * (x.exp() - 1), x)


@op("Celu", 12)
def _celu(n: Node) -> Tensor:
    x, alpha = n[0], n.get("alpha", 1.0)
    return x.maximum(0) + ((x / alpha).exp() - 1).mul(alpha).minimum(0)


@op("Selu", 1)
def _selu(n: Node) -> Tensor:
    x = n[0]
    alpha, gamma = n.get("alpha", 1.67326319217681884765625), n.get("gamma", 1.05070102214813232421875)
    return gamma * (x <= 0).where(alpha * (x.exp() - 1), x)


@op("ThresholdedRelu", 10)
def _threlu(n: Node) -> Tensor:
    x = n[0]
    return (x > n.get("alpha", 1.0)).where(x, 0)


@op("HardSigmoid", 1)
def _hardsigmoid(n: Node) -> Tensor:
    return (n[0] * n.get("alpha", 0.2) + n.get("beta", 0.5)).clip(0, 1)


@op("PRelu", 1)
def _prelu(n: Node) -> Tensor:
    x, slope = n[0], n[1]
    if slope.ndim == 1 and x.ndim >= 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        slope = slope.reshape(-1, *([1] * (x.ndim - 2)))  # one slope per channel (what exporters mean by shape (C,))
    return (x < 0).where(x * slope, x)


@op("Clip", 1, 11)
def _clip(n: Node) -> Tensor:
    x = n[0]
    if n.opset < 11:
        lo, hi = n.get("min", -math.inf), n.get("max", math.inf)
    else:
        lo_v, hi_v = n.host(1), n.host(2)
        lo = lo_v.item() if lo_v is not None else None
        hi = hi_v.item() if hi_v is not None else None
    if lo is not None:
        x = x.maximum(lo)
    if hi is not None:
        x = x.minimum(hi)
    return x


# ***** elementwise: binary math and comparisons (numpy broadcasting from opset 7) *****


def _same(a: Tensor, out: Tensor) -> Tensor:
    return out if out.dtype == a.dtype else out.cast(a.dtype)


# host copies of at most this many integers are computed with on the host by the ops that shape arithmetic passes
# through (Unsqueeze, Squeeze, Cast, Add, Sub, Mul, Div), so a shape read by a later Reshape stays known
_SHAPE_LIKE = 64


def _shape_like(n: Node, x: Optional[Tensor]) -> Optional[np.ndarray]:
    """x's host copy where it is a shape or a part of one: a few 32- or 64-bit integers (or symbolic sizes)."""
    if x is None or x.dtype not in (dtypes.int32, dtypes.int64) or type(x) is not Tensor:
        return None
    v = n.known.get(id(x))
    return v if v is not None and v.size <= _SHAPE_LIKE else None


def _known_ints(n: Node) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The host copies of a binary op's two inputs where both are shapes of one dtype (shape arithmetic)."""
    a, b = n[0], n[1]
    if a is None or b is None or a.dtype != b.dtype:
        return None
    av, bv = _shape_like(n, a), _shape_like(n, b)
    if av is None or bv is None:
        return None
    if av.dtype == object or bv.dtype == object:  # (symbolic sizes compute with Python ints)
        return av.astype(object), bv.astype(object)
    return av, bv


@op("Add", 7)
def _add(n: Node) -> Tensor:
    if (ab := _known_ints(n)) is not None:
        return _known(n, ab[0] + ab[1], n[0].dtype)
    return _same(n[0], n[0] + n[1])


@op("Sub", 7)
def _sub(n: Node) -> Tensor:
    if (ab := _known_ints(n)) is not None:
        return _known(n, ab[0] - ab[1], n[0].dtype)
    return _same(n[0], n[0] - n[1])


@op("Mul", 7)
def _mul(n: Node) -> Tensor:
    if (ab := _known_ints(n)) is not None:
        return _known(n, ab[0] * ab[1], n[0].dtype)
    return _same(n[0], n[0] * n[1])


def _trunc_div(x: object, y: object) -> object:
    """One integer quotient rounded toward zero (C's, the spec's); a symbolic size only by a positive number."""
    if isinstance(x, SymNode) or isinstance(y, SymNode):
        if not (isinstance(y, int) and y > 0 and (not isinstance(x, SymNode) or x.min >= 0)):
            raise NotSymbolic(f"Div of the symbolic size {x} by {y}")
        return x // y
    q = abs(int(x)) // abs(int(y))  # type: ignore[call-overload]
    return -q if (int(x) < 0) != (int(y) < 0) else q  # type: ignore[call-overload]


@op("Div", 7)
def _div(n: Node) -> Tensor:
    a, b = n[0], n[1]
    if (ab := _known_ints(n)) is not None and not (ab[1] == 0).any():
        av, bv = ab
        q = np.asarray(np.frompyfunc(_trunc_div, 2, 1)(av.astype(object), bv.astype(object)), dtype=object)
        return _known(n, q if av.dtype == object else q.astype(av.dtype), a.dtype)
    if dtypes.is_float(a.dtype):
        return a / b
    return a.div(b, upcast=False)  # integers: C's truncation, as the spec's reference casts the quotient


@op("Mod", 10)
def _mod(n: Node) -> Tensor:
    a, b = n[0], n[1]
    if n.get("fmod", 0):  # C fmod: the sign of the dividend
        if dtypes.is_float(a.dtype):
            return a - (a / b).trunc() * b
        return a - a.div(b, upcast=False) * b
    return _same(a, a.mod(b))


@op("Pow", 7)
def _pow(n: Node) -> Tensor:
    a, b = n[0], n[1]
    if dtypes.is_int(a.dtype) and dtypes.is_int(b.dtype):
        return _int_pow(a, b, int(max(1, n.host(1).max(initial=1))))
    return a.pow(b.cast(a.dtype) if dtypes.is_float(a.dtype) else b).cast(a.dtype)


def _int_pow(a: Tensor, e: Tensor, top: int) -> Tensor:
    """a ** e in a's integer type, exact (and wrapping as C does), by squaring over the bits of e up to `top`."""
    out, base = a.ones_like(), a
    e = e.cast(a.dtype) if e.dtype != a.dtype else e
    for _ in range(top.bit_length()):
        out = ((e % 2) == 1).where(out * base, out)
        base, e = base * base, e.div(2, upcast=False)
    return out


def _binary(fn):  # noqa: ANN001, ANN202
    return lambda n: fn(n[0], n[1])


for _name, _fn in {
    "Equal": Tensor.__eq__,
    "Less": Tensor.__lt__,
    "Greater": Tensor.__gt__,
    "LessOrEqual": Tensor.__le__,
    "GreaterOrEqual": Tensor.__ge__,
    "And": Tensor.__and__,
    "Or": Tensor.__or__,
    "Xor": Tensor.__xor__,
    "BitwiseAnd": Tensor.bitwise_and,
    "BitwiseOr": Tensor.bitwise_or,
    "BitwiseXor": Tensor.xor,
}.items():
    op(_name, 7)(_binary(_fn))


@op("BitwiseNot", 18)
def _bitnot(n: Node) -> Tensor:
    return ~n[0]


@op("BitShift", 11)
def _bitshift(n: Node) -> Tensor:
    a, b = n[0], n[1]
    return a.lshift(b) if n.get("direction") == "LEFT" else a.rshift(b)


def _variadic(name: str, fn):  # noqa: ANN001, ANN202
    def run(n: Node) -> Tensor:
        xs = [x for x in n.inputs if x is not None]
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out / len(xs) if name == "Mean" else _same(xs[0], out)

    return run


for _name, _fn in {"Max": Tensor.maximum, "Min": Tensor.minimum, "Sum": Tensor.add, "Mean": Tensor.add}.items():
    op(_name, 8)(_variadic(_name, _fn))


@op("Where", 9)
def _where(n: Node) -> Tensor:
    return n[0].where(n[1], n[2])


# ***** matrix products *****


@op("MatMul", 1)
def _matmul(n: Node) -> Tensor:
    return _mm_wide(n[0], n[1])


@op("Gemm", 7)
def _gemm(n: Node) -> Tensor:
    a, b, c = n[0], n[1], n[2]
    if n.get("transA", 0):
        a = a.transpose()
    if n.get("transB", 0):
        b = b.transpose()
    out = a.matmul(b)
    if (alpha := n.get("alpha", 1.0)) != 1.0:
        out = out * alpha
    if c is not None:
        beta = n.get("beta", 1.0)
        out = out + (c * beta if beta != 1.0 else c)
    return _same(n[0], out)


@op("Einsum", 12)
def _einsum(n: Node) -> Tensor:
    if all(x.ndim == 0 for x in n.inputs):  # scalars only: "->", ",->": their product
        out = n.inputs[0]
        for x in n.inputs[1:]:
            out = out * x
        return out
    return Tensor.einsum(n.get("equation").replace(" ", ""), *n.inputs)


# ***** convolution and pooling *****


def _spatial_pads(n: Node, in_sp: tuple[int, ...], kernel: list[int], strides: list[int], dils: list[int]) -> list:
    """Per spatial axis (begin, end) from `pads` or `auto_pad`."""
    nd, auto = len(kernel), n.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(in_sp, kernel, strides, dils):
            total = max(0, (ceil_div(size, s) - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * nd
    pads = n.get("pads", [0] * (2 * nd))
    return [(pads[i], pads[i + nd]) for i in range(nd)]


def _conv_args(n: Node, x: Tensor, kernel: list[int]) -> tuple[list[int], list[int], list]:
    nd = len(kernel)
    strides, dils = n.get("strides", [1] * nd), n.get("dilations", [1] * nd)
    return strides, dils, _spatial_pads(n, x.shape[2:], kernel, strides, dils)


@op("Conv", 1, 11)
def _conv(n: Node) -> Tensor:
    x, w, b = n[0], n[1], n[2]
    kernel = list(w.shape[2:])
    strides, dils, pads = _conv_args(n, x, kernel)
    flat: list[int] = []
    for p in reversed(pads):  # conv2d's layout: (begin, end) pairs from the last axis back
        flat += list(p)
    if x.dtype in (dtypes.float16, dtypes.bfloat16):  # each product and the sum in float32, rounded once at the end
        w, b = w.cast(dtypes.float32), None if b is None else b.cast(dtypes.float32)
        y = x.cast(dtypes.float32).conv2d(w, b, groups=n.get("group", 1), stride=strides, dilation=dils, padding=flat)
        return y.cast(x.dtype)
    return x.conv2d(w, b, groups=n.get("group", 1), stride=strides, dilation=dils, padding=flat)


@op("ConvTranspose", 1, 11)
def _conv_transpose(n: Node) -> Tensor:
    x, w, b = n[0], n[1], n[2]
    kernel, nd = list(w.shape[2:]), w.ndim - 2
    strides, dils = n.get("strides", [1] * nd), n.get("dilations", [1] * nd)
    out_pad = n.get("output_padding", [0] * nd)
    y = x.conv_transpose2d(w, None, groups=n.get("group", 1), stride=strides, dilation=dils)
    full = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(x.shape[2:], strides, kernel, dils)]
    if (out_shape := n.get("output_shape")) is not None:
        out_shape = list(out_shape)[-nd:]
        pads = []
        for f, op_, o in zip(full, out_pad, out_shape):
            total = f + op_ - o
            if n.get("auto_pad", "NOTSET") == "SAME_UPPER":
                pads.append((total // 2, total - total // 2))
            else:
                pads.append((total - total // 2, total // 2))
    elif n.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i, f, op_, s in zip(x.shape[2:], full, out_pad, strides):
            total = f + op_ - i * s
            small = total // 2
            pads.append((small, total - small) if n.get("auto_pad") == "SAME_UPPER" else (total - small, small))
    else:
        p = n.get("pads", [0] * (2 * nd)) if n.get("auto_pad", "NOTSET") != "VALID" else [0] * (2 * nd)
        pads = [(p[i], p[i + nd]) for i in range(nd)]
    # output_padding adds rows at the end that no input reaches (bias only); pads then trim each side
    y = y.pad(((0, 0), (0, 0), *[(0, max(0, op_)) for op_ in out_pad]))
    y = y.pad(((0, 0), (0, 0), *[(-min(0, pb), -min(0, pe)) for pb, pe in pads]))
    y = y.shrink(
        ((0, y.shape[0]), (0, y.shape[1]), *[(max(0, pb), s - max(0, pe)) for (pb, pe), s in zip(pads, y.shape[2:])])
    )
    return y if b is None else y + b.reshape(1, -1, *([1] * nd))


def _pool_input(
    n: Node, x: Tensor, value: float, count_pads: bool
) -> tuple[Tensor, Optional[Tensor], list[int], list[int], list[int]]:
    """x padded for pooling (explicit pads filled with `value`, ceil_mode's tail too) and the count of taps."""
    kernel = list(n.get("kernel_shape"))
    strides, dils, pads = _conv_args(n, x, kernel)
    extra = []
    for size, k, s, d, (pb, pe) in zip(x.shape[2:], kernel, strides, dils, pads):
        span = size + pb + pe - (k - 1) * d - 1
        o = (ceil_div(span, s) if n.get("ceil_mode", 0) else span // s) + 1
        if n.get("ceil_mode", 0) and (o - 1) * s >= size + pb:  # a window that starts in the end padding is dropped
            o -= 1
        extra.append(max(0, (o - 1) * s + (k - 1) * d + 1 - (size + pb + pe)))
    full = [(0, 0), (0, 0), *[(pb, pe + e) for (pb, pe), e in zip(pads, extra)]]
    xp = x.pad(tuple(full), value=value)
    ones = None
    if any(pb or pe or e for (pb, pe), e in zip(pads, extra)):
        inner = Tensor.ones(*x.shape[2:], device=x.device, dtype=x.dtype)
        if count_pads:
            inner = inner.pad(tuple(pads), value=1.0)
            ones = inner.pad(tuple((0, e) for e in extra))
        else:
            ones = inner.pad(tuple((pb, pe + e) for (pb, pe), e in zip(pads, extra)))
    return xp, ones, kernel, strides, dils


@op("MaxPool", 1, 8, 10, 11, 12)
def _maxpool(n: Node) -> Result:
    x = n[0]
    fill = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
    xp, _, kernel, strides, dils = _pool_input(n, x, fill, False)
    windows = xp._pool(tuple(kernel), strides, dils)
    out = windows.max(tuple(range(-len(kernel), 0)))
    if n.num_outputs < 2:
        return out
    # Indices: each maximum's position in the flattened input (row-major, or column-major over the spatial
    # axes with storage_order=1), taken from the same windows over a tensor of positions
    sp = x.shape[2:]
    pos = np.arange(math.prod(sp)).reshape(sp)
    if n.get("storage_order", 0):
        pos = np.arange(math.prod(sp)).reshape(sp[::-1]).T
    full = pos + np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *([1] * len(sp))) * math.prod(sp)
    n2 = Node(n.op_type, n.opset, [Tensor(full.astype(np.int64), device=n.device)], n.attrs, n.device, 1, n.known)
    pwin = _pool_input(n2, n2[0], -1, False)[0]._pool(tuple(kernel), strides, dils)
    k = math.prod(kernel)
    flat_w = windows.reshape(*windows.shape[: -len(kernel)], k)
    first = flat_w.argmax(-1, keepdim=True)
    idx = pwin.reshape(*pwin.shape[: -len(kernel)], k).gather(-1, first).squeeze(-1)
    return out, idx


@op("AveragePool", 1, 7, 10, 11, 19)
def _avgpool(n: Node) -> Tensor:
    x = n[0]
    count_pads = bool(n.get("count_include_pad", 0))
    xp, ones, kernel, strides, dils = _pool_input(n, x, 0.0, count_pads)
    axes = tuple(range(-len(kernel), 0))
    total = xp._pool(tuple(kernel), strides, dils).sum(axes)
    if ones is None:
        return total / math.prod(kernel)
    return total / ones._pool(tuple(kernel), strides, dils).sum(axes)


@op("GlobalAveragePool", 1)
def _gap(n: Node) -> Tensor:
    x = n[0]
    return _mean(x, tuple(range(2, x.ndim)), True)


@op("GlobalMaxPool", 1)
def _gmp(n: Node) -> Tensor:
    x = n[0]
    return x.max(tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalLpPool", 1, 2, 22)
def _glppool(n: Node) -> Tensor:
    x, p = n[0], n.get("p", 2)
    return x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1 / p)


# ***** normalization *****


@op("BatchNormalization", 1, 6, 7, 9, 14, 15)
def _batchnorm(n: Node) -> Result:
    x, scale, bias, mean, var = n.inputs[:5]
    if n.get("training_mode", 0):  # this batch's statistics; running ones move toward them by 1 - momentum
        axes = tuple(a for a in range(x.ndim) if a != 1)
        bmean, bvar = x.mean(axes), ((x - x.mean(axes, keepdim=True)) ** 2).mean(axes)
        y = x.batchnorm(scale, bias, bmean, (bvar + n.get("epsilon", 1e-5)).rsqrt())
        m = n.get("momentum", 0.9)
        return y, mean * m + bmean * (1 - m), var * m + bvar * (1 - m)
    invstd = (var + n.get("epsilon", 1e-5)).rsqrt()
    return x.batchnorm(scale, bias, mean, invstd)


@op("InstanceNormalization", 6)
def _instnorm(n: Node) -> Tensor:
    x, scale, bias = n[0], n[1], n[2]
    shape = (1, -1, *([1] * (x.ndim - 2)))
    y = x.layernorm(tuple(range(2, x.ndim)), eps=n.get("epsilon", 1e-5))
    return y * scale.reshape(shape) + bias.reshape(shape)


@op("LayerNormalization", 17)
def _layernorm(n: Node) -> tuple:
    x, scale, bias = n[0], n[1], n[2]
    axis = norm_axis(n.get("axis", -1), x.ndim)
    axes = tuple(range(axis, x.ndim))
    xf = x.cast(dtypes.float32) if n.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    mean = _mean(xf, axes, True)
    d = xf - mean
    invstd = (_mean(d * d, axes, True) + n.get("epsilon", 1e-5)).rsqrt()
    y = (d * invstd).cast(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, invstd


@op("LpNormalization", 1)
def _lpnorm(n: Node) -> Tensor:
    x, axis, p = n[0], n.get("axis", -1), n.get("p", 2)
    norm = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
    return (norm == 0).where(0, x / norm)  # (a zero vector stays zero)


# ***** softmax family: before opset 13 the input is read as 2-D, split at `axis` *****


def _softmax_like(kind: str):  # noqa: ANN202
    def run(n: Node) -> Tensor:
        x = n[0]
        if n.opset < 13:
            axis = norm_axis(n.get("axis", 1), x.ndim)
            flat = x.reshape(math.prod(x.shape[:axis]), -1)
            return _softmax_on(kind, flat, 1).reshape(x.shape)
        return _softmax_on(kind, x, norm_axis(n.get("axis", -1), x.ndim))

    return run


def _softmax_on(kind: str, x: Tensor, axis: int) -> Tensor:
    if kind == "Softmax":
        return x.softmax(axis)
    if kind == "LogSoftmax":
        return x.log_softmax(axis)
    return _hardmax(x, axis)


def _hardmax(x: Tensor, axis: int) -> Tensor:
    """1 at the first maximum along axis, 0 elsewhere."""
    idx = x.argmax(axis, keepdim=True)
    pos = Tensor.arange(x.shape[axis], device=x.device).reshape(tuple([-1 if a == axis else 1 for a in range(x.ndim)]))
    return (pos == idx).cast(x.dtype)


for _name in ("Softmax", "LogSoftmax", "Hardmax"):
    op(_name, 1, 13)(_softmax_like(_name))


# ***** reductions: `axes` an attribute, then an input (ReduceSum from 13, the others from 18) *****


def _reduce(kind: str, axes_input_since: int):  # noqa: ANN202
    def run(n: Node) -> Tensor:
        x = n[0]
        if n.opset >= axes_input_since:
            axes = n.ints(1)
        else:
            axes = n.get("axes")
        keep = bool(n.get("keepdims", 1))
        if not axes:
            if n.get("noop_with_empty_axes", 0) and n.opset >= axes_input_since:
                return x
            axes = list(range(x.ndim))
        ax = tuple(norm_axis(a, x.ndim) for a in axes)
        if kind in ("ReduceMax", "ReduceMin", "ReduceLogSumExp") and any(x.shape[a] == 0 for a in ax):
            # the spec's empty set: the type's lowest value for a max (-inf, False), its highest for a min
            shape = tuple(1 if i in ax else s for i, s in enumerate(x.shape) if keep or i not in ax)
            lo, hi = (-math.inf, math.inf) if dtypes.is_float(x.dtype) else (dtypes.min(x.dtype), dtypes.max(x.dtype))
            return Tensor.full(shape, hi if kind == "ReduceMin" else lo, dtype=x.dtype, device=x.device)
        if kind == "ReduceSum":
            return x.sum(ax, keepdim=keep)
        if kind == "ReduceMean":
            return _mean(x, ax, keep)
        if kind == "ReduceMax":
            return x.max(ax, keepdim=keep)
        if kind == "ReduceMin":
            return x.min(ax, keepdim=keep)
        if kind == "ReduceProd":
            return _prod(x, ax, keep)
        if kind == "ReduceL1":
            return x.abs().sum(ax, keepdim=keep)
        if kind == "ReduceL2":
            return _same(x, (x * x).sum(ax, keepdim=keep).sqrt())
        if kind == "ReduceSumSquare":
            return (x * x).sum(ax, keepdim=keep)
        if kind == "ReduceLogSum":
            return x.sum(ax, keepdim=keep).log()
        # ReduceLogSumExp, stable: max + log(sum(exp(x - max)))
        m = x.max(ax, keepdim=True)
        m = (m.abs() == math.inf).where(0, m) if dtypes.is_float(x.dtype) else m
        out = (x - m).exp().sum(ax, keepdim=True).log() + m
        return out if keep else out.reshape(tuple([s for i, s in enumerate(out.shape) if i not in ax]))

    return run


def _mean(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    """Tensor.mean, whose count (the tensor's size over the result's) is a division of one symbolic size by another
    where another axis is symbolic: here the count is the product of the reduced axes, concrete ones."""
    if all(isinstance(s, int) for s in x.shape):
        return x.mean(axes, keepdim=keep)
    count = math.prod(x.shape[a] for a in axes)
    if not isinstance(count, int):
        raise NotSymbolic(f"a mean over the symbolic axes of {x.shape}")
    is_float = dtypes.is_float(x.dtype)  # (as Tensor.mean: half types summed and divided in float32)
    out = x.sum(axes, keepdim=keep, acc_dtype=sum_acc_dtype(x.dtype) if is_float else None)
    wide = out.cast(least_upper_dtype(out.dtype, dtypes.float32))
    return wide.div(count).cast(x.dtype if is_float else dtypes.float32)


def _prod(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    """A product by halving: multiply the two halves of each axis until one element is left."""
    for a in axes:
        while x.shape[a] > 1:
            size = x.shape[a]
            if size % 2:
                one = [(0, 0)] * x.ndim
                one[a] = (0, 1)
                x = x.pad(tuple(one), value=1)
                size += 1
            lo = [(0, s) for s in x.shape]
            hi = list(lo)
            lo[a], hi[a] = (0, size // 2), (size // 2, size)
            x = x.shrink(tuple(lo)) * x.shrink(tuple(hi))
        if x.shape[a] == 0:
            x = Tensor.ones(*[1 if i == a else s for i, s in enumerate(x.shape)], dtype=x.dtype, device=x.device)
    return x if keep else x.reshape(tuple([s for i, s in enumerate(x.shape) if i not in axes]))


for _name in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
              "ReduceLogSum", "ReduceLogSumExp"):  # fmt: skip
    op(_name, 1, 18)(_reduce(_name, 18))
op("ReduceSum", 1, 13)(_reduce("ReduceSum", 13))


def _arg(kind: str):  # noqa: ANN202
    def run(n: Node) -> Tensor:
        x, axis, keep = n[0], norm_axis(n.get("axis", 0), n[0].ndim), bool(n.get("keepdims", 1))
        y = x if kind == "ArgMax" else -x
        if n.get("select_last_index", 0):
            idx = x.shape[axis] - 1 - y.flip(axis).argmax(axis, keepdim=keep)
        else:
            idx = y.argmax(axis, keepdim=keep)
        return idx.cast(dtypes.int64)

    return run


op("ArgMax", 1)(_arg("ArgMax"))
op("ArgMin", 1)(_arg("ArgMin"))


@op("CumSum", 11)
def _cumsum(n: Node) -> Tensor:
    x, axis = n[0], norm_axis(int(n.host(1).item()), n[0].ndim)
    if n.get("reverse", 0):
        x = x.flip(axis)
    y = x.cumsum(axis)
    if n.get("exclusive", 0):
        y = y - x
    return y.flip(axis) if n.get("reverse", 0) else y


# ***** shapes and data movement *****


def _known(n: Node, value: np.ndarray, dtype: Optional[DType] = None) -> Tensor:
    """A tensor of host-known values: later shape-reading ops read the host copy, no kernel runs. A copy that holds
    symbolic sizes (an object array, while walking with symbolic shapes) gets a tensor of `dtype` (int64 by default)
    computed from its Variables."""
    if isinstance(value, (SymNode, int)):  # (one element taken from a host copy that holds symbolic sizes)
        value = np.array(value, dtype=object)
    elif isinstance(value, np.generic):  # (one element, of its dtype: a numpy scalar would become a Python number's)
        value = np.asarray(value)
    if value.dtype == object:
        if (value := dynamic.normalize(value)).dtype == object:
            return n.known.put(dynamic.known_tensor(value, n.device, dtype or dtypes.int64), value)
        value = value.astype((dtype or dtypes.int64).np)
    return n.known.put(to_tensor(value, n.device), value)


def _shape_array(sizes: object) -> np.ndarray:
    """Sizes as a host copy: int64, or an object array where one is symbolic."""
    items = sizes if isinstance(sizes, (tuple, list)) else [sizes]
    return np.array(sizes, dtype=object if any(isinstance(s, SymNode) for s in items) else np.int64)


@op("Shape", 1, 15)
def _shape(n: Node) -> Tensor:
    shape = n[0].shape
    start, end = n.get("start", 0), n.get("end", len(shape))
    return _known(n, _shape_array(list(shape[slice(start, end)])), dtypes.int64)


@op("Size", 1)
def _size(n: Node) -> Tensor:
    return _known(n, _shape_array(math.prod(n[0].shape)), dtypes.int64)


@op("Constant", 1, 9, 11, 12, 13)
def _constant(n: Node) -> Tensor:
    from onnx import numpy_helper

    a = n.attrs
    if "value" in a:
        return _known(n, numpy_helper.to_array(a["value"]))
    if "value_float" in a:
        return _known(n, np.array(a["value_float"], dtype=np.float32))
    if "value_floats" in a:
        return _known(n, np.array(a["value_floats"], dtype=np.float32))
    if "value_int" in a:
        return _known(n, np.array(a["value_int"], dtype=np.int64))
    if "value_ints" in a:
        return _known(n, np.array(a["value_ints"], dtype=np.int64))
    raise n.unsupported(f"only value, value_float(s) and value_int(s) are supported, got {sorted(a)}")


@op("ConstantOfShape", 9)
def _constant_of_shape(n: Node) -> Tensor:
    from onnx import numpy_helper

    shape = n.sints(0)
    value = numpy_helper.to_array(n.attrs["value"]) if "value" in n.attrs else np.zeros(1, np.float32)
    if any(isinstance(s, SymNode) for s in shape):  # (a symbolic shape: the value broadcast on the device)
        if any(isinstance(s, SymNode) and s.min < 0 for s in shape):
            raise NotSymbolic(f"ConstantOfShape of {shape}: a size may be negative")
        one = to_tensor(value.reshape(-1)[:1].copy(), n.device)
        return one.reshape((1,) * len(shape)).expand(tuple(shape))
    return _known(n, np.full(shape, value.reshape(-1)[0], dtype=value.dtype))


@op("Cast", 6, 13, 19)
def _cast(n: Node) -> Tensor:
    from tgcore.onnx import lowbit  # (float8, float4, int4, int2: carried in a tgcore dtype)

    to, x = n.get("to"), lowbit.carrier(n[0])
    if to in lowbit.LOWBIT:
        return lowbit.cast_to(x, lowbit.LOWBIT[to], *lowbit.cast_options(n))
    dt = onnx_to_dtype(to, n.op_type, n.opset)
    if dt in (dtypes.int32, dtypes.int64) and (v := _shape_like(n, n[0])) is not None:
        return _known(n, v if v.dtype == object else v.astype(dt.np), dt)  # (shape arithmetic stays on the host)
    return x.cast(dt)


@op("CastLike", 15)
def _castlike(n: Node) -> Tensor:
    from tgcore.onnx import lowbit

    x, like = lowbit.carrier(n[0]), n[1]
    if isinstance(like, lowbit.LowBitTensor):
        return lowbit.cast_to(x, like.kind, *lowbit.cast_options(n))
    return x.cast(like.dtype)


@op("Reshape", 5, 14)
def _reshape(n: Node) -> Tensor:
    x, shape = n[0], n.sints(1)
    if any(isinstance(s, SymNode) and s.min < 1 for s in shape):  # (0 copies a size, -1 infers one: not symbolic)
        raise NotSymbolic(f"Reshape to {shape}: a symbolic size may be 0 or negative")
    if not n.get("allowzero", 0):
        shape = [x.shape[i] if isinstance(s, int) and s == 0 else s for i, s in enumerate(shape)]
    return dynamic.same_size(n, x, x.reshape(dynamic.infer_size(n, x, shape)))


@op("Flatten", 1, 9, 11, 13)
def _flatten(n: Node) -> Tensor:
    x = n[0]
    axis = norm_axis(n.get("axis", 1), x.ndim)
    return dynamic.same_size(n, x, x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@op("Transpose", 1)
def _transpose(n: Node) -> Tensor:
    x = n[0]
    return x.permute(n.get("perm", list(range(x.ndim))[::-1]))


def _axes(n: Node, input_since: int) -> Optional[list[int]]:
    return n.ints(1) if n.opset >= input_since else n.get("axes")


@op("Squeeze", 1, 11, 13)
def _squeeze(n: Node) -> Tensor:
    x, axes = n[0], _axes(n, 13)
    if axes is None:
        return _reshape_known(n, x, tuple([s for s in x.shape if s != 1]))
    ax = {norm_axis(a, x.ndim) for a in axes}
    return _reshape_known(n, x, tuple([s for i, s in enumerate(x.shape) if i not in ax]))


@op("Unsqueeze", 1, 11, 13)
def _unsqueeze(n: Node) -> Tensor:
    x, axes = n[0], _axes(n, 13)
    rank = x.ndim + len(axes)
    ax, dims = sorted(norm_axis(a, rank) for a in axes), iter(x.shape)
    return _reshape_known(n, x, tuple([1 if i in ax else next(dims) for i in range(rank)]))


def _reshape_known(n: Node, x: Tensor, shape: tuple) -> Tensor:
    """x reshaped; a host copy of its values goes along where it is a shape (a few integers)."""
    if (v := _shape_like(n, x)) is not None:
        return _known(n, v.reshape(shape), x.dtype)
    return x.reshape(shape)


@op("Concat", 4)
def _concat(n: Node) -> Tensor:
    xs = [x for x in n.inputs if x is not None]
    axis = norm_axis(n.get("axis"), xs[0].ndim)
    if all(id(x) in n.known for x in xs):
        return _known(n, np.concatenate([n.known[id(x)] for x in xs], axis), xs[0].dtype)
    return xs[0].cat(*xs[1:], dim=axis)


@op("Split", 2, 11, 13, 18)
def _split(n: Node) -> tuple:
    x = n[0]
    axis = norm_axis(n.get("axis", 0), x.ndim)
    sizes = n.ints(1) if n.opset >= 13 else n.get("split")
    if sizes is None:
        parts = n.get("num_outputs", n.num_outputs) if n.opset >= 18 else n.num_outputs
        chunk = ceil_div(x.shape[axis], parts)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    return x.split(sizes, axis)


@op("Slice", 1, 10)
def _slice(n: Node) -> Tensor:
    x = n[0]
    if n.opset < 10:
        starts, ends, axes, steps = n.get("starts"), n.get("ends"), n.get("axes"), None
    else:
        starts, ends, axes, steps = n.ints(1), n.ints(2), n.ints(3), n.ints(4)
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, x.ndim) for a in axes]
    steps = steps or [1] * len(starts)
    index: list[slice] = [slice(None)] * x.ndim
    for a, st, en, sp in zip(axes, starts, ends, steps):
        dim = x.shape[a]
        st, en = st + dim if st < 0 else st, en + dim if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), dim), min(max(en, 0), dim)
            index[a] = slice(st, en, sp)
        else:
            st, en = min(max(st, 0), dim - 1), min(max(en, -1), dim - 1)
            index[a] = slice(st, None if en < 0 else en, sp)
    if id(x) in n.known:
        return _known(n, n.known[id(x)][tuple(index)], x.dtype)
    if not all(isinstance(s, int) for s in x.shape):  # (indexing reads every size as a number: a shrink does not)
        if any(i.step not in (None, 1) for i in index):
            raise NotSymbolic(f"Slice with steps {steps} of a tensor of shape {x.shape}")
        return x.shrink(tuple(None if i.start is None else (i.start, max(i.start, i.stop)) for i in index))
    return x[tuple(index)]


def _gather_index(idx: Tensor, dim: int) -> Tensor:
    return (idx < 0).where(idx + dim, idx)


@op("Gather", 1, 11, 13)
def _gather(n: Node) -> Tensor:
    x, idx = n[0], n[1]
    axis = norm_axis(n.get("axis", 0), x.ndim)
    if id(x) in n.known and id(idx) in n.known:
        return _known(n, np.take(n.known[id(x)], n.known[id(idx)], axis=axis), x.dtype)
    flat = _gather_index(idx, x.shape[axis]).reshape(-1)
    out = x[(slice(None),) * axis + (flat,)]
    return out.reshape(tuple([*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]]))


@op("GatherElements", 11, 13)
def _gather_elements(n: Node) -> Tensor:
    x, idx = n[0], n[1]
    axis = norm_axis(n.get("axis", 0), x.ndim)
    return x.gather(axis, _gather_index(idx, x.shape[axis]))


@op("Expand", 8, 13)
def _expand(n: Node) -> Tensor:
    x, shape = n[0], n.sints(1)
    rank = max(len(shape), x.ndim)
    xs = (1,) * (rank - x.ndim) + tuple(x.shape)
    target = [1] * (rank - len(shape)) + shape
    return x.reshape(xs).expand(tuple(_broadcast_size(a, b) for a, b in zip(xs, target)))


def _broadcast_size(a: object, b: object) -> object:
    """Expand's size of an axis of size a to b (numpy's broadcast); a symbolic size only against 1 or itself."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b) if min(a, b) == 1 else b
    if isinstance(a, int) and a == 1:
        return b
    if (isinstance(b, int) and b == 1) or (isinstance(a, SymNode) and isinstance(b, SymNode) and a == b):
        return a
    raise NotSymbolic(f"Expand of a size {a} to {b}")


@op("Tile", 6, 13)
def _tile(n: Node) -> Tensor:
    return n[0].repeat(n.ints(1))


@op("Range", 11)
def _range(n: Node) -> Tensor:
    if any((v := n.known.get(id(n[i]))) is not None and v.dtype == object for i in range(3)):
        return _symbolic_range(n)
    start, limit, delta = (n.host(i).item() for i in range(3))
    if n[0].dtype == dtypes.bfloat16:  # (numpy has no bfloat16: count in float32, round once)
        return Tensor(np.arange(start, limit, delta, dtype=np.float32), device=n.device).cast(dtypes.bfloat16)
    return Tensor(np.arange(start, limit, delta, dtype=n[0].dtype.np), device=n.device)


def _symbolic_range(n: Node) -> Tensor:
    """Range of integers whose limit (or start) is a symbolic size: a symbolic number of them, by a positive delta."""
    start, limit, delta = (n.sints(i)[0] for i in range(3))  # type: ignore[index]
    span = limit - start
    if not dtypes.is_int(n[0].dtype) or not isinstance(delta, int) or delta < 1 or isinstance(span, int):
        raise NotSymbolic(f"Range({start}, {limit}, {delta}) of {n[0].dtype}")
    if span.min < 0:
        raise NotSymbolic(f"Range({start}, {limit}, {delta}): its length may be negative")
    return dynamic.arange((span + delta - 1) // delta, n.device, n[0].dtype) * delta + start


@op("Pad", 2, 11, 13, 18, 19, 21)
def _pad(n: Node) -> Tensor:
    x = n[0]
    mode = n.get("mode", "constant")
    if n.opset < 11:
        pads, value, axes = n.get("pads"), n.get("value", 0.0), None
    else:
        pads = n.ints(1)
        cv = n.host(2)
        value = cv.reshape(-1)[0].item() if cv is not None and cv.size else 0
        axes = n.ints(3)
    axes = list(range(x.ndim)) if axes is None else [norm_axis(a, x.ndim) for a in axes]
    k = len(axes)
    per = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        per[a] = (pads[i], pads[i + k])
    if mode == "constant":
        grow = tuple((max(0, b), max(0, e)) for b, e in per)
        y = x.pad(grow, value=value)
        return y.shrink(tuple((-min(0, b), s - (-min(0, e))) for (b, e), s in zip(per, y.shape)))
    if mode not in ("reflect", "edge", "wrap"):
        raise n.unsupported(f"mode {mode!r}: expected constant, reflect, edge or wrap")
    for a, (b, e) in enumerate(per):
        if b or e:
            x = _pad_axis(x, a, b, e, mode)
    return x


def _pad_axis(x: Tensor, a: int, b: int, e: int, mode: str) -> Tensor:
    """reflect / edge / wrap padding of one axis, by gathering the source index of every output position."""
    dim = x.shape[a]
    pos = np.arange(-b, dim + e)
    if mode == "edge":
        src = np.clip(pos, 0, dim - 1)
    elif mode == "wrap":
        src = pos % dim
    else:
        period = 2 * (dim - 1) if dim > 1 else 1
        m = np.abs(pos) % period
        src = np.where(m >= dim, period - m, m)
    return x[(slice(None),) * a + (Tensor(src.astype(np.int32), device=x.device),)]


@op("Dropout", 1, 7, 10, 12, 13, 22)
def _dropout(n: Node) -> tuple:
    x = n[0]
    if n.opset >= 12 and n[2] is not None and bool(n.host(2).item()):
        ratio = float(n.host(1).reshape(-1)[0]) if n[1] is not None else 0.5
        if not 0 <= ratio < 1:
            raise n.unsupported(f"ratio {ratio}: expected a value in [0, 1)")
        if ratio != 0 and 0 not in x.shape:  # training: each element kept with probability 1 - ratio, scaled up
            wide = wide_float(x.dtype)
            keep = Tensor._uniform_draw(tuple(x.shape), n.device, wide, seed_key(n)) >= ratio
            out = keep.where(x.cast(wide) * (1 / (1 - ratio)), 0).cast(x.dtype)
            return out, keep if n.num_outputs > 1 else None
    mask = Tensor.ones(*x.shape, dtype=dtypes.bool, device=x.device) if n.num_outputs > 1 else None
    return x, mask


@op("Trilu", 14)
def _trilu(n: Node) -> Tensor:
    x = n[0]
    k = int(n.host(1).item()) if n[1] is not None else 0
    if not all(isinstance(s, int) for s in x.shape[-2:]):  # (Tensor.triu counts rows and columns with numpy)
        rows = dynamic.arange(x.shape[-2], n.device, dtypes.int32).reshape(-1, 1)
        cols = dynamic.arange(x.shape[-1], n.device, dtypes.int32).reshape(1, -1)
        keep = (cols - rows >= k) if n.get("upper", 1) else (cols - rows <= k)
        return keep.where(x, 0).cast(x.dtype)
    return x.triu(k) if n.get("upper", 1) else x.tril(k)


@op("NonZero", 9, 13)
def _nonzero(n: Node) -> Tensor:
    return Tensor(np.array(np.nonzero(n.host(0)), dtype=np.int64).reshape(n[0].ndim, -1), device=n.device)


@op("OneHot", 9, 11)
def _onehot(n: Node) -> Tensor:
    idx, depth, values = n[0], int(n.host(1).reshape(-1)[0]), n[2]
    axis = n.get("axis", -1)
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + depth, idx)
    rank = idx.ndim + 1
    axis = norm_axis(axis, rank)
    pos = Tensor.arange(depth, device=n.device, dtype=dtypes.int64)
    pos = pos.reshape(tuple([depth if i == axis else 1 for i in range(rank)]))
    hit = pos == idx.unsqueeze(axis)
    off, on = values[0], values[1]
    return hit.where(on, off)


@op("DepthToSpace", 1, 11, 13)
def _d2s(n: Node) -> Tensor:
    x, bs = n[0], n.get("blocksize")
    b, c, h, w = x.shape
    if n.get("mode", "DCR") == "DCR":
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // (bs * bs), bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(b, c // (bs * bs), h * bs, w * bs)


@op("SpaceToDepth", 1, 13)
def _s2d(n: Node) -> Tensor:
    x, bs = n[0], n.get("blocksize")
    b, c, h, w = x.shape
    if n.get("mode", "DCR") == "CRD":  # (the inverse of DepthToSpace's CRD)
        y = x.reshape(b, c, h // bs, bs, w // bs, bs).permute(0, 1, 3, 5, 2, 4)
        return y.reshape(b, c * bs * bs, h // bs, w // bs)
    y = x.reshape(b, c, h // bs, bs, w // bs, bs).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(b, c * bs * bs, h // bs, w // bs)


# ***** control flow: the condition or trip count is read on the host when the node runs *****


@op("If", 1, 11, 13, 16, 19, 21)
def _if(n: Node) -> list:
    branch = n.attrs["then_branch"] if bool(n.host(0).reshape(-1)[0]) else n.attrs["else_branch"]
    return n.run_graph(branch, {})


# ***** opsets before 7: binary ops broadcast only with broadcast=1, B aligned at `axis` (or at the end) *****


def _legacy_b(n: Node, a: Tensor, b: Tensor) -> Tensor:
    """B shaped to broadcast against A the pre-opset-7 way: its dims line up with A's from `axis` (default: the end)."""
    if not n.get("broadcast", 0) or b.shape == a.shape:
        return b
    axis = n.get("axis")
    if axis is None:
        return b
    axis = norm_axis(axis, a.ndim)
    return b.reshape((1,) * axis + tuple(b.shape) + (1,) * (a.ndim - axis - b.ndim))


def _legacy_binary(fn):  # noqa: ANN001, ANN202
    return lambda n: _same(n[0], fn(n[0], _legacy_b(n, n[0], n[1])))


for _name, _fn in {"Add": Tensor.add, "Sub": Tensor.sub, "Mul": Tensor.mul}.items():
    op(_name, 1)(_legacy_binary(_fn))
op("Div", 1)(lambda n: _div(Node(n.op_type, n.opset, [n[0], _legacy_b(n, n[0], n[1])], {}, n.device, 1, n.known)))
op("Pow", 1)(lambda n: _pow(Node(n.op_type, n.opset, [n[0], _legacy_b(n, n[0], n[1])], {}, n.device, 1, n.known)))
op("Gemm", 1)(_gemm)  # (broadcast of C is numpy's either way for the shapes Gemm allows)
for _name, _fn in {"Max": Tensor.maximum, "Min": Tensor.minimum, "Sum": Tensor.add, "Mean": Tensor.add}.items():
    op(_name, 1)(_variadic(_name, _fn))  # (same shapes before opset 8; numpy broadcasting covers that)


# ***** more elementwise *****


def _atan(x: Tensor) -> Tensor:
    """atan by three half-angle steps, atan(x) = 2 atan(x / (1 + sqrt(1 + x^2))), to |x| < 0.2, then its series."""
    for _ in range(3):
        x = x / (1 + (1 + x * x).sqrt())
    x2 = x * x
    return 8 * x * (1 + x2 * (-1 / 3 + x2 * (1 / 5 + x2 * (-1 / 7 + x2 * (1 / 9 - x2 / 11)))))


def _asin(x: Tensor) -> Tensor:
    return 2 * _atan(x / (1 + (1 - x * x).sqrt()))  # (finite at x = +-1, unlike x / sqrt(1 - x^2))


op("Atan", 7)(lambda n: _atan(n[0]))
op("Asin", 7)(lambda n: _asin(n[0]))
op("Acos", 7)(lambda n: math.pi / 2 - _asin(n[0]))


@op("Swish", 24)
def _swish(n: Node) -> Tensor:
    x = n[0]
    return x * (x * n.get("alpha", 1.0)).sigmoid()


@op("Shrink", 9)
def _shrink(n: Node) -> Tensor:
    x, lambd, bias = n[0], n.get("lambd", 0.5), n.get("bias", 0.0)
    return _same(x, (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)))


# ***** normalization and losses *****


@op("RMSNormalization", 23)
def _rmsnorm(n: Node) -> Tensor:
    x, scale = n[0], n[1]
    axes = tuple(range(norm_axis(n.get("axis", -1), x.ndim), x.ndim))
    xf = x.cast(dtypes.float32) if n.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    y = xf * ((xf * xf).mean(axes, keepdim=True) + n.get("epsilon", 1e-5)).rsqrt()
    return y.cast(x.dtype) * scale


def _nll(n: Node, logp: Tensor, target: Tensor, weight: Optional[Tensor]) -> Tensor:
    """-logp[n, target[n, ...], ...] * weight[target], reduced as `reduction` says; ignore_index counts for nothing."""
    c = logp.shape[1]
    classes = Tensor.arange(c, device=n.device, dtype=target.dtype).reshape((1, c) + (1,) * (logp.ndim - 2))
    hit = (target.unsqueeze(1) == classes).cast(logp.dtype)
    w = hit if weight is None else hit * weight.cast(logp.dtype).reshape((1, c) + (1,) * (logp.ndim - 2))
    w = w.sum(1)
    if (ignore := n.get("ignore_index")) is not None:
        w = (target == ignore).where(0, w)
    loss = -(logp * hit).sum(1) * w
    reduction = n.get("reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction != "mean":
        raise n.unsupported(f"reduction {reduction!r}: expected none, sum or mean")
    return loss.sum() / w.sum()


@op("NegativeLogLikelihoodLoss", 12, 13, 22)
def _nll_loss(n: Node) -> Tensor:
    return _nll(n, n[0], n[1], n[2])


@op("SoftmaxCrossEntropyLoss", 12, 13)
def _sce_loss(n: Node) -> tuple:
    logp = n[0].log_softmax(1)
    return _nll(n, logp, n[1], n[2]), logp


# ***** scans, sorting, scattering *****


def _shifted(x: Tensor, axis: int, by: int, fill: float) -> Tensor:
    """x moved `by` places up along axis, the first `by` filled with `fill`."""
    size = x.shape[axis]
    if by >= size:
        return x.full_like(fill)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (by, 0)
    keep = [(0, s) for s in x.shape]
    keep[axis] = (0, size)
    return x.pad(tuple(pad), value=fill).shrink(tuple(keep))


@op("CumProd", 26)
def _cumprod(n: Node) -> Tensor:
    x, axis = n[0], norm_axis(int(n.host(1).item()), n[0].ndim)
    if n.get("reverse", 0):
        x = x.flip(axis)
    if n.get("exclusive", 0):
        x = _shifted(x, axis, 1, 1)
    by = 1
    while by < x.shape[axis]:  # Hillis-Steele: after the step of `by`, each holds the product of 2*by before it
        x = x * _shifted(x, axis, by, 1)
        by *= 2
    return x.flip(axis) if n.get("reverse", 0) else x


@op("EyeLike", 9)
def _eyelike(n: Node) -> Tensor:
    rows, cols = n[0].shape
    dt = onnx_to_dtype(n.get("dtype"), n.op_type, n.opset) if n.get("dtype") is not None else n[0].dtype
    return _known(n, np.eye(rows, cols, k=n.get("k", 0), dtype=dt.np))


@op("TopK", 1, 10, 11)
def _topk(n: Node) -> tuple:
    x = n[0]
    k = n.get("k") if n.opset < 10 else n.ints(1)[0]
    axis = norm_axis(n.get("axis", -1), x.ndim)
    largest = n.opset < 11 or bool(n.get("largest", 1))
    y = x if largest else -x
    low = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
    vals, idxs = [], []
    for _ in range(k):  # k rounds of argmax, each masking what it took (the first of equal values wins)
        i = y.argmax(axis, keepdim=True)
        vals.append(y.max(axis, keepdim=True))
        idxs.append(i.cast(dtypes.int64))
        pos = Tensor.arange(x.shape[axis], device=x.device).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
        y = (pos == i).where(low, y)
    if k == 0:
        shape = [0 if a == axis else s for a, s in enumerate(x.shape)]
        return x.shrink(tuple((0, s) for s in shape)), Tensor.empty(*shape, dtype=dtypes.int64, device=x.device)
    v = vals[0].cat(*vals[1:], dim=axis) if k > 1 else vals[0]
    i = idxs[0].cat(*idxs[1:], dim=axis) if k > 1 else idxs[0]
    return _same(x, v if largest else -v), i


def _scatter_axis(n: Node, data: Tensor, idx: Tensor, upd: Tensor, axis: int, reduction: str) -> Tensor:
    """data with updates written along `axis` at idx: one-hot masks of the targets, reduced over the sources."""
    d = data.shape[axis]
    idx = _gather_index(idx, d)
    # sources padded to data's shape on the other axes (a pad never hits: its mask is all false)
    grow = tuple((0, 0) if a == axis else (0, data.shape[a] - s) for a, s in enumerate(idx.shape))
    pos = Tensor.arange(d, device=data.device, dtype=idx.dtype).reshape((1,) * idx.ndim + (d,))
    hit = idx.pad(grow, value=-1).unsqueeze(-1) == pos  # source shape + (d,)
    src = upd.pad(grow).unsqueeze(-1)
    move = lambda t: t.permute([*range(axis), t.ndim - 1, *range(axis, t.ndim - 1)])  # noqa: E731 (d into axis)
    any_hit = move(hit.max(axis))
    if reduction == "mul":
        prod = _prod(hit.where(src, 1).cast(data.dtype), (axis,), False)
        return data * move(prod)
    if reduction in ("max", "min"):
        low = -math.inf if dtypes.is_float(data.dtype) else dtypes.min(data.dtype)
        if reduction == "max":
            m = hit.where(src, low).max(axis)
            return any_hit.where(data.maximum(move(m)), data)
        m = -(hit.where(-src, low).max(axis))
        return any_hit.where(data.minimum(move(m)), data)
    total = move(hit.where(src, 0).sum(axis)).cast(data.dtype)
    if reduction == "add":
        return data + total
    if reduction != "none":
        raise n.unsupported(f"reduction {reduction!r}: expected none, add, mul, max or min")
    return any_hit.where(total, data)


@op("ScatterElements", 11, 13, 16, 18)
def _scatter_elements(n: Node) -> Tensor:
    data = n[0]
    return _scatter_axis(n, data, n[1], n[2], norm_axis(n.get("axis", 0), data.ndim), n.get("reduction", "none"))


op("Scatter", 9)(_scatter_elements)


def _linear_index(idx: Tensor, dims: tuple[int, ...]) -> Tensor:
    """The row-major position, within `dims`, of each index tuple along idx's last axis (negatives wrap)."""
    out = None
    for j, d in enumerate(dims):
        part = _gather_index(idx[..., j], d) * math.prod(dims[j + 1 :])
        out = part if out is None else out + part
    return out


@op("ScatterND", 11, 13, 16, 18)
def _scatter_nd(n: Node) -> Tensor:
    data, idx, upd = n[0], n[1].cast(dtypes.int64), n[2]
    k = idx.shape[-1]
    rest = data.shape[k:]
    lin = _linear_index(idx, tuple(data.shape[:k])).reshape(-1, *([1] * len(rest)))
    flat = data.reshape(-1, *rest)
    src = upd.reshape(-1, *rest)
    out = _scatter_axis(n, flat, lin.expand(lin.shape[0], *rest), src, 0, n.get("reduction", "none"))
    return out.reshape(data.shape)


@op("GatherND", 11, 12, 13)
def _gather_nd(n: Node) -> Tensor:
    data, idx = n[0], n[1].cast(dtypes.int64)
    b, k = n.get("batch_dims", 0), idx.shape[-1]
    bshape = tuple(data.shape[:b])
    lin = _linear_index(idx, tuple(data.shape[b : b + k]))
    if b:
        batch = Tensor.arange(math.prod(bshape), device=n.device, dtype=dtypes.int64).reshape(
            bshape + (1,) * (idx.ndim - 1 - b)
        )
        lin = lin + batch * math.prod(data.shape[b : b + k])
    flat = data.reshape(-1, *data.shape[b + k :])
    return flat[lin.reshape(-1)].reshape(*idx.shape[:-1], *data.shape[b + k :])


# ***** attention (opset 23 on) *****


def _heads(x: Tensor, heads: int) -> Tensor:
    """(batch, seq, heads * size) as (batch, heads, seq, size)."""
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).permute(0, 2, 1, 3)


def repeat_heads(t: Tensor, heads: int) -> Tensor:
    """(batch, h, ...) -> (batch, heads, ...) for a multiple `heads` of h: head i serves heads i * r ... (i + 1) * r - 1
    (r = heads / h), as grouped-query attention shares a key and value head among query heads."""
    h = t.shape[1]
    return t.unsqueeze(2).expand(t.shape[0], h, heads // h, *t.shape[2:]).reshape(t.shape[0], heads, *t.shape[2:])


def _mm_wide(a: Tensor, b: Tensor) -> Tensor:
    """a @ b summed in float32 for half types (as numpy does), rounded back once."""
    if a.dtype in (dtypes.float16, dtypes.bfloat16):
        return a.cast(dtypes.float32).matmul(b.cast(dtypes.float32)).cast(a.dtype)
    return a.matmul(b)


@op("Attention", 23, 24, 25)
def _attention(n: Node) -> tuple:
    q, k, v, mask, past_k, past_v = (n[i] for i in range(6))
    nonpad = n[6] if n.opset >= 24 else None
    three_d = q.ndim == 3
    if three_d:
        q, k, v = _heads(q, n.get("q_num_heads")), _heads(k, n.get("kv_num_heads")), _heads(v, n.get("kv_num_heads"))
    present_k = k if past_k is None else past_k.cat(k, dim=2)
    present_v = v if past_v is None else past_v.cat(v, dim=2)
    k, v = present_k, present_v
    sq, skv, dt = q.shape[2], k.shape[2], q.dtype
    # the additive bias: 0 where a query may attend a key, -inf where not
    bias: Optional[Tensor] = None
    if mask is not None:
        if mask.shape[-1] < skv:  # a shorter mask covers the first keys; the rest are masked out
            fill = False if mask.dtype == dtypes.bool else -math.inf
            mask = mask.pad(((0, 0),) * (mask.ndim - 1) + ((0, skv - mask.shape[-1]),), value=fill)
        bias = mask.where(0.0, -math.inf).cast(dt) if mask.dtype == dtypes.bool else mask.cast(dt)
    cols = Tensor.arange(skv, device=n.device).reshape(1, skv)
    rows = Tensor.arange(sq, device=n.device).reshape(sq, 1)
    # query i stands at i + offset among the keys: after the past ones, or bottom-right of the valid ones
    if nonpad is not None and past_k is None:
        offset = (nonpad.cast(dtypes.int32) - sq).reshape(-1, 1, 1, 1)
    else:
        offset = past_k.shape[2] if past_k is not None else 0
    left, right = n.get("left_window_size", -1), n.get("right_window_size", -1)
    if left >= 0 or right >= 0:  # a sliding window: keys within left before and right after the query
        diff = rows + offset - cols
        ok = diff <= left if left >= 0 else None
        if right >= 0:
            ok = -diff <= right if ok is None else ok & (-diff <= right)
        window = ok.where(0.0, -math.inf).cast(dt)
        bias = window if bias is None else bias + window
    if n.get("is_causal", 0):
        causal = (cols <= rows + offset).where(0.0, -math.inf).cast(dt)
        bias = causal if bias is None else bias + causal
    if nonpad is not None:
        pad = (cols.reshape(1, skv) < nonpad.cast(dtypes.int32).reshape(-1, 1)).where(0.0, -math.inf).cast(dt)
        pad = pad.reshape(-1, 1, 1, skv)
        bias = pad if bias is None else bias + pad
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk and hq % hk == 0:  # grouped-query attention: each kv head serves hq / hk query heads in turn
        k, v = repeat_heads(k, hq), repeat_heads(v, hq)
    scale = n.get("scale")
    scale = math.sqrt(1 / math.sqrt(q.shape[3]) if scale is None else scale)  # split between q and k, as the spec
    qk = _mm_wide(q * scale, (k * scale).transpose(-1, -2))
    if (cap := n.get("softcap", 0.0)) and cap > 0:
        qk = (qk / cap).tanh() * cap
    mode = n.get("qk_matmul_output_mode", 0)
    logits = qk if bias is None else qk + bias
    qk_out = logits if mode == 2 else qk
    if (prec := n.get("softmax_precision")) is not None:
        logits = logits.cast(onnx_to_dtype(prec, n.op_type, n.opset))
    top = logits.max(-1, keepdim=True)
    top = (top == -math.inf).where(0, top)
    e = (logits - top).exp()
    total = e.sum(-1, keepdim=True)
    probs = e / (total == 0).where(1, total)
    if bias is not None:  # a row whose every key is masked attends to nothing: zeros
        blocked = bias.max(-1, keepdim=True) == -math.inf
        probs = blocked.where(0, probs)
    if mode == 3:
        qk_out = probs
    y = _mm_wide(probs.cast(dt), v)
    if three_d:
        y = y.permute(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    return y, present_k, present_v, qk_out.cast(dt)


# ***** Resize / Upsample: separable, one host-built (out, in) weight matrix per resized axis *****


def _cubic_kernel(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _source_coord(n: Node, mode: str, x: np.ndarray, scale: float, size: int, out: int, roi: tuple) -> np.ndarray:
    """Where each output position x samples the input, by coordinate_transformation_mode.

    `out` here is the unrounded output length, scale * size, as the spec's formulas read it."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adj = math.floor(out) / out
        return size / 2 * (1 - adj) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return np.zeros_like(x) if out == 1 else x * (size - 1) / (out - 1)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out > 1:
            return start * (size - 1) + x * (end - start) * (size - 1) / (out - 1)
        return np.full_like(x, 0.5 * (start + end) * (size - 1))
    raise n.unsupported(f"coordinate_transformation_mode {mode!r} is not one the spec names")


def _resize_weights(n: Node, size: int, out: int, scale: float, roi: tuple, opts: dict) -> tuple:
    """(out, in) weights, and which outputs fall outside the input (tf_crop_and_resize's extrapolation)."""
    x = _source_coord(n, opts["coord"], np.arange(out, dtype=np.float64), scale, size, scale * size, roi)
    w = np.zeros((out, size), np.float64)
    outside = (x < 0) | (x > size - 1) if opts["coord"] == "tf_crop_and_resize" else np.zeros(out, bool)
    mode = opts["mode"]
    if mode == "nearest":
        nm, fl = opts["nearest_mode"], np.floor(x)
        if nm == "round_prefer_floor":
            j = np.where(x - fl == 0.5, fl, np.round(x))
        elif nm == "round_prefer_ceil":
            j = np.where(x - fl == 0.5, fl + 1, np.round(x))
        elif nm == "floor":
            j = fl
        elif nm == "ceil":
            j = np.ceil(x)
        else:
            raise n.unsupported(f"nearest_mode {nm!r}: expected round_prefer_floor/ceil, floor or ceil")
        w[np.arange(out), np.clip(j, 0, size - 1).astype(np.int64)] = 1
    else:
        if mode == "linear":
            kernel, radius = (lambda t: np.maximum(0.0, 1 - np.abs(t))), 1
        elif mode == "cubic":
            kernel, radius = (lambda t: _cubic_kernel(t, opts["cubic_a"])), 2
        else:
            raise n.unsupported(f"mode {mode!r}: expected nearest, linear or cubic")
        stretch = scale if opts["antialias"] and scale < 1 else 1.0  # antialias widens the filter by 1 / scale
        first = math.floor(-radius / stretch) + 1
        for o in range(out):
            js = math.floor(x[o]) + np.arange(first, 2 - first)
            ws = kernel((x[o] - js) * stretch)
            if stretch < 1:
                ws = ws / ws.sum()
            if opts["exclude_outside"]:
                ws = np.where((js >= 0) & (js < size), ws, 0.0)
                ws = ws / ws.sum() if ws.sum() else ws
            np.add.at(w[o], np.clip(js, 0, size - 1), ws)  # (beyond the edges: the edge value)
    w[outside] = 0
    return w, outside


def _resize(
    n: Node, x: Tensor, scales: Optional[list], sizes: Optional[list], roi: Optional[list], opts: dict
) -> Tensor:
    axes = opts["axes"] or list(range(x.ndim))
    axes = [norm_axis(a, x.ndim) for a in axes]
    k = len(axes)
    if sizes:
        policy = opts["policy"]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(sizes[i] / x.shape[a] for i, a in enumerate(axes))
            sizes = [int(math.floor(s * x.shape[a] + 0.5)) for a in axes]
            scales = [s] * k
        else:
            scales = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
    else:
        if len(scales) != k:
            raise n.unsupported(f"{len(scales)} scales for {k} axes")
        sizes = [int(math.floor(x.shape[a] * s)) for a, s in zip(axes, scales)]
    rois = [(0.0, 1.0)] * k
    if roi and len(roi) == 2 * (len(opts["axes"]) if opts["axes"] else x.ndim):
        rois = [(roi[i], roi[i + k]) for i in range(k)]
    float_x = dtypes.is_float(x.dtype)
    y = x if float_x else x.cast(dtypes.float32)
    for (a, size, scale), r in zip(zip(axes, sizes, scales), rois):
        if size == x.shape[a] and scale == 1 and opts["coord"] != "tf_crop_and_resize":
            continue
        w, outside = _resize_weights(n, x.shape[a], size, scale, r, opts)
        wt = Tensor(w.T.astype(np.float32 if y.dtype != dtypes.float64 else np.float64), device=n.device)
        moved = y.transpose(a, -1)
        z = _mm_wide(moved, wt.cast(y.dtype))
        if outside.any():
            z = z + Tensor(outside.astype(np.float32) * opts["extrapolation"], device=n.device).cast(y.dtype)
        y = z.transpose(a, -1)
    if not float_x:  # integers: the nearest value (the spec's reference rounds)
        y = y.round().cast(x.dtype) if opts["mode"] != "nearest" else y.cast(x.dtype)
    return y


@op("Resize", 10, 11, 13, 18, 19)
def _resize_op(n: Node) -> Tensor:
    x = n[0]
    old = n.opset < 11
    opts = {
        "mode": n.get("mode", "nearest"),
        "coord": "asymmetric" if old else n.get("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": "floor" if old else n.get("nearest_mode", "round_prefer_floor"),
        "cubic_a": n.get("cubic_coeff_a", -0.75),
        "exclude_outside": n.get("exclude_outside", 0),
        "extrapolation": n.get("extrapolation_value", 0.0),
        "antialias": n.get("antialias", 0),
        "axes": n.get("axes"),
        "policy": n.get("keep_aspect_ratio_policy", "stretch"),
    }
    if old:
        scales, sizes, roi = n.host(1), None, None
    else:
        roi_v, scales, sizes = n.host(1), n.host(2), n.host(3)
        roi = None if roi_v is None or roi_v.size == 0 else [float(v) for v in roi_v.reshape(-1)]
    scales = None if scales is None or scales.size == 0 else [float(v) for v in scales.reshape(-1)]
    sizes = None if sizes is None or sizes.size == 0 else [int(v) for v in sizes.reshape(-1)]
    return _resize(n, x, scales, sizes, roi, opts)


@op("Upsample", 7, 9)
def _upsample(n: Node) -> Tensor:
    scales = n.get("scales") if n.opset < 9 else [float(v) for v in n.host(1).reshape(-1)]
    opts = {"mode": n.get("mode", "nearest"), "coord": "asymmetric", "nearest_mode": "floor", "cubic_a": -0.75,
            "exclude_outside": 0, "extrapolation": 0.0, "antialias": 0, "axes": None, "policy": "stretch"}  # fmt: skip
    return _resize(n, n[0], list(scales), None, None, opts)


# ***** transformer pieces, windows, more normalization *****


@op("RotaryEmbedding", 23)
def _rotary(n: Node) -> Tensor:
    x, cos, sin, pos = n[0], n[1], n[2], n[3]
    four_d = x.ndim == 4
    if four_d:  # (batch, heads, seq, head size) -> (batch, seq, heads, head size)
        x = x.permute(0, 2, 1, 3)
    else:
        heads = n.get("num_heads", 0)
        if not heads:
            raise n.unsupported("a 3-D input needs num_heads")
        x = x.reshape(x.shape[0], x.shape[1], heads, -1)
    if pos is not None:  # caches indexed by position: (max position, rot / 2) -> (batch, seq, rot / 2)
        flat = pos.reshape(-1)
        cos = cos[flat].reshape(*pos.shape, cos.shape[-1])
        sin = sin[flat].reshape(*pos.shape, sin.shape[-1])
    rot = n.get("rotary_embedding_dim", 0) or x.shape[-1]
    cos, sin = cos[..., : rot // 2].unsqueeze(2), sin[..., : rot // 2].unsqueeze(2)
    xr, rest = x[..., :rot], x[..., rot:]
    if n.get("interleaved", 0):
        pairs = xr.reshape(*xr.shape[:-1], rot // 2, 2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    re, im = cos * x1 - sin * x2, sin * x1 + cos * x2
    if n.get("interleaved", 0):
        out = re.unsqueeze(-1).cat(im.unsqueeze(-1), dim=-1).reshape(*xr.shape)
    else:
        out = re.cat(im, dim=-1)
    if rest.shape[-1]:
        out = out.cat(rest, dim=-1)
    out = out.cast(n[0].dtype)
    return out.permute(0, 2, 1, 3) if four_d else out.reshape(n[0].shape)


@op("SwiGLU", 28)
def _swiglu(n: Node) -> Tensor:
    gate, lin, alpha = n[0], n[1], n.get("alpha", 1.0)
    return _same(gate, gate * (gate * alpha).sigmoid() * lin)


def _window(kind: str):  # noqa: ANN202
    def run(n: Node) -> Tensor:
        size = int(n.host(0).reshape(-1)[0])
        denom = size - 1 if n.get("periodic", 1) == 0 else size
        k = 2 * np.pi * np.arange(size, dtype=np.float64) / max(denom, 1)
        if kind == "HannWindow":
            w = 0.5 - 0.5 * np.cos(k)
        elif kind == "HammingWindow":
            w = 25 / 46 - (21 / 46) * np.cos(k)
        else:
            w = 0.42 - 0.5 * np.cos(k) + 0.08 * np.cos(2 * k)
        return _known(n, w.astype(onnx_to_dtype(n.get("output_datatype", 1), n.op_type, n.opset).np))

    return run


for _name in ("HannWindow", "HammingWindow", "BlackmanWindow"):
    op(_name, 17)(_window(_name))


@op("MeanVarianceNormalization", 9, 13)
def _mvn(n: Node) -> Tensor:
    x = n[0]
    axes = tuple(norm_axis(a, x.ndim) for a in n.get("axes", [0, 2, 3]))
    d = x - x.mean(axes, keepdim=True)
    return d / ((d * d).mean(axes, keepdim=True).sqrt() + 1e-9)


@op("GroupNormalization", 18, 21)
def _groupnorm(n: Node) -> Tensor:
    x, scale, bias, groups = n[0], n[1], n[2], n.get("num_groups")
    b, c = x.shape[:2]
    xf = x.cast(dtypes.float32) if n.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    g = xf.reshape(b, groups, -1)
    y = g.layernorm(-1, eps=n.get("epsilon", 1e-5)).reshape(x.shape).cast(x.dtype)
    shape = (1, c, *([1] * (x.ndim - 2)))
    if n.opset < 21:  # scale and bias per group before opset 21
        scale = scale.reshape(groups, 1).expand(groups, c // groups).reshape(c)
        bias = bias.reshape(groups, 1).expand(groups, c // groups).reshape(c)
    return y * scale.reshape(shape) + bias.reshape(shape)


@op("LRN", 1, 13)
def _lrn(n: Node) -> Tensor:
    x, size = n[0], n.get("size")
    alpha, beta, bias = n.get("alpha", 1e-4), n.get("beta", 0.75), n.get("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = (x * x).pad(((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
    c = x.shape[1]
    total = sq[:, 0:c]
    for i in range(1, size):
        total = total + sq[:, i : i + c]
    return x / (bias + alpha / size * total).pow(beta)


@op("LpPool", 1, 2, 11, 18)
def _lppool(n: Node) -> Tensor:
    x, p = n[0], n.get("p", 2)
    xp, _, kernel, strides, dils = _pool_input(n, x.abs().pow(p), 0.0, True)
    return xp._pool(tuple(kernel), strides, dils).sum(tuple(range(-len(kernel), 0))).pow(1 / p)


@op("Compress", 9, 11)
def _compress(n: Node) -> Tensor:
    x, keep = n[0], np.nonzero(n.host(1).reshape(-1))[0]
    axis = n.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = norm_axis(axis, x.ndim)
    if keep.size == 0:
        return x.shrink(tuple((0, 0) if a == axis else (0, s) for a, s in enumerate(x.shape)))
    return x[(slice(None),) * axis + (Tensor(keep.astype(np.int32), device=n.device),)]


@op("ReverseSequence", 10)
def _reverse_sequence(n: Node) -> Tensor:
    x, lens = n[0], n[1].cast(dtypes.int32)
    baxis, taxis = n.get("batch_axis", 1), n.get("time_axis", 0)
    t = x.shape[taxis]
    shape = [1] * x.ndim
    shape[taxis] = t
    pos = Tensor.arange(t, device=n.device, dtype=dtypes.int32).reshape(shape)
    lshape = [1] * x.ndim
    lshape[baxis] = x.shape[baxis]
    lens = lens.reshape(lshape)
    src = (pos < lens).where(lens - 1 - pos, pos)  # the first len steps reversed, the rest kept
    return x.gather(taxis, src.expand(x.shape))


# ***** Loop and Scan: the body runs once per iteration, its trip count and condition read on the host *****


def _stack(parts: list[Tensor], axis: int = 0) -> Tensor:
    parts = [p.unsqueeze(axis) for p in parts]
    return parts[0].cat(*parts[1:], dim=axis) if len(parts) > 1 else parts[0]


@op("Loop", 1, 11, 13, 16, 19, 21, 23, 24)
def _loop(n: Node) -> list:
    body = n.attrs["body"]
    trip = n.host(0)
    trip = None if trip is None else int(trip.reshape(-1)[0])
    cond = n.host(1)
    go = True if cond is None else bool(cond.reshape(-1)[0])
    carried = list(n.inputs[2:])
    names = [i.name for i in body.input]
    n_carried = len(carried)
    scans: list[list[Tensor]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    if trip is None and cond is None:
        raise n.unsupported("a loop with neither a trip count nor a condition would never end")
    i = 0
    while go and (trip is None or i < trip):
        extra = {names[0]: _known(n, np.array(i, dtype=np.int64))}
        if len(names) > 1 and names[1]:
            extra[names[1]] = _known(n, np.array(go, dtype=np.bool_))
        extra.update(zip(names[2:], carried))
        outs = n.run_graph(body, extra)
        go = bool(n.host_of(outs[0]).reshape(-1)[0]) if outs[0] is not None else True
        carried = outs[1 : 1 + n_carried]
        for s, t in zip(scans, outs[1 + n_carried :]):
            s.append(t)
        i += 1
    stacked = [_stack(s) if s else Tensor.empty(0, device=n.device) for s in scans]
    return [*carried, *stacked]


@op("Scan", 8)
def _scan_batched(n: Node) -> list:
    """Opset 8: axis 0 of states and scan inputs is a batch, axis 1 the sequence; the body runs per batch row."""
    body, k = n.attrs["body"], n.get("num_scan_inputs")
    lens_given, rest = n.ints(0), n.inputs[1:]
    inits, xs = list(rest[: len(rest) - k]), list(rest[len(rest) - k :])
    if not xs or any(x.ndim < 2 or x.shape[:2] != xs[0].shape[:2] for x in xs):
        raise OnnxError(f"Scan (opset 8): expected {k} scan inputs of shape (batch, sequence, ...) with equal sizes")
    batch, longest = xs[0].shape[:2]
    lens = lens_given if lens_given is not None else [longest] * batch
    if len(lens) != batch or any(not 0 <= m <= longest for m in lens):
        raise OnnxError(f"Scan (opset 8): sequence_lens {lens} must hold {batch} lengths in [0, {longest}]")
    dirs = n.get("directions", [0] * k)
    names = [i.name for i in body.input]
    n_out = len(body.output) - len(inits)
    finals: list[list[Tensor]] = [[] for _ in inits]
    scans: list[list[list[Tensor]]] = [[] for _ in range(n_out)]  # per output, per batch row: its steps
    for b in range(batch):
        states = [s[b] for s in inits]
        steps: list[list[Tensor]] = [[] for _ in range(n_out)]
        for t in range(lens[b]):
            slices = [x[b, lens[b] - 1 - t if d else t] for x, d in zip(xs, dirs)]
            outs = n.run_graph(body, dict(zip(names, states + slices)))
            states = outs[: len(inits)]
            for s, o in zip(steps, outs[len(inits) :]):
                s.append(o)
        for f, st in zip(finals, states):
            f.append(st)
        for per_row, s in zip(scans, steps):
            per_row.append(s)
    stacked = []
    for per_row in scans:
        elem = next((s[0] for s in per_row if s), None)
        if elem is None:
            raise n.unsupported("every sequence is empty, so the scan outputs' element shape is unknown")
        rows = []
        for s in per_row:  # each row padded to the longest sequence (the spec leaves the padding undefined: zeros)
            row = _stack(s) if s else Tensor.zeros(0, *elem.shape, dtype=elem.dtype, device=n.device)
            rows.append(row.pad(((0, longest - len(s)),) + ((0, 0),) * elem.ndim))
        stacked.append(_stack(rows))
    return [*(_stack(f) for f in finals), *stacked]


@op("Scan", 9, 11, 16, 19, 21, 23, 24)
def _scan(n: Node) -> list:
    body, k = n.attrs["body"], n.get("num_scan_inputs")
    states, xs = list(n.inputs[: len(n.inputs) - k]), list(n.inputs[len(n.inputs) - k :])
    in_axes = [norm_axis(a, x.ndim) for a, x in zip(n.get("scan_input_axes", [0] * k), xs)]
    in_dirs = n.get("scan_input_directions", [0] * k)
    steps = xs[0].shape[in_axes[0]]
    names = [i.name for i in body.input]
    n_out = len(body.output) - len(states)
    out_axes, out_dirs = n.get("scan_output_axes", [0] * n_out), n.get("scan_output_directions", [0] * n_out)
    scans: list[list[Tensor]] = [[] for _ in range(n_out)]
    for t in range(steps):
        slices = []
        for x, a, d in zip(xs, in_axes, in_dirs):
            j = steps - 1 - t if d else t
            slices.append(x[(slice(None),) * a + (j,)])
        outs = n.run_graph(body, dict(zip(names, states + slices)))
        states = outs[: len(states)]
        for s, o in zip(scans, outs[len(states) :]):
            s.append(o)
    stacked = []
    for s, a, d in zip(scans, out_axes, out_dirs):
        s = s[::-1] if d else s
        stacked.append(_stack(s, norm_axis(a, s[0].ndim + 1)))
    return [*states, *stacked]


# ***** quantization (8- and 16-bit integers; float8, float4, int4 and int2 carried in a tgcore dtype: lowbit.py) *****


def _qparam(p: Optional[Tensor], x: Tensor, axis: int, block: int) -> Optional[Tensor]:
    """A scale or zero point shaped to broadcast against x: per tensor, per axis or per block along axis."""
    if p is None or p.ndim == 0 or (p.ndim == 1 and p.shape[0] == 1 and not block):  # (one value: per tensor)
        return None if p is None else p.reshape(())
    if block:
        rep = [block if a == axis else 1 for a in range(p.ndim)]
        grown = p.unsqueeze(axis + 1).expand(*p.shape[: axis + 1], block, *p.shape[axis + 1 :])
        grown = grown.reshape(*p.shape[:axis], p.shape[axis] * rep[axis], *p.shape[axis + 1 :])
        return grown.shrink(tuple((0, x.shape[a]) if a == axis else (0, s) for a, s in enumerate(grown.shape)))
    return p.reshape(tuple(-1 if a == axis else 1 for a in range(x.ndim)))


def _saturate(q: Tensor, dt) -> Tensor:  # noqa: ANN001 (a DType)
    if dtypes.is_int(dt):
        q = q.clip(dtypes.min(dt), dtypes.max(dt))
    return q.cast(dt)


def _quantize(x: Tensor, scale: Tensor, zp: Optional[Tensor], out_dt, wide) -> Tensor:  # noqa: ANN001
    q = (x.cast(wide) / scale.cast(wide)).round()  # (round: half to even, as the spec)
    if zp is not None:
        q = q + zp.cast(wide)
    return _saturate(q, out_dt)


@op("QuantizeLinear", 10, 13, 19, 21)
def _quantize_linear(n: Node) -> Tensor:
    from tgcore.onnx import lowbit  # (float8, float4, int4, int2 outputs: carried in a tgcore dtype)

    x, scale, zp = n[0], n[1], n[2]
    axis, block = norm_axis(n.get("axis", 1), max(x.ndim, 1)), n.get("block_size", 0)
    if zp is not None:
        out_dt = zp.kind if isinstance(zp, lowbit.LowBitTensor) else zp.dtype
        zp = lowbit.carrier(zp)
    elif n.get("output_dtype", 0) in lowbit.LOWBIT:
        out_dt = lowbit.LOWBIT[n.get("output_dtype")]
    elif n.get("output_dtype", 0):
        out_dt = onnx_to_dtype(n.get("output_dtype"), n.op_type, n.opset)
    else:
        out_dt = dtypes.uint8
    precision = onnx_to_dtype(n.get("precision"), n.op_type, n.opset) if n.get("precision", 0) else scale.dtype
    wide = dtypes.float32 if precision in (dtypes.float16, dtypes.bfloat16) else precision
    s, z = _qparam(scale, x, axis, block), _qparam(zp, x, axis, block)
    if not isinstance(out_dt, lowbit.LowBitType):
        # (the quotient rounds to an integer: float32 holds every half-type one)
        return _quantize(x, s, z, out_dt, wide)
    q = x.cast(wide) / s.cast(wide)
    if not out_dt.is_float:
        return lowbit.saturate_int(q.round() if z is None else q.round() + z.cast(wide), out_dt)
    # a float type rounds the quotient as computed in its precision (a half type's: float32's, rounded once more)
    q = q.cast(precision).cast(wide)
    return lowbit.cast_to(q if z is None else q + z.cast(wide), out_dt, saturate=bool(n.get("saturate", 1)))


@op("DequantizeLinear", 10, 13, 19, 21)
def _dequantize_linear(n: Node) -> Tensor:
    from tgcore.onnx import lowbit  # (float8, float4, int4, int2 inputs: carried in a tgcore dtype)

    x, scale, zp = lowbit.carrier(n[0]), n[1], n[2]
    zp = None if zp is None else lowbit.carrier(zp)
    axis, block = norm_axis(n.get("axis", 1), max(x.ndim, 1)), n.get("block_size", 0)
    out_dt = onnx_to_dtype(n.get("output_dtype"), n.op_type, n.opset) if n.get("output_dtype", 0) else scale.dtype
    s, z = _qparam(scale, x, axis, block), _qparam(zp, x, axis, block)
    wide = dtypes.float32 if out_dt in (dtypes.float16, dtypes.bfloat16) else out_dt
    if dtypes.is_float(x.dtype):  # (float8 and float4 values, carried as float32; their zero point too)
        y = x.cast(wide) if z is None else x.cast(wide) - z.cast(wide)
        return (y * s.cast(wide)).cast(out_dt)
    y = x.cast(dtypes.int32) if z is None else x.cast(dtypes.int32) - z.cast(dtypes.int32)
    return (y.cast(wide) * s.cast(wide)).cast(out_dt)


@op("DynamicQuantizeLinear", 11)
def _dynamic_quantize(n: Node) -> tuple:
    x = n[0]
    lo, hi = x.min().minimum(0), x.max().maximum(0)
    scale = (hi - lo) / 255
    zp = _saturate((-lo / scale).round(), dtypes.uint8)
    return _quantize(x, scale, zp, dtypes.uint8, dtypes.float32), scale, zp


def _dq(x: Tensor, scale: Tensor, zp: Optional[Tensor], row_axis: Optional[int] = None) -> Tensor:
    """x - zp scaled, in float32; a 1-D scale or zero point lies along row_axis (None: the last axis)."""

    def shaped(p: Tensor) -> Tensor:
        if p.ndim == 1 and p.shape[0] > 1 and row_axis is not None:
            return p.reshape(tuple(-1 if a == row_axis else 1 for a in range(x.ndim)))
        return p

    y = x.cast(dtypes.float32)
    if zp is not None:
        y = y - shaped(zp).cast(dtypes.float32)
    return y * shaped(scale).cast(dtypes.float32)


def _requantize(y: Tensor, scale: Tensor, zp: Optional[Tensor]) -> Tensor:
    return _quantize(y, scale.cast(dtypes.float32), zp, zp.dtype if zp is not None else dtypes.uint8, dtypes.float32)


@op("QLinearMatMul", 10, 21)
def _qlinear_matmul(n: Node) -> Tensor:
    a, b = n[0], n[3]
    y = _dq(a, n[1], n[2], a.ndim - 2).matmul(_dq(b, n[4], n[5]))
    return _quantize(
        y, n[6].cast(dtypes.float32), n[7], n[7].dtype if n[7] is not None else dtypes.uint8, dtypes.float32
    )


@op("MatMulInteger", 10)
def _matmul_integer(n: Node) -> Tensor:
    a, b, az, bz = n[0].cast(dtypes.int32), n[1].cast(dtypes.int32), n[2], n[3]
    if az is not None:
        a = a - (az.reshape(-1, 1) if az.ndim == 1 and az.shape[0] > 1 else az).cast(dtypes.int32)
    if bz is not None:
        b = b - bz.cast(dtypes.int32)
    return a.matmul(b)


def _conv_with(n: Node, x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    inner = Node("Conv", n.opset, [x, w, b], n.attrs, n.device, 1, n.known)
    return _conv(inner)


@op("ConvInteger", 10)
def _conv_integer(n: Node) -> Tensor:
    x, w, xz, wz = n[0].cast(dtypes.float32), n[1].cast(dtypes.float32), n[2], n[3]
    if xz is not None:
        x = x - xz.cast(dtypes.float32)
    if wz is not None:
        w = w - (wz.reshape(-1, *([1] * (w.ndim - 1))) if wz.ndim == 1 else wz).cast(dtypes.float32)
    return _conv_with(n, x, w, None).round().cast(dtypes.int32)  # (exact: small integer sums in float32)


@op("QLinearConv", 10)
def _qlinear_conv(n: Node) -> Tensor:
    x, w = n[0], n[3]
    xf = _dq(x, n[1], n[2])
    wf = _dq(w, n[4], n[5], 0)
    bias = (
        n[8].cast(dtypes.float32) * (n[1].cast(dtypes.float32) * n[4].cast(dtypes.float32))
        if n[8] is not None
        else None
    )
    y = _conv_with(n, xf, wf, bias)
    return _quantize(
        y, n[6].cast(dtypes.float32), n[7], n[7].dtype if n[7] is not None else dtypes.uint8, dtypes.float32
    )


# ***** sequences (Python lists of tensors) and optionals (None when empty) *****


def _seq_pos(n: Node, i: int, size: int, default: int) -> int:
    p = n.host(i)
    p = default if p is None else int(p.reshape(-1)[0])
    return p + size if p < 0 else p


@op("SequenceEmpty", 11)
def _seq_empty(n: Node) -> tuple:
    return ([],)


@op("SequenceConstruct", 11)
def _seq_construct(n: Node) -> tuple:
    return (list(n.inputs),)


@op("SequenceInsert", 11)
def _seq_insert(n: Node) -> tuple:
    seq = list(n[0])
    seq.insert(_seq_pos(n, 2, len(seq), len(seq)), n[1])
    return (seq,)


@op("SequenceErase", 11)
def _seq_erase(n: Node) -> tuple:
    seq = list(n[0])
    del seq[_seq_pos(n, 1, len(seq), len(seq) - 1)]
    return (seq,)


@op("SequenceAt", 11)
def _seq_at(n: Node) -> Tensor:
    return n[0][_seq_pos(n, 1, len(n[0]), 0)]


@op("SequenceLength", 11)
def _seq_length(n: Node) -> Tensor:
    return _known(n, np.array(len(n[0]), dtype=np.int64))


@op("ConcatFromSequence", 11)
def _concat_from_seq(n: Node) -> Tensor:
    seq = n[0]
    if n.get("new_axis", 0):
        return _stack(seq, norm_axis(n.get("axis"), seq[0].ndim + 1))
    axis = norm_axis(n.get("axis"), seq[0].ndim)
    return seq[0].cat(*seq[1:], dim=axis) if len(seq) > 1 else seq[0]


@op("SplitToSequence", 11)
def _split_to_seq(n: Node) -> tuple:
    x = n[0]
    axis = norm_axis(n.get("axis", 0), x.ndim)
    size = x.shape[axis]
    split = n.host(1)
    if split is None:
        parts = list(x.split(1, axis))
        if not n.get("keepdims", 1):
            parts = [p.squeeze(axis) for p in parts]
        return (parts,)
    if split.ndim == 0:
        step = int(split)
        sizes = [min(step, size - i) for i in range(0, size, step)]
    else:
        sizes = [int(s) for s in split]
    return (list(x.split(sizes, axis)),)


@op("SequenceMap", 17)
def _seq_map(n: Node) -> tuple:
    body, seq, extra = n.attrs["body"], n[0], n.inputs[1:]
    names = [i.name for i in body.input]
    outs: list[list] = [[] for _ in body.output]
    for i in range(len(seq)):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        for o, t in zip(outs, n.run_graph(body, dict(zip(names, args)))):
            o.append(t)
    return tuple(outs)


@op("Optional", 15)
def _optional(n: Node) -> tuple:
    return (n[0],)


@op("OptionalHasElement", 15, 18)
def _optional_has(n: Node) -> Tensor:
    return _known(n, np.array(n[0] is not None, dtype=np.bool_))


@op("OptionalGetElement", 15, 18)
def _optional_get(n: Node) -> tuple:
    if n[0] is None:
        raise OnnxError(f"{n.op_type}: the optional input is empty")
    return (n[0],)


# ***** bits, crops, uniques *****


@op("BitCast", 26)
def _bitcast(n: Node) -> Tensor:
    x, to = n[0], onnx_to_dtype(n.get("to"), n.op_type, n.opset)
    if x.dtype.itemsize != to.itemsize:
        raise n.unsupported(f"{x.dtype} and {to} differ in size; BitCast needs equal sizes")
    if dtypes.bool in (x.dtype, to):  # (a bool is one byte holding 0 or 1: a cast is its bitcast)
        return x.cast(to)
    return x.bitcast(to)


@op("CenterCropPad", 18)
def _center_crop_pad(n: Node) -> Tensor:
    x, target = n[0], n.ints(1)
    axes = [norm_axis(a, x.ndim) for a in n.get("axes", list(range(x.ndim)))]
    for a, t in zip(axes, target):
        size = x.shape[a]
        if t < size:  # crop: the extra row goes at the end
            start = (size - t) // 2
            x = x.shrink(tuple((start, start + t) if i == a else (0, s) for i, s in enumerate(x.shape)))
        elif t > size:
            before = (t - size) // 2
            x = x.pad(tuple((before, t - size - before) if i == a else (0, 0) for i in range(x.ndim)))
    return x


@op("Unique", 11)
def _unique(n: Node) -> tuple:
    """On the host: the output's length is data dependent."""
    x, axis = n.host(0), n.get("axis")
    ax = None if axis is None else norm_axis(axis, x.ndim)
    vals, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=ax)
    if not n.get("sorted", 1):  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        vals = np.take(vals, order, axis=0 if ax is None else ax)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    outs = (vals, first, inverse.reshape(-1), counts)
    return tuple(_known(n, o if i == 0 else o.astype(np.int64)) for i, o in enumerate(outs))


# ***** RNN, GRU, LSTM: the recurrence unrolled over the (static) sequence length *****


def _activation(n: Node, name: str, alpha: Optional[float], beta: Optional[float]):  # noqa: ANN202
    simple = {"Tanh": Tensor.tanh, "Sigmoid": Tensor.sigmoid, "Relu": Tensor.relu, "Softsign": Tensor.softsign,
              "Softplus": Tensor.softplus}  # fmt: skip
    if name in simple:
        return simple[name]
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: (x < 0).where(x * a, x)
    if name == "HardSigmoid":
        a, b = 0.2 if alpha is None else alpha, 0.5 if beta is None else beta
        return lambda x: (x * a + b).clip(0, 1)
    if name == "Affine":
        return lambda x: x * alpha + beta
    if name == "ScaledTanh":
        return lambda x: (x * beta).tanh() * alpha
    raise n.unsupported(f"activation {name!r} is not implemented yet")


def _recurrent(n: Node, gates: int, defaults: list[str], cell) -> tuple:  # noqa: ANN001 (cell: a step function)
    x, w, r, b, lens, h0 = (n[i] for i in range(6))
    layout, hidden = n.get("layout", 0), n.get("hidden_size")
    if layout:
        x = x.permute(1, 0, 2)
    seq, batch = x.shape[0], x.shape[1]
    if lens is not None and any(v != seq for v in n.ints(4)):
        raise n.unsupported("sequence_lens shorter than the sequence are not implemented yet")
    direction = n.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    names = n.get("activations", defaults * dirs)
    alphas, betas = n.get("activation_alpha", []), n.get("activation_beta", [])
    acts = [
        _activation(n, a, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
        for i, a in enumerate(names)
    ]
    clip = n.get("clip")
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        wd, rd = w[d], r[d]
        bd = b[d] if b is not None else Tensor.zeros(2 * gates * hidden, dtype=x.dtype, device=x.device)
        h = h0[d] if h0 is not None else Tensor.zeros(batch, hidden, dtype=x.dtype, device=x.device)
        state = {"h": h, "c": n[6][d] if n.op_type == "LSTM" and n[6] is not None else h.zeros_like()}
        if n.op_type == "LSTM" and n[7] is not None:
            state["p"] = n[7][d]
        xw = x.matmul(wd.transpose()) + bd[: gates * hidden]  # every step's input projection at once
        steps = range(seq - 1, -1, -1) if reverse else range(seq)
        out = [None] * seq
        for t in steps:
            state = cell(n, xw[t], state, rd, bd[gates * hidden :], acts[len(defaults) * d :], hidden, clip)
            out[t] = state["h"]
        ys.append(_stack(out, 0))
        hs.append(state["h"])
        cs.append(state["c"])
    y = _stack(ys, 1)  # (seq, dirs, batch, hidden)
    yh, yc = _stack(hs, 0), _stack(cs, 0)
    if layout:
        y, yh, yc = y.permute(2, 0, 1, 3), yh.permute(1, 0, 2), yc.permute(1, 0, 2)
    return (y, yh, yc) if n.op_type == "LSTM" else (y, yh)


def _clipped(v: Tensor, clip: Optional[float]) -> Tensor:
    return v if clip is None else v.clip(-clip, clip)


def _rnn_cell(n: Node, xw: Tensor, s: dict, r: Tensor, rb: Tensor, acts: list, hidden: int, clip) -> dict:  # noqa: ANN001
    return {**s, "h": acts[0](_clipped(xw + s["h"].matmul(r.transpose()) + rb, clip))}


def _gru_cell(n: Node, xw: Tensor, s: dict, r: Tensor, rb: Tensor, acts: list, hidden: int, clip) -> dict:  # noqa: ANN001
    h, f, g = s["h"], acts[0], acts[1]
    hr = h.matmul(r[: 2 * hidden].transpose()) + rb[: 2 * hidden]
    z = f(_clipped(xw[:, :hidden] + hr[:, :hidden], clip))
    rr = f(_clipped(xw[:, hidden : 2 * hidden] + hr[:, hidden:], clip))
    rh, rbh = r[2 * hidden :], rb[2 * hidden :]
    if n.get("linear_before_reset", 0):
        cand = xw[:, 2 * hidden :] + rr * (h.matmul(rh.transpose()) + rbh)
    else:
        cand = xw[:, 2 * hidden :] + (rr * h).matmul(rh.transpose()) + rbh
    hn = g(_clipped(cand, clip))
    return {**s, "h": (1 - z) * hn + z * h}


def _lstm_cell(n: Node, xw: Tensor, s: dict, r: Tensor, rb: Tensor, acts: list, hidden: int, clip) -> dict:  # noqa: ANN001
    h, c, (f, g, hact) = s["h"], s["c"], acts[:3]
    pre = xw + h.matmul(r.transpose()) + rb  # gates in the order i, o, f, c
    gi, go, gf, gc = (pre[:, k * hidden : (k + 1) * hidden] for k in range(4))
    p = s.get("p")
    if p is not None:
        gi, gf = gi + p[:hidden] * c, gf + p[2 * hidden :] * c
    i = f(_clipped(gi, clip))
    fg = 1 - i if n.get("input_forget", 0) else f(_clipped(gf, clip))
    c = fg * c + i * g(_clipped(gc, clip))
    if p is not None:
        go = go + p[hidden : 2 * hidden] * c
    o = f(_clipped(go, clip))
    return {**s, "h": o * hact(c), "c": c}


op("RNN", 7, 14, 22)(lambda n: _recurrent(n, 1, ["Tanh"], _rnn_cell))
op("GRU", 7, 14, 22)(lambda n: _recurrent(n, 3, ["Sigmoid", "Tanh"], _gru_cell))
op("LSTM", 7, 14, 22)(lambda n: _recurrent(n, 4, ["Sigmoid", "Tanh", "Tanh"], _lstm_cell))


# ***** DFT as matrix products with host-built cos/sin tables; NonMaxSuppression; AffineGrid *****


@op("DFT", 17, 20)
def _dft(n: Node) -> Tensor:
    """y[k] = sum_j x[j] e^(-+2 pi i jk / L) as two real matrix products; onesided: RFFT forward, IRFFT inverse."""
    x = n[0]
    if n.opset >= 20:
        axis = int(n.host(2).reshape(-1)[0]) if n[2] is not None else -2
    else:
        axis = n.get("axis", 1)
    axis = norm_axis(axis, x.ndim)
    if not 0 <= axis < x.ndim - 1:
        raise n.unsupported(f"axis {axis} of a rank-{x.ndim} input: expected a signal axis, not the last one")
    if x.shape[-1] not in (1, 2):
        raise OnnxError(f"DFT: the last axis holds (real, imaginary) and has size {x.shape[-1]}; expected 1 or 2")
    inverse, onesided = bool(n.get("inverse", 0)), bool(n.get("onesided", 0))
    complex_in = x.shape[-1] == 2
    if onesided and complex_in != inverse:
        raise n.unsupported("onesided takes a real input forward (RFFT) and a complex one inverse (IRFFT)")
    re = x[..., 0]
    im = x[..., 1] if complex_in else None
    size = x.shape[axis]
    irfft = onesided and inverse
    given = n.host(1) if n[1] is not None else None
    length = int(given.reshape(-1)[0]) if given is not None and given.size else (2 * (size - 1) if irfft else size)
    if length < 1:
        raise OnnxError(f"DFT: dft_length is {length}; expected a positive length")
    # the input's length along axis: the signal, or IRFFT's one-sided bins 0..length // 2
    taken = length // 2 + 1 if irfft else length

    def fit(t: Tensor) -> Tensor:  # zero-padded or cut to `taken` along axis
        if taken > size:
            return t.pad(tuple((0, taken - size) if a == axis else (0, 0) for a in range(t.ndim)))
        return t.shrink(tuple((0, taken) if a == axis else (0, s) for a, s in enumerate(t.shape)))

    re, im = fit(re), None if im is None else fit(im)
    outs = length // 2 + 1 if onesided and not inverse else length
    j, k = np.arange(taken).reshape(-1, 1), np.arange(outs).reshape(1, -1)  # (input position, output position)
    angle = (2 if inverse else -2) * np.pi * ((k * j) % length) / length
    scale = np.full((taken, 1), 1 / length if inverse else 1.0)
    if irfft:  # each bin but 0 and length/2 stands for itself and its conjugate mirror
        scale[1 : (length + 1) // 2] *= 2
    wide = wide_float(x.dtype)
    cos_t = Tensor((np.cos(angle) * scale).astype(wide.np), device=n.device)
    sin_t = Tensor((np.sin(angle) * scale).astype(wide.np), device=n.device)
    last = lambda t: t.cast(wide).transpose(axis, -1)  # noqa: E731 (the signal axis to the end)
    back = lambda t: t.transpose(axis, -1).unsqueeze(-1)  # noqa: E731
    yr, yi = last(re).matmul(cos_t), last(re).matmul(sin_t)
    if im is not None:
        yr, yi = yr - last(im).matmul(sin_t), yi + last(im).matmul(cos_t)
    if irfft:  # a real signal: its real part only
        return back(yr).cast(x.dtype)
    return back(yr).cat(back(yi), dim=-1).cast(x.dtype)


@op("NonMaxSuppression", 10, 11)
def _nms(n: Node) -> Tensor:
    """On the host: how many boxes survive is data dependent."""
    boxes, scores = n.host(0).astype(np.float64), n.host(1).astype(np.float64)
    limit = int(n.host(2).reshape(-1)[0]) if n[2] is not None and n.host(2).size else 0
    iou_max = float(n.host(3).reshape(-1)[0]) if n[3] is not None and n.host(3).size else 0.0
    floor = float(n.host(4).reshape(-1)[0]) if n[4] is not None and n.host(4).size else None
    if n.get("center_point_box", 0):  # (x center, y center, width, height) -> corners
        c, half = boxes[..., :2], boxes[..., 2:] / 2
        boxes = np.concatenate([c - half, c + half], -1)[..., [1, 0, 3, 2]]
    lo, hi = np.minimum(boxes[..., :2], boxes[..., 2:]), np.maximum(boxes[..., :2], boxes[..., 2:])
    area = np.prod(hi - lo, -1)
    picked = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            order = np.argsort(-scores[b, c], kind="stable")
            keep: list[int] = []
            for i in order:
                if len(keep) >= limit or (floor is not None and scores[b, c, i] <= floor):
                    break
                if keep:
                    inter = np.prod(
                        np.clip(np.minimum(hi[b, keep], hi[b, i]) - np.maximum(lo[b, keep], lo[b, i]), 0, None), -1
                    )
                    iou = inter / (area[b, keep] + area[b, i] - inter)
                    if (iou > iou_max).any():
                        continue
                keep.append(int(i))
            picked += [(b, c, i) for i in keep]
    return _known(n, np.array(picked, dtype=np.int64).reshape(-1, 3))


@op("AffineGrid", 20)
def _affine_grid(n: Node) -> Tensor:
    theta, size = n[0], n.ints(1)
    spatial = size[2:]
    align = n.get("align_corners", 0)
    axes = []
    for s in spatial:  # normalized coordinates of each pixel center (or corner) in [-1, 1]
        v = np.linspace(-1, 1, s) if align else (np.arange(s) * 2 + 1) / s - 1
        axes.append(v if s > 1 or align else np.zeros(1))
    mesh = np.meshgrid(*axes, indexing="ij")[::-1]  # x first: the last spatial axis
    base = np.stack([*mesh, np.ones_like(mesh[0])], -1).reshape(-1, len(spatial) + 1)
    pts = Tensor(base.astype(theta.dtype.np), device=n.device)
    out = pts.matmul(theta.transpose(-1, -2))  # (batch, points, dims)
    return out.reshape(size[0], *spatial, len(spatial))


@op("MaxUnpool", 9, 11)
def _max_unpool(n: Node) -> Tensor:
    """The indices address the shape MaxPool's attributes imply; an output_shape input pads that shape at its ends."""
    x, idx = n[0], n[1]
    kernel, nd = n.get("kernel_shape"), x.ndim - 2
    strides = n.get("strides", [1] * nd)
    pads = n.get("pads", [0] * (2 * nd)) if n[2] is None else [0] * (2 * nd)  # (output_shape: pads are ignored)
    sp = [(i - 1) * s + k - pads[a] - pads[a + nd] for a, (i, s, k) in enumerate(zip(x.shape[2:], strides, kernel))]
    shape = [*x.shape[:2], *sp]
    flat = Tensor.zeros(1, math.prod(shape), dtype=x.dtype, device=x.device)
    out = _scatter_axis(n, flat, idx.reshape(1, -1), x.reshape(1, -1), 1, "none").reshape(shape)
    if n[2] is None:
        return out
    want = n.ints(2)
    if len(want) != len(shape) or any(w < s for w, s in zip(want, shape)) or want[:2] != shape[:2]:
        raise OnnxError(
            f"MaxUnpool: output_shape {want} is smaller than, or of another rank or batch/channels than, the unpooled "
            f"shape {shape} that kernel_shape and strides imply; expected each dimension at least that size"
        )
    return out.pad(tuple((0, w - s) for w, s in zip(want, shape)))  # (the extra rows and columns at the end)
