"""The example's models: a small MLP and a small CNN, both classifiers (what `mlopt trace` traces and
`train.py` trains). No batch norm and no other buffers, so DDP has nothing to broadcast in the forward pass
and the only collectives of a step are the gradient all-reduces.

    mlopt trace examples/train_ddp/models.py:mlp --batch 32 --input-shape 256 -o mlp.trace.json
    mlopt trace examples/train_ddp/models.py:cnn --batch 32 --input-shape 3,32,32 -o cnn.trace.json
"""

from __future__ import annotations

from torch import nn

# Per-sample input shape of each model (without the batch dimension) and its number of classes.
INPUT_SHAPES = {"mlp": (256,), "cnn": (3, 32, 32)}
CLASSES = 10
BATCH = 32  # per rank


def mlp() -> nn.Module:
    """256 -> 512 -> 512 -> 256 -> 10 with ReLUs: 0.53 M parameters (2.1 MB of float32 gradients)."""
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 256), nn.ReLU(),
        nn.Linear(256, CLASSES),
    )


def cnn() -> nn.Module:
    """Three 3x3 convolutions with ReLU and max-pooling on 3x32x32 images, then two linear layers."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 256), nn.ReLU(),
        nn.Linear(256, CLASSES),
    )


MODELS = {"mlp": mlp, "cnn": cnn}
