"""Bugs of tgcore itself (not of the device under test) that the suite has found and that are not fixed yet.

Each matching test is marked `xfail(strict=True)`: the run stays green, the bug stays visible in the table, and
the day the bug is fixed the test passes, fails as XPASS(strict), and its entry here must be deleted."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class KnownIssue:
    test: str  # the test's name with its parameters, e.g. "test_alu[MULACC-bfloat16]"
    reason: str  # what is wrong, and a minimal reproduction
    devices: Optional[tuple[str, ...]] = None  # the devices it shows on (canonical base names), None for every device


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
)


def known_issue(test_name: str, device: str) -> Optional[KnownIssue]:
    """The known core bug that test `test_name` shows on `device`, if any."""
    base = device.split(":")[0]
    for issue in KNOWN_ISSUES:
        if issue.test == test_name and (issue.devices is None or base in issue.devices):
            return issue
    return None
