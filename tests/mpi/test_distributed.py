"""tgcore.distributed: collectives, the sampler, checkpoints and DistributedOptimizer in one process (world size 1),
and on two ranks through mpiexec: values against numpy, two ranks' half batches against one process's full batch,
shape mismatches reported, a rank that raises ending the job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="tgcore.distributed needs mpi4py: pip install './[mpi]'")

from tgcore import Device, Tensor, dtypes, nn  # noqa: E402
from tgcore import distributed as dist  # noqa: E402
from tgcore.nn.state import get_parameters  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import ranks  # noqa: E402

RANKS = os.path.join(os.path.dirname(__file__), "ranks.py")


def _mpiexec() -> str:
    found = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = found if os.path.exists(found) else shutil.which("mpiexec")
    if found is None:
        pytest.fail("mpi4py is installed but no mpiexec is beside Python or on PATH: pip install mpich")
    return found


def _two_ranks(mode: str, out: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_mpiexec(), "-n", "2", sys.executable, RANKS, mode, out],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def test_one_process_is_a_world_of_one() -> None:
    dist.init()
    dist.init()  # idempotent
    assert (dist.rank(), dist.world_size(), dist.local_rank()) == (0, 1, 0)
    t = Tensor([[1.5, -2.0], [3.0, 4.0]])
    for op in ("sum", "mean", "max", "min"):
        np.testing.assert_array_equal(dist.all_reduce(t, op).numpy(), t.numpy())
    assert dist.all_gather(t).shape == (1, 2, 2)
    np.testing.assert_array_equal(dist.broadcast(t).numpy(), t.numpy())
    with pytest.raises(ValueError, match="op must be one of"):
        dist.all_reduce(t, "prod")
    with pytest.raises(TypeError, match="mean needs a float tensor"):
        dist.all_reduce(Tensor([1, 2], dtype=dtypes.int32), "mean")
    with pytest.raises(ValueError, match="root 1 is not a rank"):
        dist.broadcast(t, root=1)
    dist.barrier()


def test_sampler_splits_evenly_pads_by_wrapping_and_reshuffles_by_epoch() -> None:
    shares = [dist.DistributedSampler(10, seed=1, rank=r, world_size=3) for r in range(3)]
    got = [s.indices() for s in shares]
    assert [len(s) for s in shares] == [4, 4, 4] and all(len(g) == 4 for g in got)
    flat = np.concatenate(got)
    assert set(flat.tolist()) == set(range(10)) and len(flat) == 12  # two padded from the start of the order
    for s in shares:
        s.set_epoch(1)
    assert any(not np.array_equal(a, s.indices()) for a, s in zip(got, shares))
    kept = [
        dist.DistributedSampler(10, shuffle=False, drop_last=True, rank=r, world_size=3).indices() for r in range(3)
    ]
    assert [k.tolist() for k in kept] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError, match="rank 3 is not in"):
        dist.DistributedSampler(10, rank=3, world_size=3)


def test_checkpoint_round_trip_and_a_fresh_start(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt.safetensors")
    assert dist.load_checkpoint(path) is None
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    dist.save_checkpoint(path, {"w": w}, step=12)
    state, step = dist.load_checkpoint(path)
    assert step == 12 and np.array_equal(state["w"].to(w.device).numpy(), w.numpy())
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # nothing half-written beside it


def test_distributed_optimizer_on_one_rank_is_the_optimizer() -> None:
    x, y = ranks.data()
    a, b = ranks.Net(), ranks.Net()
    for pa, pb in zip(get_parameters(a), get_parameters(b)):
        pb.assign(pa.detach()).realize()
    wrapped = dist.DistributedOptimizer(nn.optim.Adam(get_parameters(a), lr=0.05), bucket_bytes=200)
    ranks.train(a, wrapped, x, y)
    ranks.train(b, nn.optim.Adam(get_parameters(b), lr=0.05), x, y)
    for pa, pb in zip(get_parameters(a), get_parameters(b)):
        np.testing.assert_allclose(pa.numpy(), pb.numpy(), rtol=1e-6, atol=1e-7)
    assert wrapped.reductions == 0  # a mean over one rank is the gradient: nothing travels


def test_distributed_optimizer_under_tinyjit_on_one_rank() -> None:
    x, y = ranks.data()
    a, b = ranks.Net(), ranks.Net()
    for pa, pb in zip(get_parameters(a), get_parameters(b)):
        pb.assign(pa.detach()).realize()
    ranks.train_jit(a, dist.DistributedOptimizer(nn.optim.Adam(get_parameters(a), lr=0.05)), x, y)
    ranks.train(b, nn.optim.Adam(get_parameters(b), lr=0.05), x, y)
    for pa, pb in zip(get_parameters(a), get_parameters(b)):
        np.testing.assert_allclose(pa.numpy(), pb.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("host_copy", ["0", "1"])
def test_two_ranks_collectives_match_numpy(tmp_path, host_copy) -> None:  # noqa: ANN001
    """On the device's own memory where its plugin offers a Collective (CLANG, LLVM: 10 of the 11 collectives here;
    bfloat16, which MPI has no type for, travels as a float32 host array), and all through host arrays with
    TGCORE_MPI_HOST_COPY=1."""
    out = _two_ranks("collectives", str(tmp_path), TGCORE_MPI_HOST_COPY=host_copy)
    assert out.returncode == 0, out.stdout + out.stderr
    in_place = 10 if host_copy == "0" and Device[Device.DEFAULT].collective is not None else 0
    for r in (0, 1):
        assert f"rank {r}: collectives right, {in_place} in place" in out.stdout, out.stdout


@pytest.mark.parametrize("mode", ["ddp", "ddp-jit"])
def test_two_ranks_half_batches_equal_one_process_full_batch(tmp_path, mode) -> None:  # noqa: ANN001
    """Plain, and as a TinyJit-captured step: its replays reduce too (the reduction is a node the jit records)."""
    out = _two_ranks(mode, str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    init = np.load(tmp_path / "init.npz")
    final = np.load(tmp_path / "final.npz")
    net = ranks.Net()
    for i, p in enumerate(get_parameters(net)):
        p.assign(Tensor(init[f"arr_{i}"])).realize()
    x, y = ranks.data()
    ranks.train(net, nn.optim.Adam(get_parameters(net), lr=0.05), x, y)
    for i, p in enumerate(get_parameters(net)):
        np.testing.assert_allclose(final[f"arr_{i}"], p.numpy(), rtol=1e-5, atol=1e-6)
        assert not np.allclose(final[f"arr_{i}"], init[f"arr_{i}"])  # it trained
    # 4 gradients of 192, 32, 96 and 12 bytes in buckets of at most 200 bytes: [192], [32, 96, 12]
    assert "reductions per step: 2" in out.stdout


def test_two_ranks_with_different_shapes_are_told_which(tmp_path) -> None:  # noqa: ANN001
    out = _two_ranks("mismatch", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    for r in (0, 1):
        assert f"rank {r}: all_reduce(sum): the ranks passed tensors of different shapes" in out.stdout
    assert "rank 0: (2, 3) float" in out.stdout and "rank 1: (3, 2) float" in out.stdout


def test_a_rank_that_raises_ends_the_job(tmp_path) -> None:  # noqa: ANN001
    out = _two_ranks("raise", str(tmp_path), timeout=60, TGCORE_MPI_TIMEOUT="30")
    assert out.returncode != 0
    assert "rank 1 fails on purpose" in out.stderr and "rank 1 raised ValueError; aborting the job" in out.stderr


def test_a_rank_that_dies_ends_the_job(tmp_path) -> None:  # noqa: ANN001
    """Rank 1's process exits at once (as a crash would); rank 0, waiting in all_reduce, does not wait forever: the
    job ends with an error (MPICH's launcher ends it, or rank 0's timeout does), well before the test's limit."""
    out = _two_ranks("die", str(tmp_path), timeout=60, TGCORE_MPI_TIMEOUT="10")
    assert out.returncode != 0
    assert "all_reduce returned without rank 1" not in out.stdout + out.stderr


def test_a_rank_that_never_comes_times_out(tmp_path) -> None:  # noqa: ANN001
    """Rank 1 hangs; rank 0's wait ends at the timeout with a clear message and ends the job (well before the hang)."""
    out = _two_ranks("hang", str(tmp_path), timeout=45, TGCORE_MPI_TIMEOUT="2")
    assert out.returncode != 0
    assert "rank 0: all_reduce(sum) (comparing shapes) did not complete within 2 s" in out.stderr, out.stderr
