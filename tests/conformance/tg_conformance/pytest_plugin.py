"""The suite's command-line options, as a pytest plugin (entry point `pytest11`), so that
`python -m pytest --pyargs tg_conformance --device CLANG` parses them before it finds the package's conftest.

It only adds options; everything else (the device, fixtures, the report) lives in the package's conftest and is
active only when the conformance tests are collected."""
from __future__ import annotations

import pytest

OPTIONS: list[tuple[str, dict]] = [
    ("--device", {"default": None, "help": "tg-conformance: the device to test (default: $TG_CONFORMANCE_DEVICE, "
                                           "else tgcore's default device)"}),
    ("--compile-only", {"action": "store_true", "default": False,
                        "help": "tg-conformance: render and compile every kernel, run nothing on the device"}),
    ("--render-only", {"action": "store_true", "default": False,
                       "help": "tg-conformance: only render every kernel"}),
    ("--tg-json", {"default": None, "metavar": "PATH", "help": "tg-conformance: write the JSON report to PATH"}),
    ("--tg-level", {"default": None, "type": int, "metavar": "N",
                    "help": "tg-conformance: run levels 1 to N only"}),
    ("--tg-xfail-file", {"default": [], "action": "append", "metavar": "FILE",
                         "help": "tg-conformance: tests expected to fail, one id or pattern a line with '# reason'"}),
    ("--tg-skip-file", {"default": [], "action": "append", "metavar": "FILE",
                        "help": "tg-conformance: tests not to run, one id or pattern a line with '# reason'"}),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tg-conformance", "tgcore device conformance")
    for name, kwargs in OPTIONS:
        try:
            group.addoption(name, **kwargs)
        except ValueError:  # another plugin owns an option of that name: the suite reads that one
            pass
