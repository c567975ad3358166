"""The user's expectation files (`--xfail-file F`, `--skip-file F`): tests a young backend knows it fails or must not
run yet, each with the reason, so a run stays readable while the backend grows and shows what it gained.

One entry a line: a test id or pattern, then `#` and the reason, which is required:

    test_l3_uops.py::test_alu[SIN-float16]   # float16 sin is computed in float16: off by 3 ulp
    test_l6_*                                # the programs are not there yet

A pattern matches a test's id (`tests/test_l3_uops.py::test_alu[SIN-float16]`, with or without the leading
`tests/`) or its name (`test_alu[SIN-float16]`); `*` matches any characters and everything else matches itself
(`[`, `]` and spaces too, as test ids have them). Blank lines and lines that start with `#` are comments."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

SUITE_FOLDER = "tests/"  # the test modules' folder, which a pattern may leave out


class ExpectationFileError(ValueError):
    """An expectation file that cannot be read or has a line without a pattern or a reason."""


@dataclass
class Expectation:
    """One line of an expectation file."""

    pattern: str
    reason: str
    where: str  # "FILE:LINE"
    matched: int = 0
    _regex: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._regex = re.compile(".*".join(re.escape(part) for part in self.pattern.split("*")))

    def matches(self, nodeid: str, name: str) -> bool:
        candidates = (nodeid, nodeid.removeprefix(SUITE_FOLDER), name)
        return any(self._regex.fullmatch(c) for c in candidates)


def read_expectations(path: str, kind: str) -> list[Expectation]:
    """The entries of expectation file `path` (`kind` is "xfail" or "skip", for the messages)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ExpectationFileError(f"--{kind}-file {path}: cannot be read: {e}") from e
    entries = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        pattern, sep, reason = text.partition("#")
        pattern, reason = pattern.strip(), reason.strip()
        where = f"{path}:{number}"
        if not sep or not reason:
            raise ExpectationFileError(
                f"--{kind}-file {where}: {text!r} gives no reason; expected 'TEST-ID-OR-PATTERN  # why', "
                f"e.g. 'test_l3_uops.py::test_alu[SIN-float16]  # float16 sin is not accurate yet'")
        entries.append(Expectation(pattern, reason, where))
    return entries


def first_match(entries: list[Expectation], nodeid: str, name: str) -> Expectation | None:
    """The first entry that matches the test (and counts it), or None."""
    for entry in entries:
        if entry.matches(nodeid, name):
            entry.matched += 1
            return entry
    return None
