"""Gantt charts of a schedule plan's compared systems (Syndicate paper, Fig. 15): `mlopt simulate --gantt-systems`.

A schedule plan records, per compared system (fifo, bs+, s-exec, s-sched, syndicate), its issue order and the
execution option of every comm-op (`payload.system_plans`). :func:`system_schedules` replays each of them with
optSched on the problem rebuilt from the trace and topology (:func:`problem_from_plan`, as `mlopt validate`
does), and :func:`plot_systems` draws them one panel per system on a shared time axis: a row for the compute
stream and one per channel; compute in one colour, motifs coloured by their collective (a motif holding
several channels is drawn on each of its rows), dashed lines where an unrolled iteration ends (the end of its
last task, compute or motif, as the iteration simulator measures it).

Matplotlib's object API on the Agg canvas, saved through `mlopt.sim.plots._save` (no Software tag, so the same
input gives the same bytes) into a temporary file whose bytes are then written atomically.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from mlopt.errors import InputError
from mlopt.formats.io import atomic_write_bytes, staged_files
from mlopt.planners.schedule.from_trace import cost_table_for
from mlopt.planners.schedule.planner import issued
from mlopt.planners.schedule.optsched import Schedule, ScheduleProblem, optsched
from mlopt.planners.schedule.problem import schedule_problem
from mlopt.sim import workload as wl
from mlopt.sim.plots import _save
from mlopt.sim.training_plots import COLLECTIVE_COLORS

SYSTEMS = ("fifo", "bs+", "hand", "s-exec", "s-sched", "syndicate")  # the paper's order (and hand), for the panels
COMPUTE_COLOR = "#4c72b0"
OTHER_COLOR = "#17becf"  # a motif whose collective is unknown or has no colour of its own
COMPUTE_ROW = "compute"


class SystemPlanError(ValueError):
    """A system's plan does not fit the problem; `field` is the JSON path of the culprit in the plan file."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


# ------------------------------------------------------------------------------------------------- replay


def problem_from_plan(payload: Mapping[str, Any], trace, topology, source: str) -> ScheduleProblem:
    """The ScheduleProblem the plan was searched on: the trace unrolled over the plan's iterations, timed in
    its network mode (as `mlopt plan schedule` and `mlopt validate --model --topology` build it)."""
    options = payload["options"]
    workload = wl.chain(wl.from_trace(trace, source=source), options["iterations"])
    return schedule_problem(workload, topology, mode=options["mode"], source=source,
                            costs=cost_table_for(options.get("cost_table"), topology))


def system_names(names) -> list[str]:
    """The paper's order first (fifo, bs+, s-exec, s-sched, syndicate), then any other name sorted."""
    names = list(names)
    return [n for n in SYSTEMS if n in names] + sorted(n for n in names if n not in SYSTEMS)


def system_schedules(problem: ScheduleProblem, payload: Mapping[str, Any], *,
                     check_makespan: bool = True) -> dict[str, Schedule]:
    """Every system of `payload["system_plans"]` replayed by optSched (its order, its option per comm-op), in
    the paper's order. SystemPlanError (a ValueError with the JSON `field`) when the plan does not fit the
    problem: no system plans, other comm-ops, an option list of another length or out of range, an unknown
    order, or (check_makespan) a replayed makespan other than the plan's `makespan_us`."""
    plans = payload.get("system_plans")
    if not isinstance(plans, Mapping) or not plans:
        raise SystemPlanError("$.payload.system_plans", "missing: the plan has no per-system plans to draw "
                                                        "(replan it with this version of `mlopt plan schedule`)")
    comm = [t.id for t in problem.tasks if t.kind == "comm"]
    ops = payload.get("comm_ops")
    if isinstance(ops, list):
        ids = [op.get("id") if isinstance(op, Mapping) else None for op in ops]
        if ids != comm:
            raise SystemPlanError("$.payload.comm_ops", f"the plan lists {len(ids)} comm-ops, the problem rebuilt "
                                                        f"from the trace and topology has {len(comm)} (or other ids): "
                                                        "the plan was made for another trace")
    out: dict[str, Schedule] = {}
    for name in system_names(plans):
        entry = plans[name]
        where = f"$.payload.system_plans.{name}"
        if not isinstance(entry, Mapping):
            raise SystemPlanError(where, "must be an object with order and options")
        options = entry.get("options")
        if not isinstance(options, list) or len(options) != len(comm):
            count = len(options) if isinstance(options, list) else "no"
            raise SystemPlanError(f"{where}.options", f"system {name!r} has {count} execution options, the problem "
                                                      f"has {len(comm)} comm-ops (one option per comm-op, in the "
                                                      "order of comm_ops)")
        issue = entry.get("issue", "enforcer")
        if issue not in ("framework", "enforcer"):
            raise SystemPlanError(f"{where}.issue", f"system {name!r}: issue must be 'framework' or 'enforcer', "
                                                    f"got {issue!r}")
        try:
            schedule = optsched(issued(problem, issue), dict(zip(comm, options)), entry.get("order"))
        except ValueError as exc:
            field = f"{where}.order" if str(exc).startswith("order ") else f"{where}.options"
            raise SystemPlanError(field, f"system {name!r}: {exc}") from None
        recorded = entry.get("makespan_us")
        if check_makespan and isinstance(recorded, (int, float)) and not math.isclose(
                schedule.makespan_us, recorded, rel_tol=1e-9, abs_tol=1e-6):
            raise SystemPlanError(f"{where}.makespan_us", f"system {name!r}: the plan says {recorded} us, optSched "
                                                          f"replays {schedule.makespan_us} us (another trace, topology "
                                                          "or mode?)")
        out[name] = schedule
    return out


# ---------------------------------------------------------------------------------------------------- plots


def iterations_of(problem: ScheduleProblem) -> int:
    """Unrolled iterations of the problem (its tasks' iteration numbers)."""
    return max((t.iteration for t in problem.tasks), default=0) + 1


def iteration_ends(problem: ScheduleProblem, schedule: Schedule) -> list[float]:
    """End of each unrolled iteration but the last: the end of its last task (compute or comm)."""
    ends: dict[int, float] = {}
    for t in problem.tasks:
        if t.id in schedule.task_times:
            ends[t.iteration] = max(ends.get(t.iteration, 0.0), schedule.task_times[t.id][1])
    return [ends[k] for k in sorted(ends)][:-1]


def system_title(name: str, schedule: Schedule, iterations: int) -> str:
    return (f"{name}: {schedule.makespan_us / max(1, iterations):,.1f} us/iteration, "
            f"compute idle {schedule.compute_idle_pct:.1f}%")


def motif_collective(problem: ScheduleProblem, schedule: Schedule, task_id: int, index: int) -> str:
    """The collective a motif (MotifRun) runs: from the problem's decompositions (per option, per run: a
    motifs.Motif, or the tuple of Motifs issued together as that run, all of one collective), else the
    comm-op's, else ''."""
    option = schedule.plan.get(task_id, 0)
    decomposition = problem.decompositions.get(task_id)
    if decomposition and option < len(decomposition) and index < len(decomposition[option]):
        part = decomposition[option][index]
        if isinstance(part, (tuple, list)):
            part = part[0] if part else None
        collective = getattr(part, "collective", "")
        if collective:
            return str(collective)
    op = problem.ops.get(task_id)
    return str(getattr(op, "collective", "")) if op is not None else ""


def _merged(intervals) -> list[tuple[float, float]]:
    """Union of (start, end) intervals of positive length, sorted."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _draw_panel(ax, problem: ScheduleProblem, schedule: Schedule, legend: dict[str, str]) -> None:
    rows = [COMPUTE_ROW, *problem.channels]
    row = {name: k for k, name in enumerate(rows)}
    compute = _merged(schedule.task_times[t.id] for t in problem.tasks if t.kind == "compute")
    if compute:  # the busy stretches of the stream, without edges: dense small kernels stay one colour
        ax.broken_barh([(s, e - s) for s, e in compute], (row[COMPUTE_ROW] - 0.4, 0.8), facecolors=COMPUTE_COLOR,
                       linewidth=0)
        legend.setdefault("compute", COMPUTE_COLOR)
    edge = {"edgecolor": "black", "linewidth": 0.15 if len(schedule.motifs) > 150 else 0.3}
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for m in schedule.motifs:
        collective = motif_collective(problem, schedule, m.task_id, m.motif_index)
        for channel in sorted(m.channels):
            bars.setdefault((channel, collective), []).append((m.start_us, max(m.end_us - m.start_us, 0.0)))
    for (channel, collective), spans in sorted(bars.items(), key=lambda kv: (row[kv[0][0]], kv[0][1])):
        color = COLLECTIVE_COLORS.get(collective, OTHER_COLOR)
        ax.broken_barh(sorted(spans), (row[channel] - 0.4, 0.8), facecolors=color, **edge)
        legend.setdefault(collective or "comm", color)
    for end in iteration_ends(problem, schedule):
        ax.axvline(end, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # compute on top
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _figure(problem: ScheduleProblem, panels: list[tuple[str, Schedule]], title: str | None):
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it
    from matplotlib.patches import Patch

    rows = 1 + len(problem.channels)
    height = 0.9 + len(panels) * (0.55 + 0.32 * rows) + (0.3 if title else 0.0)
    fig = Figure(figsize=(11.0, height), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    legend: dict[str, str] = {}
    for ax, (panel_title, schedule) in zip(axes, panels):
        _draw_panel(ax, problem, schedule, legend)
        ax.set_title(panel_title, fontsize=9, loc="left")
    axes[-1].set_xlim(0, max([s.makespan_us for _, s in panels] + [1e-9]))
    axes[-1].set_xlabel("time (us)")
    if title:
        fig.suptitle(title, fontsize=10)
    handles = [Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=l) for l, c in legend.items()]
    if handles:
        fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=len(handles), frameon=False)
    return fig


def _save_atomic(fig, path: str | os.PathLike) -> Path:
    """`_save` (reproducible bytes, format from the suffix) into a temporary file, then an atomic write."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="mlopt-gantt-") as tmp:
        scratch = _save(fig, Path(tmp) / f"figure{path.suffix or '.png'}")
        atomic_write_bytes(path, scratch.read_bytes())
    return path


def plot_systems(problem: ScheduleProblem, schedules: Mapping[str, Schedule], path: str | os.PathLike,
                 title: str | None = None) -> Path:
    """One panel per system (in the order of `schedules`) stacked on a shared time axis; the legend once.
    Returns the path written (format from its suffix; PNG by default)."""
    if not schedules:
        raise ValueError("no systems to draw")
    iterations = iterations_of(problem)
    panels = [(system_title(name, s, iterations), s) for name, s in schedules.items()]
    return _save_atomic(_figure(problem, panels, title), path)


def plot_system(problem: ScheduleProblem, schedule: Schedule, path: str | os.PathLike, title: str | None = None,
                *, name: str | None = None) -> Path:
    """One system's schedule alone (panel titled with `name`, default its issue order; `title` heads the
    figure)."""
    panel = system_title(name or f"{schedule.order} order", schedule, iterations_of(problem))
    return _save_atomic(_figure(problem, [(panel, schedule)], title), path)


def system_file(path: str | os.PathLike, name: str) -> Path:
    """`<stem>.<system><suffix>` next to `path`; the name made file-safe ("bs+" -> "bs-plus")."""
    path = Path(path)
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.replace("+", "-plus")).strip("-") or "system"
    return path.with_name(f"{path.stem}.{safe}{path.suffix or '.png'}")


# ------------------------------------------------------------------------------------------------------ CLI


def write_system_gantts(plan_path: str | os.PathLike, payload: Mapping[str, Any], trace, topology, source: str,
                        path: str | os.PathLike, title: str | None = None) -> list[Path]:
    """`mlopt simulate PLAN --model TRACE --topology T --gantt-systems PATH`: the combined figure at `path` and
    one figure per system next to it (:func:`system_file`), all of them or none. Returns the paths written,
    the combined one first. A plan that does not fit the trace and topology: InputError naming the plan file
    and the field (exit 2)."""
    plan_path = str(plan_path)
    options = payload.get("options")
    if not isinstance(options, Mapping) or "iterations" not in options or "mode" not in options:
        raise InputError(plan_path, "$.payload.options", "needs iterations and mode (the problem the plan was made on)")
    try:
        problem = problem_from_plan(payload, trace, topology, source)
    except (ValueError, TypeError) as exc:
        raise InputError(plan_path, "$.payload.options", str(exc)) from None
    try:
        schedules = system_schedules(problem, payload)
    except SystemPlanError as exc:
        raise InputError(plan_path, exc.field, str(exc)) from None
    files = {name: system_file(path, name) for name in schedules}
    if len(set(files.values())) < len(files):
        raise InputError(plan_path, "$.payload.system_plans", "two system names map to the same file name: "
                                                              + ", ".join(sorted(schedules)))

    targets = [Path(path), *files.values()]
    with staged_files(targets) as temps:  # every figure or none
        plot_systems(problem, schedules, temps[0], title)
        for (name, schedule), temp in zip(schedules.items(), temps[1:]):
            plot_system(problem, schedule, temp, title, name=name)
    return targets
