"""Train the digits MLP data-parallel on MPI ranks: each rank a share of every batch, gradients averaged.

mpiexec -n 2 python examples/ddp_digits.py [--device CLANG] [--epochs 10] [--checkpoint ckpt.safetensors]

Every rank runs this program. Rank 0's initial weights go to every rank (broadcast_parameters); each epoch the training
set is split by rank (DistributedSampler), each rank computes the gradient of its share of a batch, and
DistributedOptimizer averages them before the update, so two ranks with batch 32 each take the steps one process would
take with batch 64. Rank 0 prints the loss and the test accuracy; with --checkpoint it saves after every epoch and a
rerun resumes from the last one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mlp_digits import MLP  # the demo's model (this folder is on the path of a script run from it)
from sklearn.datasets import load_digits

from tgcore import Device, Tensor
from tgcore import distributed as dist
from tgcore.nn.optim import Adam
from tgcore.nn.state import get_state_dict, load_state_dict


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="tgcore device (default: the best available)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32, help="examples per rank in a step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, help="save here after every epoch, and resume from it")
    args = parser.parse_args()
    if args.device:
        Device.DEFAULT = args.device
    dist.init()
    rank, world = dist.rank(), dist.world_size()
    if rank == 0:
        print(f"device: {Device.DEFAULT}, ranks: {world}, batch {args.batch} a rank ({args.batch * world} a step)")

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(args.seed).permutation(len(x))  # the same split on every rank
    split = int(0.8 * len(x))
    x_train, y_train, x_test, y_test = x[order[:split]], y[order[:split]], x[order[split:]], y[order[split:]]

    Tensor.manual_seed(args.seed + rank)  # different on purpose: broadcast_parameters makes them rank 0's
    model = MLP([64, 128, 64, 10])
    state = get_state_dict(model)
    dist.broadcast_parameters(state)
    opt = dist.DistributedOptimizer(Adam(list(state.values()), lr=3e-3))
    first_epoch = 1
    if args.checkpoint and (saved := dist.load_checkpoint(args.checkpoint)) is not None:
        weights, done = saved
        load_state_dict(model, {k[6:]: v for k, v in weights.items() if k.startswith("model.")}, verbose=False)
        load_state_dict(opt.optimizer, {k[4:]: v for k, v in weights.items() if k.startswith("opt.")}, verbose=False)
        first_epoch = done + 1
        if rank == 0:
            print(f"resumed from {args.checkpoint} after epoch {done}")

    sampler = dist.DistributedSampler(len(x_train), seed=args.seed)
    accuracy = 0.0
    for epoch in range(first_epoch, args.epochs + 1):
        st = time.perf_counter()
        sampler.set_epoch(epoch)
        mine = sampler.indices()
        losses = []
        with Tensor.train():
            for i in range(0, len(mine) - args.batch + 1, args.batch):
                idx = mine[i : i + args.batch]
                opt.zero_grad()
                loss = model(Tensor(x_train[idx])).sparse_categorical_crossentropy(Tensor(y_train[idx]))
                loss.backward()
                opt.step()
                losses.append(loss.item())
        mean_loss = dist.all_reduce(Tensor([float(np.mean(losses))]), "mean").item()
        accuracy = float((model(Tensor(x_test)).argmax(axis=1).numpy() == y_test).mean())
        if args.checkpoint:
            # the weights and the optimizer's state (Adam's moments and step counts), so a resumed run goes on exactly
            dist.save_checkpoint(
                args.checkpoint, {**get_state_dict(model, "model."), **get_state_dict(opt.optimizer, "opt.")}, epoch
            )
        if rank == 0:
            took = time.perf_counter() - st
            print(f"epoch {epoch:2d}  loss {mean_loss:.4f}  test accuracy {accuracy:.3f}  ({took:.2f} s)")
    return accuracy


if __name__ == "__main__":
    main()
