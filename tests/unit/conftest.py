"""Unit tests run on the built-in PYTHON device: no plugin is needed, whatever is installed."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

# set before tgcore picks its default device (Device.DEFAULT is resolved lazily, on first use)
os.environ["DEVICE"] = "PYTHON"

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _python_default_device() -> None:
    """Make PYTHON the default device even if tgcore was imported before this conftest."""
    from tgcore import Device

    Device.DEFAULT = "PYTHON"


@pytest.fixture
def registered() -> Iterator[Callable[[Any], Any]]:
    """Register plugin objects on the process's plugin manager; each is unregistered after the test."""
    from tgcore.registry import plugins

    names: list[str] = []

    def register(plugin: Any) -> Any:
        names.append(plugin.__name__)
        return plugins.register(plugin)

    yield register
    for n in names:
        if n in plugins.records:
            plugins.unregister(n)
