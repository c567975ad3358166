"""`python -m tgcore new-plugin NAME`: the names and their checks, the files written, and the generated plugin
registered directly and run against numpy (tests/scaffold installs it in a fresh venv and runs tg-conformance)."""

from __future__ import annotations

import importlib
import pathlib
import shutil
import sys
from typing import Any, Iterator

import numpy as np
import pytest

from tgcore import Device, Tensor
from tgcore.__main__ import main as tgcore_main
from tgcore.plugin import CompileError, plugin_module
from tgcore.registry import plugins
from tgcore.scaffold import ScaffoldError, plugin_files, plugin_names, write_plugin

NAME = "scaffoldunit"  # a device no plugin here registers


def test_names_follow_from_the_plugin_name() -> None:
    names = plugin_names("My_Dev")
    assert (names.name, names.device, names.package, names.distribution, names.cls) == (
        "my_dev",
        "MY_DEV",
        "tg_my_dev",
        "tg-my-dev",
        "MyDev",
    )


@pytest.mark.parametrize("bad", ["", "my-dev", "1dev", "_dev", "my dev", "dév", "tg.dev"])
def test_a_name_that_is_not_an_identifier_is_refused(bad: str, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ScaffoldError, match="not a valid identifier.*expected a letter followed by"):
        write_plugin(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("taken", ["python", "Python", "disk"])
def test_a_name_of_an_existing_device_is_refused(taken: str, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ScaffoldError, match=f"device {taken.upper()} already exists.*choose another name"):
        write_plugin(taken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_name_of_an_installed_plugin_is_refused(tmp_path: pathlib.Path) -> None:
    plugins.register(plugin_module("scaffoldtaken"), name="scaffoldtaken")  # a plugin that registers no device
    try:
        with pytest.raises(ScaffoldError, match="a plugin named 'scaffoldtaken' is already installed"):
            write_plugin("scaffoldtaken", tmp_path / "out")
    finally:
        plugins.unregister("scaffoldtaken")
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_empty_is_left_alone(tmp_path: pathlib.Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="not an empty folder"):
        write_plugin(NAME, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert write_plugin(NAME, tmp_path / "empty") == tmp_path / "empty"


def test_the_package_has_its_entry_point_and_every_part(tmp_path: pathlib.Path) -> None:
    tomllib = pytest.importorskip("tomllib")
    root = write_plugin(NAME, tmp_path / "pkg")
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == sorted(plugin_files(plugin_names(NAME)))
    assert written == sorted(
        [
            "pyproject.toml",
            "README.md",
            "tox.ini",
            f"tg_{NAME}/__init__.py",
            f"tg_{NAME}/compiler.py",
            f"tg_{NAME}/renderer.py",
            f"tg_{NAME}/runtime.py",
            f"tests/test_{NAME}.py",
        ]
    )
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == f"tg-{NAME}"
    assert project["project"]["entry-points"]["tgcore"] == {NAME: f"tg_{NAME}"}
    assert f"tg-conformance --device {NAME.upper()}" in (root / "tox.ini").read_text()
    for path in root.rglob("*"):
        if path.is_file():
            assert "@" not in path.read_text().replace("@hookimpl", ""), f"{path} keeps a template marker"
        if path.suffix == ".py":
            compile(path.read_text(), str(path), "exec")  # (a SyntaxError fails the test)


def test_the_command_writes_the_package_and_reports_bad_names(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tgcore_main(["new-plugin", NAME, "--dir", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / f"tg_{NAME}" / "__init__.py").is_file()
    assert f"device {NAME.upper()}" in capsys.readouterr().out
    assert tgcore_main(["new-plugin", "my-dev", "--dir", str(tmp_path / "bad")]) == 2
    assert "'my-dev' is not a valid identifier" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.fixture
def generated_plugin(tmp_path: pathlib.Path) -> Iterator[Any]:
    """The generated plugin's module, imported from its folder and registered directly; removed afterwards."""
    root = write_plugin(NAME, tmp_path / "pkg")
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(f"tg_{NAME}")
        plugins.register(module, name=NAME)
        yield module
    finally:
        if NAME in plugins.records:
            plugins.unregister(NAME)
        sys.path.remove(str(root))
        for mod in [m for m in sys.modules if m == f"tg_{NAME}" or m.startswith(f"tg_{NAME}.")]:
            del sys.modules[mod]


needs_cc = pytest.mark.skipif(
    not any(shutil.which(cc) for cc in ("gcc", "cc", "clang")), reason="no C compiler (gcc, cc, clang) here"
)


@needs_cc
def test_the_generated_plugin_runs_tensor_ops_against_numpy(generated_plugin: Any) -> None:
    device = NAME.upper()
    assert Device.status(device) is None
    a = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    b = np.array([0.5, -2.0, 3.0, 1.25], dtype=np.float32)
    got = (Tensor(a, device=device) * Tensor(b, device=device)).sum(axis=1).numpy()
    np.testing.assert_array_equal(got, (a * b).sum(axis=1))
    x = Tensor(np.arange(7, dtype=np.int32), device=device)
    np.testing.assert_array_equal((x * x - 3).numpy(), np.arange(7) ** 2 - 3)


@needs_cc
def test_the_generated_compiler_raises_compile_error_with_the_log(generated_plugin: Any) -> None:
    with pytest.raises(CompileError) as info:
        Device[NAME.upper()].compiler.compile("int broken( {")
    assert info.value.log.strip() and info.value.src == "int broken( {"


def test_without_a_compiler_the_device_says_so(generated_plugin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert "CC='no-such-compiler-here' was not found" in str(generated_plugin.probe())
