"""tg-metal's tests import tg-conformance's level-3 case lists, whose tests carry the suite's `tg_op` marker."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tg_op(name): the row of tg-conformance's table a test belongs to")
