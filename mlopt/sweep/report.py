"""The sweep's summary: one row per cell as CSV and Markdown (pandas), and algbw-vs-size plots.

DIR/summary.csv: every column (axes, status, exit code, objective, gap, wall time, cache, plan file, the
planner's headline numbers, message, warnings, the matching direct command). DIR/summary.md: the same
rows with the columns a reader scans. DIR/GRID/algbw-COLLECTIVE-TOPOLOGY.png for collective grids: algbw
against buffer size, one series per algorithm option (and per other axis), with the topology's bound.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import atomic_write_text
from mlopt.formats.show import stdout_console
from mlopt.sim.plots import plot_size_sweep
from mlopt.sweep.spec import _token

FIRST = ["grid", "cell"]
AFTER_AXES = ["status", "exit_code", "objective", "gap", "wall_s", "cache", "plan"]
LAST = ["message", "warnings", "command"]
MARKDOWN_DROP = {"exit_code", "warnings", "command", "grid", "buffer_bytes", "bound_us"}


SUMMARY_FILES = ("summary.csv", "summary.md")  # in the sweep's output folder

def require_pandas() -> None:
    try:
        import pandas  # noqa: F401
    except ImportError as exc:
        raise InputError("mlopt sweep", "pandas", f"the summary needs the 'sweep' extra: "
                                                 f"pip install 'mlopt[sweep]' ({exc})") from None


def frame(rows: list[dict[str, Any]]):
    """Rows (dicts with an `axes` mapping) -> a DataFrame, columns in a fixed order."""
    import pandas as pd

    axis_cols: list[str] = []
    metric_cols: list[str] = []
    flat = []
    for row in rows:
        out = {k: v for k, v in row.items() if k != "axes"}
        for axis, value in row["axes"].items():
            if axis not in axis_cols:
                axis_cols.append(axis)
            out[axis] = value
        for k in out:
            if k not in FIRST + AFTER_AXES + LAST + axis_cols and k not in metric_cols and k != "index":
                metric_cols.append(k)
        flat.append(out)
    columns = FIRST + axis_cols + AFTER_AXES + metric_cols + LAST
    return pd.DataFrame(flat, columns=columns)


def _cell_text(value: Any, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        if column == "wall_s":
            return f"{value:.2f}"
        if column in ("gap", "compute_overhead"):
            return f"{value * 100:.2f}%"
        if column.endswith("_bytes") and value.is_integer():  # whole numbers pandas holds as floats (NaN rows)
            return str(int(value))
        return f"{value:.6g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(df) -> str:
    """GitHub Markdown table of a DataFrame (without pandas' optional tabulate dependency)."""
    cols = [c for c in df.columns if c not in MARKDOWN_DROP and not df[c].isna().all()]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for record in df[cols].itertuples(index=False):
        lines.append("| " + " | ".join(_cell_text(v, c) for v, c in zip(record, cols)) + " |")
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path, rows: list[dict[str, Any]], spec_path: str, counts: dict[str, int],
                  plots: list[str]) -> tuple[Path, Path]:
    df = frame(rows)
    csv_path, md_path = (out_dir / name for name in SUMMARY_FILES)
    atomic_write_text(csv_path, df.to_csv(index=False, lineterminator="\n"))
    failed = counts["failed"]
    head = [f"# Sweep {Path(spec_path).name}", "",
            f"{counts['plans']} of {len(rows)} cells have plans ({counts['solved']} solved, {counts['hits']} cache "
            f"hits, {counts['resumed']} resumed); {failed} failed."
            + (" `mlopt sweep` exits 1 when a cell fails." if failed else ""), ""]
    body = markdown_table(df)
    tail = ["", "Plots: " + ", ".join(f"[{p}]({p})" for p in plots)] if plots else []
    atomic_write_text(md_path, "\n".join(head) + body + "\n".join(tail) + ("\n" if tail else ""))
    return csv_path, md_path


def _arg(args: tuple[str, ...], name: str) -> str | None:
    for k in range(len(args) - 1):
        if args[k] == name:
            return args[k + 1]
    return None


def collective_plots(out_dir: Path, cells: list, rows: list[dict[str, Any]]) -> list[str]:
    """algbw vs size per (grid, collective, topology) of the collective cells with plans; relative paths."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for cell, row in zip(cells, rows):
        if cell.planner != "collective" or row.get("time_us") in (None, 0) or not row.get("buffer_bytes"):
            continue
        collective, topology = _arg(cell.args, "--collective"), _arg(cell.args, "--topology")
        if collective is None or topology is None:
            continue
        others = [f"{k}={v}" for k, v in cell.axes if k not in ("collective", "size", "topology")]
        label = ", ".join(others) if others else (_arg(cell.args, "--algorithm") or "auto")
        groups.setdefault((cell.grid, collective, topology), []).append(
            {"algorithm": label, "buffer_bytes": row["buffer_bytes"], "time_us": row["time_us"],
             "bound_us": row.get("bound_us")})
    written = []
    for (grid, collective, topology), points in sorted(groups.items()):
        shown = _token(topology, os.path.isfile(topology))
        rel = f"{grid}/algbw-{collective}-{shown}.png"
        (out_dir / grid).mkdir(parents=True, exist_ok=True)
        plot_size_sweep(points, out_dir / rel, metric="algbw", title=f"{collective} on {shown}: algbw vs size")
        written.append(rel)
    return written


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    """The per-cell summary as a rich table on stdout."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    table.add_column("cell", overflow="fold", min_width=12)
    for name in ("status", "objective", "gap", "wall s", "cache"):
        table.add_column(name, no_wrap=True)
    table.add_column("message", overflow="fold")
    colour = {"optimal": "green", "feasible": "green", "heuristic": "cyan", "infeasible": "yellow"}
    for r in rows:
        style = colour.get(r["status"], "red")
        table.add_row(Text(f"{r['grid']}/{r['cell']}"), Text(str(r["status"]), style=style),
                      _cell_text(r["objective"], "objective"), _cell_text(r["gap"], "gap"),
                      _cell_text(r["wall_s"], "wall_s"), r["cache"], Text(r["message"]))
    stdout_console().print(table)
