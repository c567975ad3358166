"""m. Data-parallel training on MPI (tgcore.distributed): a step of the MLP 784-512-512-10 with Adam, batch 64 on each
rank, on 1 and 2 ranks of this machine (mpiexec), in ms per step, and the part of it spent averaging the gradients
(DistributedOptimizer.reduce_gradients: on a device with a Collective, MPI reduces the buckets in the device's own
memory; the 2-rank step is measured again with TGCORE_MPI_HOST_COPY=1, every bucket copied out, reduced by MPI and
copied back). On one machine two ranks share its cores, so the figure shows the reduction's cost more than a
speed-up. Needs the extra `[mpi]`; without
mpi4py and mpiexec it is skipped, saying so. Checked: the loss stays finite and falls."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Optional

from bench.harness import Case, Context, Measured, Skip, median

TITLE = "distributed"
TINY = False
SIZES, BATCH = (784, 512, 512, 10), 64


def _mpiexec() -> Optional[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def _launch(ranks: int, device: str, steps: int, host_copy: bool = False) -> dict:
    mpiexec = _mpiexec()
    if mpiexec is None:
        raise Skip("no mpiexec beside Python or on PATH: pip install './[mpi]'")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "bench.workloads.distributed", device, str(steps)]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env={**os.environ, "DEVICE": device, "TGCORE_MPI_HOST_COPY": "1" if host_copy else "0"},
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()[-600:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(ctx: Context) -> None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        for runner in ctx.tgcore:
            ctx.skip(Case("m", TITLE, "MLP step, 1 rank", "ms/step", False), runner, "mpi4py is not installed")
        return
    steps = 8 if ctx.quick else 30
    for runner in ctx.tgcore:
        if runner.device == "PYTHON":
            continue
        for ranks, host_copy in ((1, False), (2, False), (2, True)):
            how = ", through host arrays" if host_copy else ""
            step = Case(
                "m", TITLE, f"MLP 784-512-512-10 B={BATCH}/rank step, {ranks} rank(s){how}", "ms/step", False, False
            )
            reduce = Case("m", TITLE, f"  of it averaging gradients, {ranks} rank(s){how}", "ms/step", False, False)
            got: dict = {}

            def body(
                ranks: int = ranks, device: str = runner.device, got: dict = got, copy: bool = host_copy
            ) -> Measured:
                got.update(_launch(ranks, device, steps, copy))
                losses = got["losses"]
                bad = (
                    None
                    if all(map(lambda v: v == v and abs(v) < 1e9, losses)) and losses[-1] < losses[0]
                    else (f"the loss went {losses[0]} -> {losses[-1]}")
                )
                return Measured(median(got["step_s"]) * 1e3, got["step_s"], bad)

            if ctx.attempt(step, runner, body).status == "ok":
                ctx.figure(reduce, runner, median(got["reduce_s"]) * 1e3, got["reduce_s"])


def _rank_program(device: str, steps: int) -> None:
    """What each rank runs: timed steps of the MLP, rank 0 printing the figures as one JSON line."""
    import numpy as np

    from tgcore import Device, Tensor, nn
    from tgcore import distributed as dist
    from tgcore.nn.state import get_parameters

    Device.DEFAULT = device
    dist.init()
    rng = np.random.default_rng(dist.rank())
    x = Tensor(rng.standard_normal((BATCH, SIZES[0])).astype(np.float32))
    y = Tensor(rng.integers(0, SIZES[-1], BATCH).astype(np.int32))
    layers = [nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])]
    params = get_parameters(layers)
    dist.broadcast_parameters(params)
    opt = dist.DistributedOptimizer(nn.optim.Adam(params, lr=1e-3))
    step_s, reduce_s, losses = [], [], []
    with Tensor.train():
        for i in range(steps + 2):  # two warm-up steps compile the kernels
            st = time.perf_counter()
            opt.zero_grad()
            h = x
            for layer in layers[:-1]:
                h = layer(h).relu()
            loss = layers[-1](h).sparse_categorical_crossentropy(y)
            loss.backward()
            Tensor.realize(loss, *[p.grad for p in params])
            mid = time.perf_counter()
            opt.reduce_gradients()  # (lazy: the reduction runs when the averaged gradients are realized)
            Tensor.realize(*[p.grad for p in params])
            reduced = time.perf_counter()
            Tensor.realize(*opt.optimizer.schedule_step())
            end = time.perf_counter()
            losses.append(loss.item())
            if i >= 2:
                step_s.append(end - st)
                reduce_s.append(reduced - mid)
    if dist.rank() == 0:
        print(json.dumps({"step_s": step_s, "reduce_s": reduce_s, "losses": losses}))


if __name__ == "__main__":
    _rank_program(sys.argv[1], int(sys.argv[2]))
