"""The run's report: every test's outcome labelled (level, op, dtype), the op x dtype table, skip reasons,
the failures with their repro lines, and the JSON file."""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter, defaultdict
from typing import Any, Optional

import pytest

from tg_conformance import __version__ as conformance_version
from tg_conformance.causes import MAX_EXAMPLES, first_line, group_failures, normalize
from tg_conformance.provenance import run_environment
from tg_conformance.target import COMPILE, RENDER, RUN, Target
from tgcore.plugin import ALL_DTYPES

LEVELS = {1: "allocator", 2: "compiler", 3: "uops", 4: "tensor ops", 5: "engine", 6: "programs"}
_SHORT = {"bool": "bool", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
          "uint32": "u32", "int64": "i64", "uint64": "u64", "float16": "f16", "bfloat16": "bf16", "float32": "f32",
          "float64": "f64", "-": "-"}
_COLUMNS = [dt.short_name for dt in ALL_DTYPES] + ["-"]
MAX_REPRO_LINES = 16
MAX_LINE = 600
MAX_OP_WIDTH = 26
MAX_VERDICT_CAUSE = 200
_MODE_FLAG = {RUN: "", COMPILE: " --compile-only", RENDER: " --render-only"}


def _label(value: Any) -> str:
    if hasattr(value, "short_name"):
        return str(value.short_name)
    if hasattr(value, "name") and not isinstance(value, str):
        return str(value.name)
    return str(value)


def labels_of(item: pytest.Item) -> tuple[int, str, str]:
    """(level, op, dtype) of a test: level from its module (test_l<N>_...), op from its `op` parameter or name
    (plus `->dst` for conversions), dtype from its `dtype` parameter ("-" when it has none)."""
    module = getattr(item, "module", None)
    match = re.search(r"test_l(\d)_", getattr(module, "__name__", ""))
    level = int(match.group(1)) if match else 0
    params = getattr(getattr(item, "callspec", None), "params", {})
    marker = item.get_closest_marker("tg_op")
    func = getattr(item, "originalname", item.name).removeprefix("test_")
    op = _label(params["op"]) if "op" in params else func
    if marker:
        op = f"{marker.args[0]} {op}" if "op" in params else marker.args[0]
    if "dst" in params:
        op = f"{op}->{_label(params['dst'])}"
    dtype = _label(params["dtype"]) if "dtype" in params else "-"
    return level, op, dtype


class ConformanceReport:
    """Collects the outcomes (fed by the conftest's hooks) and prints / writes the report at the end."""

    def __init__(self, target: Target, json_path: Optional[str], options: Optional[dict[str, Any]] = None) -> None:
        self.target, self.json_path = target, json_path
        self.options = options or {}  # what selected the tests (level, expectation files), for the JSON
        self.unmatched: list[str] = []  # the expectation files' entries that match no test of the suite
        self.results: dict[str, dict[str, Any]] = {}
        self.start = time.perf_counter()

    def record_makereport(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
        level, op, dtype = labels_of(item)
        entry = self.results.setdefault(item.nodeid, {
            "nodeid": item.nodeid, "test": item.name, "level": level, "op": op, "dtype": dtype, "outcome": "passed",
            "duration_s": 0.0})
        entry["duration_s"] = round(entry["duration_s"] + report.duration, 4)
        if report.failed and "repro" not in entry:  # the suite's assertion messages are the repro lines
            if call.excinfo is None:
                text = str(report.longrepr)
            elif isinstance(exc := call.excinfo.value, (AssertionError, pytest.fail.Exception)):
                text = str(exc)
            else:
                text = f"{type(exc).__name__}: {exc}"
            entry["repro"] = text.strip().splitlines() or [f"{report.when} failed"]
            self._add_cause(entry, item)

    def _add_cause(self, entry: dict[str, Any], item: Optional[pytest.Item]) -> None:
        """The failure's first line, its cause (that line without what varies between tests) and its rerun."""
        line = first_line(entry.get("repro", []))
        params = getattr(getattr(item, "callspec", None), "params", {}) if item is not None else {}
        entry["error"] = line
        entry["cause"] = normalize(line, params)
        mode = _MODE_FLAG[self.target.mode]
        entry["rerun"] = f"tg-conformance --device {self.target.name}{mode} -k '{entry['test']}'"

    def record_logreport(self, report: pytest.TestReport) -> None:
        entry = self.results.get(report.nodeid)
        if entry is None:
            return
        xfail = hasattr(report, "wasxfail")
        if report.failed:
            entry["outcome"] = "failed"
            if report.when != "call" and "repro" not in entry:
                entry["repro"] = [f"error in {report.when}"]
                self._add_cause(entry, None)
        elif report.skipped and entry["outcome"] != "failed":
            if xfail:
                entry["outcome"], entry["reason"] = "xfailed", str(report.wasxfail)
            else:
                entry["outcome"] = "skipped"
                longrepr = report.longrepr
                reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
                entry["reason"] = reason.removeprefix("Skipped: ")
        elif report.passed and report.when == "call" and xfail:
            entry["outcome"], entry["reason"] = "xpassed", str(report.wasxfail)

    # ***** the summary *****

    def counts(self) -> Counter:
        return Counter(r["outcome"] for r in self.results.values())

    def table(self) -> dict[str, dict[str, dict[str, str]]]:
        """{level: {op: {dtype: cell}}} with cell one of ok / FAIL / xfail / skip (render / compile in those modes)."""
        cells: dict[tuple[int, str, str], list[str]] = defaultdict(list)
        for r in self.results.values():
            cells[(r["level"], r["op"], r["dtype"])].append(r["outcome"])
        ok = {RUN: "ok", COMPILE: "comp", RENDER: "rend"}[self.target.mode]
        out: dict[str, dict[str, dict[str, str]]] = {}
        for (level, op, dtype), outcomes in cells.items():
            if "failed" in outcomes:
                cell = "FAIL"
            elif "passed" in outcomes or "xpassed" in outcomes:
                cell = ok
            elif "xfailed" in outcomes:
                cell = "xfail"
            else:
                cell = "skip"
            out.setdefault(str(level), {}).setdefault(op, {})[dtype] = cell
        return out

    def skip_reasons(self) -> Counter:
        return Counter(r["reason"] for r in self.results.values() if r["outcome"] == "skipped")

    def verdict(self) -> str:
        """One line: PASS or FAIL, how many of the tests that ran passed, and the first failure with its error."""
        counts = self.counts()
        ran = sum(counts[k] for k in ("passed", "failed", "xfailed", "xpassed"))
        passed = counts["passed"] + counts["xpassed"]
        others = [f"{counts[k]} {k}" for k in ("failed", "xfailed", "xpassed", "skipped") if counts[k]]
        word = "FAIL" if counts["failed"] else "PASS" if ran else "NO TEST RAN"
        line = (f"tg-conformance {self.target.name} ({self.target.mode} mode): {word}"
                f": {passed} of {ran} passed" + (f" ({', '.join(others)})" if others else ""))
        first = next((r for r in self.results.values() if r["outcome"] == "failed"), None)
        if first is not None:
            error = first.get("error", "")
            if len(error) > MAX_VERDICT_CAUSE:
                error = error[:MAX_VERDICT_CAUSE - 4] + " ..."
            line += f"; first failure: {first['nodeid']}: {error}"
        return line

    def failure_groups(self) -> list[dict[str, Any]]:
        """The failures grouped by cause, the most common first (see tg_conformance.causes)."""
        return group_failures([r for r in self.results.values() if r["outcome"] == "failed"])

    def summarize(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if tr.config.option.collectonly:
            return
        elapsed = time.perf_counter() - self.start
        t = self.target
        counts = self.counts()
        verdict = self.verdict()
        tr.write_sep("=", f"tg-conformance: {t.name} ({t.mode} mode)")
        tr.write_line(verdict, bold=True, red=bool(counts["failed"]), green=not counts["failed"])
        table = self.table()
        used = [c for c in _COLUMNS if any(c in row for ops in table.values() for row in ops.values())]
        width = min(MAX_OP_WIDTH, max([len(op) for ops in table.values() for op in ops] + [10])) + 2
        header = "op".ljust(width) + "".join(_SHORT[c].rjust(6) for c in used)
        for level in sorted(table, key=int):
            tr.write_line("")
            tr.write_line(f"level {level}: {LEVELS.get(int(level), '?')}", bold=True)
            tr.write_line(header)
            for op, row in table[level].items():
                name = op if len(op) <= MAX_OP_WIDTH else op[:MAX_OP_WIDTH - 3] + "..."
                line = name.ljust(width) + "".join(row.get(c, ".").rjust(6) for c in used)
                tr.write_line(line, red="FAIL" in row.values())
        tr.write_line("")
        reasons = self.skip_reasons()
        if reasons:
            tr.write_line("skipped, by reason:", bold=True)
            for reason, n in reasons.most_common():
                tr.write_line(f"  {n:5d} x {reason}")
        xpassed = [r for r in self.results.values() if r["outcome"] == "xpassed"]
        if xpassed:
            tr.write_line("")
            tr.write_line(f"expected to fail, but passed ({len(xpassed)}): remove them from the xfail file", bold=True)
            for r in xpassed:
                tr.write_line(f"  XPASS {r['nodeid']}  ({r.get('reason', '')})", green=True)
        if self.unmatched:
            tr.write_line("")
            tr.write_line(f"expectation file entries that match no test ({len(self.unmatched)}):", bold=True)
            for entry in self.unmatched:
                tr.write_line(f"  {entry}")
        groups = self.failure_groups()
        if groups:
            tr.write_line("")
            tr.write_line(f"failures ({counts['failed']}), by cause ({len(groups)}):", bold=True, red=True)
            for g in groups:
                first = g["first"]
                tr.write_line(f"{g['count']:5d} x {g['cause']}", red=True)
                tr.write_line(f"        first: {first['nodeid']}")
                lines = first.get("repro", [])
                for line in lines[:MAX_REPRO_LINES]:
                    tr.write_line(f"          {line if len(line) <= MAX_LINE else line[:MAX_LINE] + ' ...'}")
                if len(lines) > MAX_REPRO_LINES:
                    tr.write_line(f"          ... ({len(lines) - MAX_REPRO_LINES} more lines in the JSON report)")
                tr.write_line(f"        rerun: {first['rerun']}")
                others = g["tests"][1:]
                if others:
                    more = f" and {len(others) - MAX_EXAMPLES} more" if len(others) > MAX_EXAMPLES else ""
                    tr.write_line(f"        also: {', '.join(others[:MAX_EXAMPLES])}{more}")
        if self.json_path:
            self.write_json(self.json_path, elapsed, table, verdict, groups)
            tr.write_line("")
            tr.write_line(f"JSON report: {self.json_path}")

    def write_json(self, path: str, elapsed: float, table: dict[str, Any], verdict: str,
                   groups: list[dict[str, Any]]) -> None:
        t = self.target
        data = {
            "verdict": verdict,
            "device": t.name,
            "mode": t.mode,
            **run_environment(t),
            "tg_conformance_version": conformance_version,
            "options": self.options,
            "spec": {"dtypes": [dt.short_name for dt in t.spec.dtypes],
                     "tolerances": {dt.short_name: list(v) for dt, v in t.spec.tolerances.items()}},
            "duration_s": round(elapsed, 3),
            "summary": dict(self.counts()),
            "failure_groups": [{"cause": g["cause"], "count": g["count"], "first": g["first"]["nodeid"],
                                "error": g["first"].get("error", ""), "repro": g["first"].get("repro", []),
                                "rerun": g["first"]["rerun"], "tests": g["tests"]} for g in groups],
            "skip_reasons": dict(self.skip_reasons()),
            "expectations_unmatched": self.unmatched,
            "table": table,
            "results": list(self.results.values()),
        }
        # written beside its place and renamed into it: a run killed meanwhile leaves the last complete report
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
