"""Builds one-op kernels straight from UOps and runs them on a device: the ALU, cast and bitcast checks use it."""

from __future__ import annotations

from typing import Optional

import numpy as np

from tgcore.codegen.uops import UOp, UOps
from tgcore.device import Buffer, Device
from tgcore.dtype import DType, PtrDType, bf16_round, dtypes
from tgcore.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tgcore.plugin import numpy_dtype

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32]
INTS += [dtypes.int64, dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


def np_type(dt: DType) -> type:
    return numpy_dtype(dt).type


def edge_values(dt: DType) -> np.ndarray:
    """Values of `dt` that find the edge cases: zero, signs, extremes, NaN, infinities, subnormals."""
    if dt == dtypes.bool:
        return np.array([False, True])
    if dtypes.is_int(dt):
        info = np.iinfo(dt.np)
        vals = {0, 1, 2, 3, 7, 8, 31, 32, 63, 64, 100, info.max, info.max - 1, info.min, info.min + 1}
        if info.min < 0:
            vals |= {-1, -2, -3, -7, -8, -100}
        vals = {v for v in vals if info.min <= v <= info.max}
        return np.array(sorted(vals), dtype=dt.np)
    big = {dtypes.float16: 65504.0, dtypes.bfloat16: 3.3e38, dtypes.float32: 3.4e38, dtypes.float64: 1.7e308}[dt]
    tiny = {dtypes.float16: 6e-8, dtypes.bfloat16: 1e-40, dtypes.float32: 1e-45, dtypes.float64: 5e-324}[dt]
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.25, 1e-3, 123.456, -1000.0, big, -big, tiny, -tiny]
    vals += [np.inf, -np.inf, np.nan]
    with np.errstate(all="ignore"):
        out = np.array(vals, dtype=np_type(dt))
    return bf16_round(out) if dt == dtypes.bfloat16 else out


def to_buffer(device: str, values: np.ndarray, dt: DType) -> Buffer:
    if dt == dtypes.bfloat16:
        raw = (bf16_round(values.astype(np.float32)).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    else:
        raw = values.astype(dt.np).tobytes()
    return Buffer(device, len(values), dt, initial_value=raw)


def from_buffer(buf: Buffer) -> np.ndarray:
    return buf.numpy().copy()


def elementwise_uops(op: Optional[Op], in_dts: list[DType], out_dt: DType, n: int, kind: UOps = UOps.ALU) -> list[UOp]:
    """out[i] = op(in0[i], in1[i], ...) for i < n, as a CPU loop (RANGE); `kind` CAST or BITCAST takes one input."""
    out = UOp(UOps.DEFINE_GLOBAL, PtrDType.of(out_dt), (), (0, "data0", True))
    ins = [UOp(UOps.DEFINE_GLOBAL, PtrDType.of(d), (), (i + 1, f"data{i + 1}", False)) for i, d in enumerate(in_dts)]
    zero, end = UOp(UOps.CONST, dtypes.int32, (), 0), UOp(UOps.CONST, dtypes.int32, (), n)
    rng = UOp(UOps.RANGE, dtypes.int32, (zero, end), (0, False))
    loads = [UOp(UOps.LOAD, d, (g, rng)) for g, d in zip(ins, in_dts)]
    value = UOp(kind, out_dt, tuple(loads), op)
    store = UOp(UOps.STORE, None, (out, rng, value))
    return [out, *ins, zero, end, rng, *loads, value, store, UOp(UOps.ENDRANGE, None, (rng,))]


def run_uops(device: str, uops: list[UOp], bufs: list[Buffer], name: str = "test_kernel") -> None:
    dev = Device[device]
    src = dev.renderer.render(name, uops)
    prg = dev.runtime(device, name, dev.compiler.compile(src))
    prg(*[b.allocate()._opaque for b in bufs])


def run_elementwise(
    device: str, op: Optional[Op], inputs: list[np.ndarray], in_dts: list[DType], out_dt: DType, kind: UOps = UOps.ALU
) -> np.ndarray:
    n = len(inputs[0])
    out = Buffer(device, n, out_dt)
    bufs = [out] + [to_buffer(device, x, d) for x, d in zip(inputs, in_dts)]
    run_uops(device, elementwise_uops(op, in_dts, out_dt, n, kind), bufs)
    return from_buffer(out)


def operands(op: Op, dt: DType) -> tuple[list[np.ndarray], list[DType], DType]:
    """Every pair (or single, or triple) of edge values for `op` on `dt`, the input dtypes, and the result dtype."""
    vals = edge_values(dt)
    out_dt = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPEQ) else dt
    if op in UnaryOps:
        return [vals], [dt], out_dt
    if op is TernaryOps.WHERE:
        a, b = np.meshgrid(vals, vals[::-1])
        cond = np.arange(a.size) % 3 == 0
        return [cond, a.ravel(), b.ravel()], [dtypes.bool, dt, dt], dt
    if op is TernaryOps.MULACC:
        sub = vals[: min(len(vals), 9)]
        a, b, c = (x.ravel() for x in np.meshgrid(sub, sub, sub))
        return [a, b, c], [dt, dt, dt], dt
    a, b = np.meshgrid(vals, vals)
    return [a.ravel(), b.ravel()], [dt, dt], out_dt


def ops_for(dt: DType) -> list[Op]:
    """The ALU ops exec_alu defines on `dt`."""
    common: list[Op] = [BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPEQ]
    common += [UnaryOps.NEG, TernaryOps.WHERE, TernaryOps.MULACC]
    if dt == dtypes.bool:
        return common + [BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR]
    common += [BinaryOps.SUB, BinaryOps.DIV, BinaryOps.MOD]
    if dtypes.is_int(dt):
        return common + [BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR]
    return common + [UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT]


TRANSCENDENTAL = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN)


def cast_inputs(src: DType, dst: DType) -> np.ndarray:
    """Edge values of `src` that numpy converts to `dst` the same way on every platform (float -> int in range)."""
    vals = edge_values(src)
    if dtypes.is_float(src) and dtypes.is_int(dst):
        info = np.iinfo(dst.np)
        with np.errstate(all="ignore"):
            keep = np.isfinite(vals) & (np.trunc(vals.astype(np.float64)) >= info.min)
            keep &= np.trunc(vals.astype(np.float64)) <= info.max
            if dst == dtypes.uint64 or dst == dtypes.int64:  # float64(2**63) rounds up out of range
                keep &= np.abs(vals.astype(np.float64)) < 2.0**63
        vals = vals[keep]
    return vals


def reference_cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        if dst == dtypes.bool:
            return x != 0
        out = x.astype(np_type(dst))
    return bf16_round(out) if dst == dtypes.bfloat16 else out


def reference_bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    if src == dtypes.bfloat16:
        x = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out = np.ascontiguousarray(x).view(np.uint16 if dst == dtypes.bfloat16 else dst.np)
    if dst == dtypes.bfloat16:
        return (out.astype(np.uint32) << 16).view(np.float32)
    return out


def same_bits(got: np.ndarray, want: np.ndarray, zero_sign: bool = True) -> np.ndarray:
    """Elementwise: the same value, bit for bit (any NaN matches any NaN; +-0 match unless zero_sign)."""
    got, want = np.asarray(got), np.asarray(want).astype(got.dtype)
    if got.dtype.kind != "f":
        return got == want
    width = got.dtype.itemsize
    same = (got.view(f"u{width}") == want.view(f"u{width}")) | (np.isnan(got) & np.isnan(want))
    return same if zero_sign else same | ((got == 0) & (want == 0))
