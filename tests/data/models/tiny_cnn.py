"""A tiny residual CNN for the memory planner's tests: conv/BN/ReLU/max-pool/residual add/linear.

Traced in a second on CPU with `--batch 4 --input-shape 3,16,16`; has the structures MONeT plans for
(in-place ReLU after BN, a skip connection, a max-pool with indices) without torchvision.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """conv-BN-ReLU-conv-BN, residual add, ReLU (torchvision's BasicBlock without downsampling)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class TinyResidual(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 4, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.blocks = nn.Sequential(*(Block(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def build() -> nn.Module:
    return TinyResidual()


class TinyWithUnknownOp(TinyResidual):
    """The same network with a GELU in the head: an op type the memory catalog does not know."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(super().forward(x))


def build_with_unknown_op() -> nn.Module:
    return TinyWithUnknownOp()
