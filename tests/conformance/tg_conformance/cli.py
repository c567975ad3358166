"""`tg-conformance --device NAME`: run the suite on one device, print the op x dtype table, write the JSON report.

Nothing of tgcore is imported before the options are read: by default the run gets a compile cache of its own
(CACHEDB, which tgcore reads when it is imported), so a kernel another compiler built, or a build of the same
compiler with other flags, is never taken for this one's."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

from tg_conformance import ENV_PRIVATE_CACHE

ENV_DEVICE = "TG_CONFORMANCE_DEVICE"  # the device to test when --device is not given (as tg_conformance.target's)
USAGE_ERROR = 4  # pytest's exit code for bad options and files


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tg-conformance", description="Run the tgcore conformance suite on one device.")
    p.add_argument("--device", help=f"device to test, e.g. CLANG (default: ${ENV_DEVICE}, else tgcore's default)")
    p.add_argument("--json", metavar="PATH",
                   help="where to write the JSON report (default: tg-conformance-<device>.json)")
    p.add_argument("-k", metavar="EXPR", help="only run tests matching the pytest keyword expression EXPR")
    p.add_argument("-x", action="store_true", help="stop at the first failure")
    p.add_argument("-v", action="store_true", help="list every test as it runs")
    p.add_argument("--level", type=int, metavar="N", choices=range(1, 7),
                   help="run levels 1 to N only (1 allocator, 2 compiler, 3 uops, 4 tensor ops, 5 engine, 6 programs); "
                        "-k test_lN runs level N alone")
    p.add_argument("--xfail-file", action="append", default=[], metavar="FILE",
                   help="tests expected to fail: one test id or pattern a line, each with '# reason'; one that "
                        "passes is reported as XPASS and does not fail the run")
    p.add_argument("--skip-file", action="append", default=[], metavar="FILE",
                   help="tests not to run: one test id or pattern a line, each with '# reason'")
    p.add_argument("--use-cache", action="store_true",
                   help="use the user's compile cache (CACHEDB, default ~/.cache/tgcore/cache.db) instead of a "
                        "cache of this run's own, removed at its end")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compile-only", action="store_true",
                      help="render and compile every kernel without running anything on the device (the level-6 "
                           "programs run on a host device: $TG_CONFORMANCE_HOST, else tgcore's default, else PYTHON)")
    mode.add_argument("--render-only", action="store_true", help="only render every kernel")
    return p.parse_args(argv)


def _private_cache() -> str:
    """Point CACHEDB at a new, empty cache in a folder of its own, before tgcore reads it; the folder's path."""
    folder = tempfile.mkdtemp(prefix="tg-conformance-cache-")
    path = os.path.join(folder, "cache.db")
    os.environ["CACHEDB"] = os.environ[ENV_PRIVATE_CACHE] = path
    helpers = sys.modules.get("tgcore.helpers")
    if helpers is not None:  # tgcore was imported already (main() called from a program): it rereads the global
        helpers.CACHEDB = path  # type: ignore[attr-defined]
    return folder


def _check_expectation_files(args: argparse.Namespace) -> Optional[str]:
    """The first problem of the --xfail-file / --skip-file files, before anything runs."""
    from tg_conformance.expectations import ExpectationFileError, read_expectations

    for kind, paths in (("xfail", args.xfail_file), ("skip", args.skip_file)):
        for path in paths:
            try:
                read_expectations(path, kind)
            except ExpectationFileError as e:
                return str(e)
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    problem = _check_expectation_files(args)
    if problem is not None:
        print(f"tg-conformance: {problem}", file=sys.stderr)
        return USAGE_ERROR
    saved = {k: os.environ.get(k) for k in ("CACHEDB", ENV_PRIVATE_CACHE)}
    saved_db = getattr(sys.modules.get("tgcore.helpers"), "CACHEDB", None)
    folder = None if args.use_cache else _private_cache()
    try:
        return _run(args)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            for key, value in saved.items():  # a program that called main() gets its environment back
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if saved_db is not None:
                sys.modules["tgcore.helpers"].CACHEDB = saved_db  # type: ignore[attr-defined]


def _run(args: argparse.Namespace) -> int:
    import pytest

    from tg_conformance.target import COMPILE, RENDER, RUN, Target, TargetUnavailable
    from tgcore.device import Device

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
    if args.level is not None:
        pytest_args += ["--tg-level", str(args.level)]
    for path in args.xfail_file:
        pytest_args += ["--tg-xfail-file", path]
    for path in args.skip_file:
        pytest_args += ["--tg-skip-file", path]
    if mode != RUN:
        pytest_args.append(f"--{mode}-only")
    print(_headline(target, private_cache=not args.use_cache), flush=True)
    started = time.time()
    code = int(pytest.main(pytest_args))
    verdict = _read_verdict(json_path, started)
    if verdict is not None:  # the run's last line, after pytest's own
        print(verdict)
    return code


def _headline(target: Any, private_cache: bool) -> str:
    """What is tested with what: the device, its plugin and tgcore's version, the compiler, the cache."""
    import tgcore
    from tg_conformance.provenance import compiler_info, plugin_info

    plugin = plugin_info(target.name)
    compiler = compiler_info(target.compiler)
    dist = f" ({plugin['distribution']})" if plugin["distribution"] else ""
    parts = [f"tg-conformance: {target.name} ({target.mode} mode)",
             f"plugin {plugin['name']} {plugin['version']}{dist}", f"tgcore {tgcore.__version__}"]
    if compiler is not None:
        parts.append(f"compiler {compiler['identity'] or compiler['class']}")
    from tgcore import helpers

    parts.append("a compile cache of its own" if private_cache else f"the compile cache {helpers.CACHEDB}")
    return ", ".join(parts)


def _read_verdict(json_path: str, started: float) -> Optional[str]:
    """The verdict of the report this run wrote (None when it wrote none: pytest stopped early and said why)."""
    try:
        if os.path.getmtime(json_path) < started - 1:
            return None
        with open(json_path, encoding="utf-8") as f:
            return str(json.load(f)["verdict"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


if __name__ == "__main__":
    sys.exit(main())
