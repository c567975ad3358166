"""First-call latency of a never-seen elementwise kernel, compile included, on every available device.

Each run builds a kernel no process has compiled before (a fresh random constant is part of its source) with the
disk cache off, so the first call pays for everything: schedule, render, compile, load and run. A breakdown of
the same stages on another fresh kernel, and the warm call (the same kernel again), follow in the table.
`python -m bench --only g` runs the same measurement inside the benchmark harness, with tinygrad as the peer.

It also times `Tensor.randn(1024, 1024, dtype=...).max().item()` in a new Python process, import included, once
with an empty disk cache (every kernel compiled) and once more with the cache that run left (nothing compiled), in
each float dtype: the first result a script that draws random tensors waits for. (Python's own bytecode is cached,
as an installed package's is: new_process_env.)

    python bench/compile_latency.py                      # every available device
    python bench/compile_latency.py --devices LLVM CLANG --repeats 20
    python bench/compile_latency.py --devices CLANG --randn-only
"""

from __future__ import annotations

import os

os.environ["DISABLE_COMPILER_CACHE"] = "1"  # before tgcore looks: every compile below must really compile
os.environ["DISABLE_PROGRAM_CACHE"] = "1"  # and every kernel be lowered (not read from the disk table)

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

SIZE = 4096
RANDN_DTYPES = ("float32", "float16", "bfloat16", "float64")
# the new process's script: seconds to import tgcore, seconds from there to the first result, and the result
_RANDN_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from tgcore import Tensor
t1 = time.perf_counter()
value = Tensor.randn(1024, 1024, device=sys.argv[1], dtype=sys.argv[2]).max().item()
print(json.dumps([t1 - t0, time.perf_counter() - t1, value]))
"""


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


def new_process_env(folder: str, device: str) -> dict[str, str]:
    """The environment of a new process that runs as a user's would: the disk caches on (the cache at
    `folder`/cache.db), and Python's bytecode cached as an installed package's is (pip compiles it at install;
    PYTHONDONTWRITEBYTECODE, as tox sets it, would have each process compile every module's source again: ~0.3 s of
    an import), in `folder` rather than the source tree, written here by importing tgcore and opening `device`."""
    kept = ("DISABLE_COMPILER_CACHE", "DISABLE_PROGRAM_CACHE", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in kept}
    env["CACHEDB"] = os.path.join(folder, "cache.db")
    env["PYTHONPYCACHEPREFIX"] = os.path.join(folder, "pycache")
    warm = f"from tgcore import Device; Device[{device!r}]"
    subprocess.run([sys.executable, "-c", warm], env={**env, "CACHELEVEL": "0"}, capture_output=True, check=True)
    return env


def randn_in_new_process(device: str, dtype: str, env: dict[str, str]) -> tuple[float, float, float]:
    """(seconds to import tgcore, seconds from there to the first result, the result) of randn(1024, 1024).max() in
    a new Python process of environment `env` (new_process_env)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RANDN_SCRIPT, device, dtype], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"randn on {device} in {dtype} failed in its process:\n{proc.stderr[-2000:]}")
    import_s, first_s, value = json.loads(proc.stdout.strip().splitlines()[-1])
    return import_s, first_s, value


def randn_cold_and_warm(device: str, dtype: str) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """randn_in_new_process with an empty disk cache, then again in another process with the cache the first left."""
    with tempfile.TemporaryDirectory() as folder:
        env = new_process_env(folder, device)
        return randn_in_new_process(device, dtype, env), randn_in_new_process(device, dtype, env)


def print_randn(devices: list[str]) -> None:
    print("randn(1024, 1024).max().item() in a new process: import, then to the first result (s)")
    print(f"{'device':8s} {'dtype':9s} {'import':>7s} {'empty cache':>12s} {'warm cache':>11s}")
    for device in devices:
        for dtype in RANDN_DTYPES:
            cold, warm = randn_cold_and_warm(device, dtype)
            same = "" if cold[2] == warm[2] else f"  MISMATCH: {cold[2]} then {warm[2]}"
            print(f"{device:8s} {dtype:9s} {warm[0]:7.2f} {cold[1]:12.2f} {warm[1]:11.2f}{same}")


def main() -> None:
    from tgcore import Device, Tensor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="*", help="devices to measure (default: every available one)")
    parser.add_argument("--repeats", type=int, default=10, help="new kernels per device (the median is shown)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kernels' constants (default: random)")
    parser.add_argument("--randn-only", action="store_true", help="only the randn figures in new processes")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    devices = args.devices or Device.available()
    if args.randn_only:
        print_randn(devices)
        return
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
    print()
    print_randn(devices)


if __name__ == "__main__":
    main()
