"""Packaging a user can trust: every distribution of this repository pins the tgcore it was built for, no pin can be
met by the unrelated project named tgcore on PyPI (1.0.98 and rising), and the versions agree with the packages'.

With TGCORE_WHEELHOUSE set to a folder of wheels of every distribution (`tox -e packaging` builds one), each
plugin and tg-conformance is installed from it into a fresh venv, the package index giving only third-party
dependencies, and must come with this tgcore and list its device in `python -m tgcore devices`."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGINS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))
DISTRIBUTIONS = [ROOT, *PLUGINS, ROOT / "tests" / "conformance"]
UNRELATED_TGCORE = ("1.0.98", "1.0.99", "1.1", "2.0.0", "2.1.0", "10")  # PyPI's, and releases it may make
ENV_WHEELHOUSE = "TGCORE_WHEELHOUSE"


def project(folder: pathlib.Path) -> dict:
    with open(folder / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def core_version() -> Version:
    return Version(project(ROOT)["version"])


def package_version(folder: pathlib.Path) -> str:
    """`__version__` of the distribution's one top-level package, read from its source."""
    name = project(folder)["name"].replace("-", "_")
    text = (folder / name / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    assert match, f"{folder / name / '__init__.py'} sets no __version__"
    return match.group(1)


def tgcore_pin(folder: pathlib.Path) -> SpecifierSet:
    reqs = [Requirement(r) for r in project(folder).get("dependencies", [])]
    pins = [r for r in reqs if r.name == "tgcore"]
    assert len(pins) == 1, f"{folder}/pyproject.toml: expected one tgcore requirement, got {pins}"
    return pins[0].specifier


def test_the_core_version_names_the_plugin_api_major() -> None:
    """tgcore's version is 0.<plugin API major>.<release>, below 1 where the unrelated project's never are."""
    version = core_version()
    assert version.major == 0 and version < Version("1.0.98"), version
    plugin = pytest.importorskip("tgcore.plugin")
    api = plugin.PLUGIN_API_VERSION
    major = api[0] if isinstance(api, tuple) else api
    if major < 2:
        pytest.skip(f"this core serves plugin API {api}, which predates the 0.<API major> version scheme")
    assert version.minor == major, f"tgcore {version} serves plugin API {api}: its version must be 0.{major}.x"


@pytest.mark.parametrize("folder", DISTRIBUTIONS[1:], ids=lambda f: project(f)["name"])
def test_every_distribution_pins_this_core_and_never_the_unrelated_one(folder: pathlib.Path) -> None:
    pin = tgcore_pin(folder)
    version = core_version()
    assert pin.contains(version), f"{project(folder)['name']} pins tgcore{pin}, which excludes this core {version}"
    assert not pin.contains(f"{version.major}.{version.minor + 1}.0"), \
        f"{project(folder)['name']} pins tgcore{pin}: it must stop below the next plugin API major"
    for unrelated in UNRELATED_TGCORE:
        assert not pin.contains(unrelated), f"{project(folder)['name']}'s tgcore{pin} admits PyPI's tgcore {unrelated}"


@pytest.mark.parametrize("folder", DISTRIBUTIONS, ids=lambda f: project(f)["name"])
def test_versions_agree(folder: pathlib.Path) -> None:
    """The version in pyproject.toml is the package's `__version__`, and every distribution releases with the core."""
    assert project(folder)["version"] == package_version(folder) == str(core_version())


# ***** from a wheelhouse, into fresh venvs *****

def _venv(folder: pathlib.Path) -> pathlib.Path:
    """A fresh venv without pip (the outer pip installs into it): its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / ("Scripts" if os.name == "nt" else "bin") / "python"


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


# (distribution, its tgcore entry points: None for tg-conformance, which has none)
INSTALLS = [(project(f)["name"], project(f).get("entry-points", {}).get("tgcore")) for f in DISTRIBUTIONS[1:]]


@pytest.mark.parametrize("dist,entry_points", INSTALLS, ids=[d for d, _ in INSTALLS])
def test_install_from_the_wheelhouse(dist: str, entry_points: dict | None, tmp_path: pathlib.Path) -> None:
    wheelhouse = os.environ.get(ENV_WHEELHOUSE)
    if not wheelhouse:
        pytest.skip(f"${ENV_WHEELHOUSE} names no wheelhouse (tox -e packaging builds one and sets it)")
    python = _venv(tmp_path / "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    # ours from the wheelhouse alone, without dependencies; then the index gives only the third-party ones: the
    # core installed here already meets the plugin's pin, so pip keeps it
    _run([*pip, "--no-index", "--find-links", wheelhouse, "--no-deps", "tgcore", dist])
    _run([*pip, "--find-links", wheelhouse, "tgcore", dist])
    code = ("import importlib.metadata as m, tgcore, tgcore.plugin; "
            "print(m.version('tgcore'), tgcore.__version__, tgcore.plugin.ENTRY_POINT_GROUP)")
    version = str(core_version())
    assert _run([str(python), "-c", code], cwd=tmp_path).stdout.split() == [version, version, "tgcore"]
    listing = _run([str(python), "-m", "tgcore", "devices"], cwd=tmp_path).stdout
    if entry_points is not None:
        for name, module in entry_points.items():
            _run([str(python), "-c", f"import {module}"], cwd=tmp_path)
            row = rf"^{re.escape(name)}\s+{re.escape(version)}\s+entry point {re.escape(module)}\s+loaded"
            assert re.search(row, listing, re.M), f"plugin {name} {version} is not loaded:\n{listing}"
    else:  # tg-conformance: its command runs
        assert "--xfail-file" in _run([str(python.parent / "tg-conformance"), "--help"], cwd=tmp_path).stdout


def test_a_plugin_alone_brings_this_core(tmp_path: pathlib.Path) -> None:
    """`pip install --find-links WHEELHOUSE tg-clang`, the core not named: the plugin's pin chooses ours, not
    PyPI's."""
    wheelhouse = os.environ.get(ENV_WHEELHOUSE)
    if not wheelhouse:
        pytest.skip(f"${ENV_WHEELHOUSE} names no wheelhouse (tox -e packaging builds one and sets it)")
    python = _venv(tmp_path / "venv")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--find-links", wheelhouse,
          "tg-clang"])
    got = _run([str(python), "-c", "import importlib.metadata as m; print(m.version('tgcore'))"], cwd=tmp_path)
    assert got.stdout.strip() == str(core_version())
