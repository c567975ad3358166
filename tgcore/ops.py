"""The operations: enums for every op, the kernel AST (LazyOp), and the reference semantics of each ALU op.

`exec_alu` is the one place that says what an op computes. Every device must match it (the conformance
suite checks), and it follows numpy: IEEE floats with NaN propagating through MAX, integers that wrap,
integer division that truncates toward zero and gives 0 when dividing by 0, shifts past the width give 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Union

import numpy as np

from tgcore.dtype import ConstType, DType, bf16_round, dtypes


class _OpEnum(Enum):
    """An op enum. Members are singletons compared by identity, so they hash by identity too: object's C hash
    instead of Enum's Python one (ops are hashed in every schedule-cache key and kernel cache lookup)."""

    __hash__ = object.__hash__


class UnaryOps(_OpEnum):
    """Elementwise ops of one operand. CAST and BITCAST take the target dtype from the node."""

    EXP2 = auto()
    LOG2 = auto()
    CAST = auto()
    BITCAST = auto()
    SIN = auto()
    SQRT = auto()
    NEG = auto()


class BinaryOps(_OpEnum):
    """Elementwise ops of two operands. CMPLT and CMPEQ return bool."""

    ADD = auto()
    SUB = auto()
    MUL = auto()
    DIV = auto()
    MAX = auto()
    MOD = auto()
    CMPLT = auto()
    CMPEQ = auto()
    XOR = auto()
    AND = auto()
    OR = auto()
    SHL = auto()
    SHR = auto()


class TernaryOps(_OpEnum):
    """WHERE(cond, a, b) selects; MULACC(a, b, c) is a*b+c (rounded as two ops; once, for float32 / float64, on a
    Renderer that declares fused_mulacc)."""

    WHERE = auto()
    MULACC = auto()


class ReduceOps(_OpEnum):
    """Reductions over axes."""

    SUM = auto()
    MAX = auto()


class BufferOps(_OpEnum):
    """Leaves and roots of a kernel AST: read a buffer, a constant, write a buffer."""

    LOAD = auto()
    CONST = auto()
    STORE = auto()


class LoadOps(_OpEnum):
    """Graph ops that are not computed by a generated kernel (or that mark kernel boundaries)."""

    EMPTY = auto()
    CONST = auto()
    COPY = auto()
    CONTIGUOUS = auto()
    CUSTOM = auto()
    ASSIGN = auto()


class IndexOps(_OpEnum):
    """Graph ops that read a buffer at positions computed from data. GATHER (arg: the axis) reads its first source, a
    realized buffer, at the second's integer values along that axis; in a kernel AST it is a LOAD whose src is the
    index expression and whose arg a GatherBuffer (the kernel computes the index and the load together)."""

    GATHER = auto()


class ComposedOps(_OpEnum):
    """Float functions composed from the elementwise ops above (tgcore/lazymath.py says how, to numpy's accuracy). In
    the lazy graph each is one elementwise node, so building and scheduling exp(x) costs one node, not the ~35 of its
    composition; the scheduler writes the composition into the kernel that computes it (engine/schedule.py), so a
    kernel's AST, a renderer and a device never meet one."""

    EXP = auto()
    EXPM1 = auto()
    LOG1P = auto()
    COS = auto()
    TANH = auto()
    SINH = auto()
    COSH = auto()
    SOFTPLUS = auto()
    SIGMOID = auto()


Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, LoadOps, IndexOps, ComposedOps]

# the function of LazyBuffers each ComposedOps stands for, registered by tgcore/lazymath.py where they are written
# (here, so that lazy.py reads them without importing lazymath, which is written on lazy.py's LazyBuffer)
COMPOSITIONS: dict[ComposedOps, Callable[[Any], Any]] = {}


@dataclass(frozen=True)
class MemBuffer:
    """Kernel argument `idx`, read or written through the ShapeTracker `st`."""

    idx: int
    dtype: DType
    st: Any  # ShapeTracker (typed Any to keep ops.py free of the shape layer)

    def real_size(self) -> int:
        """Elements of the buffer this access may touch (from its first)."""
        return self.st.real_size()


@dataclass(frozen=True)
class GatherBuffer(MemBuffer):
    """Kernel argument `idx` read at a position that depends on data: the LOAD that carries it has one src, an integer
    expression i; `st` is the access with the gathered axis at stride 0, and the element read is st's plus
    clamp(i, 0, size - 1) * stride. The clamp keeps every read inside the buffer even where no check ran (the checks
    of the index values, tensor.py, raise before the kernel runs)."""

    stride: int = 0
    size: int = 1

    def real_size(self) -> int:
        return self.st.real_size() + (self.size - 1) * max(self.stride, 0)  # (a negative stride reads below st's)


@dataclass(frozen=True)
class ConstBuffer:
    """A constant broadcast over the ShapeTracker `st` (masked positions read 0)."""

    val: ConstType | Any  # a Python number, or a bound symbolic Variable
    dtype: DType
    st: Any


@dataclass(frozen=True, eq=False)
class LazyOp:
    """A node of a kernel's AST: `op` applied to `src`, with `arg` (axes, dtype, buffer, ...)."""

    op: Op
    src: tuple[LazyOp, ...] = ()
    arg: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.op, self.src, self.arg)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    # the hash is of strings among others, which hash differently in each process: a pickle carries the fields only
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, LazyOp) and _same_ast(self, other, set()))

    def lazyops(self) -> list[LazyOp]:
        """Every node of this AST, each once, parents before children."""
        seen: dict[LazyOp, None] = {}
        _preorder(self, seen)
        return list(seen)


def _preorder(n: LazyOp, seen: dict[LazyOp, None]) -> None:
    """(A function of its own, not a closure: a recursive closure is a reference cycle for the garbage collector.)"""
    if n not in seen:
        seen[n] = None
        for s in n.src:
            _preorder(s, seen)


def _same_ast(a: LazyOp, b: LazyOp, same: set[tuple[int, int]]) -> bool:
    """Structural equality of two ASTs; pairs already found equal are remembered, so shared subtrees cost once."""
    if a is b or (id(a), id(b)) in same:
        return True
    if a._hash != b._hash or a.op != b.op or a.arg != b.arg or len(a.src) != len(b.src):  # type: ignore[attr-defined]
        return False
    if not all(_same_ast(x, y, same) for x, y in zip(a.src, b.src)):
        return False
    same.add((id(a), id(b)))
    return True


# ***** reference semantics, on numpy arrays *****


def _np(dtype: DType) -> type:
    # bfloat16 values are carried as float32 rounded to bfloat16 precision
    return np.float32 if dtype == dtypes.bfloat16 else dtype.np  # type: ignore[return-value]


def _magnitude(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|x| as uint64, x < 0): exact for every integer dtype, INT64_MIN included."""
    u = x.astype(np.uint64)
    neg = x < 0 if np.issubdtype(x.dtype, np.signedinteger) else np.zeros(x.shape, dtype=bool)
    return np.where(neg, np.uint64(0) - u, u), neg


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # truncates toward zero like C; computed on magnitudes so INT_MIN / -1 wraps instead of trapping
    (ma, na), (mb, nb) = _magnitude(a), _magnitude(b)
    zero = mb == 0
    q = ma // np.where(zero, np.uint64(1), mb)
    q = np.where(na ^ nb, np.uint64(0) - q, q)
    return np.where(zero, np.uint64(0), q).astype(a.dtype)


def _int_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # the sign follows the dividend like C's %; x % 0 is 0 like numpy
    (ma, na), (mb, _) = _magnitude(a), _magnitude(b)
    zero = mb == 0
    r = ma % np.where(zero, np.uint64(1), mb)
    r = np.where(na, np.uint64(0) - r, r)
    return np.where(zero, np.uint64(0), r).astype(a.dtype)


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    big = (b.astype(np.int64) >= bits) | (b.astype(np.int64) < 0)
    safe = np.where(big, 0, b).astype(a.dtype)
    if left:
        out = np.left_shift(a, safe)
        return np.where(big, 0, out).astype(a.dtype)
    out = np.right_shift(a, safe)
    fill = np.where(a < 0, -1, 0) if np.issubdtype(a.dtype, np.signedinteger) else 0
    return np.where(big, fill, out).astype(a.dtype)


def exec_alu(op: Op, dtype: DType, operands: list[np.ndarray]) -> np.ndarray:
    """The result of ALU `op` on numpy `operands`, as an array of `dtype` (the op's result dtype)."""
    if op is TernaryOps.MULACC:  # a*b rounds to the dtype before c is added, as two separate ops would
        return exec_alu(BinaryOps.ADD, dtype, [exec_alu(BinaryOps.MUL, dtype, operands[:2]), operands[2]])
    with np.errstate(all="ignore"):
        out = _ALU[op](*operands) if op in _ALU else _exec_special(op, dtype, operands)
    out = np.asarray(out).astype(_np(dtype), copy=False)
    return bf16_round(out) if dtype == dtypes.bfloat16 else out


def _exec_special(op: Op, dtype: DType, ops: list[np.ndarray]) -> np.ndarray:
    a = ops[0]
    is_int = np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_
    if op is BinaryOps.DIV:
        return _int_div(a, ops[1]) if is_int else a / ops[1]
    if op is BinaryOps.MOD:
        return _int_mod(a, ops[1]) if is_int else np.fmod(a, ops[1])
    if op is BinaryOps.SHL:
        return _shift(a, ops[1], left=True)
    if op is BinaryOps.SHR:
        return _shift(a, ops[1], left=False)
    if op is BinaryOps.MAX:
        return np.maximum(a, ops[1])
    if op is UnaryOps.NEG:
        return np.logical_not(a) if a.dtype == np.bool_ else np.negative(a)
    raise NotImplementedError(f"no reference semantics for {op}")


_ALU: dict[Op, Callable[..., np.ndarray]] = {
    UnaryOps.EXP2: np.exp2,
    UnaryOps.LOG2: np.log2,
    UnaryOps.SIN: np.sin,
    UnaryOps.SQRT: np.sqrt,
    BinaryOps.ADD: np.add,
    BinaryOps.SUB: np.subtract,
    BinaryOps.MUL: np.multiply,
    BinaryOps.CMPLT: np.less,
    BinaryOps.CMPEQ: np.equal,
    BinaryOps.XOR: np.bitwise_xor,
    BinaryOps.AND: np.bitwise_and,
    BinaryOps.OR: np.bitwise_or,
    TernaryOps.WHERE: lambda c, a, b: np.where(c, a, b),
}
