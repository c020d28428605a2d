"""A BERT-base-like encoder for tracing on the CPU (`mlopt trace bench/models/bert_like.py:bert_base
--input-shape 128,768`): 12 post-norm transformer layers of width 768, 12 heads, feed-forward 3072, as BERT-base,
without the token embedding (mlopt traces float inputs) and with a linear head. About 85M parameters."""

from __future__ import annotations

import torch
from torch import nn


class EncoderClassifier(nn.Module):
    def __init__(self, layers: int = 12, width: int = 768, heads: int = 12, ffn: int = 3072, classes: int = 2):
        super().__init__()
        block = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)[:, 0])


def bert_base() -> nn.Module:
    return EncoderClassifier()


def bert_small() -> nn.Module:
    """A small encoder of the same structure (4 layers, width 256, 4 heads, feed-forward 1024; about 3.2M
    parameters) for benches that run many real steps on a small CPU (bench/memory_fidelity.py)."""
    return EncoderClassifier(layers=4, width=256, heads=4, ffn=1024)
