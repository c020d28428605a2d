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
