"""Unit tests run on the built-in PYTHON device: no plugin is needed, whatever is installed."""
from __future__ import annotations

import os

# set before tgcore picks its default device (Device.DEFAULT is resolved lazily, on first use)
os.environ["DEVICE"] = "PYTHON"

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _python_default_device() -> None:
    """Make PYTHON the default device even if tgcore was imported before this conftest."""
    from tgcore import Device

    Device.DEFAULT = "PYTHON"
