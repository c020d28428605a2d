"""Shared test helpers: paths to the reference artefacts and an in-process CLI runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_REFERENCE = REPO.parent / "shared" / "reference"


def reference(*parts: str) -> Path:
    """A file under ../shared/reference, skipping the test when the checkout has no shared/ beside it."""
    path = SHARED_REFERENCE.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference artefact not available: {path}")
    return path


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys):
    """Run `mlopt ARGS...` in-process through the real entry point (exit codes and error lines included)."""
    from mlopt.cli import main

    def run(*args: str) -> CliResult:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="module")
def torchvision_module():
    """torchvision (with mlopt's nms shim when its compiled ops do not load); skips when unusable or absent."""
    pytest.importorskip("torch")
    from mlopt.pytorch.models import import_torchvision

    try:
        module, shim = import_torchvision()
    except Exception as error:  # noqa: BLE001 - any failure means: no usable torchvision here
        pytest.skip(f"torchvision cannot be imported, even with the nms shim: {error}")
    yield module
    del shim


@pytest.fixture(scope="session")
def ddp_example_trace(tmp_path_factory) -> Path:
    """examples/ddp_mlp imported once per session with `mlopt trace` (2 ranks; DDP's two gradient buckets of
    4,460,800 and 1,052,672 bytes and its two start-up broadcasts)."""
    from mlopt.cli import main

    example = REPO / "examples" / "ddp_mlp"
    out = tmp_path_factory.mktemp("ddp-example") / "trace.json"
    code = main(["trace", str(example / "rank0.et.json.gz"), "--kineto", str(example / "rank0.kineto.json.gz"),
                 "-o", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="session")
def runtime_library():
    """Skip when the C++ runtime library is not built (mlopt.native.binding finds none)."""
    from mlopt.native import binding as native

    try:
        native.library()
    except native.RuntimeLibraryNotFound as exc:
        pytest.skip(f"mlopt runtime library unavailable: {exc}")
