"""tg-conformance as a product: the run's own compile cache, failures grouped by cause, the verdict line, --level,
--xfail-file / --skip-file, and what the JSON report says of the plugin, the compiler and the machine.

The CLI runs in a fresh process (it sets CACHEDB before tgcore is imported) on FAKE, a device made here of PYTHON's
parts and a compiler that declares a cachekey and an identity, and that can be broken the way a bad flag breaks one
(every compile fails with one message whose numbers vary); each run selects a few tests with -k."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

import tgcore

pytest.importorskip("tg_conformance")

from tg_conformance.causes import group_failures, normalize  # noqa: E402
from tg_conformance.expectations import ExpectationFileError, first_match, read_expectations  # noqa: E402

FAKE_PLUGIN = '''
import dataclasses, itertools, os, sys
from tgcore.device import CompileError
from tgcore.plugin import hookimpl
from tgcore.registry import plugins
from tgcore.runtime import python as py

__version__ = "3.1.4"
calls = itertools.count(4000)

class FakeCompiler(py.PythonCompiler):
    cachekey = "tg_conformance_test_fake"
    identity = "fakecc 1.2.3 -O2"
    def compile(self, src):
        if os.environ.get("FAKE_BROKEN"):
            raise CompileError(f"fakecc: error: unknown option -mbroken (process {next(calls)} at 0x7f3a{next(calls)})",
                               log="", src=src)
        return super().compile(src)

@hookimpl
def tg_register_devices(registry):
    registry.add(dataclasses.replace(registry.specs["PYTHON"], name="FAKE", priority=0))
@hookimpl
def tg_renderer(device): return py.PythonRenderer() if device == "FAKE" else None
@hookimpl
def tg_compiler(device): return FakeCompiler() if device == "FAKE" else None
@hookimpl
def tg_allocator(device): return py.MallocAllocator() if device == "FAKE" else None
@hookimpl
def tg_runtime(device): return py.PythonProgram if device == "FAKE" else None

plugins.register(sys.modules[__name__], name="fake")
'''

RUNNER = '''
import sys
sys.path.insert(0, sys.argv[1])
import fake_plugin  # registers FAKE
from tg_conformance.cli import main
sys.exit(main(sys.argv[2:]))
'''

ALU_ADD = "test_l3 and test_alu and ADD and (int8 or int16 or int32)"  # 6 tests: 3 dtypes, signed and unsigned


@pytest.fixture
def run_cli(tmp_path: pathlib.Path):
    """Run tg-conformance on FAKE in a fresh process: (exit code, stdout, the JSON report or None)."""
    (tmp_path / "fake_plugin.py").write_text(FAKE_PLUGIN)
    (tmp_path / "runner.py").write_text(RUNNER)

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, dict | None]:
        report = tmp_path / "report.json"
        if report.exists():
            report.unlink()
        full_env = {k: v for k, v in os.environ.items() if k != "FAKE_BROKEN"}
        full_env.update({"CACHEDB": str(tmp_path / "user-cache.db"), "TMPDIR": str(tmp_path),
                         "TG_CONFORMANCE_JOBS": "1", **(env or {})})
        proc = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path), "--device", "FAKE",
                               "--json", str(report), *args], capture_output=True, text=True, env=full_env,
                              cwd=tmp_path, timeout=300)
        data = json.loads(report.read_text()) if report.exists() else None
        return proc.returncode, proc.stdout + proc.stderr, data

    return run


# ***** failure causes and expectation files, without a run *****

def test_normalize_strips_what_varies() -> None:
    a = normalize("ALU ADD on int8: compile failed: CompileError: cc exited 1 (pid 4242 at 0x7ffe12ab) in "
                  f"{os.path.join(tempfile.gettempdir(), 'tgcore-0', 'compile-8x1')}/k.c",
                  {"op": "ADD", "dtype": "int8"})
    b = normalize("ALU MUL on uint16: compile failed: CompileError: cc exited 1 (pid 77 at 0x5555) in "
                  f"{os.path.join(tempfile.gettempdir(), 'tgcore-0', 'compile-zz9')}/k.c",
                  {"op": "MUL", "dtype": "uint16"})
    assert a == b == "ALU <op> on <dtype>: compile failed: CompileError: cc exited N (pid N at 0x?) in <tmp>/..."
    # names that carry digits stay, and another error stays another cause
    assert normalize("unknown type float16 in gidx0", {}) == "unknown type float16 in gidx0"
    assert normalize("2 of 9 lanes differ", {}) != normalize("segfault", {})


def test_group_failures_counts_and_keeps_the_first() -> None:
    failed = [{"nodeid": f"t{i}", "cause": "A" if i % 3 else "B"} for i in range(7)]
    groups = group_failures(failed)
    assert [(g["cause"], g["count"], g["first"]["nodeid"]) for g in groups] == [("A", 4, "t1"), ("B", 3, "t0")]
    assert groups[1]["tests"] == ["t0", "t3", "t6"]


def test_expectation_files(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "xfail.txt"
    f.write_text("# comment\n\ntest_l3_uops.py::test_alu[SIN-float16]   # f16 sin\ntest_l6_*  # later\n"
                 "test_indexing[x[..., 1]]  # spaces and brackets\n")
    entries = read_expectations(str(f), "xfail")
    assert [(e.pattern, e.reason, e.where.rsplit(":", 1)[1]) for e in entries] == [
        ("test_l3_uops.py::test_alu[SIN-float16]", "f16 sin", "3"), ("test_l6_*", "later", "4"),
        ("test_indexing[x[..., 1]]", "spaces and brackets", "5")]
    assert first_match(entries, "tests/test_l3_uops.py::test_alu[SIN-float16]", "test_alu[SIN-float16]") is entries[0]
    # brackets are literal: [SIN-float16] is not a character class
    assert first_match(entries, "tests/test_l3_uops.py::test_alu[S-float16]", "test_alu[S-float16]") is None
    assert first_match(entries, "tests/test_l6_programs.py::test_mlp", "test_mlp") is entries[1]
    assert first_match(entries, "tests/test_l4_tensor.py::test_indexing[x[..., 1]]", "test_indexing[x[..., 1]]") \
        is entries[2]
    assert entries[0].matched == 1 and entries[1].matched == 1
    f.write_text("test_l6_*  # ok\ntest_l3_uops.py::test_alu[SIN-float16]\n")
    with pytest.raises(ExpectationFileError, match=r"xfail.txt:2: .* gives no reason"):
        read_expectations(str(f), "xfail")
    with pytest.raises(ExpectationFileError, match="cannot be read"):
        read_expectations(str(tmp_path / "missing.txt"), "skip")


# ***** the CLI, end to end on FAKE *****

def test_broken_compiler_is_one_cause_and_the_user_cache_is_untouched(run_cli, tmp_path: pathlib.Path) -> None:
    code, out, data = run_cli("-k", ALU_ADD, env={"FAKE_BROKEN": "1"})
    assert code == 1, out
    assert data is not None and data["summary"] == {"failed": 6}
    [group] = data["failure_groups"]
    assert group["count"] == 6 and len(group["tests"]) == 6
    assert group["cause"].startswith("ALU <op> on <dtype>: compile failed: CompileError: fakecc: error: unknown "
                                     "option -mbroken (process N at 0x?)")
    assert group["first"] == group["tests"][0] and group["rerun"].startswith("tg-conformance --device FAKE -k '")
    verdict = data["verdict"]
    assert verdict.startswith("tg-conformance FAKE (run mode): FAIL: 0 of 6 passed (6 failed); first failure: "
                              f"{group['first']}: ALU ")
    lines = out.strip().splitlines()
    summary_start = next(i for i, line in enumerate(lines) if "tg-conformance: FAKE (run mode) ==" in line)
    assert lines[summary_start + 1] == verdict and lines[-1] == verdict  # the report starts and ends with it
    assert "    6 x ALU <op> on <dtype>: compile failed" in out
    # the run's own cache took the compiles: the user's CACHEDB was never created, and the private one is gone
    assert not (tmp_path / "user-cache.db").exists()
    assert data["compile_cache"]["private"] and not os.path.exists(data["compile_cache"]["path"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tg-conformance-cache-")]


def test_json_names_plugin_compiler_and_machine_and_use_cache(run_cli, tmp_path: pathlib.Path) -> None:
    code, out, data = run_cli("-k", "test_trivial_kernel_runs", "--use-cache")
    assert code == 0, out
    assert data is not None and data["summary"] == {"passed": 1} and data["failure_groups"] == []
    assert data["verdict"] == "tg-conformance FAKE (run mode): PASS: 1 of 1 passed"
    assert data["plugin"]["name"] == "fake" and data["plugin"]["source"] == "registered"
    assert data["plugin"]["version"] == "3.1.4" and data["plugin"]["entry_point"] is None
    assert data["compiler"]["class"] == "fake_plugin.FakeCompiler"
    assert data["compiler"]["cachekey"] == "tg_conformance_test_fake"
    assert data["compiler"]["identity"] == "fakecc 1.2.3 -O2"
    assert data["tgcore_version"] == tgcore.__version__
    assert data["machine"]["os"] and data["machine"]["cpu"] and data["machine"]["arch"]
    # --use-cache: the user's cache holds the kernel
    assert data["compile_cache"] == {"path": str(tmp_path / "user-cache.db"), "private": False, "disabled": False}
    assert (tmp_path / "user-cache.db").exists()


def test_level_xfail_and_skip_files(run_cli, tmp_path: pathlib.Path) -> None:
    xfail, skip = tmp_path / "xfail.txt", tmp_path / "skip.txt"
    xfail.write_text("test_l1_allocator.py::test_allocator_as_buffer  # fixed since: reported as XPASS\n"
                     "test_alu[ADD-int8]  # the broken compile\n")
    skip.write_text("test_l1_allocator.py::test_allocator_offset_views*  # not yet\n")
    code, out, data = run_cli("--level", "1", "-k", "test_allocator_as_buffer or offset_views or test_alu",
                              "--xfail-file", str(xfail), "--skip-file", str(skip))
    assert code == 0, out
    assert data is not None and {r["level"] for r in data["results"]} == {1}  # test_alu is level 3
    outcomes = {r["test"]: (r["outcome"], r.get("reason", "")) for r in data["results"]}
    assert outcomes["test_allocator_as_buffer"][0] == "xpassed"
    assert outcomes["test_allocator_offset_views[256]"] == ("skipped", f"skip file {skip}:1: not yet")
    assert "XPASS tests/test_l1_allocator.py::test_allocator_as_buffer" in out
    assert data["verdict"].startswith("tg-conformance FAKE (run mode): PASS: 1 of 1 passed (1 xpassed, 2 skipped)")
    # the level-3 xfail failing as expected does not fail the run
    code, out, data = run_cli("-k", "test_alu and ADD and int8 and not uint8", "--xfail-file", str(xfail),
                              env={"FAKE_BROKEN": "1"})
    assert code == 0, out
    assert data is not None and data["summary"] == {"xfailed": 1}
    # a line without a reason stops the run before it starts
    xfail.write_text("test_alu[ADD-int8]\n")
    code, out, data = run_cli("--xfail-file", str(xfail))
    assert code == 4 and data is None
    assert f"{xfail}:1: 'test_alu[ADD-int8]' gives no reason" in out
