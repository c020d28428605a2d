"""Tiny models for the tracer's tests (tests/pytorch/test_trace.py).

Reached either as a file spec, `tests/data/models/tiny_models.py:build_mlp`, or as a module spec,
`tiny_models:build_mlp`, with tests/data/models on sys.path.
"""

from __future__ import annotations

from torch import nn

IN_FEATURES = 8
HIDDEN = 16
CLASSES = 4


def build_mlp(in_features: int = IN_FEATURES, hidden: int = HIDDEN, classes: int = CLASSES) -> nn.Module:
    """Linear -> ReLU -> Linear: forward is t, addmm, relu, t, addmm (+ the loss's ops)."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def build_cnn(channels: int = 4, classes: int = CLASSES) -> nn.Module:
    """Conv -> BatchNorm -> ReLU -> global pool -> Linear, for 3x8x8 inputs (channels-last tracing)."""
    return nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                         nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))


def not_a_module() -> int:
    return 42


def broken_builder() -> nn.Module:
    raise ValueError("this builder always fails")


class _Alternating(nn.Module):
    """Adds a ReLU on every other call: a step that is not repeatable, for the tracer's repeat check."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(IN_FEATURES, CLASSES)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.linear(x)
        return out.relu() if self.calls % 2 else out


def build_alternating() -> nn.Module:
    return _Alternating()
