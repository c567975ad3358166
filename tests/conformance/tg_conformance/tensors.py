"""Helpers of the tensor-level tests: tensors of any dtype on the target, inputs, and tolerances."""
from __future__ import annotations

from typing import Optional

import numpy as np

from tg_conformance import reference as ref
from tg_conformance.target import Target
from tgcore import Tensor
from tgcore.dtype import DType, dtypes


def tensor(target: Target, values: np.ndarray, dtype: DType, requires_grad: Optional[bool] = None) -> Tensor:
    """A tensor of `dtype` on the target holding `values` (bfloat16: float32 values cast on the device)."""
    if dtype == dtypes.bfloat16:
        return Tensor(np.array(values, dtype=np.float32, order="C"), device=target.name).cast(dtypes.bfloat16)
    return Tensor(np.array(values, dtype=ref.carrier(dtype), order="C"), device=target.name,
                  requires_grad=requires_grad)


def values(dtype: DType, shape: tuple[int, ...], rng: np.random.Generator, low: float = -10, high: float = 10,
           nonzero: bool = False) -> np.ndarray:
    """Random values of `dtype` in [low, high) (small integers for integer dtypes), as its carrier."""
    n = int(np.prod(shape))
    if dtype == dtypes.bool:
        out = rng.integers(0, 2, n).astype(np.bool_)
    elif dtypes.is_int(dtype):
        lo, hi = ref.int_range(dtype)
        out = ref.make_array(rng.integers(max(int(low), lo), min(int(high), hi), n, endpoint=True), dtype)
        if nonzero:
            out[out == 0] = 1
    else:
        out = ref.make_array(rng.uniform(low, high, n), dtype)
        if nonzero:
            out[out == 0] = 1
    return out.reshape(shape)


def eps(dtype: DType) -> float:
    """The spacing of `dtype`'s values just above 1."""
    return {dtypes.float16: 2.0**-10, dtypes.bfloat16: 2.0**-7, dtypes.float32: 2.0**-23,
            dtypes.float64: 2.0**-52}[dtype]


def composite_tolerance(target: Target, dtype: DType) -> tuple[float, float]:
    """The device's tolerance for `dtype`, widened to 4 ulps for functions the core composes from several ops."""
    atol, rtol = target.tolerance(dtype)
    return max(atol, 4 * eps(dtype)), max(rtol, 4 * eps(dtype))
