"""Train a small MLP on scikit-learn's bundled handwritten digits (no download), printing loss and accuracy.

python examples/mlp_digits.py [--device CLANG] [--epochs 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits

from tgcore import Device, Tensor
from tgcore.nn import Linear
from tgcore.nn.optim import Adam


class MLP:
    def __init__(self, sizes: list[int]) -> None:
        self.layers = [Linear(a, b) for a, b in zip(sizes, sizes[1:])]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)

    def parameters(self) -> list[Tensor]:
        return [t for layer in self.layers for t in (layer.weight, layer.bias) if t is not None]


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="tgcore device (default: the best available)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.device:
        Device.DEFAULT = args.device
    print(f"device: {Device.DEFAULT}")

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(x))
    split = int(0.8 * len(x))
    x_train, y_train, x_test, y_test = x[order[:split]], y[order[:split]], x[order[split:]], y[order[split:]]

    Tensor.manual_seed(args.seed)
    model = MLP([64, 128, 64, 10])
    opt = Adam(model.parameters(), lr=3e-3)
    x_test_t, y_test_np = Tensor(x_test), y_test

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        st = time.perf_counter()
        Tensor.training = True
        perm = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(perm) - args.batch + 1, args.batch):
            idx = perm[i : i + args.batch]
            opt.zero_grad()
            loss = model(Tensor(x_train[idx])).sparse_categorical_crossentropy(Tensor(y_train[idx]))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        Tensor.training = False
        predictions = model(x_test_t).argmax(axis=-1).numpy()
        accuracy = float((predictions == y_test_np).mean())
        print(
            f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  test accuracy {accuracy * 100:6.2f}%  "
            f"({time.perf_counter() - st:.2f} s)"
        )
    print(f"final test accuracy: {accuracy * 100:.2f}%")
    return accuracy


if __name__ == "__main__":
    acc = main()
    raise SystemExit(0 if acc > 0.9 else 1)
