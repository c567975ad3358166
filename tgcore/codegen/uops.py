"""The UOp IR: the flat list of micro-ops that the linearizer emits and every device's renderer receives.

A kernel is a list of UOps in execution order. Each UOp is `UOp(op, dtype, src, arg)`; `src` are earlier UOps
of the same list. The kinds, as `op: dtype; src; arg`:

- DEFINE_GLOBAL: PtrDType of the elements; (); (index, name, writable): a buffer argument
- DEFINE_VAR: int32 (int64 when min..max passes int32's range); (); (name, min, max): a symbolic shape variable
  passed by value; name is its identifier (codegen/names.py: `var_<name>` or `varx_<hex>`, never the user's text)
  or core_start / core_end
- DEFINE_LOCAL: PtrDType of the elements; (); (name, size): memory shared by a workgroup; in a CPU-style kernel
  (a Renderer with `scratch_max`, never with a BARRIER) scratch memory of the calling thread's own
- DEFINE_ACC: scalar; (); the initial value (a Python number): an accumulator variable
- CONST: scalar; (); a Python bool / int / float
- SPECIAL: the index dtype; (); (dim, name, size): a launched index; name "gidx<dim>" (global) or "lidx<dim>"
  (local); size an int, or a Node (a symbolic launch) whose Variables carry their identifiers as names
- RANGE: the index dtype; (start, end); (axis, is_reduce): a loop variable, from start up to end (exclusive)
- ENDRANGE: None; (RANGE,); None: closes the loop
- LOAD: element dtype; (buffer, index) or (buffer, index, gate, alt): reads alt where gate is false. The index is any
  expression of the index dtype, one computed from loaded values too (a gather: an embedding lookup's row comes from
  the token id the kernel loaded; the linearizer clamps such a value into the buffer before it enters the index)
- STORE: None; (buffer, index, value) or (buffer, index, value, gate)
- ALU: result dtype; operands; a UnaryOps / BinaryOps / TernaryOps
- CAST: target dtype; (x,); None: value conversion
- BITCAST: target dtype; (x,); None: the same bits reinterpreted (same itemsize)
- PHI: accumulator dtype; (DEFINE_ACC, new value); None: the accumulator takes the new value. Reading the
  DEFINE_ACC reads the accumulator's current value (in a loop: the value left by the last PHI that ran); a PHI read
  as a source is the value it assigned, and is only read before the accumulator changes again
- IF / ENDIF: None; (gate,) / (IF,); None
- BARRIER: None; (); None: every thread of the workgroup waits here
- VECTORIZE: dtype.vec(n); n scalar uops; None: the vector whose lane i is src[i] (a splat when all are one uop)
- GEP: scalar dtype; (vector,); i: lane i of the vector

Vectors (only for a Renderer whose `vector_uops` is True; no other renderer ever receives them): a dtype made by
`dtype.vec(n)` (n > 1; so far float32 and float64, n a power of two up to 16) may be the dtype of
- LOAD (buffer, index): the n consecutive elements from `index` (not necessarily aligned; never gated),
- STORE (buffer, index, vector value): likewise; or (buffer, index, vector value, gate), gated by one scalar bool for
  all n elements (a CPU-style kernel's PADTO rows only),
- ALU with ADD, SUB, MUL, DIV, NEG, the ops in the renderer's `vector_math`, and MULACC where the renderer
  declares `fused_mulacc`: lane by lane, every operand a vector of the same dtype; except that CMPLT and CMPEQ (in
  `vector_math`) compare two float32 vectors into a `bool.vec(n)` mask, and WHERE (in `vector_math`) selects between
  two float32 vectors by such a mask. A mask comes only from such a comparison and goes only to a WHERE or a GEP
  (a lane as a scalar bool); it is never loaded, stored, cast or VECTORIZEd. (A cast of a mask to float32 is
  lowered as a WHERE between 1.0 and 0.0.)
- DEFINE_ACC (every lane starts at the scalar arg) and PHI,
- BITCAST (in `vector_math`) of a float32 (float64) vector to the uint32 (uint64) vector of its bits, and back: the
  one way an integer vector (`VECTOR_BITS`) arises; on such a vector, SHL (in `vector_math`) by a VECTORIZE of one
  CONST smaller than the lane's width in bits (so no lane shifts past it),
besides VECTORIZE and GEP. Anything else (casts, comparisons, transcendental ops) stays scalar, through GEP.

Every name a uop declares (and the kernel name a renderer receives) is an ASCII identifier that no other declaration
of the kernel shares; codegen/names.py says which names a renderer may give its own declarations.

Indices are element indices (not bytes) of the kernel's index dtype: int32, or int64 in a kernel whose index values
may pass int32's range (a buffer or an index space past 2^31 - 1 elements: codegen/linearizer.py decides). Every
index uop of a kernel (RANGE, SPECIAL, the ALU uops and CONSTs of its index math) has that one dtype; in an int64
kernel an int32 DEFINE_VAR enters the index math through a CAST to int64 at the top of the kernel.

ALU semantics are `tgcore.ops.exec_alu`'s, except float32 and float64 MULACC on a renderer that declares
`fused_mulacc`: a*b+c rounded once (C's fma). The linearizer emits MULACC only there, to accumulate a SUM of products.
CMPLT and CMPEQ return bool. Loops nest: every RANGE is closed by its ENDRANGE in the reverse order they were opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional

from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps, TernaryOps, UnaryOps

# what vectors are made of, and the ALU ops that take them (see the module docstring)
VECTOR_DTYPES = (dtypes.float32, dtypes.float64)
VECTOR_ALU = (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.DIV, UnaryOps.NEG)
# the integer vectors a float vector's BITCAST gives, for a renderer whose `vector_math` lists BITCAST (and SHL)
VECTOR_BITS = {dtypes.float32: dtypes.uint32, dtypes.float64: dtypes.uint64}


def is_vector_bitcast(src: DType, dst: DType) -> bool:
    """Whether a BITCAST from `src` to `dst` (scalar dtypes) may run on whole vectors: a float vector dtype to the
    uint of its bits, or back."""
    return VECTOR_BITS.get(src) == dst or VECTOR_BITS.get(dst) == src


def is_vector_shift(dt: DType, amount: Any) -> bool:
    """Whether SHL of `dt` (a scalar dtype) by the constant `amount` may run on whole vectors (VECTOR_BITS)."""
    return dt in VECTOR_BITS.values() and isinstance(amount, int) and 0 <= amount < dt.itemsize * 8


# the ops of a renderer's `vector_math` that take or give bool vectors (masks), and the one dtype they compare and
# select: a comparison's mask has a lane per compared element, of that element's width in C's vector extensions
VECTOR_SELECT = (BinaryOps.CMPLT, BinaryOps.CMPEQ, TernaryOps.WHERE)
VECTOR_SELECT_DTYPE = dtypes.float32


def has_vector_select(vector_math: Any) -> bool:
    """Whether a renderer's `vector_math` declares the masks: CMPLT, CMPEQ and WHERE, the three together."""
    return all(op in vector_math for op in VECTOR_SELECT)


# the dtypes of index arithmetic (see the module docstring)
INDEX_DTYPES = (dtypes.int32, dtypes.int64)


class UOps(Enum):
    """The kinds of micro-op (see the module docstring for each one's fields)."""

    # members are singletons: hashed by identity, object's C hash instead of Enum's Python one (every uop the
    # linearizer emits is looked up by a key holding its kind: ~0.6M hashes for ResNet-50's 39 kernels)
    __hash__ = object.__hash__

    DEFINE_GLOBAL = auto()
    DEFINE_VAR = auto()
    DEFINE_LOCAL = auto()
    DEFINE_ACC = auto()
    CONST = auto()
    SPECIAL = auto()
    RANGE = auto()
    ENDRANGE = auto()
    LOAD = auto()
    STORE = auto()
    ALU = auto()
    CAST = auto()
    BITCAST = auto()
    PHI = auto()
    IF = auto()
    ENDIF = auto()
    BARRIER = auto()
    VECTORIZE = auto()
    GEP = auto()


@dataclass(frozen=True, eq=False)
class UOp:
    """One micro-op. Identity is by object: the list is a program, so two equal-looking LOADs may differ."""

    op: UOps
    dtype: Optional[DType] = None
    src: tuple[UOp, ...] = ()
    arg: Any = None

    def __repr__(self) -> str:
        return f"UOp({self.op.name}, {self.dtype}, nsrc={len(self.src)}, arg={self.arg!r})"


def index_uops(uops: list[UOp]) -> set[int]:
    """The ids of the index arithmetic: the scalar ALU, RANGE and SPECIAL uops computed from launch indices, loop
    variables, symbolic sizes (through their CAST in an int64 kernel) and constants only, and used only to address
    memory, gate a load or store, bound a loop or branch (directly or through other such uops). For a valid kernel
    none of them overflows the kernel's index dtype, so a renderer may spell them in a form its compiler folds into
    addresses (plain C arithmetic, a 64-bit type)."""
    from_indices: set[int] = set()
    users: dict[int, list[tuple[UOp, int]]] = {}
    for u in uops:
        if u.op in (UOps.CONST, UOps.SPECIAL, UOps.RANGE, UOps.DEFINE_VAR) or (
            (u.op is UOps.ALU or (u.op is UOps.CAST and u.dtype in INDEX_DTYPES))
            and all(id(s) in from_indices for s in u.src)
        ):
            from_indices.add(id(u))
        for position, s in enumerate(u.src):
            users.setdefault(id(s), []).append((u, position))
    addressing: set[int] = set()

    def addresses(user: UOp, position: int) -> bool:
        if user.op is UOps.LOAD:  # (buffer, index, gate, alt): alt is a value
            return position in (1, 2)
        if user.op is UOps.STORE:  # (buffer, index, value, gate)
            return position in (1, 3)
        return user.op in (UOps.RANGE, UOps.ENDRANGE, UOps.IF) or id(user) in addressing

    for u in reversed(uops):  # every user comes after what it uses
        if u.op in (UOps.ALU, UOps.RANGE, UOps.SPECIAL) and id(u) in from_indices and u.dtype is not None:
            if u.dtype.count == 1 and users.get(id(u)) and all(addresses(user, p) for user, p in users[id(u)]):
                addressing.add(id(u))
    return addressing


def plain_index_ops(uops: list[UOp], index: Optional[set[int]] = None) -> set[int]:
    """The ids of the int32 and int64 `+ - *` uops of the index arithmetic (index_uops): they cannot overflow for a
    valid kernel, so a renderer that spells int math to wrap (numpy's semantics) may spell these plainly instead,
    which lets its compiler fold them into addresses."""
    if index is None:  # (index_uops(uops), where the caller has it)
        index = index_uops(uops)
    return {
        id(u)
        for u in uops
        if id(u) in index
        and u.op is UOps.ALU
        and u.dtype in INDEX_DTYPES
        and u.arg in (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL)
        and all(s.dtype == u.dtype for s in u.src)
    }


def print_uops(uops: list[UOp]) -> str:
    """A readable listing of a uop list, one line each, sources as indices."""
    index = {id(u): i for i, u in enumerate(uops)}
    lines = []
    for i, u in enumerate(uops):
        srcs = [index.get(id(s), -1) for s in u.src]
        lines.append(f"{i:4d} {u.op.name:14s} {str(u.dtype):28s} {str(srcs):16s} {u.arg!r}")
    return "\n".join(lines)
