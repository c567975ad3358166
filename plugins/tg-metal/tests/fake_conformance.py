"""`python fake_conformance.py [tg-conformance options]`: tg-conformance on METAL in RUN mode, on any OS, over the
fake pyobjc Metal of fake_metal.py (two fake GPUs, so METAL:1 exists). tg-metal's own compiler, allocator and
runtime code runs; kernels run on this CPU (cpu_emulation.py). Slow: every kernel is built with a C++ compiler."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fake_metal as fake  # noqa: E402
import tg_metal  # noqa: E402
from tg_metal import context as metal_context  # noqa: E402
from tg_metal.syntax import ENV_CHECK, find_cxx  # noqa: E402


def main(argv: list[str]) -> int:
    cxx = find_cxx()
    if cxx is None:
        print("fake_conformance: no C++ front end (clang++, g++, c++) on PATH", file=sys.stderr)
        return 2
    metal = fake.metal_module(fake.Device(cxx), fake.Device(cxx, gpu="Second Fake GPU"))
    metal_context.import_metal = lambda: (metal, fake.dispatch_module())
    tg_metal._runs_here = tg_metal._is_mine
    os.environ.setdefault(ENV_CHECK, "0")  # the fake's compiler parses every kernel anyway
    from tg_conformance.cli import main as conformance

    return conformance(["--device", "METAL", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
