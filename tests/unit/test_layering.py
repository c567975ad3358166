"""The layering of tgcore/: its import graph, read from the source, has no cycle, and the plugin contract
(tgcore/plugin.py) is the ground floor, importing nothing of the engine."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tgcore"
THIRD_PARTY = {"numpy", "pluggy", "tqdm"}  # the core's dependencies
# what the contract may import of tgcore: leaf modules that import only the standard library, the core's dependencies
# and each other (test_contract_floor_is_closed checks it)
CONTRACT_MAY_IMPORT = {"tgcore.dtype", "tgcore.helpers", "tgcore.renderer.errors", "tgcore.scratch"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(f): f for f in sorted(PACKAGE.rglob("*.py"))}


def _inside(node: ast.AST, parents: dict[ast.AST, ast.AST], kinds: tuple[type, ...], test: str = "") -> bool:
    while (node := parents.get(node)) is not None:  # type: ignore[assignment]
        if isinstance(node, kinds) and (not test or test in ast.unparse(node.test)):  # type: ignore[attr-defined]
            return True
    return False


def imports_of(path: Path, functions: bool = True) -> set[str]:
    """The modules `path` imports when it runs (not under `if TYPE_CHECKING:`), with the imports inside functions when
    `functions`. At module level `import a.b.c` imports the packages a and a.b too; inside a function only a.b.c
    counts: a function runs after every module-level import is done, so the packages it passes are loaded already."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _inside(node, parents, (ast.If,), "TYPE_CHECKING"):
            continue
        in_function = _inside(node, parents, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if in_function and not functions:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from tgcore.engine import realize` imports the module tgcore.engine.realize
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            parts = target.split(".")
            found.update([target] if in_function else (".".join(parts[:i]) for i in range(1, len(parts) + 1)))
    found.discard(me)
    return found


def import_graph(functions: bool = True) -> dict[str, set[str]]:
    """tgcore's modules -> the tgcore modules each imports."""
    return {name: imports_of(path, functions) & set(MODULES) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One cycle of `graph` as a path [a, b, ..., a], or None. A module's edge to its own package (tgcore.x.y ->
    tgcore.x: the package runs first when the module is imported) is no cycle unless the package imports back."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
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
    assert {"tgcore.engine.runner", "tgcore.engine.search"} <= graph["tgcore.engine.realize"]
    assert "tgcore.codegen.linearizer" in graph["tgcore.codegen.program"]
    assert "tgcore.storage" in graph["tgcore.lazy"] and "tgcore.storage" in graph["tgcore.tensor"]
    assert not {"tgcore.lazy", "tgcore.tensor"} & graph["tgcore.storage"]  # (it makes their objects by type())
    assert not {"tgcore.lazy", "tgcore.multi", "tgcore.tensor"} & graph["tgcore.runtime.disk"]  # the device only


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"p.m": {"p"}, "p": set()}) is None


def test_no_import_cycle_at_module_level():
    cycle = find_cycle(import_graph(functions=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    "a, b",
    [
        ("tgcore.device", "tgcore.plugin"),
        ("tgcore.codegen.kernel", "tgcore.codegen.linearizer"),
        ("tgcore.engine.realize", "tgcore.engine.search"),
    ],
)
def test_the_named_circles_are_gone(a, b):
    graph = import_graph()
    assert not (b in graph[a] and a in graph[b]), f"{a} and {b} import each other"
    assert "tgcore.plugin" not in {a, b} or "tgcore.device" not in graph["tgcore.plugin"]


def test_no_import_cycle_with_function_level_imports():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _outside_floor(name: str) -> set[str]:
    """What module `name` imports that is neither the standard library, the core's dependencies nor the floor."""
    outside = set()
    for target in imports_of(MODULES[name]):
        top = target.split(".")[0]
        if top in sys.stdlib_module_names or top in THIRD_PARTY or target == "tgcore" or target in CONTRACT_MAY_IMPORT:
            continue
        if target == "tgcore.renderer" and name.startswith("tgcore.renderer."):  # (its own package: see find_cycle)
            continue
        outside.add(target)
    return outside


def test_contract_is_the_ground_floor():
    outside = _outside_floor("tgcore.plugin")
    assert not outside, f"tgcore/plugin.py imports {sorted(outside)}: the contract must import nothing of the engine"


def test_contract_floor_is_closed():
    for name in CONTRACT_MAY_IMPORT:
        assert not _outside_floor(name), f"{name}, which the contract imports, imports {_outside_floor(name)}"


def test_names_that_moved_above_the_contract_are_forwarded_not_imported():
    import tgcore.plugin as contract
    import tgcore.registry as registry

    assert "tgcore.registry" not in imports_of(MODULES["tgcore.plugin"])  # (but for type names)
    assert contract.plugins is registry.plugins and contract.PluginManager is registry.PluginManager
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        contract.nothing_here


@pytest.mark.parametrize("name", ["tgcore.plugin", "tgcore.registry", "tgcore.engine.runner", "tgcore.codegen.program"])
def test_modules_import(name):
    assert importlib.import_module(name).__name__ == name
