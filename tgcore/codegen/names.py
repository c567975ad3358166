"""The identifiers of generated source: every name a kernel's uops or its function name carry.

Renderers paste names into source text (C, OpenCL, CUDA, Metal, LLVM IR), so a name must never be able to break out
of an identifier. The names the core makes itself are fixed words with an index (data0, stage0, gidx0, core_start);
the two that come from outside, a symbolic Variable's name (a model file may give it: ONNX dim_param) and a kernel
name made from a shape that holds such Variables, are mapped here, and only here, to identifiers of a strict grammar:

- a Variable named like an ASCII identifier becomes `var_<name>`; any other name `varx_<its UTF-8 bytes in hex>`.
  The two forms differ in their fourth character and each is one-to-one, so two names never share an identifier;
  the prefix keeps them apart from every name a renderer declares (keywords, libm's functions, its own locals);
- a kernel name keeps the letters, digits and underscores of the text it is made from, the rest as hex codes; it is
  `E`, `r` (the names Kernel.name makes: `E_4_4`, `r_N_16`) or, for any other text, `k`, then nothing or `_...`, and
  at most MAX_KERNEL_NAME characters.

A renderer may therefore declare any name (its own locals, helper functions) that is not `E`, `r` or `k` and does not
start with `var`, `E_`, `r_` or `k_`. The user's own name stays what it was (Variable.expr, errors, DEBUG output); only
the uops carry the identifier.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

from tgcore.codegen.uops import UOp, UOps
from tgcore.helpers import to_function_name

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # ASCII only: every target language takes these
KERNEL_NAME = re.compile(r"[Erk](?:_[A-Za-z0-9_]*)?")
VARIABLE_NAME = re.compile(r"var_[A-Za-z0-9_]*|varx_(?:[0-9a-f]{2})*")
MAX_KERNEL_NAME = 120  # longer names (a shape of many long Variable names) end in a digest of the whole name
# the names the core gives its own DEFINE_VARs (CPU-style threads: the bounds of a thread's part of the outer loop)
THREAD_BOUNDS = ("core_start", "core_end")


def variable_identifier(name: str) -> str:
    """The identifier a Variable named `name` has in generated source (see the module docstring)."""
    if IDENTIFIER.fullmatch(name):
        return "var_" + name
    return "varx_" + name.encode("utf-8", "surrogatepass").hex()


def kernel_identifier(name: str) -> str:
    """The function name a kernel called `name` has in generated source (see the module docstring)."""
    text = to_function_name(name)
    if not KERNEL_NAME.fullmatch(text):
        text = "k_" + text
    if len(text) > MAX_KERNEL_NAME:  # names need not be unique (each kernel is compiled alone): a digest will do
        text = text[: MAX_KERNEL_NAME - 17] + "_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return text


def internal_prefix(base: str, taken: Iterable[str]) -> str:
    """`base` with underscores in front until no name of `taken` starts with it: a prefix for the core's own Variables
    (loop indices) that no Variable of the user's can be confused with, whatever it is named."""
    names = list(taken)
    while any(t.startswith(base) for t in names):
        base = "_" + base
    return base


def check_names(name: str, header: Iterable[UOp]) -> None:
    """ValueError unless kernel `name` and the names the `header` uops (DEFINE_GLOBAL, DEFINE_VAR, DEFINE_LOCAL) declare
    follow the grammar above and no two are the same: the last guard before a renderer pastes them into source."""
    if not KERNEL_NAME.fullmatch(name) or len(name) > MAX_KERNEL_NAME:
        raise ValueError(f"kernel name {name!r} is not one tgcore makes: expected kernel_identifier's form")
    seen: set[str] = set()
    for u in header:
        if u.op is UOps.DEFINE_GLOBAL:
            declared = u.arg[1]
        elif u.op in (UOps.DEFINE_VAR, UOps.DEFINE_LOCAL):
            declared = u.arg[0]
        else:
            continue
        if not isinstance(declared, str) or not IDENTIFIER.fullmatch(declared):
            raise ValueError(f"{u.op.name} declares {declared!r}: expected an identifier, [A-Za-z_][A-Za-z0-9_]*")
        if u.op is UOps.DEFINE_VAR and not (VARIABLE_NAME.fullmatch(declared) or declared in THREAD_BOUNDS):
            raise ValueError(f"DEFINE_VAR {declared!r} is not named by variable_identifier")
        if declared in seen:
            raise ValueError(f"two uops of one kernel declare {declared!r}: each name must be declared once")
        seen.add(declared)
