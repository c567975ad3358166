"""Failures grouped by root cause: one broken compiler flag fails hundreds of tests with one message, and the
report should say so once, with the count and the first test that shows it, instead of hundreds of times.

A failure's cause is the first line of its message with what varies from test to test taken out: the test's own
parameters (op, dtype, size, ...), numbers, addresses and temporary paths."""
from __future__ import annotations

import re
import tempfile
from typing import Any

MAX_CAUSE = 240  # characters of a cause kept in the report
MAX_EXAMPLES = 5  # tests named beside a group's first one in the terminal

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
# a number that is not part of a name (int8, gidx0 and sm_75 stay), with its sign, fraction and exponent
_NUMBER = re.compile(r"(?<![A-Za-z_0-9.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![A-Za-z_0-9])")
_SPACES = re.compile(r"\s+")


def _parameter_texts(params: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, placeholder) for every parameter value of a test, longest text first, so that `float16` goes before
    a `float1` inside it."""
    texts: dict[str, str] = {}
    for name, value in params.items():
        for text in {str(value), str(getattr(value, "short_name", "")), str(getattr(value, "name", ""))}:
            if len(text) >= 2 and not text.isdigit():  # a digit parameter is a number: the number rule takes it
                texts.setdefault(text, f"<{name}>")
    return sorted(texts.items(), key=lambda kv: -len(kv[0]))


def normalize(message: str, params: dict[str, Any] | None = None) -> str:
    """The cause of a failure whose message's first line is `message`: the same text for the same error in
    different tests."""
    text = message
    for value, placeholder in _parameter_texts(params or {}):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", placeholder, text)
    text = text.replace(tempfile.gettempdir(), "<tmp>")
    text = re.sub(r"<tmp>/\S*", "<tmp>/...", text)
    text = _ADDRESS.sub("0x?", text)
    text = _NUMBER.sub("N", text)
    text = _SPACES.sub(" ", text).strip()
    return text if len(text) <= MAX_CAUSE else text[:MAX_CAUSE - 4] + " ..."


def first_line(lines: list[str]) -> str:
    """The line of a failure's message that names its cause: the first that is not blank."""
    return next((line.strip() for line in lines if line.strip()), "failed without a message")


def group_failures(failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed results (report entries with "cause") in groups of one cause, the most common first; each group
    keeps its count, its tests' ids, and its first test (in the order they ran) as the repro."""
    groups: dict[str, dict[str, Any]] = {}
    for r in failed:
        group = groups.setdefault(r["cause"], {"cause": r["cause"], "count": 0, "first": r, "tests": []})
        group["count"] += 1
        group["tests"].append(r["nodeid"])
    return sorted(groups.values(), key=lambda g: -g["count"])  # sorted() is stable: ties keep the run's order
