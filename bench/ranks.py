"""Launching one job's ranks as local processes, the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK), for the
benches that need several processes (bench/collectives_mp.py, bench/fidelity_mp.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence


def spawn_ranks(n: int, command: Callable[[int], Sequence[str]], env: dict[str, str], timeout_s: float,
                cwd: Path, what: str) -> None:
    """Runs command(rank) for every rank at once and waits; SystemExit naming `what` when one fails or the job
    outlives timeout_s (then every rank is killed)."""
    procs = [subprocess.Popen(list(command(r)), cwd=cwd,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), **env))
             for r in range(n)]
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"{what} did not finish within {timeout_s:.0f} s")
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"{what} failed: exit codes {[p.returncode for p in procs]}")
