"""The program each rank of the 2-rank tests runs (under mpiexec); `python ranks.py MODE OUT_DIR`."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from tgcore import Tensor, TinyJit, dtypes, nn
from tgcore import distributed as dist
from tgcore.nn.state import get_parameters

# the data set and model of the equivalence test: the pytest process builds the same ones for its reference
N_ITEMS, IN, HIDDEN, OUT, STEPS = 16, 6, 8, 3, 4  # TinyJit: captured at step 2, replayed at 3 and 4


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((N_ITEMS, IN)).astype(np.float32), rng.integers(0, OUT, N_ITEMS).astype(np.int32)


class Net:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, OUT)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).tanh())


def train(net: Net, opt, x: np.ndarray, y: np.ndarray) -> None:  # noqa: ANN001
    with Tensor.train():
        for _ in range(STEPS):
            opt.zero_grad()
            net(Tensor(x)).sparse_categorical_crossentropy(Tensor(y)).backward()
            opt.step()


def train_jit(net: Net, opt, x: np.ndarray, y: np.ndarray) -> None:  # noqa: ANN001
    """The same steps as train, as one TinyJit-captured function (replayed from the third step on)."""

    @TinyJit
    def step(xt: Tensor, yt: Tensor) -> Tensor:
        opt.zero_grad()
        loss = net(xt).sparse_categorical_crossentropy(yt)
        loss.backward()
        opt.step()
        return loss.realize()

    with Tensor.train():
        for _ in range(STEPS):
            step(Tensor(x), Tensor(y))


def main(mode: str, out: str) -> None:
    dist.init()
    r, world = dist.rank(), dist.world_size()
    assert world == 2, world
    if mode == "collectives":
        t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1))
        base = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(dist.all_reduce(t).numpy(), base * 3)
        np.testing.assert_array_equal(dist.all_reduce(t, "mean").numpy(), base * 1.5)
        np.testing.assert_array_equal(dist.all_reduce(t, "max").numpy(), base * 2)
        np.testing.assert_array_equal(dist.all_reduce(t.T, "min").numpy(), base.T)  # (a view: reduced as its values)
        d = dist.all_reduce(Tensor([0.1, -3.0], dtype=dtypes.float64) * (r + 1), "mean")
        assert d.dtype == dtypes.float64 and d.numpy().tolist() == [0.1 * 3 / 2, -4.5]
        u = dist.all_reduce(Tensor([250, 3], dtype=dtypes.uint8) + r)
        assert u.dtype == dtypes.uint8 and u.numpy().tolist() == [245, 7]  # (uint8 wraps, as numpy's does)
        i = dist.all_reduce(Tensor([r + 1, 10], dtype=dtypes.int64))
        assert i.dtype == dtypes.int64 and i.numpy().tolist() == [3, 20]
        b = dist.all_reduce(Tensor([1.5, -2.0], dtype=dtypes.bfloat16) * (r + 1))
        assert b.dtype == dtypes.bfloat16 and b.cast(dtypes.float32).numpy().tolist() == [4.5, -6.0]
        np.testing.assert_array_equal(dist.broadcast(Tensor([float(r), 7.0 * r]), root=1).numpy(), [1.0, 7.0])
        g = dist.all_gather(Tensor([[r, r + 10]], dtype=dtypes.int32))
        assert g.shape == (2, 1, 2) and g.numpy().tolist() == [[[0, 10]], [[1, 11]]]
        dist.barrier()
        shares = dist.all_gather(Tensor(dist.DistributedSampler(7, seed=3).indices().astype(np.int32))).numpy()
        assert shares.shape == (2, 4) and set(shares.ravel().tolist()) == set(range(7)), shares
        assert t.numpy().tolist() == (base * (r + 1)).tolist()  # the inputs are left as they were
        print(f"rank {r}: collectives right, {dist.in_place_count()} in place")
    elif mode in ("ddp", "ddp-jit"):
        x, y = data()
        net = Net()
        if r == 1:  # weights unlike rank 0's, which broadcast_parameters must replace
            for p in get_parameters(net):
                p.assign(p * 0 + 5).realize()
        dist.broadcast_parameters(get_parameters(net))
        if r == 0:
            np.savez(os.path.join(out, "init.npz"), *[p.numpy() for p in get_parameters(net)])
        opt = dist.DistributedOptimizer(nn.optim.Adam(get_parameters(net), lr=0.05), bucket_bytes=200)
        half = N_ITEMS // 2
        mine_x, mine_y = x[r * half : (r + 1) * half], y[r * half : (r + 1) * half]
        (train_jit if mode == "ddp-jit" else train)(net, opt, mine_x, mine_y)
        mine = [p.numpy() for p in get_parameters(net)]
        other = dist.all_gather(Tensor(np.concatenate([m.ravel() for m in mine]))).numpy()
        np.testing.assert_array_equal(other[0], other[1])  # the ranks stay in step, bit for bit
        if r == 0:
            np.savez(os.path.join(out, "final.npz"), *mine)
            print(f"reductions per step: {opt.reductions}")
        dist.save_checkpoint(os.path.join(out, "ckpt.safetensors"), {"w": get_parameters(net)[0]}, step=STEPS)
        state, step = dist.load_checkpoint(os.path.join(out, "ckpt.safetensors"))
        assert step == STEPS and np.array_equal(state["w"].to(get_parameters(net)[0].device).numpy(), mine[0])
    elif mode == "mismatch":
        try:
            dist.all_reduce(Tensor.ones(2, 3) if r == 0 else Tensor.ones(3, 2))
        except dist.DistributedError as e:
            print(f"rank {r}: {e}")
            return
        raise AssertionError("a shape mismatch across ranks was not detected")
    elif mode == "raise":
        if r == 1:
            raise ValueError("rank 1 fails on purpose")
        dist.all_reduce(Tensor.ones(4))  # rank 1 never comes: the job must end, not hang
        raise AssertionError("all_reduce returned without rank 1")
    elif mode == "die":
        if r == 1:
            os._exit(3)  # gone at once, no exception, no goodbye: as a killed or crashed process
        dist.all_reduce(Tensor.ones(4))
        raise AssertionError("all_reduce returned without rank 1")
    elif mode == "hang":
        if r == 1:
            time.sleep(60)  # alive but never joining: rank 0's wait must end at the timeout
        dist.all_reduce(Tensor.ones(4))
        raise AssertionError("all_reduce returned without rank 1")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
