"""`mlopt sweep SPEC -o DIR`: resume, cache, execute, install, summarise.

Per cell, in spec order: with --resume, a cell whose files exist and whose plan is a valid envelope is
kept as it is ("resumed"); else a cache hit is copied in ("hit"); else the cell is sent to the executor
and, when it wrote a plan, installed and cached ("miss"; "off" without a cache). A cell that fails (exit
3: infeasible; 2: bad input such as a broken sketch; 1: anything else) is recorded with its message and
the sweep goes on; its files from an earlier run are removed. The summary lists every cell.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from mlopt.errors import InputError, MloptError
from mlopt.formats.io import output_error
from mlopt.planners.registry import plan_metrics
from mlopt.sweep import cache as cache_mod
from mlopt.sweep.cells import Cell, complete_plan, metrics_from_files, status_of_exit
from mlopt.sweep.executors import check_available, execute
from mlopt.sweep.report import SUMMARY_FILES, collective_plots, require_pandas, write_summary
from mlopt.sweep.spec import load_spec

PLAN_STATUSES = ("optimal", "feasible", "heuristic")


class SweepFailed(MloptError):
    """Some cells failed (their plans are missing); the others were written. Exit code 1."""

    exit_code = 1


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]
    counts: dict[str, int]
    summary_csv: Path
    summary_md: Path
    plots: list[str]

    def raise_for_failures(self) -> None:
        failed = [r for r in self.rows if r["status"] not in PLAN_STATUSES]
        if failed:
            first = failed[0]
            raise SweepFailed(f"{len(failed)} of {len(self.rows)} cells failed (first: "
                              f"{first['grid']}/{first['cell']}: {first['status']}: {first['message']}); "
                              f"see {self.summary_md}")


def run_sweep(spec_path: str, out_dir: str, *, executor: str = "local", address: str | None = None,
              workers: int | None = None, resume: bool = False, cache_dir: str | None = None,
              use_cache: bool = True, verbose: int = 1, bar: bool = False) -> SweepResult:
    spec = load_spec(spec_path)
    require_pandas()
    check_available(executor, address)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "$", "is a file; -o names the sweep's folder")
    check_summary_paths(out)
    new_folder = not out.exists()
    before = set() if new_folder else files_under(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _run(spec, out, executor, address, workers, resume, cache_dir, use_cache, verbose, bar)
    except OSError as exc:
        undo_outputs(out, new_folder, before)
        raise output_error(out, exc) from None
    except BaseException:  # a failure or Ctrl-C of the sweep itself (not of a cell): leave no new files
        undo_outputs(out, new_folder, before)
        raise


def check_summary_paths(out: Path) -> None:
    """The summary files must be writable as files: found before any cell runs, not after the last one."""
    for name in SUMMARY_FILES:
        if (out / name).is_dir():
            raise InputError(str(out / name), "$", "is a directory; the sweep writes its summary there")


def files_under(out: Path) -> set[Path]:
    return {p for p in out.rglob("*")}


def undo_outputs(out: Path, new_folder: bool, before: set[Path]) -> None:
    """Remove what this run added: the whole folder when it made it, else the files and folders that were not
    there before (files it replaced keep their new content: a rerun of those cells)."""
    import shutil

    if new_folder:
        shutil.rmtree(out, ignore_errors=True)
        return
    for path in sorted(files_under(out) - before, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _run(spec, out: Path, executor: str, address: str | None, workers: int | None, resume: bool,
         cache_dir: str | None, use_cache: bool, verbose: int, bar: bool) -> SweepResult:
    cache = cache_mod.PlanCache(cache_dir or cache_mod.default_cache_dir()) if use_cache else None
    cells = list(spec.cells)
    rows: dict[int, dict[str, Any]] = {}
    keys: dict[int, str] = {}
    pending: list[Cell] = []
    with _reporter(len(cells), verbose, bar) as report:
        for cell in cells:
            if resume:
                doc = complete_plan(out, cell)
                if doc is not None:
                    rows[cell.index] = _row(cell, out, plan_metrics(cell.planner, doc), 0, "", [], None, "resumed")
                    report(cell, rows[cell.index])
                    continue
            if cache is not None and not cell.record_wall_time:
                keys[cell.index] = cache_mod.cell_key(cell)
                started = time.perf_counter()
                files = cache.lookup(keys[cell.index])
                if files is not None and cell.plan_file.rsplit("/", 1)[-1] in files:
                    cache_mod.install_files(out, cell, files)
                    rows[cell.index] = _row(cell, out, metrics_from_files(cell, files), 0, "", [],
                                            time.perf_counter() - started, "hit")
                    report(cell, rows[cell.index])
                    continue
            pending.append(cell)
        by_index = {cell.index: cell for cell in pending}
        tasks = [(cell.index, cell.task(out)) for cell in pending]
        for index, outcome in execute(executor, tasks, address=address, workers=workers):
            cell = by_index[index]
            rows[index] = _finish(cell, out, outcome, cache if index in keys else None, keys.get(index))
            report(cell, rows[index])
    ordered = [rows[c.index] for c in cells]
    counts = {
        "plans": sum(r["status"] in PLAN_STATUSES for r in ordered),
        "failed": sum(r["status"] not in PLAN_STATUSES for r in ordered),
        "hits": sum(r["cache"] == "hit" for r in ordered),
        "resumed": sum(r["cache"] == "resumed" for r in ordered),
    }
    counts["solved"] = counts["plans"] - counts["hits"] - counts["resumed"]
    plots = collective_plots(out, cells, ordered)
    csv_path, md_path = write_summary(out, ordered, spec.path, counts, plots)
    return SweepResult(ordered, counts, csv_path, md_path, plots)


def _finish(cell: Cell, out: Path, outcome: Any, cache: cache_mod.PlanCache | None, key: str | None) -> dict:
    cache_state = "miss" if cache is not None else "off"
    if isinstance(outcome, BaseException):
        cache_mod.remove_files(out, cell)
        return _row(cell, out, {"status": "error"}, 1, f"the worker failed: {type(outcome).__name__}: {outcome}",
                    [], None, cache_state)
    code, files = outcome["code"], outcome["files"]
    plan_name = cell.plan_file.rsplit("/", 1)[-1]
    if code == 0 and plan_name not in files:
        code, outcome = 1, {**outcome, "message": f"internal error: the command wrote no {plan_name}"}
    if code != 0:
        cache_mod.remove_files(out, cell)
        return _row(cell, out, {"status": status_of_exit(code)}, code, outcome["message"], outcome["warnings"],
                    outcome["wall_s"], cache_state)
    cache_mod.install_files(out, cell, files)
    if cache is not None and key is not None:
        cache.store(key, cell, files)
    return _row(cell, out, metrics_from_files(cell, files), 0, "", outcome["warnings"], outcome["wall_s"],
                cache_state)


def _row(cell: Cell, out: Path, metrics: dict[str, Any], code: int, message: str, warnings: list[str],
         wall_s: float | None, cache_state: str) -> dict[str, Any]:
    metrics = dict(metrics)
    status = metrics.pop("status", None)
    if "algorithm" in metrics:
        metrics["plan_algorithm"] = metrics.pop("algorithm")
    return {
        "index": cell.index, "grid": cell.grid, "cell": cell.stem, "axes": dict(cell.axes),
        "status": status, "exit_code": code, "objective": metrics.pop("objective", None),
        "gap": metrics.pop("gap", None), "wall_s": wall_s, "cache": cache_state,
        "plan": cell.plan_file if code == 0 else None, **metrics,
        "message": message, "warnings": "; ".join(warnings), "command": cell.command(out),
    }


def _line(done: int, total: int, cell: Cell, row: dict[str, Any]) -> str:
    what = row["status"]
    if row["objective"] is not None:
        what += f", objective {row['objective']:.6g}"
    if row["cache"] in ("hit", "resumed"):
        what += f", {'cache hit' if row['cache'] == 'hit' else 'resumed'}"
    elif row["wall_s"] is not None:
        what += f", {row['wall_s']:.1f} s"
    if row["message"]:
        what += f": {row['message']}"
    return f"[{done}/{total}] {cell.grid}/{cell.stem}: {what}"


@contextlib.contextmanager
def _reporter(total: int, verbose: int, bar: bool) -> Iterator[Callable[[Cell, dict[str, Any]], None]]:
    """A rich progress bar over cells (bar=True) with one line per finished cell; plain lines otherwise
    (verbose >= 1); nothing with -q."""
    done = 0
    if not bar or verbose < 1:
        def plain(cell: Cell, row: dict[str, Any]) -> None:
            nonlocal done
            done += 1
            if verbose >= 1:
                print(_line(done, total, cell, row), file=sys.stderr, flush=True)

        yield plain
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    console = Console(stderr=True)
    colour = {"optimal": "green", "feasible": "green", "heuristic": "cyan", "infeasible": "yellow", "error": "red"}
    with Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), TextColumn("{task.description}"), console=console) as progress:
        task = progress.add_task("", total=total)

        def fancy(cell: Cell, row: dict[str, Any]) -> None:
            nonlocal done
            done += 1
            style = colour.get(row["status"], "red")
            progress.console.print(f"[{style}]{escape(_line(done, total, cell, row))}[/{style}]", highlight=False)
            progress.update(task, advance=1, description=escape(f"{cell.grid}/{cell.stem}"))

        yield fancy
