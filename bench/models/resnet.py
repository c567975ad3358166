"""ResNet-18 and ResNet-50 (the ImageNet shapes: 7x7 stem, max pool, four stages, average pool, 1000 classes), for
inference: BatchNorm with running statistics."""

from __future__ import annotations

import functools
from typing import Any

STAGE_WIDTHS = (64, 128, 256, 512)
DEPTHS = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}


def _plan(depth: int, blocks: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(in_channels, width, stride) of every block, stage after stage."""
    expansion = 1 if depth < 50 else 4
    plan, channels = [], 64
    for stage, (width, n) in enumerate(zip(STAGE_WIDTHS, blocks)):
        for i in range(n):
            plan.append((channels, width, 2 if stage and not i else 1))
            channels = width * expansion
    return plan


# ***** tinygrad-style (tgcore, tinygrad) *****


class _LazyBlock:
    def __init__(self, api: Any, bottleneck: bool, cin: int, width: int, stride: int) -> None:
        nn = api.nn
        self.bottleneck = bottleneck
        cout = width * 4 if bottleneck else width
        if bottleneck:
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        else:
            self.conv1 = nn.Conv2d(cin, width, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.downsample = (
            [nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)]
            if stride != 1 or cin != cout
            else []
        )

    def __call__(self, x: Any) -> Any:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        if self.bottleneck:
            out = self.bn3(self.conv3(out.relu()))
        shortcut = x
        for layer in self.downsample:
            shortcut = layer(shortcut)
        return (out + shortcut).relu()


class LazyResNet:
    def __init__(self, api: Any, depth: int, blocks: tuple[int, ...], classes: int = 1000) -> None:
        nn = api.nn
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
        plan = _plan(depth, blocks)
        starts = [sum(blocks[:i]) for i in range(len(blocks) + 1)]
        for s in range(4):
            setattr(self, f"layer{s + 1}", [_LazyBlock(api, depth >= 50, *p) for p in plan[starts[s] : starts[s + 1]]])
        self.fc = nn.Linear(STAGE_WIDTHS[-1] * (4 if depth >= 50 else 1), classes)

    def __call__(self, x: Any) -> Any:
        x = self.bn1(self.conv1(x)).relu().pad2d((1, 1, 1, 1), value=float("-inf")).max_pool2d(3, 2)
        for s in range(4):
            for block in getattr(self, f"layer{s + 1}"):
                x = block(x)
        return self.fc(x.mean((2, 3)))


# ***** torch *****


@functools.cache
def torch_block() -> Any:
    """The torch residual block class (basic or bottleneck), made on first use so that torch is imported late."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, bottleneck: bool, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.bottleneck = bottleneck
            cout = width * 4 if bottleneck else width
            if bottleneck:
                self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
                self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
                self.bn2 = nn.BatchNorm2d(width)
                self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            else:
                self.conv1 = nn.Conv2d(cin, width, 3, stride=stride, padding=1, bias=False)
                self.bn1 = nn.BatchNorm2d(width)
                self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
            self.downsample = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Sequential()
            )

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.bottleneck:
                out = self.bn3(self.conv3(torch.relu(out)))
            return torch.relu(out + self.downsample(x))

    return Block


def torch_resnet(depth: int, blocks: tuple[int, ...], classes: int = 1000) -> Any:
    import torch
    from torch import nn

    Block = torch_block()

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
            plan = _plan(depth, blocks)
            starts = [sum(blocks[:i]) for i in range(len(blocks) + 1)]
            for s in range(4):
                stage = [Block(depth >= 50, *p) for p in plan[starts[s] : starts[s + 1]]]
                setattr(self, f"layer{s + 1}", nn.Sequential(*stage))
            self.fc = nn.Linear(STAGE_WIDTHS[-1] * (4 if depth >= 50 else 1), classes)

        def forward(self, x: Any) -> Any:
            x = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(x.mean((2, 3)))

    return ResNet().eval()
