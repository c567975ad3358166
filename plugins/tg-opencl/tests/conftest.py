"""Where the OpenCL platform here cannot build kernels (its probe says why), the tests that build or run one skip with
that reason; those marked `no_build` (rendering, device selection, the probe itself) run everywhere."""

from __future__ import annotations

import pytest
from tg_opencl import probe


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "no_build: the test builds no OpenCL program, so it runs without a platform")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = probe()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"OPENCL is unavailable here: {reason}")
    for item in items:
        if item.get_closest_marker("no_build") is None:
            item.add_marker(skip)
