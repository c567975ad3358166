"""The pytest side of the suite: the device under test, its fixtures, and the report.

The options (--device, --compile-only, --render-only, --tg-json) come from `tg_conformance.pytest_plugin`. This
conftest is found when pytest collects the package, so everything here is lazy: the device is resolved once the
tests are collected (an unavailable device ends the run with exit code 2 and the reason)."""
from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np
import pytest

from tg_conformance.known_issues import known_issue
from tg_conformance.report import ConformanceReport
from tg_conformance.target import COMPILE, ENV_DEVICE, RENDER, RUN, Target, TargetUnavailable
from tg_conformance.uop_cases import seeded_rng
from tgcore.device import Device

_state: dict[str, Optional[object]] = {"target": None, "report": None}


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
        _state["report"] = ConformanceReport(target, _option(config, "--tg-json"))  # type: ignore[arg-type]
    return _state["target"]  # type: ignore[return-value]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tg_op(name): the row of the conformance table this test belongs to")
    _state["target"] = _state["report"] = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Resolve the device once the tests are known, and mark the tests of known core bugs xfail(strict=True)."""
    if not items:
        return
    target = resolve_target(config)
    if not target.executes:  # the known issues are wrong results: nothing to mark where nothing runs
        return
    for item in items:
        issue = known_issue(item.name, target.name)
        if issue is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=issue.reason))


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
