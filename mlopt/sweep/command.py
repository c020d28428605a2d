"""How a sweep cell runs `mlopt plan PLANNER ARGS`: the kind's `plan_files` (mlopt.planners.protocol), called
directly with the cell's options by flag name, not through the command line (issue 25). mlopt.sweep does not
import mlopt.cli at all; the options a spec may give are the kind's declared `CommandOption`s, from which the
command line builds its flags, so a cell accepts and converts exactly what `mlopt plan PLANNER` does.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

from mlopt.errors import MloptError
from mlopt.planners.options import CommandOption
from mlopt.planners.registry import planner_kind

EXIT_INTERNAL = 1  # what `mlopt` exits with on a bug (mlopt.cli.EXIT_INTERNAL)

# One cell at a time per process: the warnings machinery is process-global, so threaded workers (a Dask worker
# with several threads, or an in-process LocalCluster) take turns; processes are the unit of parallelism
# (local pool processes, single-threaded cluster workers).
_RUN_LOCK = threading.Lock()


def plan_options(planner: str) -> dict[str, CommandOption]:
    """Long option name (without --) -> the declared option of `mlopt plan PLANNER`."""
    return {o.name: o for o in planner_kind(planner).all_command_options}


def run_planner(planner: str, args: dict[str, Any], output: Path) -> tuple[int, str, list[str]]:
    """`mlopt plan PLANNER ARGS -o OUTPUT` without the command line: (exit code, one-line message, warnings),
    errors mapped as `mlopt.cli.main` maps them (but returned, not printed; warnings collected, not printed)."""
    caught: list[str] = []
    try:
        with _RUN_LOCK, warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            try:
                planner_kind(planner).plan_files(args, output)
            finally:
                for w in records:
                    text = str(w.message)
                    if text not in caught:
                        caught.append(text)
        return 0, "", caught
    except MloptError as exc:
        return exc.exit_code, str(exc), caught
    except Exception as exc:  # noqa: BLE001 - a bug in mlopt: one line, like `mlopt` without -vv
        return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}", caught
