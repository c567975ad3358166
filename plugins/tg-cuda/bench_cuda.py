"""Throughput of a few workloads on CUDA, against numpy on the CPU and torch on the same GPU (where torch is there).

Each workload is checked against numpy, realized once (compile and warm-up), then timed over `--repeats`
realizations of a new lazy graph (scheduling included, as a user pays it) with the device synchronized; the median
is shown. The ratios are the other library's time over tgcore's: above 1, tgcore is faster.

    python plugins/tg-cuda/bench_cuda.py [--device CUDA] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np


@dataclass
class Workload:
    """One measured computation: the same thing written for tgcore, numpy and torch, and how much work it is."""

    name: str
    inputs: tuple[np.ndarray, ...]
    tgcore: Callable[..., Any]
    numpy: Callable[..., Any]
    torch: Callable[..., Any]
    work: float  # bytes moved or flops done
    unit: str  # "GB/s" or "GFLOP/s"


def make_workloads(n: int, m: int) -> list[Workload]:
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 1, n).astype(np.float32), rng.uniform(0, 1, n).astype(np.float32)
    ma, mb = rng.standard_normal((m, m)).astype(np.float32), rng.standard_normal((m, m)).astype(np.float32)
    return [
        Workload(
            f"elementwise chain {n >> 20}M f32",
            (a, b),
            lambda x, y: ((x * 1.5 + y).exp2().sqrt() - x).maximum(0.25),
            lambda x, y: np.maximum(np.sqrt(np.exp2(x * np.float32(1.5) + y)) - x, np.float32(0.25)),
            lambda x, y: ((x * 1.5 + y).exp2().sqrt() - x).clamp_min(0.25),
            3 * 4 * n,
            "GB/s",
        ),
        Workload(
            f"sum {n >> 20}M f32",
            (a,),
            lambda x: x.sum(),
            lambda x: x.sum(dtype=np.float32),
            lambda x: x.sum(),
            4 * n,
            "GB/s",
        ),
        Workload(
            f"matmul {m}x{m} f32",
            (ma, mb),
            lambda x, y: x @ y,
            lambda x, y: x @ y,
            lambda x, y: x @ y,
            2 * m**3,
            "GFLOP/s",
        ),
    ]


def median_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        st = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def main() -> None:
    from tgcore import Device, Tensor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CUDA")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=16 << 20, help="elements of the elementwise and sum inputs")
    parser.add_argument("--matmul", type=int, default=1024, help="side of the square matmul")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    torch: Optional[Any] = None
    try:
        import torch as _torch

        torch = _torch if _torch.cuda.is_available() else None
    except ImportError:
        pass
    sync = Device[args.device].synchronize
    rows = []
    for w in make_workloads(args.size, args.matmul):
        ours = [Tensor(x, device=args.device).realize() for x in w.inputs]
        expected = np.asarray(w.numpy(*w.inputs), dtype=np.float64)
        got = w.tgcore(*ours).numpy().astype(np.float64)
        correct = bool(np.allclose(got, expected, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(expected).max()))))
        t_ours = median_seconds(lambda: w.tgcore(*ours).realize(), sync, args.repeats)
        t_numpy = median_seconds(lambda: w.numpy(*w.inputs), lambda: None, args.repeats)
        t_torch = None
        if torch is not None:
            theirs = [torch.from_numpy(x).cuda() for x in w.inputs]
            t_torch = median_seconds(lambda: w.torch(*theirs), torch.cuda.synchronize, args.repeats)
        rows.append(
            {
                "workload": w.name,
                "correct": correct,
                "tgcore_ms": t_ours * 1e3,
                "rate": w.work / t_ours / 1e9,
                "unit": w.unit,
                "x_numpy": t_numpy / t_ours,
                "x_torch": t_torch / t_ours if t_torch is not None else None,
            }
        )
    print(f"{'workload':28s} {'ok':>3s} {'tgcore':>11s} {'rate':>16s} {'x numpy':>8s} {'x torch':>8s}")
    for r in rows:
        x_torch = f"{r['x_torch']:8.3f}" if r["x_torch"] is not None else "       -"
        print(
            f"{r['workload']:28s} {'yes' if r['correct'] else 'NO':>3s} {r['tgcore_ms']:8.3f} ms "
            f"{r['rate']:8.1f} {r['unit']:7s} {r['x_numpy']:8.3f} {x_torch}"
        )
    print("x numpy, x torch: their time over tgcore's (above 1: tgcore is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not all(r["correct"] for r in rows):
        raise SystemExit("a workload computed a wrong result on " + args.device)


if __name__ == "__main__":
    main()
