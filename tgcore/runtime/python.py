"""The built-in PYTHON device: a UOp interpreter, registered through the same hooks as any plugin.

Its renderer serializes the UOp list to JSON; its "compiler" returns those bytes; its Program interprets them.
Global dimensions are launched like a GPU grid (one SPECIAL per dimension) and all grid positions execute at
once as numpy lanes, so the interpreter is exact (it uses `tgcore.ops.exec_alu`) and fast enough for tests. It also
runs workgroups (local SPECIALs, DEFINE_LOCAL shared memory, BARRIER: every work item is a lane, all in step), for a
Renderer that declares them; its own does not, so plain PYTHON kernels keep one lane per output.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import DTYPES_DICT, DType, PtrDType, dtypes
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu
from tgcore.plugin import (
    PLUGIN_API_VERSION,
    CompileError,
    Compiler,
    DeviceSpec,
    MallocAllocator,
    Program,
    Renderer,
    hookimpl,
    numpy_dtype,
    part_for,
)
from tgcore.shape.symbolic import Node

_ENUMS = {e.__name__: e for e in (UnaryOps, BinaryOps, TernaryOps)}


def _encode_arg(arg: Any) -> Any:
    if isinstance(arg, tuple):
        return {"t": [_encode_arg(a) for a in arg]}
    if isinstance(arg, (UnaryOps, BinaryOps, TernaryOps)):
        return {"op": f"{type(arg).__name__}.{arg.name}"}
    if isinstance(arg, float):
        return {"f": repr(arg)}
    if arg is None or isinstance(arg, (bool, int, str)):
        return arg
    if isinstance(arg, Node):  # a symbolic launch size (SPECIAL): kept as text, the launch passes the real one
        return {"node": str(arg)}
    raise NotImplementedError(f"the PYTHON renderer cannot serialize the uop argument {arg!r}")


def _decode_arg(arg: Any) -> Any:
    if isinstance(arg, dict):
        if "t" in arg:
            return tuple(_decode_arg(a) for a in arg["t"])
        if "op" in arg:
            enum, name = arg["op"].split(".")
            return _ENUMS[enum][name]
        if "node" in arg:
            return arg["node"]
        return float(arg["f"])
    return arg


def _encode_dtype(dt: Optional[DType]) -> Any:
    return None if dt is None else [dt.scalar().name, isinstance(dt, PtrDType), dt.count]


def _decode_dtype(enc: Any) -> Optional[DType]:
    if enc is None:
        return None
    dt = DTYPES_DICT[enc[0]]
    if enc[2] > 1:
        dt = dt.vec(enc[2])
    return PtrDType.of(dt) if enc[1] else dt


class PythonRenderer(Renderer):
    """Serializes uops to JSON text."""

    device = "PYTHON"
    global_max = (2**31 - 1, 2**31 - 1, 2**31 - 1)
    vector_uops = True  # the interpreter runs them (a vector is one more numpy axis); the optimizer only makes
    # them where an upcast axis gives a group of lanes, so plain PYTHON kernels stay scalar

    def render(self, name: str, uops: list[UOp]) -> str:
        index = {id(u): i for i, u in enumerate(uops)}
        rows = []
        for u in uops:
            if u.op not in UOps:
                raise NotImplementedError(f"PYTHON cannot render uop {u.op}")
            rows.append([u.op.name, _encode_dtype(u.dtype), [index[id(s)] for s in u.src], _encode_arg(u.arg)])
        return json.dumps({"name": name, "uops": rows})


class PythonCompiler(Compiler):
    """Checks the serialized program parses; the bytes are the program."""

    identity = "none: the serialized uop list is the program"
    concurrent = True  # a parse in Python of a string of its own

    def compile(self, src: str) -> bytes:
        try:
            json.loads(src)["uops"]
        except (ValueError, KeyError, TypeError) as e:
            raise CompileError(f"PYTHON program does not parse: {e}", log=str(e), src=src) from e
        return src.encode()


def _np_type(dt: DType) -> type:
    return numpy_dtype(dt).type


class PythonProgram(Program):
    """Interprets a serialized uop list over numpy lanes."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        rows = json.loads(lib.decode())["uops"]
        self.uops = [(UOps[op], _decode_dtype(dt), tuple(src), _decode_arg(arg)) for op, dt, src, arg in rows]

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = (1, 1, 1),
        local_size: Optional[tuple[int, ...]] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        # a lane per work item: workgroup after workgroup, its items in a row; dimension 0 varies fastest in both
        (grid, n_groups), (local, n_local) = _positions(global_size), _positions(local_size)
        lanes = n_groups * n_local
        grid, local = np.repeat(grid, n_local, axis=1), np.tile(local, n_groups)
        group_of = np.repeat(np.arange(n_groups, dtype=np.int64), n_local)
        values: list[Any] = [None] * len(self.uops)
        var_iter = iter(vals)
        pc = 0
        while pc < len(self.uops):
            op, dt, src, arg = self.uops[pc]
            s = [values[i] for i in src]
            if op is UOps.DEFINE_GLOBAL:
                assert dt is not None
                raw = bufs[arg[0]]
                if isinstance(dt, PtrDType) and dt.base == dtypes.bfloat16:
                    values[pc] = _BF16View(raw)
                else:
                    values[pc] = np.frombuffer(raw, dtype=_np_type(dt)) if len(raw) else np.zeros(0, _np_type(dt))
            elif op is UOps.DEFINE_VAR:
                assert dt is not None
                values[pc] = _np_type(dt)(next(var_iter))
            elif op is UOps.CONST:
                assert dt is not None
                values[pc] = _value_of(arg, dt)
            elif op is UOps.SPECIAL:
                assert dt is not None
                values[pc] = (grid if arg[1].startswith("gidx") else local)[arg[0]].astype(_np_type(dt))
            elif op is UOps.DEFINE_LOCAL:
                assert dt is not None
                values[pc] = _Shared(np.zeros(n_groups * arg[1], _np_type(dt)), group_of * arg[1])
            elif op is UOps.DEFINE_ACC:
                assert dt is not None
                values[pc] = np.full((lanes, dt.count) if dt.count > 1 else lanes, _value_of(arg, dt.scalar()))
            elif op is UOps.VECTORIZE:
                values[pc] = np.stack([np.broadcast_to(x, (lanes,)) for x in s], axis=-1)
            elif op is UOps.GEP:
                values[pc] = s[0][..., arg]
            elif op is UOps.RANGE:
                assert dt is not None
                values[pc] = _np_type(dt)(s[0])  # ENDRANGE jumps back past the RANGE, so this runs once per entry
                if values[pc] >= s[1]:  # empty loop: skip to after its ENDRANGE
                    pc = self._end_of(pc) + 1
                    continue
            elif op is UOps.ENDRANGE:
                rng = src[0]
                values[rng] = values[rng] + values[rng].dtype.type(1)  # (in the loop variable's dtype)
                if values[rng] < values[self.uops[rng][2][1]]:
                    pc = rng + 1
                    continue
            elif op is UOps.LOAD:
                assert dt is not None
                buf, idx = s[0], np.broadcast_to(s[1], (lanes,))
                if isinstance(buf, _Shared):  # each workgroup's own part of the shared memory
                    buf, idx = buf.data, buf.base + idx
                if dt.count > 1:  # consecutive elements from idx (gated: the alternative's where the gate is false)
                    at = idx[:, None] + np.arange(dt.count)
                    if len(s) != 4:
                        values[pc] = buf[at]
                    else:  # (a lane whose gate is false reads nothing: its index may be anywhere)
                        gate = np.broadcast_to(s[2], (lanes,))[:, None]
                        got = buf[np.where(gate, at, 0)] if len(buf) else np.zeros(at.shape, _np_type(dt.scalar()))
                        values[pc] = np.where(gate, got, np.broadcast_to(s[3], at.shape)).astype(got.dtype)
                elif len(s) == 4:
                    gate = np.broadcast_to(s[2], (lanes,))
                    safe = np.where(gate, idx, 0)
                    got = buf[safe] if len(buf) else np.zeros(lanes, _np_type(dt))
                    values[pc] = np.where(gate, got, s[3]).astype(_np_type(dt))
                else:
                    values[pc] = buf[idx]
            elif op is UOps.STORE:
                buf, idx = s[0], np.broadcast_to(s[1], (lanes,))
                if isinstance(buf, _Shared):
                    buf, idx = buf.data, buf.base + idx
                count = self.uops[src[2]][1].count  # type: ignore[union-attr]
                if count > 1:
                    idx = (idx[:, None] + np.arange(count)).reshape(-1)
                val = np.broadcast_to(s[2], (lanes, count) if count > 1 else (lanes,)).reshape(-1)
                if len(s) == 4:  # (a vector's gate covers its `count` elements)
                    gate = np.broadcast_to(s[3], (lanes,))
                    gate = np.repeat(gate, count) if count > 1 else gate
                    idx, val = idx[gate], val[gate]
                buf[idx] = val
            elif op is UOps.ALU:
                assert dt is not None
                values[pc] = exec_alu(arg, dt.scalar(), [np.asarray(x) for x in s])
            elif op is UOps.CAST:
                assert dt is not None
                values[pc] = _cast(np.asarray(s[0]), dt)
            elif op is UOps.BITCAST:
                assert dt is not None
                values[pc] = _bitcast(np.asarray(s[0]), self.uops[src[0]][1], dt)
            elif op is UOps.PHI:
                values[src[0]] = values[pc] = np.broadcast_to(s[1], values[src[0]].shape).copy()
            elif op is UOps.BARRIER:
                pass  # every work item runs each uop before any runs the next: they are always in step
            elif op in (UOps.IF, UOps.ENDIF):
                raise NotImplementedError(f"PYTHON does not interpret {op}")
            pc += 1
        return None

    def _end_of(self, rng: int) -> int:
        return next(i for i, (op, _, src, _) in enumerate(self.uops) if op is UOps.ENDRANGE and src[0] == rng)


def _positions(size: Optional[tuple[int, ...]]) -> tuple[np.ndarray, int]:
    """Every position in a launch grid of `size` (dims x positions, dimension 0 fastest), and how many."""
    dims = tuple(size) if size else (1,)
    return np.indices(tuple(reversed(dims))).reshape(len(dims), -1)[::-1], int(np.prod(dims))


class _Shared:
    """Shared memory (DEFINE_LOCAL): one block per workgroup; `base` is each lane's block offset."""

    def __init__(self, data: np.ndarray, base: np.ndarray) -> None:
        self.data, self.base = data, base


class _BF16View:
    """A bfloat16 buffer read and written as float32 values."""

    def __init__(self, raw: Any) -> None:
        self.bits = np.frombuffer(raw, dtype=np.uint16) if len(raw) else np.zeros(0, np.uint16)

    def __len__(self) -> int:
        return len(self.bits)

    def __getitem__(self, idx: Any) -> np.ndarray:
        return (self.bits[idx].astype(np.uint32) << 16).view(np.float32)

    def __setitem__(self, idx: Any, val: Any) -> None:
        from tgcore.dtype import bf16_round

        self.bits[idx] = (bf16_round(np.asarray(val, dtype=np.float32)).view(np.uint32) >> 16).astype(np.uint16)


def _value_of(arg: Any, dt: DType) -> np.ndarray:
    """A constant as a value of `dt` (bfloat16: float32 rounded to nearest even, as a renderer spells it)."""
    from tgcore.dtype import bf16_round

    with np.errstate(over="ignore"):
        value = np.array(arg, dtype=_np_type(dt))
    return bf16_round(value) if dt.scalar() == dtypes.bfloat16 else value


def _cast(x: np.ndarray, dt: DType) -> np.ndarray:
    from tgcore.dtype import bf16_round

    with np.errstate(all="ignore"):
        if dt == dtypes.bool:
            return x != 0
        out = x.astype(_np_type(dt))
    return bf16_round(out) if dt == dtypes.bfloat16 else out


def _bitcast(x: np.ndarray, from_dt: Optional[DType], dt: DType) -> np.ndarray:
    assert from_dt is not None
    if from_dt == dtypes.bfloat16:
        x = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out = np.ascontiguousarray(x.astype(x.dtype)).view(np.uint16 if dt == dtypes.bfloat16 else _np_type(dt))
    return (out.astype(np.uint32) << 16).view(np.float32) if dt == dtypes.bfloat16 else out


# ***** registration, through the same hooks as any plugin *****


@hookimpl
def tg_register_devices(registry: Any) -> None:
    registry.add(
        DeviceSpec(
            "PYTHON",
            PLUGIN_API_VERSION,
            priority=0,
            description="built-in UOp interpreter (numpy), for tests; needs no compiler",
        )
    )


tg_renderer = part_for("PYTHON", PythonRenderer)
tg_compiler = part_for("PYTHON", PythonCompiler)
tg_allocator = part_for("PYTHON", MallocAllocator)
tg_runtime = part_for("PYTHON", lambda: PythonProgram)
