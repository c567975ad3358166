"""A small ResNet-like CNN for a training step: a 3x3 stem (conv, BatchNorm, ReLU), two basic residual blocks
(the second halves the size and doubles the channels through a 1x1 downsample), average pool, a linear layer to
10 classes. BatchNorm uses the batch's statistics (training mode) and updates its running ones."""

from __future__ import annotations

from typing import Any

from bench.models.resnet import _LazyBlock, torch_block

WIDTH, CLASSES = 16, 10


class LazyCNN:
    def __init__(self, api: Any) -> None:
        nn = api.nn
        self.conv1, self.bn1 = nn.Conv2d(3, WIDTH, 3, padding=1, bias=False), nn.BatchNorm2d(WIDTH)
        self.blocks = [_LazyBlock(api, False, WIDTH, WIDTH, 1), _LazyBlock(api, False, WIDTH, 2 * WIDTH, 2)]
        self.fc = nn.Linear(2 * WIDTH, CLASSES)

    def __call__(self, x: Any) -> Any:
        x = self.bn1(self.conv1(x)).relu()
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean((2, 3)))


def torch_cnn() -> Any:
    import torch
    from torch import nn

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, WIDTH, 3, padding=1, bias=False), nn.BatchNorm2d(WIDTH)
            block = torch_block()
            self.blocks = nn.Sequential(block(False, WIDTH, WIDTH, 1), block(False, WIDTH, 2 * WIDTH, 2))
            self.fc = nn.Linear(2 * WIDTH, CLASSES)

        def forward(self, x: Any) -> Any:
            return self.fc(self.blocks(torch.relu(self.bn1(self.conv1(x)))).mean((2, 3)))

    return CNN().train()
