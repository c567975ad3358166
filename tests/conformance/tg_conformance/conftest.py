"""The pytest side of the suite: the device under test, its fixtures, and the report.

The options (--device, --compile-only, --render-only, --tg-json, --tg-level, --tg-xfail-file, --tg-skip-file)
come from `tg_conformance.pytest_plugin`. This conftest is found when pytest collects the package, so everything here
is lazy: the device is resolved once the tests are collected (an unavailable device ends the run with exit code 2 and
the reason)."""
from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np
import pytest

from tg_conformance.expectations import Expectation, ExpectationFileError, first_match, read_expectations
from tg_conformance.known_issues import known_issue
from tg_conformance.report import ConformanceReport, labels_of
from tg_conformance.target import COMPILE, ENV_DEVICE, RENDER, RUN, Target, TargetUnavailable
from tg_conformance.uop_cases import seeded_rng
from tgcore.device import Device

_state: dict[str, Optional[object]] = {"target": None, "report": None}
LEVEL_RANGE = range(1, 7)


def _option(config: pytest.Config, name: str) -> object:
    return config.getoption(name, default=None)


def resolve_target(config: pytest.Config) -> Target:
    """The target the options name, made once per session; exits the run with code 2 when it is unavailable."""
    if _state["target"] is None:
        if _option(config, "--compile-only") and _option(config, "--render-only"):
            raise pytest.UsageError("--compile-only and --render-only exclude each other")
        mode = COMPILE if _option(config, "--compile-only") else RENDER if _option(config, "--render-only") else RUN
        name = str(_option(config, "--device") or os.environ.get(ENV_DEVICE) or Device.DEFAULT)
        try:
            target = Target.resolve(name, mode)
        except TargetUnavailable as e:
            pytest.exit(f"tg-conformance: device {name} is unavailable: {e}", returncode=2)
        _state["target"] = target
        _state["report"] = ConformanceReport(target, _option(config, "--tg-json"),  # type: ignore[arg-type]
                                             options={"level": _option(config, "--tg-level"),
                                                      "xfail_files": _option(config, "--tg-xfail-file") or [],
                                                      "skip_files": _option(config, "--tg-skip-file") or [],
                                                      "keyword": _option(config, "keyword") or None})
    return _state["target"]  # type: ignore[return-value]


def _expectations(config: pytest.Config, kind: str) -> list[Expectation]:
    entries: list[Expectation] = []
    for path in _option(config, f"--tg-{kind}-file") or []:
        try:
            entries += read_expectations(str(path), kind)
        except ExpectationFileError as e:
            raise pytest.UsageError(str(e)) from e
    return entries


def _select_levels(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of levels above --tg-level."""
    level = _option(config, "--tg-level")
    if level is None:
        return
    if level not in LEVEL_RANGE:
        raise pytest.UsageError(f"--level {level}: expected a level from {LEVEL_RANGE[0]} to {LEVEL_RANGE[-1]}")
    kept = [item for item in items if labels_of(item)[0] <= level]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if labels_of(item)[0] > level])
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tg_op(name): the row of the conformance table this test belongs to")
    _state["target"] = _state["report"] = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the levels asked for, resolve the device once the tests are known, mark the tests of known core bugs
    xfail(strict=True), and apply the user's skip and xfail files (an xfail that passes is reported, not failed)."""
    skips, xfails = _expectations(config, "skip"), _expectations(config, "xfail")
    _select_levels(config, items)
    if not items:
        return
    target = resolve_target(config)
    for item in items:
        skip = first_match(skips, item.nodeid, item.name)
        if skip is not None:
            item.add_marker(pytest.mark.skip(reason=f"skip file {skip.where}: {skip.reason}"))
            continue
        # the known issues are wrong results: nothing to mark where nothing runs (pytest obeys the first xfail mark)
        issue = known_issue(item.name, target.name) if target.executes else None
        if issue is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=issue.reason))
        xfail = first_match(xfails, item.nodeid, item.name)
        if xfail is not None:
            item.add_marker(pytest.mark.xfail(strict=False, reason=f"xfail file {xfail.where}: {xfail.reason}"))
    report = _state["report"]
    if isinstance(report, ConformanceReport):
        report.unmatched = [f"{e.where}: {e.pattern}" for e in skips + xfails if not e.matched]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    if isinstance(_state["report"], ConformanceReport):
        _state["report"].record_makereport(item, call, outcome.get_result())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if isinstance(_state["report"], ConformanceReport):
        _state["report"].record_logreport(report)


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    if isinstance(_state["report"], ConformanceReport):
        _state["report"].summarize(terminalreporter)


@pytest.fixture(scope="session")
def target(pytestconfig: pytest.Config) -> Target:
    """The device under test."""
    return resolve_target(pytestconfig)


@pytest.fixture
def executing(target: Target) -> Target:
    """The device under test, for tests that execute on it (skipped in compile-only and render-only modes)."""
    target.require_execution()
    return target


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> Iterator[np.random.Generator]:
    """A generator seeded from the test's name: the same inputs on every run and every device."""
    yield seeded_rng(request.node.name)
