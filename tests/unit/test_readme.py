"""Every ```python block of the READMEs runs as printed, each in a fresh process in an empty working directory.

A block is skipped only when a module it imports is not installed, or a device it names is not available here; with
TGCORE_README_STRICT=1 (the clang tox env, which installs what the blocks import) a missing module fails instead.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tgcore import Device

ROOT = pathlib.Path(__file__).resolve().parents[2]
READMES = [
    ROOT / "README.md",
    *sorted((ROOT / "plugins").glob("*/README.md")),
    ROOT / "tests" / "conformance" / "README.md",
]
KNOWN_DEVICES = ("PYTHON", "CLANG", "LLVM", "OPENCL", "CUDA", "METAL", "DISK")
BLOCK_TIMEOUT_S = 600  # the training example takes ~20 s on CLANG and a few minutes on PYTHON


@dataclass(frozen=True)
class Block:
    """One fenced python block: where it starts (the line after its fence) and its code."""

    readme: pathlib.Path
    line: int
    code: str

    @property
    def where(self) -> str:
        """README path (relative to the repository when inside it) and line."""
        readme = self.readme.relative_to(ROOT) if self.readme.is_relative_to(ROOT) else self.readme
        return f"{readme}:{self.line}"

    @property
    def first_line(self) -> str:
        """The block's first line that is not blank."""
        return next((line for line in self.code.splitlines() if line.strip()), "")


_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def python_blocks(readme: pathlib.Path) -> list[Block]:
    """The ```python (or ```py) blocks of a markdown file, in order."""
    blocks: list[Block] = []
    lines = readme.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, language = match.group(1), match.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence[0] * len(fence)):
            end += 1
        if language in ("python", "py", "python3"):
            blocks.append(Block(readme, i + 2, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return blocks


ALL_BLOCKS = [block for readme in READMES if readme.exists() for block in python_blocks(readme)]


def imported_modules(code: str) -> list[str]:
    """The top-level names of the modules a block imports (absolute imports only)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.extend(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names))


def named_devices(code: str) -> list[str]:
    """The devices a block names in a string literal ("CLANG", "CLANG:1", ...)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":")[0].upper()
            if name in KNOWN_DEVICES and node.value.split(":")[0].isupper():
                names.append(node.value)
    return list(dict.fromkeys(names))


def missing_requirement(block: Block) -> str | None:
    """Why the block cannot run here (a module not installed, a device unavailable), or None."""
    for module in imported_modules(block.code):
        if importlib.util.find_spec(module) is None:
            if os.environ.get("TGCORE_README_STRICT", "0") != "0":
                pytest.fail(f"{block.where}: the block needs module {module!r}, which this test env must install")
            return f"needs module {module!r}, which is not installed"
    for device in named_devices(block.code):
        if (reason := Device.status(device)) is not None:
            return f"needs device {device}, not available here: {reason}"
    return None


def test_the_readmes_have_python_blocks() -> None:
    assert any(block.readme == ROOT / "README.md" for block in ALL_BLOCKS), "README.md has no ```python block"


def test_block_extraction(tmp_path: pathlib.Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# title\n"
        "\n"
        "    pip install x      # an indented shell block: not run\n"
        "\n"
        "```python\n"
        "a = 1\n"
        "\n"
        "print(a)\n"
        "```\n"
        "```sh\n"
        "rm -rf /\n"
        "```\n"
        "````python\n"
        "s = '```'\n"
        "````\n"
        "```\n"
        "table, no language\n"
        "```\n"
        "~~~py\n"
        "b = 2\n"
        "~~~\n",
        encoding="utf-8",
    )
    blocks = python_blocks(readme)
    assert [(b.line, b.code) for b in blocks] == [(6, "a = 1\n\nprint(a)\n"), (14, "s = '```'\n"), (20, "b = 2\n")]
    assert blocks[0].first_line == "a = 1"
    assert imported_modules("import os.path\nfrom tgcore.nn import Linear\nfrom . import x\n") == ["os", "tgcore"]
    code = 'Tensor([1], device="CLANG").to("LLVM:1")\nprint("clang", "PYTHONPATH")'
    assert sorted(named_devices(code)) == ["CLANG", "LLVM:1"]


def test_what_a_block_needs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    monkeypatch.delenv("TGCORE_README_STRICT", raising=False)
    assert missing_requirement(Block(readme, 1, "import numpy\nfrom tgcore import Tensor\n")) is None
    absent = Block(readme, 1, "import tgcore_no_such_module_here\n")
    assert missing_requirement(absent) == "needs module 'tgcore_no_such_module_here', which is not installed"
    unavailable = [d for d in KNOWN_DEVICES if Device.status(d) is not None]
    if unavailable:  # on a machine with every device the check cannot be made, and there is nothing to skip
        reason = missing_requirement(Block(readme, 1, f'Tensor([1.0], device="{unavailable[0]}")\n'))
        assert reason is not None and reason.startswith(f"needs device {unavailable[0]}, not available here: ")
    monkeypatch.setenv("TGCORE_README_STRICT", "1")
    with pytest.raises(pytest.fail.Exception, match="must install"):
        missing_requirement(absent)


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.where for block in ALL_BLOCKS])
def test_readme_block_runs(block: Block, tmp_path: pathlib.Path) -> None:
    if (reason := missing_requirement(block)) is not None:
        pytest.skip(f"{block.where} ({block.first_line!r}) {reason}")
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    # as a reader runs it: tgcore picks its own default device (the unit tests' conftest sets DEVICE=PYTHON), and
    # a cache of its own, so nothing of the reader's cache is read or written
    env = {k: v for k, v in os.environ.items() if k != "DEVICE"}
    env["CACHEDB"] = str(tmp_path / "cache.db")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    if proc.returncode != 0:
        error = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
        pytest.fail(
            f"{block.where}: the block starting {block.first_line!r} fails: {error}\n"
            f"--- stderr ---\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
