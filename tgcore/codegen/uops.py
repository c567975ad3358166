"""The UOp IR: the flat list of micro-ops that the linearizer emits and every device's renderer receives.

A kernel is a list of UOps in execution order. Each UOp is `UOp(op, dtype, src, arg)`; `src` are earlier UOps
of the same list. The kinds, with their `dtype`, `src` and `arg`:

| op            | dtype                  | src                                   | arg                                  |
|---------------|------------------------|---------------------------------------|--------------------------------------|
| DEFINE_GLOBAL | PtrDType of elements   | ()                                    | (index, name, writable)              |
| DEFINE_VAR    | int32                  | ()                                    | (name, min, max): a symbolic shape   |
| DEFINE_LOCAL  | PtrDType of elements   | ()                                    | (name, size) shared by a workgroup   |
| DEFINE_ACC    | scalar                 | ()                                    | initial value (Python number)        |
| CONST         | scalar                 | ()                                    | Python bool / int / float            |
| SPECIAL       | int32                  | ()                                    | (dim, name, size): a launched index; name starts with "gidx" (global) or "lidx" (local) |
| RANGE         | int32                  | (start CONST, end UOp)                | (axis, is_reduce)                    |
| ENDRANGE      | None                   | (RANGE,)                              | None                                 |
| LOAD          | element dtype          | (buffer, index) or (buffer, index, gate, alt): reads alt where gate is false | None |
| STORE         | None                   | (buffer, index, value) or (buffer, index, value, gate)                   | None |
| ALU           | result dtype           | operands                              | a UnaryOps/BinaryOps/TernaryOps      |
| CAST          | target dtype           | (x,) value conversion                 | None                                 |
| BITCAST       | target dtype           | (x,) same bits, same itemsize         | None                                 |
| PHI           | accumulator dtype      | (DEFINE_ACC, new value)               | None: the accumulator takes the value|
| IF / ENDIF    | None                   | (gate,) / (IF,)                       | None                                 |
| BARRIER       | None                   | ()                                    | None                                 |

Indices are element indices (not bytes), int32. ALU semantics are `tgcore.ops.exec_alu`'s. CMPLT and CMPEQ
return bool. Loops nest: every RANGE is closed by its ENDRANGE in the reverse order they were opened.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional

from tgcore.dtype import DType


class UOps(Enum):
    """The kinds of micro-op (see the module docstring for each one's fields)."""

    DEFINE_GLOBAL = auto(); DEFINE_VAR = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto()  # noqa: E702
    CONST = auto(); SPECIAL = auto(); RANGE = auto(); ENDRANGE = auto()  # noqa: E702
    LOAD = auto(); STORE = auto(); ALU = auto(); CAST = auto(); BITCAST = auto(); PHI = auto()  # noqa: E702
    IF = auto(); ENDIF = auto(); BARRIER = auto()  # noqa: E702


@dataclass(frozen=True, eq=False)
class UOp:
    """One micro-op. Identity is by object: the list is a program, so two equal-looking LOADs may differ."""

    op: UOps
    dtype: Optional[DType] = None
    src: tuple[UOp, ...] = ()
    arg: Any = None

    def __repr__(self) -> str:
        return f"UOp({self.op.name}, {self.dtype}, nsrc={len(self.src)}, arg={self.arg!r})"


def print_uops(uops: list[UOp]) -> str:
    """A readable listing of a uop list, one line each, sources as indices."""
    index = {id(u): i for i, u in enumerate(uops)}
    lines = []
    for i, u in enumerate(uops):
        srcs = [index.get(id(s), -1) for s in u.src]
        lines.append(f"{i:4d} {u.op.name:14s} {str(u.dtype):28s} {str(srcs):16s} {u.arg!r}")
    return "\n".join(lines)
