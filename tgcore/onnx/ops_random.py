"""ONNX operators that draw random numbers: RandomUniform, RandomNormal, their -Like forms, Bernoulli and
Multinomial (Dropout in training mode draws its mask here too: ops.py).

Every draw comes from tgcore's counter-based generator on the device (Tensor.rand), so a replay of the model's
recorded kernels draws fresh numbers on each run, and a process that makes the same draws in the same order gets the
same numbers. A node's `seed` attribute picks a stream of its own (the generator's key, mixed with the seed of
Tensor.manual_seed): two nodes with different seeds draw different numbers at the same draw. As ONNX says, the
numbers are not those of another runtime for that seed."""

from __future__ import annotations

import math
import struct
from typing import Optional

from tgcore.dtype import DType, dtypes
from tgcore.onnx.registry import Node, onnx_to_dtype, op, wide_float
from tgcore.tensor import Tensor, _with_check

_MASK64 = (1 << 64) - 1


def seed_key(n: Node) -> Optional[int]:
    """The generator's key for a node with a `seed` attribute (a float): its bits, mixed into manual_seed's seed."""
    seed = n.get("seed")
    if seed is None:
        return None
    bits = struct.unpack("<Q", struct.pack("<d", float(seed)))[0]
    return (Tensor._seed ^ (bits * 0x9E3779B97F4A7C15)) & _MASK64


def _float_dtype(n: Node, default: DType) -> DType:
    """The output dtype a random op names in its `dtype` attribute (else `default`), which must be a float type."""
    dt = onnx_to_dtype(n.get("dtype"), n.op_type, n.opset) if n.get("dtype") is not None else default
    if not dtypes.is_float(dt):
        raise n.unsupported(f"dtype {dt}: expected a float type (float16, bfloat16, float32 or float64)")
    return dt


def _shape_of(n: Node) -> tuple[int, ...]:
    shape = tuple(int(s) for s in n.get("shape", ()))
    if n.get("shape") is None or any(s < 0 for s in shape):
        raise n.unsupported(f"shape {n.get('shape')}: expected the output's shape, sizes of at least 0")
    return shape


def _uniform(n: Node, shape: tuple[int, ...], dt: DType) -> Tensor:
    low, high = float(n.get("low", 0.0)), float(n.get("high", 1.0))
    if not low <= high:
        raise n.unsupported(f"low {low} and high {high}: expected low <= high")
    if 0 in shape:
        return Tensor.zeros(shape, dtype=dt, device=n.device)
    # drawn in float32 at least (float16 has 11 bits), then scaled to [low, high)
    wide = wide_float(dt)
    u = Tensor._uniform_draw(shape, n.device, wide, seed_key(n))
    return (u * (high - low) + low).cast(dt)


def _normal(n: Node, shape: tuple[int, ...], dt: DType) -> Tensor:
    mean, scale = float(n.get("mean", 0.0)), float(n.get("scale", 1.0))
    wide = wide_float(dt)
    return (Tensor._normal_draw(shape, n.device, wide, seed_key(n)) * scale + mean).cast(dt)


@op("RandomUniform", 1, 22)
def _random_uniform(n: Node) -> Tensor:
    return _uniform(n, _shape_of(n), _float_dtype(n, dtypes.float32))


@op("RandomNormal", 1, 22)
def _random_normal(n: Node) -> Tensor:
    return _normal(n, _shape_of(n), _float_dtype(n, dtypes.float32))


@op("RandomUniformLike", 1, 22)
def _random_uniform_like(n: Node) -> Tensor:
    x = n[0]
    return _uniform(n, tuple(x.shape), _float_dtype(n, x.dtype))


@op("RandomNormalLike", 1, 22)
def _random_normal_like(n: Node) -> Tensor:
    x = n[0]
    return _normal(n, tuple(x.shape), _float_dtype(n, x.dtype))


@op("Bernoulli", 15, 22)
def _bernoulli(n: Node) -> Tensor:
    p = n[0]
    if not dtypes.is_float(p.dtype):
        raise n.unsupported(f"input of {p.dtype}: expected probabilities of a float type")
    dt = onnx_to_dtype(n.get("dtype"), n.op_type, n.opset) if n.get("dtype") is not None else p.dtype
    wide = wide_float(p.dtype)
    if 0 in p.shape:
        return Tensor.zeros(p.shape, dtype=dt, device=n.device)
    out = (Tensor._uniform_draw(tuple(p.shape), n.device, wide, seed_key(n)) < p.cast(wide)).cast(dt)
    bad = (p < 0) | (p > 1) | (p != p)  # (torch raises for these too)
    return _with_check(out, bad, "Bernoulli: a probability is outside [0, 1] or NaN", ValueError)


@op("Multinomial", 7, 22)
def _multinomial(n: Node) -> Tensor:
    x = n[0]
    dt = onnx_to_dtype(n.get("dtype", 6), n.op_type, n.opset)  # (6: int32, the default)
    if dt not in (dtypes.int32, dtypes.int64):
        raise n.unsupported(f"dtype {dt}: expected int32 or int64")
    if x.ndim != 2 or not dtypes.is_float(x.dtype) or x.shape[1] < 1:
        raise n.unsupported(f"input {x.shape} of {x.dtype}: expected (batch, classes) of float log-probabilities")
    samples = int(n.get("sample_size", 1))
    if samples < 1:
        raise n.unsupported(f"sample_size {samples}: expected at least 1")
    batch, classes = x.shape
    wide = wide_float(x.dtype)
    if batch == 0:
        return Tensor.zeros(0, samples, dtype=dt, device=n.device)
    # each sample is the first class whose cumulative probability passes a uniform draw on [0, the total)
    cdf = x.cast(wide).softmax(-1).cumsum(-1)
    u = Tensor._uniform_draw((batch, samples), n.device, wide, seed_key(n)) * cdf[:, -1:]
    picked = (cdf.unsqueeze(1) <= u.unsqueeze(-1)).sum(-1).minimum(classes - 1).cast(dt)
    # (as torch refuses: a NaN or +inf log-probability, or a row that is -inf throughout, is no distribution)
    bad = (x != x) | (x == math.inf) | (x.max(-1, keepdim=True) == -math.inf)
    message = "Multinomial: a row of log-probabilities holds NaN or +inf, or only -inf"
    return _with_check(picked, bad, message, ValueError)
