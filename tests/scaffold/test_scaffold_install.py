"""What a backend author does with the scaffold, end to end: `python -m tgcore new-plugin NAME` in an empty folder,
`pip install <checkout> <checkout>/tests/conformance ./tg-NAME` into a fresh venv, the package's own tests, and
`tg-conformance --device NAME` passing with the generated code unchanged.

Slow (the venv's install takes a minute or two, the whole suite on a new device compiles hundreds of kernels):
run it through `tox -e scaffold`, or `pytest tests/scaffold`."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = "scaffoldci"
DEVICE = NAME.upper()
INSTALL_TIMEOUT_S = 1200
CONFORMANCE_TIMEOUT_S = 3600  # the limits turn a hang into a failure; a pass takes a few minutes


def _run(cmd: list[str], cwd: pathlib.Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited with {proc.returncode}\n{proc.stdout[-6000:]}{proc.stderr}"
    return proc


@pytest.mark.skipif(
    not any(shutil.which(cc) for cc in (os.environ.get("CC") or "gcc", "cc", "clang")),
    reason="no C compiler here: the generated device needs one",
)
def test_generated_plugin_installs_and_passes_conformance(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DEVICE", DEVICE)}
    env["CACHEDB"] = str(tmp_path / "cache.db")  # a cache of its own: every kernel is built by the new compiler
    _run([sys.executable, "-m", "tgcore", "new-plugin", NAME], tmp_path, env, 120)
    package = tmp_path / f"tg-{NAME}"
    assert (package / "pyproject.toml").is_file()

    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    bin_dir = tmp_path / "venv" / ("Scripts" if os.name == "nt" else "bin")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    python = str(bin_dir / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run(
        [*pip, str(ROOT), str(ROOT / "tests" / "conformance"), str(package), "pytest"], tmp_path, env, INSTALL_TIMEOUT_S
    )

    devices = _run([python, "-m", "tgcore", "devices"], tmp_path, env, 120).stdout
    assert any(line.split()[:2] == [DEVICE, NAME] and "available" in line for line in devices.splitlines()), devices
    _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests")], tmp_path, env, 600)

    report = tmp_path / "conformance.json"
    run = _run(
        [str(bin_dir / "tg-conformance"), "--device", DEVICE, "--json", str(report)],
        tmp_path,
        env,
        CONFORMANCE_TIMEOUT_S,
    )
    results = json.loads(report.read_text())
    outcomes = {r["outcome"] for r in results["results"]}
    assert outcomes <= {"passed", "skipped", "xfailed"}, run.stdout[-6000:]
    assert {r["level"] for r in results["results"] if r["outcome"] == "passed"} == {1, 2, 3, 4, 5, 6}
    # skipped only for what the generated device does not claim: float16, bfloat16, host threads, shared memory
    claims = ("dtype float16", "dtype bfloat16", "Renderer.threads", "no workgroups with shared memory")
    assert [r for r in results["skip_reasons"] if not any(c in r for c in claims)] == []
