"""The table printed at the end of a run, and the JSON report."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Optional

from bench.harness import Case, Result


def ratio(case: Case, tgcore_value: float, peer_value: float) -> float:
    """tgcore's figure over the best peer's, as a speed: above 1 tgcore is better, below 1 the peer is."""
    if case.higher_is_better:
        return tgcore_value / peer_value if peer_value else float("inf")
    return peer_value / tgcore_value if tgcore_value else float("inf")


def best_peer(case: Case, results: list[Result]) -> Optional[Result]:
    """The peer with the best figure on `case` among those whose result agrees with numpy."""
    peers = [r for r in results if r.case == case and r.framework != "tgcore" and r.status == "ok"]
    if not peers:
        return None
    key = (lambda r: r.value) if case.higher_is_better else (lambda r: -r.value)
    return max(peers, key=key)


def number(v: float) -> str:
    """Three significant digits, never in exponent notation for the sizes the benchmark prints."""
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}" if v >= 1e-3 else f"{v:.1e}"


def _cell(r: Optional[Result], best: Optional[Result]) -> str:
    if r is None:
        return ""
    if r.status == "skip":
        return "skip"
    if r.status == "error" or r.value is None:
        return "ERROR"
    text = number(r.value)
    if r.status == "mismatch":
        return f"{text} MISMATCH!"
    if r.framework == "tgcore" and best is not None and r.case.compare and r.value and best.value:
        return f"{text} ({number(ratio(r.case, r.value, best.value))}x)"
    if best is not None and r is best and r.case.compare:
        return f"{text}*"
    return text


def table(results: list[Result], runners: list[str], peers: list[str]) -> str:
    """The results as a table: one row per case, one column per tgcore device then per peer."""
    cases: list[Case] = []
    for r in results:
        if r.case not in cases:
            cases.append(r.case)
    # (a peer that only one workload runs, e.g. onnxruntime, gets its column after the others)
    extra = [r.runner for r in results if r.runner not in runners + peers]
    columns = [n for n in dict.fromkeys(runners + peers + extra) if any(r.runner == n for r in results)]
    rows = [["", "case", "unit", *columns]]
    for case in cases:
        mine = [r for r in results if r.case == case]
        best = best_peer(case, mine)
        cells = {r.runner: _cell(r, best) for r in mine}
        rows.append([f"{case.workload} {case.title}", case.case, case.unit, *(cells.get(c, "") for c in columns)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(cell.ljust(w) if j < 3 else cell.rjust(w) for j, (cell, w) in enumerate(zip(row, widths)))
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def notes(results: list[Result]) -> list[str]:
    """One line per skip, error and mismatch, with its reason."""
    out = []
    for r in results:
        if r.status != "ok" and r.note:
            label = {"skip": "skipped", "error": "ERROR", "mismatch": "MISMATCH against numpy"}[r.status]
            out.append(f"{r.runner} | {r.case.workload} {r.case.title} {r.case.case}: {label}: {r.note}")
    return out


def to_json(path: str, meta: dict[str, Any], results: list[Result]) -> None:
    """Write the run's settings, machine, and every result (with its timed runs and its ratio to the best peer)."""
    records = []
    for r in results:
        record = asdict(r)
        record["case"] = asdict(r.case)
        best = best_peer(r.case, results)
        if (
            r.framework == "tgcore"
            and r.status == "ok"
            and best is not None
            and r.case.compare
            and r.value
            and best.value
        ):
            record["best_peer"] = best.runner
            record["ratio_to_best_peer"] = ratio(r.case, r.value, best.value)
        records.append(record)
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": records}, f, indent=1, default=str)
        f.write("\n")
