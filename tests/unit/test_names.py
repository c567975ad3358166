"""Names in generated source: a symbolic Variable's name (a model file may give it) never reaches a kernel's source as
it is; each maps to an identifier of a strict grammar, one to one, and kernels with any name give numpy's result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tgcore import Tensor, Variable
from tgcore.codegen.kernel import Kernel
from tgcore.codegen.names import (
    IDENTIFIER,
    KERNEL_NAME,
    MAX_KERNEL_NAME,
    check_names,
    internal_prefix,
    kernel_identifier,
    variable_identifier,
)
from tgcore.codegen.program import to_program
from tgcore.codegen.uops import UOp, UOps
from tgcore.dtype import PtrDType, dtypes
from tgcore.renderer.cstyle import CStyleLanguage
from tgcore.runtime.python import PythonRenderer
from tgcore.shape.symbolic import Node

# names that break out of an identifier in one target language or another, keywords, and names that renderers or the
# core use for their own things
HOSTILE = [
    'N\n#define N (system("touch pwned"), 4)\n',
    "n; system(1); int m",
    "#include <stdio.h>",
    "a /* b",
    "a */ b",
    "// x",
    '"quoted"',
    "'q'",
    "back\\slash\\",
    "%d %n",
    "two words",
    "naïve",
    "名前",
    "\ud800",  # a lone surrogate: a str, not UTF-8 text
    "int",
    "return",
    "bufs",
    "vals",
    "gidx0",
    "acc0",
    "data0",
    "core_start",
    "_axis0",
    "var_n",
    "varx_6e",
    "INFINITY",
    "sin",
    "%x",
    "!",
]


def _sum_kernel(name: str, n: int = 3) -> tuple[Tensor, np.ndarray]:
    """(a * 2 + 1).sum(1) of a (3, n) tensor reshaped to a Variable `name`, and numpy's answer."""
    x = np.arange(3 * n, dtype=np.float32).reshape(3, n)
    a = Tensor(x).reshape(3, Variable(name, 1, 10).bind(n))
    return (a * 2 + 1).sum(1), (x * 2 + 1).sum(1)


def _program(t: Tensor, renderer: object = None):  # -> ProgramSpec
    return to_program(Kernel(t.schedule()[-1].ast, renderer or PythonRenderer()))


class PlainC(CStyleLanguage):
    """The core's C-family base as it is: CPU-style loops, no dialect."""


@pytest.mark.parametrize("name", HOSTILE)
def test_a_kernel_with_a_hostile_variable_name_gives_numpys_result(name: str) -> None:
    got, want = _sum_kernel(name)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("name", HOSTILE)
def test_the_source_carries_only_the_identifier(name: str) -> None:
    got, _ = _sum_kernel(name)
    for renderer in (PythonRenderer(), PlainC()):
        program = _program(got, renderer)
        declared = [u.arg[0] for u in program.uops if u.op is UOps.DEFINE_VAR]
        assert declared == [variable_identifier(name)], declared
        assert IDENTIFIER.fullmatch(declared[0]) and KERNEL_NAME.fullmatch(program.name)
        specials = [u.arg[2] for u in program.uops if u.op is UOps.SPECIAL and isinstance(u.arg[2], Node)]
        assert all(v.expr == declared[0] for node in specials for v in node.vars())
        # the user's Variable stays what it was: the launch binds it, errors and DEBUG output name it
        assert [v.expr for v in program.variables] == [name]
        src = program.src
        if renderer.device == "PYTHON":  # JSON: the user's name is none of its strings (but a word it uses itself)
            assert name not in _strings(json.loads(src)) or name in ("int", "gidx0", "data0")
        else:  # the prelude's includes are the renderer's own lines, before the kernel
            src = "\n".join(line for line in src.splitlines() if line not in renderer.prelude)
            assert src.isascii() and not any(c in src for c in "#\"'\\%") and "/*" not in src and "//" not in src
            assert f"const int {declared[0]}" in src


def _strings(tree: object) -> set[str]:
    """Every string in a decoded JSON document."""
    if isinstance(tree, str):
        return {tree}
    if isinstance(tree, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in tree.items()))
    if isinstance(tree, list):
        return set().union(*(_strings(x) for x in tree))
    return set()


def test_identifiers_are_one_to_one() -> None:
    names = HOSTILE + [
        "a b",
        "a_b",
        "a__b",
        "a",
        "A",
        "n",
        "var_n",
        "varx_n",
        "6e",
        "x_",
        "_",
        "é",
        "e\u0301",
        "a" * 500,
    ]
    ids = [variable_identifier(n) for n in names]
    assert len(set(ids)) == len(set(names))
    assert all(IDENTIFIER.fullmatch(i) for i in ids)
    assert variable_identifier("start_pos") == "var_start_pos"  # a plain name stays readable
    assert variable_identifier("") == "varx_"


def test_two_variables_whose_names_look_alike_stay_apart() -> None:
    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    for first, second in (("a b", "a_b"), ("var_a", "a"), ("n", "N"), ("varx_61", "a")):
        a = Tensor(x[:4, :5].copy()).reshape(Variable(first, 1, 6).bind(4), Variable(second, 1, 7).bind(5))
        out = (a * 3 + 1).sum()
        program = _program(out)
        declared = [u.arg[0] for u in program.uops if u.op is UOps.DEFINE_VAR]
        assert len(set(declared)) == 2, declared
        assert out.item() == (x[:4, :5] * 3 + 1).sum()


def test_an_empty_variable_name_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty name"):
        Variable("", 1, 10)


def test_errors_name_the_variable_as_the_user_wrote_it() -> None:
    name = "batch size;\n"
    with pytest.raises(ValueError, match="batch size;"):
        Variable(name, 1, 10).bind(11)
    assert Variable(name, 1, 10).expr == name


def test_kernel_names_are_identifiers_of_a_bounded_length() -> None:
    for text in ["E_4_4", "r_3_N", "E", "", "3d", "int", "a/*b*/", "x" * 1000, "r_" + "é" * 200, "\x1b[31mE_1\x1b[0m"]:
        name = kernel_identifier(text)
        assert KERNEL_NAME.fullmatch(name) and len(name) <= MAX_KERNEL_NAME, name
    assert kernel_identifier("E_4_4") == "E_4_4" and kernel_identifier("int") == "k_int"
    assert kernel_identifier("x" * 1000) != kernel_identifier("x" * 999)  # the digest of the whole name
    got, _ = _sum_kernel("a very long name " * 40)
    assert len(_program(got).name) <= MAX_KERNEL_NAME


def test_a_kernel_name_given_to_to_program_is_mapped_too() -> None:
    got, _ = _sum_kernel("n")
    k = Kernel(got.schedule()[-1].ast, PythonRenderer())
    assert to_program(k, 'evil"();').name == "k_evil2228293B"


def test_internal_prefix_avoids_every_taken_name() -> None:
    assert internal_prefix("_axis", ["n", "m"]) == "_axis"
    assert internal_prefix("_axis", ["_axis0"]) == "__axis"
    assert internal_prefix("_axis", ["_axis", "__axis3"]) == "___axis"


def _header(*names: tuple[UOps, str]) -> list[UOp]:
    out = []
    for i, (op, name) in enumerate(names):
        if op is UOps.DEFINE_GLOBAL:
            out.append(UOp(op, PtrDType.of(dtypes.float32), (), (i, name, True)))
        elif op is UOps.DEFINE_LOCAL:
            out.append(UOp(op, PtrDType.of(dtypes.float32), (), (name, 4)))
        else:
            out.append(UOp(op, dtypes.int32, (), (name, 0, 9)))
    return out


def test_check_names_refuses_what_the_core_would_never_declare() -> None:
    check_names(
        "E_4", _header((UOps.DEFINE_GLOBAL, "data0"), (UOps.DEFINE_VAR, "var_n"), (UOps.DEFINE_VAR, "core_end"))
    )
    with pytest.raises(ValueError, match="kernel name"):
        check_names("main", [])
    with pytest.raises(ValueError, match="not an identifier|expected an identifier"):
        check_names("E_4", _header((UOps.DEFINE_GLOBAL, "data0;")))
    with pytest.raises(ValueError, match="variable_identifier"):
        check_names("E_4", _header((UOps.DEFINE_VAR, "n")))
    with pytest.raises(ValueError, match="declare 'stage0'"):
        check_names("E_4", _header((UOps.DEFINE_LOCAL, "stage0"), (UOps.DEFINE_LOCAL, "stage0")))


def test_a_loop_index_is_never_confused_with_a_variable_named_like_it() -> None:
    # the linearizer's loop index of axis 0 of this kernel is a Variable in [0, 3]: a user's Variable with the same
    # name and bounds used to compare equal to it
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    for name in ("_axis0", "_axis1", "__axis0"):
        a = Tensor(x[:, :3].copy()).reshape(4, Variable(name, 0, 3).bind(3))
        np.testing.assert_array_equal((a * 2 + 1).sum(1).numpy(), (x[:, :3] * 2 + 1).sum(1))
