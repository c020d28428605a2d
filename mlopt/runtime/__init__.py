"""Runtime integrations that run real frameworks to produce mlopt inputs.

* `torch_models`: resolve model specs (`torchvision:resnet18`, `package.module:callable`,
  `path/to/file.py:callable`) to `torch.nn.Module`s, with the torchvision import shim.
* `torch_trace`: trace one CPU training step (forward, loss, backward, optimizer step) into a
  `ModelTrace` through a TorchDispatchMode; `trace_model_spec` is the CLI's entry point.

These modules import torch at import time; import them lazily where torch is optional.
"""
