"""Plots of memory plans: the memory/compute trade-off of a sweep, and memory over one schedule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from mlopt.sim.plots import _MARKERS, _save

GIB = 2**30


def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: str | os.PathLike) -> Path:
    """Labels, grid and legend shared by the memory plots, then the reproducible save."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def plot_tradeoff(series: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike,
                  title: str = "memory vs compute") -> Path:
    """Compute overhead (%) against memory ratio (peak / store-all peak), one line per algorithm."""
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it

    fig = Figure(figsize=(6.4, 4.2), dpi=120)
    ax = fig.add_subplot()
    for n, (name, rows) in enumerate(sorted(series.items())):
        points = sorted((r["memory_ratio"], 100.0 * r["compute_overhead"]) for r in rows if r.get("peak_bytes"))
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=_MARKERS[n % len(_MARKERS)], label=name)
    ax.scatter([1.0], [0.0], color="black", zorder=3, label="store-all (PyTorch)")
    return _finish(fig, ax, "peak memory / store-all peak", "compute overhead over store-all (%)", title, path)


def plot_memory_timeline(timelines: Mapping[str, Sequence[Any]], path: str | os.PathLike, budget_bytes: int | None,
                         title: str = "memory over the step") -> Path:
    """Memory (GiB) at each operator's peak along forward, recomputation and backward, one line per plan."""
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it

    fig = Figure(figsize=(8.0, 4.2), dpi=120)
    ax = fig.add_subplot()
    for name, events in timelines.items():
        ax.plot(range(len(events)), [e.bytes / GIB for e in events], linewidth=1.0, label=name)
    if budget_bytes:
        ax.axhline(budget_bytes / GIB, color="red", linestyle="--", linewidth=1.0, label="budget")
    return _finish(fig, ax, "operator (forward, then backward stages with their recomputations)", "memory (GiB)", title, path)
