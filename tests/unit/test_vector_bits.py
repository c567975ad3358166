"""A float vector's bits on whole vectors (a renderer's `vector_math` holding BITCAST and SHL, codegen/uops.py
VECTOR_BITS): exp, which builds its powers of two that way, within an ulp of the exact value on every device (float32
and float64, subnormal and overflowing results, NaN and infinities) and vector code where the renderer declares them;
bit casts and shifts written as Tensor ops give numpy's bits on every device, and a shift by a tensor (not a constant)
stays scalar."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOps
from tgcore.device import Device
from tgcore.engine.realize import get_kernel
from tgcore.ops import BinaryOps, UnaryOps

DEVICES = ["PYTHON"] + sorted(d for d in Device.available() if d != "PYTHON")


def _uops(t: Tensor) -> list:
    ast = t.schedule()[-1].ast
    return to_program(get_kernel(Device[t.device].renderer, ast, t.device)).uops


def _declares_bits(device: str) -> bool:
    renderer = Device[device].renderer
    return renderer.vector_uops and {UnaryOps.BITCAST, BinaryOps.SHL} <= set(renderer.vector_math)


def _exp_ulps(got: np.ndarray, x: np.ndarray) -> float:
    """The largest error of `got` = exp(x) in units of the last place of the exact value, exact in long double."""
    with np.errstate(over="ignore", invalid="ignore"):
        exact = np.exp(x.astype(np.longdouble))
        rounded = exact.astype(x.dtype)
        spacing = np.spacing(np.abs(rounded)).astype(np.longdouble)
        same = (got == rounded) | (np.isnan(got) & np.isnan(exact))  # (infinities and NaNs included)
        err = np.where(same, 0, np.abs(got.astype(np.longdouble) - exact) / np.where(same, 1, spacing))
    return float(np.max(err))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
def test_exp_within_an_ulp(device: str, dtype: object) -> None:
    if dtype not in Device[device].spec.dtypes:
        pytest.skip(f"{device} does not claim {dtype}")
    np_dtype = np.float32 if dtype == dtypes.float32 else np.float64
    lo, hi = (-104.0, 89.0) if dtype == dtypes.float32 else (-746.0, 710.0)
    rng = np.random.default_rng(5)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, hi, lo, lo - 50, hi + 50, 0.5, -0.5]
    x = np.concatenate([rng.uniform(lo, hi, 20000), rng.uniform(-1, 1, 5000), special]).astype(np_dtype)
    got = Tensor(x, device=device, dtype=dtype).exp().numpy()
    assert got.dtype == np_dtype
    assert _exp_ulps(got, x) <= 1.0
    # the special values exactly: e^0 = 1, e^inf = inf, e^-inf = 0, NaN stays NaN, overflow and underflow
    np.testing.assert_array_equal(got[-13:-8], np.array([1.0, 1.0, np.inf, 0.0, np.nan], np_dtype))
    np.testing.assert_array_equal(got[-4:-2], np.array([0.0, np.inf], np_dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_exp_kernel_is_vector_code_where_the_renderer_declares_its_bits(device: str) -> None:
    x = Tensor(np.linspace(-5, 5, 4096, dtype=np.float32), device=device)
    uops = _uops(x.exp())
    vector_bitcasts = [u for u in uops if u.op is UOps.BITCAST and u.dtype.count > 1]
    vector_shifts = [u for u in uops if u.op is UOps.ALU and u.arg is BinaryOps.SHL and u.dtype.count > 1]
    if _declares_bits(device):
        assert vector_bitcasts and vector_shifts
        assert {u.dtype.scalar() for u in vector_bitcasts} == {dtypes.uint32, dtypes.float32}
    else:
        assert not vector_bitcasts and not vector_shifts


@pytest.mark.parametrize("device", DEVICES)
def test_bit_casts_and_shifts_match_numpy(device: str) -> None:
    a = np.random.default_rng(6).standard_normal(1024).astype(np.float32)
    a[:6] = [np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.0e38]
    x = Tensor(a, device=device)
    bits = a.view(np.uint32)
    # float bits shifted by constants within the width (vector code where declared), and past it (0)
    for amount in (0, 1, 9, 23, 31):
        got = (x.bitcast(dtypes.uint32) << amount).bitcast(dtypes.float32).numpy()
        np.testing.assert_array_equal(got.view(np.uint32), bits << np.uint32(amount))
    np.testing.assert_array_equal((x.bitcast(dtypes.uint32) << 32).numpy(), np.zeros_like(bits))
    # by a tensor of amounts: lane by lane (the amounts may pass the width), never a vector shift
    amounts = np.arange(1024, dtype=np.uint32) % 40
    shifted = x.bitcast(dtypes.uint32) << Tensor(amounts, device=device)
    assert not [u for u in _uops(shifted) if u.op is UOps.ALU and u.arg is BinaryOps.SHL and u.dtype.count > 1]
    want = np.where(amounts < 32, bits << np.minimum(amounts, 31), 0).astype(np.uint32)
    np.testing.assert_array_equal(shifted.numpy(), want)
    if dtypes.float64 in Device[device].spec.dtypes:
        d = a.astype(np.float64)
        got64 = (Tensor(d, device=device).bitcast(dtypes.uint64) << 52).numpy()
        np.testing.assert_array_equal(got64, d.view(np.uint64) << np.uint64(52))
