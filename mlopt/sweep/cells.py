"""A sweep cell: one `mlopt plan PLANNER ...` invocation, its output files, and how a worker runs it.

A cell is run in-process by the function `mlopt plan PLANNER` itself calls, the kind's `plan_files`
(mlopt.sweep.command), with the cell's options by flag name, so a cell's plan is the plan that command
writes: the worker gives it `-o TMP/NAME` in a private temporary folder and sends back the bytes of every file written there; the client installs them under the sweep's
output folder atomically. Plans name their side files by base name only (`"xml": "ag.xml"`, the tuner
CSV's name), so the bytes do not depend on the folder they were written in, and a cell's plan equals the
one `mlopt plan PLANNER ARGS -o DIR/GRID/NAME` writes directly.

Workers need only `mlopt` importable and the cell's input files readable at the paths the spec gives;
they do not need the output folder (remote Dask/Ray workers return bytes, the client writes).
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from mlopt.errors import MloptError
from mlopt.formats.io import parse_document
from mlopt.formats.plan import PlanFile, plan_from_dict
from mlopt.planners.protocol import PlannerKind
from mlopt.planners.registry import plan_metrics, planner_kind
from mlopt.sweep.command import run_planner

EXIT_INFEASIBLE = 3

# Options a spec may not set: the sweep sets the output itself; the rest write or print elsewhere, or make
# the command check a plan instead of writing one.
REFUSED_OPTIONS = {
    "output": "the sweep names every cell's output itself (-o DIR of `mlopt sweep`)",
    "json": "the sweep records every cell's summary itself (--json of `mlopt sweep`)",
    "dump-model": "it writes a file outside the sweep's folder",
    "sweep": "`plan memory --sweep` writes a folder of its own; make budget-ratio a grid axis instead",
    "check": "a sweep writes plans; check them with `mlopt plan ... --check` afterwards",
    "resolve": "a sweep writes plans; check them with `mlopt plan ... --check` afterwards",
    "strict-version": "a sweep writes plans; check them with `mlopt plan ... --check` afterwards",
}


@dataclass(frozen=True)
class Cell:
    """One grid point: `mlopt plan PLANNER ARGS -o DIR/OUTPUT`."""

    index: int  # position in the sweep (spec order)
    grid: str  # the grid's name: the sub-folder of the output folder
    planner: str
    axes: tuple[tuple[str, str], ...]  # (axis, value as written in the spec) in grid order
    args: tuple[str, ...]  # planner arguments, without -o (the direct command's; the cache key hashes them)
    output: str  # -o path relative to the sweep folder (posix): GRID/NAME.SUFFIX
    record_wall_time: bool = False  # such plans are not byte-reproducible: never cached
    # the same arguments by flag name, converted as the command line converts them (what the worker plans with)
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def stem(self) -> str:
        """The cell's name: its output's file name without the planner's suffix."""
        return self.basename[: -len(self.kind.output_suffix)]

    @property
    def kind(self) -> PlannerKind:
        return planner_kind(self.planner)

    @property
    def files(self) -> list[str]:
        return self.kind.files(self.output)

    @property
    def plan_file(self) -> str:
        """The plan envelope (JSON) among the files."""
        return self.files[-1]

    @property
    def basename(self) -> str:
        return PurePosixPath(self.output).name

    def argv(self, out_dir: str | os.PathLike) -> list[str]:
        """`mlopt` arguments of the matching direct command."""
        return ["plan", self.planner, *self.args, "-o", str(Path(out_dir) / self.output)]

    def command(self, out_dir: str | os.PathLike) -> str:
        return shlex.join(["mlopt", *self.argv(out_dir)])

    def task(self, out_dir: str | os.PathLike) -> dict[str, Any]:
        """What a worker needs (plain data, cheap to ship to Dask or Ray workers); `folder` only names the
        final folder in messages in place of the worker's temporary one."""
        return {"planner": self.planner, "options": dict(self.options), "basename": self.basename,
                "folder": str(Path(out_dir) / PurePosixPath(self.output).parent)}


def run_cell(task: dict[str, Any]) -> dict[str, Any]:
    """Run one cell's `mlopt plan` in this process (its kind's plan_files), writing into a private temporary
    folder.

    Returns {"code", "message", "warnings", "wall_s", "files": {name: bytes}}; code and message are what
    `mlopt` would exit with and print (0 and "" on success). Runs on workers: plain data in and out.
    """
    with tempfile.TemporaryDirectory(prefix="mlopt-sweep-cell-") as tmp:
        started = time.perf_counter()
        code, message, caught = run_planner(task["planner"], task["options"], Path(tmp) / task["basename"])
        wall = time.perf_counter() - started
        if task.get("folder"):
            message = message.replace(tmp, task["folder"])
            caught = [text.replace(tmp, task["folder"]) for text in caught]
        files = {}
        if code == 0:
            for name in sorted(os.listdir(tmp)):
                path = os.path.join(tmp, name)
                if os.path.isfile(path) and not name.startswith("."):
                    with open(path, "rb") as handle:
                        files[name] = handle.read()
    return {"code": code, "message": message, "warnings": caught, "wall_s": wall, "files": files}


def status_of_exit(code: int) -> str:
    return "infeasible" if code == EXIT_INFEASIBLE else "error"


def read_plan_bytes(data: bytes, source: str) -> tuple[dict[str, Any], PlanFile]:
    """The plan envelope in `data` as read and as checked (format, schema major, schema); InputError otherwise."""
    doc = parse_document(data, source)
    return doc, plan_from_dict(doc, source)


def complete_plan(out_dir: Path, cell: Cell) -> dict[str, Any] | None:
    """The cell's plan envelope when every file of the cell exists and the plan is a valid envelope (the
    kind's own file checks passing: a collective plan's MSCCL-EF XML matching the sidecar's hash); None otherwise."""
    paths = [out_dir / f for f in cell.files]
    if not all(p.is_file() for p in paths):
        return None
    try:
        doc, plan = read_plan_bytes(paths[-1].read_bytes(), str(paths[-1]))
        if cell.kind.staleness.file_checks(paths[-1], plan):
            return None
    except (MloptError, OSError, ValueError):
        return None
    return doc


def metrics_from_files(cell: Cell, files: dict[str, bytes]) -> dict[str, Any]:
    data = files[PurePosixPath(cell.plan_file).name]
    return plan_metrics(cell.planner, json.loads(data))
