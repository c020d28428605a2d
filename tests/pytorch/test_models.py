"""`mlopt.pytorch.prepare_torchvision`: a training script's way to import torchvision in the environment the
README installs (a CPU torch beside a torchvision wheel built for another torch), tried as a user's script
would: a fresh interpreter that calls it and then imports torchvision itself."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:  # found without importing it (the import is under test)
    pytest.skip("torchvision is not installed", allow_module_level=True)

USER_SCRIPT = textwrap.dedent("""
    import warnings
    warnings.simplefilter("ignore")
    import mlopt.pytorch
    returned = mlopt.pytorch.prepare_torchvision()
    import gc; gc.collect()              # the shim must outlive the call, whatever the caller keeps
    import torchvision                   # the user's own import, after the helper
    from torchvision.models import resnet18
    import torch
    model = resnet18(num_classes=10)
    out = model(torch.randn(2, 3, 64, 64))
    assert returned is torchvision and tuple(out.shape) == (2, 10)
    print("ok", torchvision.__version__)
""")

PLAIN_IMPORT = "import torch, torchvision; print('plain import ok')"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_a_users_script_imports_torchvision_after_the_helper():
    result = _run(USER_SCRIPT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok ")


def test_the_helper_is_what_makes_the_import_work_where_the_wheels_differ():
    """Where the plain import fails it is with torchvision's missing-op error, which the helper works around
    (the test above); where the wheels match, the plain import works and the helper is a plain import."""
    plain = _run(PLAIN_IMPORT)
    if plain.returncode != 0:
        assert "torchvision::nms" in plain.stderr and "does not exist" in plain.stderr, plain.stderr[-2000:]
    else:
        assert "plain import ok" in plain.stdout
