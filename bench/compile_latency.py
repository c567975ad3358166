"""First-call latency of a never-seen elementwise kernel, compile included, on every available device.

Each run builds a kernel no process has compiled before (a fresh random constant is part of its source) with the
disk cache off, so the first call pays for everything: schedule, render, compile, load and run. A breakdown of
the same stages on another fresh kernel, and the warm call (the same kernel again), follow in the table.
`python -m bench --only g` runs the same measurement inside the benchmark harness, with tinygrad as the peer.

    python bench/compile_latency.py                      # every available device
    python bench/compile_latency.py --devices LLVM CLANG --repeats 20
"""

from __future__ import annotations

import os

os.environ["DISABLE_COMPILER_CACHE"] = "1"  # before tgcore looks: every compile below must really compile

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

SIZE = 4096


def expression(x: Any, c: float) -> Any:
    """A five-op elementwise chain: one kernel, new whenever `c` is new (tgcore and tinygrad tensors alike)."""
    return ((x * c + 1.5).exp2().sqrt() - c).maximum(0.25)


def expected(x: np.ndarray, c: float) -> np.ndarray:
    """`expression` in float64 numpy."""
    return np.maximum(np.sqrt(np.exp2(x.astype(np.float64) * c + 1.5)) - c, 0.25)


def first_and_warm_call(
    tensor: Any, device: str, synchronize: Callable[[], None], rng: random.Random
) -> tuple[float, float, np.ndarray, np.ndarray, float]:
    """Seconds for the first realize of a new kernel and for the same kernel once compiled, with the output, the
    input and the constant (to check the output). `tensor` is tgcore's Tensor class, or tinygrad's."""
    x_np = np.arange(SIZE, dtype=np.float32) / SIZE
    x = tensor(x_np, device=device).realize()
    synchronize()
    c = rng.uniform(1.0, 2.0)
    st = time.perf_counter()
    expression(x, c).realize()
    synchronize()
    first = time.perf_counter() - st
    st = time.perf_counter()
    out = expression(x, c).realize()
    synchronize()
    warm = time.perf_counter() - st
    return first, warm, out.numpy(), x_np, c


def stages(device: str, rng: random.Random) -> tuple[float, float, float]:
    """Seconds to render (optimize and linearize included), compile, and load one new tgcore kernel."""
    from tgcore import Device, Tensor
    from tgcore.codegen.program import to_program
    from tgcore.engine.realize import get_kernel

    x = Tensor(np.arange(SIZE, dtype=np.float32), device=device).realize()
    ast = expression(x, rng.uniform(1.0, 2.0)).schedule()[-1].ast
    dev = Device[device]
    t0 = time.perf_counter()
    program = to_program(get_kernel(dev.renderer, ast, device))  # optimized, as the first call's kernel is
    t1 = time.perf_counter()
    lib = dev.compiler.compile(program.src)
    t2 = time.perf_counter()
    dev.runtime(device, program.name, lib)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def main() -> None:
    from tgcore import Device, Tensor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="*", help="devices to measure (default: every available one)")
    parser.add_argument("--repeats", type=int, default=10, help="new kernels per device (the median is shown)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kernels' constants (default: random)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    devices = args.devices or Device.available()
    print(f"first call of a never-seen elementwise kernel ({SIZE} float32, 5 ops), median of {args.repeats} kernels")
    print(f"{'device':8s} {'first call':>11s} {'render':>9s} {'compile':>9s} {'load':>9s} {'warm call':>10s}")
    for device in devices:
        sync = Device[device].synchronize
        first_and_warm_call(Tensor, device, sync, rng)  # open the device and import its toolchain outside the timing
        calls = [first_and_warm_call(Tensor, device, sync, rng) for _ in range(args.repeats)]
        parts = [stages(device, rng) for _ in range(args.repeats)]
        first = statistics.median([c[0] for c in calls]) * 1e3
        warm = statistics.median([c[1] for c in calls]) * 1e3
        render, compile_, load = (statistics.median([p[i] for p in parts]) * 1e3 for i in range(3))
        print(f"{device:8s} {first:8.2f} ms {render:6.2f} ms {compile_:6.2f} ms {load:6.2f} ms {warm:7.3f} ms")


if __name__ == "__main__":
    main()
