"""Plots of a simulated training iteration: a Gantt timeline of the lanes, and exposed vs overlapped time of
each collective. Matplotlib's object API on the Agg canvas, saved reproducibly (see mlopt.sim.plots)."""

from __future__ import annotations

import os
from pathlib import Path

from mlopt.sim.plots import _save
from mlopt.sim.training import IterationReport, ItemTiming

PHASE_COLORS = {
    "forward": "#4c72b0", "backward": "#dd8452", "weight_grad": "#c44e52", "optimizer": "#55a868",
    "recompute": "#e5ae38", "other": "#9b9b9b",
}
COLLECTIVE_COLORS = {
    "allreduce": "#8172b3", "allgather": "#64b5cd", "reducescatter": "#da8bc3", "alltoall": "#ccb974",
    "broadcast": "#937860", "reduce": "#8c8c8c", "barrier": "#222222",
}
EXPOSED_COLOR = "#d62728"
OVERLAPPED_COLOR = "#2ca02c"


def _color(t: ItemTiming) -> tuple[str, str]:
    """(legend label, colour) of an item: compute by phase, comm by collective."""
    if t.kind == "comm":
        return t.collective or "comm", COLLECTIVE_COLORS.get(t.collective, "#17becf")
    return t.phase or "compute", PHASE_COLORS.get(t.phase, "#bcbd22")


def plot_gantt(report: IterationReport, path: str | os.PathLike, title: str | None = None) -> Path:
    """Lanes top to bottom: compute, each channel, and a last row marking exposed communication (collectives
    running while compute idles). Compute bars are coloured by phase, collectives by kind; dashed lines
    mark iteration boundaries. Returns the path written (format from its suffix)."""
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it
    from matplotlib.patches import Patch

    lanes = report.lanes() + ["exposed comm"]
    row = {lane: k for k, lane in enumerate(lanes)}
    bars: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for t in report.items:
        label, color = _color(t)
        bars.setdefault((t.lane, label, color), []).append((t.start_us, max(t.duration_us, 0.0)))
    fig = Figure(figsize=(10.0, 1.2 + 0.55 * len(lanes)))
    ax = fig.add_subplot()
    legend: dict[str, str] = {}
    for (lane, label, color), spans in sorted(bars.items(), key=lambda kv: (row[kv[0][0]], kv[0][1])):
        ax.broken_barh(spans, (row[lane] - 0.4, 0.8), facecolors=color, edgecolor="black", linewidth=0.2)
        legend.setdefault(label, color)
    exposed = [(s, e - s) for s, e in report.exposed_intervals()]
    if exposed:
        ax.broken_barh(exposed, (row["exposed comm"] - 0.4, 0.8), facecolors=EXPOSED_COLOR)
        legend.setdefault("exposed comm", EXPOSED_COLOR)
    for end in report.iteration_ends()[:-1]:
        ax.axvline(end, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(report.iteration_time_us, 1e-9))
    ax.set_xlabel("time (us)")
    ax.set_title(title or _summary(report), fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    handles = [Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=l) for l, c in legend.items()]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return _save(fig, path)


def _summary(report: IterationReport) -> str:
    T = report.iteration_time_us
    share = 100.0 * report.exposed_us / T if T > 0 else 0.0
    return (f"{report.workload or 'workload'}: {T:,.1f} us, compute {report.compute_us:,.1f} us, "
            f"exposed comm {report.exposed_us:,.1f} us ({share:.1f}%), {report.policy}, "
            f"{report.channels} channel{'s' if report.channels != 1 else ''}")


def _top_collectives(report: IterationReport, top: int) -> list[ItemTiming]:
    comm = [t for t in report.items if t.kind == "comm"]
    if len(comm) > top:
        keep = {t.id for t in sorted(comm, key=lambda t: (-t.exposed_us, -t.duration_us, t.id))[:top]}
        comm = [t for t in comm if t.id in keep]
    return sorted(comm, key=lambda t: (t.start_us, t.id))


def _label(t: ItemTiming, iterations: int) -> str:
    it = f" it{t.iteration}" if iterations > 1 else ""
    return f"{t.name}{it} [{t.id}]"


def plot_exposed(report: IterationReport, path: str | os.PathLike, title: str | None = None, *,
                 top: int = 30) -> Path:
    """Horizontal bars, one per collective in start order: its exposed time (compute idle) and its
    overlapped time (hidden behind compute). With more than `top` collectives, the `top` most exposed."""
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it

    rows = _top_collectives(report, top)
    iterations = len(report.per_iteration_us)
    fig = Figure(figsize=(8.0, 1.6 + 0.28 * max(len(rows), 3)))
    ax = fig.add_subplot()
    if rows:
        y = range(len(rows))
        exposed = [t.exposed_us for t in rows]
        hidden = [max(t.duration_us - t.exposed_us, 0.0) for t in rows]
        ax.barh(y, exposed, color=EXPOSED_COLOR, label="exposed")
        ax.barh(y, hidden, left=exposed, color=OVERLAPPED_COLOR, label="overlapped")
        ax.set_yticks(list(y))
        ax.set_yticklabels([_label(t, iterations) for t in rows], fontsize=7 if len(rows) < 40 else 5)
        ax.invert_yaxis()
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no collectives", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
    ax.set_xlabel("time (us)")
    shown = "" if len(rows) == sum(t.kind == "comm" for t in report.items) else f" (top {len(rows)} by exposed)"
    ax.set_title(title or f"exposed vs overlapped communication per collective{shown}", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)

