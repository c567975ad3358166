"""`tg-conformance --device NAME`: run the suite on one device, print the op x dtype table, write the JSON report."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import pytest

from tg_conformance.target import COMPILE, ENV_DEVICE, RENDER, RUN, Target, TargetUnavailable
from tgcore.device import Device


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tg-conformance", description="Run the tgcore conformance suite on one device.")
    p.add_argument("--device", help=f"device to test, e.g. CLANG (default: ${ENV_DEVICE}, else tgcore's default)")
    p.add_argument("--json", metavar="PATH",
                   help="where to write the JSON report (default: tg-conformance-<device>.json)")
    p.add_argument("-k", metavar="EXPR", help="only run tests matching the pytest keyword expression EXPR")
    p.add_argument("-x", action="store_true", help="stop at the first failure")
    p.add_argument("-v", action="store_true", help="list every test as it runs")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compile-only", action="store_true",
                      help="render and compile every kernel without running anything on the device (the level-6 "
                           "programs run on a host device: $TG_CONFORMANCE_HOST, else tgcore's default, else PYTHON)")
    mode.add_argument("--render-only", action="store_true", help="only render every kernel")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    name = args.device or os.environ.get(ENV_DEVICE) or Device.DEFAULT
    mode = COMPILE if args.compile_only else RENDER if args.render_only else RUN
    try:
        target = Target.resolve(name, mode)
    except TargetUnavailable as e:
        print(f"tg-conformance: device {name} is unavailable: {e}", file=sys.stderr)
        return 2
    json_path = args.json or f"tg-conformance-{target.name.replace(':', '_')}.json"
    suite = os.path.dirname(os.path.abspath(__file__))
    pytest_args = [suite, "--device", target.name, "--tg-json", json_path, "-p", "tg_conformance.pytest_plugin",
                   "-p", "no:cacheprovider", "--tb=no", "-rN", "-q" if not args.v else "-v", "--rootdir", suite,
                   # this process imported tg_conformance before pytest started: its plugin cannot be rewritten
                   "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.k:
        pytest_args += ["-k", args.k]
    if args.x:
        pytest_args.append("-x")
    if mode != RUN:
        pytest_args.append(f"--{mode}-only")
    return int(pytest.main(pytest_args))


if __name__ == "__main__":
    sys.exit(main())
