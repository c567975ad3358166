"""python -m bench: tgcore's devices against numpy, torch and tinygrad, one workload after another, in one process.

    python -m bench                        # every workload, every available device (PYTHON on the tiny ones only)
    python -m bench --quick                # smaller sizes and fewer runs: a smoke run of a few minutes (most of it
                                           # compiling workload h's models: --only a,b,... leaves them out)
    python -m bench --only a,e --devices CLANG,LLVM --json bench.json

To measure numpy with the BLAS kernel for this processor, run it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench

Each figure is the median of several timed runs after a warm-up. Every result is checked against numpy (the whole
models of workload h against torch); a mismatch or an error is printed where it happens and again at the end, and
one of tgcore's makes the exit status 1 (a peer's is reported, not a failure of tgcore). Speed is never a failure:
the figures and their ratios are for people to read.
"""

from __future__ import annotations

import os

# every compile in this process is a real one (workloads g and h measure them): no compiled kernel comes from the disk
# cache. Set before tgcore or tinygrad looks
os.environ["DISABLE_COMPILER_CACHE"] = "1"
os.environ["DISABLE_PROGRAM_CACHE"] = "1"  # (nor a rendered kernel from the disk table: first calls lower every kernel)

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from bench import harness, report, runners  # noqa: E402
from bench.workloads import WORKLOADS  # noqa: E402


def _list(values: list[str]) -> list[str]:
    """Split a list option at commas and spaces: ["a,b", "c"] gives ["a", "b", "c"]."""
    return [part for value in values for part in value.replace(",", " ").split()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=doc.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    titles = ", ".join(f"{k} {m.TITLE}" for k, m in WORKLOADS.items())
    parser.add_argument("--only", nargs="+", default=list(WORKLOADS), help=f"workloads to run, e.g. a,e ({titles})")
    parser.add_argument(
        "--devices",
        nargs="+",
        default=None,
        help="tgcore devices, e.g. CLANG,LLVM (default: every available one; PYTHON only on the tiny workloads "
        "e and g unless named here)",
    )
    parser.add_argument(
        "--peers",
        nargs="+",
        default=list(runners.PEERS),
        help="peers to compare with, those installed of: numpy,torch,tinygrad (default: all); 'none' for none",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer runs, for a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure, at most (default 7; 3 quick)")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds one figure may take: a measurement stops at 3 timed runs past it, and a larger size is skipped "
        "on a runner when the smaller one says it would not fit (default 40; 8 quick)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every result, the machine and the settings here")
    args = parser.parse_args(argv)
    args.only, args.peers = _list(args.only), _list(args.peers)
    args.devices = _list(args.devices) if args.devices else None
    unknown = [w for w in args.only if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)}: choose from {titles}")
    if args.peers == ["none"]:
        args.peers = []
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.budget = args.budget or (8.0 if args.quick else 40.0)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    meta = harness.environment()
    tgcore_runners, devices_left_out, python_asked = runners.tgcore_devices(args.devices)
    peer_runners, peers_left_out = runners.peers(args.peers)
    meta.update(
        args=vars(args),
        blas=harness.blas_info(),  # after torch's import, so its BLAS shows too
        torch_threads=next((r.torch.get_num_threads() for r in peer_runners if r.torch is not None), None),
        devices=[r.name for r in tgcore_runners],
        devices_left_out=devices_left_out,
        peers=[r.name for r in peer_runners],
        peers_left_out=peers_left_out,
    )
    _print_header(meta)

    results: list[harness.Result] = []
    meta["workload_seconds"] = {}
    for key in args.only:
        workload = WORKLOADS[key]
        mine = [r for r in tgcore_runners if r.name != "PYTHON" or workload.TINY or python_asked]
        print(f"\n== {key}. {workload.TITLE} ==", flush=True)
        ctx = harness.Context(mine + peer_runners, args.quick, args.repeats, args.budget)
        t0 = time.perf_counter()
        workload.run(ctx)
        meta["workload_seconds"][key] = round(time.perf_counter() - t0, 1)
        print(f"   ({meta['workload_seconds'][key]:.0f} s)", flush=True)
        results.extend(ctx.results)

    meta["load_average_end"] = list(os.getloadavg())
    meta["seconds"] = round(time.perf_counter() - started, 1)
    print(
        f"\n{'=' * 20} results ({meta['date']}, load average {_load(meta['load_average_start'])} at the start, "
        f"{_load(meta['load_average_end'])} at the end, {meta['seconds']:.0f} s) {'=' * 20}"
    )
    print("tgcore cells: figure (figure / best peer's, as a speed: >1x tgcore is better); * marks the best peer")
    print(report.table(results, [r.name for r in tgcore_runners], [r.name for r in peer_runners]))
    if lines := report.notes(results):
        print("\nnotes:")
        for line in lines:
            print(f"  {line}")
    if args.json:
        report.to_json(args.json, meta, results)
        print(f"\nwrote {args.json}")
    failed = [r for r in results if r.status in ("mismatch", "error") and r.framework == "tgcore"]
    if failed:
        print(f"\n!!! {len(failed)} result(s) disagree with numpy or raised an error:", file=sys.stderr)
        for r in failed:
            print(
                f"!!!   {r.runner} | {r.case.workload} {r.case.title} {r.case.case}: {r.status}: {r.note}",
                file=sys.stderr,
            )
        return 1
    return 0


def _load(triple: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in triple)


def _print_header(meta: dict) -> None:
    print(
        f"tgcore bench  {meta['date']}  {meta['cpu']}, {meta['cores']} cores, load average "
        f"{_load(meta['load_average_start'])}"
    )
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    print(f"python {meta['python']}; {versions}")
    source = meta["tgcore_source"]
    if "commit" in source:
        state = " with uncommitted changes to tgcore/ or plugins/" if source["modified"] else ""
        print(f"tgcore from {source['path']} at commit {source['commit']}{state}")
    else:
        print(f"tgcore from {source['path']}")
    print(
        f"tgcore devices: {', '.join(meta['devices']) or 'none'}; peers: {', '.join(meta['peers']) or 'none'}"
        f"; torch threads: {meta['torch_threads']}"
    )
    for name, reason in {**meta["devices_left_out"], **meta["peers_left_out"]}.items():
        print(f"  left out: {name}: {reason}")
    for lib in meta["blas"]:
        if lib.get("user_api") == "blas":
            print(
                f"BLAS: {lib['internal_api']} {lib['version']} ({lib['prefix']}), kernel {lib['architecture']}, "
                f"{lib['num_threads']} threads"
            )
        elif "user_api" in lib:
            print(f"{lib['user_api']}: {lib['internal_api']} ({lib['prefix']}), {lib['num_threads']} threads")
        else:
            print(f"BLAS: {lib['note']}")
    if (load := meta["load_average_start"][0]) > (meta["cores"] or 1) / 2:
        print(
            f"WARNING: load average {load:.2f} on {meta['cores']} cores: other processes compete for the cores, so "
            "every figure is lower than on an idle machine, and multi-threaded ones (numpy's BLAS, torch) can drop "
            "by far more"
        )
    env = {
        k: v
        for k, v in meta["env"].items()
        if v is not None and k not in ("DISABLE_COMPILER_CACHE", "DISABLE_PROGRAM_CACHE")
    }
    if "OPENBLAS_CORETYPE" in env or "OPENBLAS_L2_SIZE" in env:
        print(
            f"WARNING: {env} is set: numpy's OpenBLAS runs the kernel it names, not this processor's; for a fair "
            "figure run `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench`"
        )
    elif env:
        print(f"environment: {env}")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
