"""Comparing a device's results with the reference, and failure messages that say how to reproduce them."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tg_conformance import reference as ref
from tgcore.dtype import DType

MAX_SHOWN = 6


def _repr_list(values: Sequence[object], dt: DType) -> str:
    return "[" + ", ".join(ref.fmt(v, dt) for v in values) + "]"


def assert_lanes(title: str, device: str, call: str, columns: Sequence[tuple[np.ndarray, DType]], got: np.ndarray,
                 exp: np.ndarray, out_dt: DType, repro_fn: str, repro_args: Sequence[str],
                 tolerance: Optional[tuple[float, float]] = None, zero_sign_free: Optional[np.ndarray] = None) -> None:
    """Fail, listing the first differing lanes and a one-line repro, unless `got` matches `exp` on every lane.

    `call` names the operation in the listing (e.g. "ADD"); `repro_fn` / `repro_args` make the repro call, to which
    the differing lanes' operand lists are appended."""
    if got.shape != exp.shape:
        raise AssertionError(f"{title} on {device}: got {got.shape[0]} results for {exp.shape[0]} lanes")
    bad = ref.mismatches(got, exp, out_dt, tolerance, zero_sign_free)
    if not bad.any():
        return
    lanes = np.flatnonzero(bad)
    rule = "exact match required" if tolerance is None else f"tolerance atol={tolerance[0]:g} rtol={tolerance[1]:g}"
    lines = [f"{title} on {device}: {len(lanes)} of {len(bad)} lanes differ ({rule})"]
    for lane in lanes[:MAX_SHOWN]:
        args = ", ".join(ref.fmt(col[lane], dt) for col, dt in columns)
        lines.append(f"  {call}({args}) -> expected {ref.fmt(exp[lane], out_dt)}, got {ref.fmt(got[lane], out_dt)}")
    if len(lanes) > MAX_SHOWN:
        lines.append(f"  ... and {len(lanes) - MAX_SHOWN} more")
    shown = lanes[:MAX_SHOWN]
    operand_lists = [_repr_list(col[shown], dt) for col, dt in columns]
    args = ", ".join([repr(a) for a in (device, *repro_args)] + operand_lists)
    lines.append(f"repro: python -c \"from tg_conformance.kernels import {repro_fn}; {repro_fn}({args})\"")
    raise AssertionError("\n".join(lines))


def assert_array(what: str, device: str, got: np.ndarray, exp: np.ndarray, *, atol: float = 0.0, rtol: float = 0.0,
                 inputs: Sequence[tuple[str, np.ndarray]] = (), exact_dtype: bool = True) -> None:
    """Fail with expected vs got (and the inputs) unless `got` equals `exp` (within atol/rtol for floats).

    NaN matches NaN; with atol == rtol == 0 floats must be equal (0.0 == -0.0)."""
    got, exp = np.asarray(got), np.asarray(exp)
    problem = None
    if got.shape != exp.shape:
        problem = f"shape {got.shape}, expected {exp.shape}"
    elif exact_dtype and got.dtype != exp.dtype:
        problem = f"dtype {got.dtype}, expected {exp.dtype}"
    elif got.size:
        if np.issubdtype(exp.dtype, np.floating) or np.issubdtype(got.dtype, np.floating):
            g, e = got.astype(np.float64), exp.astype(np.float64)
            with np.errstate(all="ignore"):
                ok = (np.abs(g - e) <= atol + rtol * np.abs(e)) | (np.isnan(g) & np.isnan(e)) | (g == e)
        else:
            ok = got == exp
        if not ok.all():
            bad = np.argwhere(~ok)
            first = tuple(int(i) for i in bad[0])
            problem = (f"{len(bad)} of {ok.size} elements differ (atol={atol:g}, rtol={rtol:g}); first at index "
                       f"{first}: expected {exp[first]!r}, got {got[first]!r}")
    if problem is None:
        return
    lines = [f"{what} on {device}: {problem}"]
    with np.printoptions(threshold=24, edgeitems=3, linewidth=100000):
        for name, arr in inputs:
            a = np.asarray(arr)
            lines.append(f"  input {name}: {a.dtype} {a.shape} {_one_line(a)}")
        lines.append(f"  expected: {_one_line(exp)}")
        lines.append(f"  got:      {_one_line(got)}")
    raise AssertionError("\n".join(lines))


def _one_line(a: np.ndarray) -> str:
    return " ".join(repr(a).split())


# ***** for a plugin whose float32 exp2 is its own routine, promised within 1 ulp (tg-clang's, tg-llvm's) *****


def exp2_inputs() -> np.ndarray:
    """float32 exp2 arguments: the edges (NaN, infinities, overflow at 128, the subnormal and underflow range below
    -126 and -150, zeros, tiny values) and 64k random ones, padded to a multiple of every vector width."""
    rng = np.random.default_rng(0)
    specials = [np.nan, np.inf, -np.inf, 128.0, 127.99999, -150.0, -149.0, -149.5, -126.5, 0.0, -0.0, 1e-30, 88.7]
    x = np.concatenate(
        [specials, rng.uniform(-160, 135, 40000), rng.uniform(-2, 2, 20000), rng.standard_normal(4000) * 1e-6]
    ).astype(np.float32)
    return np.resize(x, (len(x) // 64 + 1) * 64)


def exp2_op(x: np.ndarray, device: str) -> np.ndarray:
    """The EXP2 op itself on `device` (Tensor.exp2 goes through exp(x * ln 2))."""
    from tgcore import Tensor
    from tgcore.ops import UnaryOps

    return Tensor(Tensor(x, device=device).lazydata.e(UnaryOps.EXP2)).numpy()


def assert_exp2_within_one_ulp(device: str) -> None:
    """float32 EXP2 on `device` is within 1 ulp of the exact value on exp2_inputs() (inf where it overflows, 0 where
    it underflows, NaN for NaN), and the optimizer's kernel (vector lanes) gives the unoptimized one's bits."""
    from tgcore.helpers import Context

    x = exp2_inputs()
    got = exp2_op(x, device)
    with np.errstate(over="ignore"):
        exact = np.exp2(x.astype(np.float64)).astype(np.float32)
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(got[~finite], exact[~finite])
    err = np.abs(got[finite].astype(np.float64) - exact[finite])
    ulp = np.spacing(np.abs(exact[finite]))
    assert np.all(err <= ulp), f"exp2 on {device} is {float(np.max(err / ulp))} ulp off"
    assert got[1] == np.inf and got[2] == 0 and got[3] == np.inf and got[5] == 0 and got[6] == exact[6]
    with Context(NOOPT=1):  # one element per iteration: the scalar code
        scalar = exp2_op(x, device)
    np.testing.assert_array_equal(scalar.view(np.uint32), got.view(np.uint32))
