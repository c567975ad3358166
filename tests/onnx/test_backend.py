"""onnx's own backend suite (node, simple, pytorch-converted and pytorch-operator cases) on tgcore's default device.

tests/onnx/skips.txt lists every case expected to fail, each with its reason: those run as expected failures, so a
case that starts passing fails the run until its line is removed. TGCORE_ONNX_ALL=1 runs every case plainly (to
count what passes)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("onnx")
import onnx.backend.test  # noqa: E402

from tgcore.onnx import backend  # noqa: E402


def read_skips(path: Path) -> dict[str, str]:
    """pattern -> reason, from lines `PATTERN  reason`; '#' starts a comment line."""
    out = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{path.name}:{lineno}: {pattern!r} has no reason")
        re.compile(pattern)
        out[pattern] = reason.strip()
    return out


SKIPS = read_skips(Path(__file__).with_name("skips.txt"))
_suite = onnx.backend.test.BackendTest(backend, __name__)
if not os.environ.get("TGCORE_ONNX_ALL"):
    for _pattern in SKIPS:
        _suite.xfail(_pattern)

_KINDS = ("OnnxBackendNodeModelTest", "OnnxBackendSimpleModelTest", "OnnxBackendPyTorchConvertedModelTest",
          "OnnxBackendPyTorchOperatorModelTest")  # fmt: skip
globals().update({name: case for name, case in _suite.test_cases.items() if name in _KINDS})


def test_every_skip_has_a_reason() -> None:
    assert SKIPS and all(SKIPS.values())
