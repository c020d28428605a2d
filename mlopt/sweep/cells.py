"""A sweep cell: one `mlopt plan PLANNER ...` invocation, its output files, and how a worker runs it.

A cell is run in-process through the very click command `mlopt plan PLANNER` is (`mlopt.cli.cli`), so a
cell's plan is the plan that command writes: the worker gives it `-o TMP/NAME` in a private temporary
folder and sends back the bytes of every file written there; the client installs them under the sweep's
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

EXIT_INFEASIBLE = 3
# One cell at a time per process: the warnings machinery and click's context are process-global, so threaded
# workers (a Dask worker with several threads, or an in-process LocalCluster) take turns; processes are the
# unit of parallelism (local pool processes, single-threaded cluster workers).
_INVOKE_LOCK = threading.Lock()


@dataclass(frozen=True)
class PlannerKind:
    """What a sweep needs to know about one `mlopt plan` subcommand."""

    name: str
    suffix: str  # of the -o path
    path_options: tuple[str, ...]  # always files: relative paths are resolved against the spec's folder
    maybe_path_options: tuple[str, ...]  # presets or files: resolved only when such a file exists there

    def files(self, output: str) -> list[str]:
        """Every file the command writes for `-o output` (relative posix paths), the plan envelope last."""
        out = PurePosixPath(output)
        if self.name == "collective":  # mlopt.formats.plan.sidecar_path
            return [str(out), str(out.with_suffix(".json"))]
        if self.name == "threads":  # mlopt.planners.threads.from_trace.tuner_file_for
            stem = out.name[:-5] if out.name.endswith(".json") else out.name
            return [str(out.with_name(f"{stem}.nccl-tuner.csv")), str(out)]
        return [str(out)]


PLANNERS: dict[str, PlannerKind] = {
    "collective": PlannerKind("collective", ".xml", ("sketch",), ("topology",)),
    "memory": PlannerKind("memory", ".plan.json", ("model", "ops"), ()),
    "threads": PlannerKind("threads", ".plan.json", ("model", "contention"), ()),
    "schedule": PlannerKind("schedule", ".plan.json", ("model", "cost-table"), ("topology",)),
}

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
    args: tuple[str, ...]  # planner arguments, without -o
    output: str  # -o path relative to the sweep folder (posix): GRID/NAME.SUFFIX
    record_wall_time: bool = False  # such plans are not byte-reproducible: never cached

    @property
    def stem(self) -> str:
        """The cell's name: its output's file name without the planner's suffix."""
        return self.basename[: -len(self.kind.suffix)]

    @property
    def kind(self) -> PlannerKind:
        return PLANNERS[self.planner]

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
        return {"planner": self.planner, "args": list(self.args), "basename": self.basename,
                "folder": str(Path(out_dir) / PurePosixPath(self.output).parent)}


def run_cell(task: dict[str, Any]) -> dict[str, Any]:
    """Run one cell's `mlopt plan` command in this process, writing into a private temporary folder.

    Returns {"code", "message", "warnings", "wall_s", "files": {name: bytes}}; code and message are what
    `mlopt` would exit with and print (0 and "" on success). Runs on workers: plain data in and out.
    """
    with tempfile.TemporaryDirectory(prefix="mlopt-sweep-cell-") as tmp:
        argv = ["-q", "plan", task["planner"], *task["args"], "-o", os.path.join(tmp, task["basename"])]
        started = time.perf_counter()
        code, message, caught = invoke(argv)
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


def invoke(argv: list[str]) -> tuple[int, str, list[str]]:
    """`mlopt ARGV` through the click command group, errors mapped to exit codes and one-line messages as
    `mlopt.cli.main` maps them (but returned, not printed; warnings collected, not printed)."""
    import warnings

    import click

    from mlopt.cli import EXIT_INTERNAL, cli
    from mlopt.errors import MloptError

    caught: list[str] = []
    try:
        with _INVOKE_LOCK, warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            try:
                cli.main(args=argv, prog_name="mlopt", standalone_mode=False)
            finally:
                for w in records:
                    text = str(w.message)
                    if text not in caught:
                        caught.append(text)
        return 0, "", caught
    except click.exceptions.Exit as exc:
        return exc.exit_code, "", caught
    except click.Abort:
        return EXIT_INTERNAL, "aborted", caught
    except click.ClickException as exc:
        return exc.exit_code, exc.format_message(), caught
    except MloptError as exc:
        return exc.exit_code, str(exc), caught
    except Exception as exc:  # noqa: BLE001 - a bug in mlopt: one line, like `mlopt` without -vv
        return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}", caught


def status_of_exit(code: int) -> str:
    return "infeasible" if code == EXIT_INFEASIBLE else "error"


def plan_metrics(planner: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Status, objective and the planner's headline numbers from a plan envelope (for the summary)."""
    prov, payload = doc.get("provenance", {}), doc.get("payload", {})
    row: dict[str, Any] = {"status": prov.get("status"), "objective": prov.get("objective"), "gap": prov.get("gap")}
    if planner == "collective":
        bound = payload.get("lower_bound") or {}
        row.update(algorithm=payload.get("algorithm"), buffer_bytes=payload.get("size_bytes"),
                   time_us=payload.get("predicted_time_us"), algbw_GBps=payload.get("algbw_GBps"),
                   bound_us=bound.get("time_us"), ratio_to_bound=payload.get("ratio_to_bound"))
    elif planner == "memory":
        predicted = payload.get("predicted") or {}
        row.update(algorithm=payload.get("algorithm"), budget_bytes=payload.get("budget_bytes"),
                   peak_bytes=predicted.get("peak_bytes"), memory_ratio=predicted.get("memory_ratio"),
                   compute_overhead=predicted.get("compute_overhead"))
    elif planner == "threads":
        row.update(algorithm=payload.get("algorithm"), groups=len(payload.get("groups") or []))
    elif planner == "schedule":
        predicted = payload.get("predicted") or {}
        row.update(algorithm=payload.get("algorithm"), iteration_us=predicted.get("iteration_us"))
    return row


def read_plan_bytes(data: bytes, source: str) -> dict[str, Any]:
    """The plan envelope in `data`, checked (format, schema major, schema); InputError otherwise."""
    from mlopt.formats.io import parse_document
    from mlopt.formats.plan import plan_from_dict

    doc = parse_document(data, source)
    plan_from_dict(doc, source)
    return doc


def complete_plan(out_dir: Path, cell: Cell) -> dict[str, Any] | None:
    """The cell's plan envelope when every file of the cell exists and the plan is a valid envelope (the
    MSCCL-EF XML of a collective plan also matching the sidecar's hash); None otherwise."""
    from mlopt.errors import MloptError
    from mlopt.formats.io import sha256_file

    paths = [out_dir / f for f in cell.files]
    if not all(p.is_file() for p in paths):
        return None
    try:
        doc = read_plan_bytes(paths[-1].read_bytes(), str(paths[-1]))
    except (MloptError, OSError, ValueError):
        return None
    if cell.planner == "collective":
        payload = doc.get("payload", {})
        if payload.get("xml") != paths[0].name or payload.get("xml_sha256") != sha256_file(paths[0]):
            return None
    return doc


def metrics_from_files(cell: Cell, files: dict[str, bytes]) -> dict[str, Any]:
    data = files[PurePosixPath(cell.plan_file).name]
    return plan_metrics(cell.planner, json.loads(data))
