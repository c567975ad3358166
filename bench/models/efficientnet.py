"""EfficientNet-B0 for inference: a 3x3 stem, 16 MBConv blocks (1x1 expansion, depthwise kxk, squeeze-and-excite,
1x1 projection, residual where the shape allows), a 1x1 head to 1280 channels, average pool, 1000 classes; swish
everywhere, BatchNorm with running statistics. Padding is k // 2 on every side (no TF "same" asymmetry)."""

from __future__ import annotations

from typing import Any

# (expand ratio, kernel, stride of the first block, channels out, blocks) of the 7 stages
STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # fmt: skip
STEM, HEAD = 32, 1280


def _plan(max_blocks: int, stages: int) -> list[tuple[int, int, int, int, int]]:
    """(expand, kernel, stride, in, out) of every block of the first `stages` stages, at most `max_blocks` a stage
    (fewer of both for a quick run)."""
    plan, cin = [], STEM
    for expand, kernel, stride, cout, n in STAGES[:stages]:
        for i in range(min(n, max_blocks)):
            plan.append((expand, kernel, stride if i == 0 else 1, cin, cout))
            cin = cout
    return plan


# ***** tinygrad-style (tgcore, tinygrad) *****


class _LazyMBConv:
    def __init__(self, api: Any, expand: int, kernel: int, stride: int, cin: int, cout: int) -> None:
        nn = api.nn
        mid, squeezed = cin * expand, max(1, cin // 4)
        self.residual = stride == 1 and cin == cout
        self.expand = [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)] if expand != 1 else []
        self.dw = nn.Conv2d(mid, mid, kernel, stride=stride, padding=kernel // 2, groups=mid, bias=False)
        self.bn_dw = nn.BatchNorm2d(mid)
        self.se_reduce, self.se_expand = nn.Conv2d(mid, squeezed, 1), nn.Conv2d(squeezed, mid, 1)
        self.project, self.bn_project = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)

    def __call__(self, x: Any) -> Any:
        h = self.expand[1](self.expand[0](x)).swish() if self.expand else x
        h = self.bn_dw(self.dw(h)).swish()
        gate = self.se_expand(self.se_reduce(h.mean((2, 3), keepdim=True)).swish()).sigmoid()
        h = self.bn_project(self.project(h * gate))
        return h + x if self.residual else h


class LazyEfficientNet:
    def __init__(self, api: Any, max_blocks: int = 4, stages: int = 7, classes: int = 1000) -> None:
        nn = api.nn
        self.stem, self.bn_stem = nn.Conv2d(3, STEM, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(STEM)
        self.blocks = [_LazyMBConv(api, *p) for p in _plan(max_blocks, stages)]
        self.head, self.bn_head = nn.Conv2d(STAGES[stages - 1][3], HEAD, 1, bias=False), nn.BatchNorm2d(HEAD)
        self.fc = nn.Linear(HEAD, classes)

    def __call__(self, x: Any) -> Any:
        x = self.bn_stem(self.stem(x)).swish()
        for block in self.blocks:
            x = block(x)
        return self.fc(self.bn_head(self.head(x)).swish().mean((2, 3)))


# ***** torch *****


def torch_efficientnet(max_blocks: int = 4, stages: int = 7, classes: int = 1000) -> Any:
    import torch
    from torch import nn

    silu = torch.nn.functional.silu

    class MBConv(nn.Module):
        def __init__(self, expand: int, kernel: int, stride: int, cin: int, cout: int) -> None:
            super().__init__()
            mid, squeezed = cin * expand, max(1, cin // 4)
            self.residual = stride == 1 and cin == cout
            self.expand = (
                nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)) if expand != 1 else None
            )
            self.dw = nn.Conv2d(mid, mid, kernel, stride=stride, padding=kernel // 2, groups=mid, bias=False)
            self.bn_dw = nn.BatchNorm2d(mid)
            self.se_reduce, self.se_expand = nn.Conv2d(mid, squeezed, 1), nn.Conv2d(squeezed, mid, 1)
            self.project, self.bn_project = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)

        def forward(self, x: Any) -> Any:
            h = silu(self.expand(x)) if self.expand is not None else x
            h = silu(self.bn_dw(self.dw(h)))
            gate = torch.sigmoid(self.se_expand(silu(self.se_reduce(h.mean((2, 3), keepdim=True)))))
            h = self.bn_project(self.project(h * gate))
            return h + x if self.residual else h

    class EfficientNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.bn_stem = nn.Conv2d(3, STEM, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(STEM)
            self.blocks = nn.Sequential(*[MBConv(*p) for p in _plan(max_blocks, stages)])
            self.head, self.bn_head = nn.Conv2d(STAGES[stages - 1][3], HEAD, 1, bias=False), nn.BatchNorm2d(HEAD)
            self.fc = nn.Linear(HEAD, classes)

        def forward(self, x: Any) -> Any:
            x = self.blocks(silu(self.bn_stem(self.stem(x))))
            return self.fc(silu(self.bn_head(self.head(x))).mean((2, 3)))

    return EfficientNet().eval()
