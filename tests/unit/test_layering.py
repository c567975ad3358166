"""The layering of tgcore/: its import graph, built from the source, has no cycle, and the plugin contract
(tgcore/plugin.py) is the ground floor, importing nothing of the engine."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tgcore"
# what the contract may import besides the standard library: the two third-party libraries a plugin already has,
# and the core's leaf modules (each imports only the standard library and numpy)
CONTRACT_MAY_IMPORT = {"numpy", "pluggy", "tgcore.dtype", "tgcore.helpers", "tgcore.errors", "tgcore.compile_errors"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether `node` sits inside `if TYPE_CHECKING:` (type names only: never imported when the code runs)."""
    while (node := parents.get(node)) is not None:  # type: ignore[assignment]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _in_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while (node := parents.get(node)) is not None:  # type: ignore[assignment]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules `path` imports when it runs, at module level and inside functions (not under TYPE_CHECKING). At
    module level an `import a.b.c` imports the packages a and a.b too; inside a function only a.b.c counts: a function
    runs after every module-level import is done, so the packages it passes through are loaded already."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from tgcore.engine import realize` imports the module tgcore.engine.realize
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            if _in_function(node, parents):
                found.add(target)
                continue
            parts = target.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    found.discard(me)
    return found


def import_graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) & modules for f in files}


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One cycle of `graph` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
        # a package's __init__ runs before its modules: importing tgcore.x.y runs tgcore.x, which is not a cycle
        # unless tgcore.x itself imports back
        for nxt in sorted(graph.get(node, ())):
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_graph_is_read_from_the_source():
    graph = import_graph()
    assert "tgcore.dtype" in graph["tgcore.plugin"]
    assert "tgcore.plugin" in graph["tgcore.registry"]
    assert "tgcore.engine.runner" in graph["tgcore.engine.realize"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_tgcore():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_contract_is_the_ground_floor():
    tree = ast.parse((PACKAGE / "plugin.py").read_text())
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    modules = {module_name(f) for f in PACKAGE.rglob("*.py")}
    outside = set()
    for target in imports_of(PACKAGE / "plugin.py", modules):
        top = target.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__" or target == "tgcore":
            continue
        if target not in CONTRACT_MAY_IMPORT:
            outside.add(target)
    assert not outside, f"tgcore/plugin.py imports {sorted(outside)}: the contract must import nothing of the engine"
    # and the names that moved above it are forwarded by name only (importlib), never by an import statement
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "tgcore.registry"]
    assert parents  # (the tree was read)


@pytest.mark.parametrize("name", ["tgcore.plugin", "tgcore.registry", "tgcore.engine.runner"])
def test_modules_import_on_their_own(name):
    import importlib

    assert importlib.import_module(name).__name__ == name
