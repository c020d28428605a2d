"""Plots of simulated collectives: size sweeps against the lower bound, and message timelines.

Matplotlib is driven through its object API with the Agg canvas (no pyplot, no global backend switch),
and the files are byte-for-byte reproducible: PNG without the Software tag, SVG with a fixed hash salt
and no date, PDF without creation date. The format follows the path's suffix (.png, .svg, .pdf).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SVG_HASHSALT = "mlopt"
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")


def _get(row: Any, key: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(key, default)
    return getattr(row, key, default)


def _save(fig: Any, path: str | os.PathLike) -> Path:
    import matplotlib  # lazy: matplotlib takes ~0.5 s to import and only plots need it
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    FigureCanvasAgg(fig)
    suffix = path.suffix.lower()
    metadata: dict[str, Any]
    if suffix == ".svg":
        metadata = {"Date": None}
    elif suffix == ".pdf":
        metadata = {"CreationDate": None, "ModDate": None}
    elif suffix in (".png", ""):
        metadata = {"Software": None}
    else:
        metadata = {}
    with matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT, "svg.fonttype": "path"}):
        fig.savefig(path, metadata=metadata or None, format=suffix.lstrip(".") or "png")
    return path


def _size_label(nbytes: float) -> str:
    """Binary units for powers of two (nccl-tests sweeps), decimal otherwise."""
    binary = float(nbytes).is_integer() and nbytes >= 1024 and int(nbytes) & (int(nbytes) - 1) == 0
    units = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if binary else (("GB", 1e9), ("MB", 1e6), ("KB", 1e3))
    for unit, scale in units:
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def plot_size_sweep(rows: Iterable[Any], path: str | os.PathLike, *, metric: str = "time",
                    title: str | None = None) -> Path:
    """Time (metric="time", us) or algbw (metric="algbw", GB/s) against buffer size, log-log.

    rows: mappings or objects with `algorithm` (series name), `buffer_bytes`, `time_us`, and optionally
    `bound_us` (the lower bound at that size). The bound is drawn once as a dashed black line (the largest
    bound given for each size; for algbw, the matching upper bound buffer / bound). Series are drawn in
    name order, points in size order. Returns the path written.
    """
    from matplotlib.figure import Figure  # lazy: matplotlib takes ~0.5 s to import and only plots need it

    if metric not in ("time", "algbw"):
        raise ValueError("metric must be 'time' or 'algbw'")
    series: dict[str, list[tuple[float, float]]] = {}
    bounds: dict[float, float] = {}
    for row in rows:
        size = float(_get(row, "buffer_bytes"))
        t = float(_get(row, "time_us"))
        series.setdefault(str(_get(row, "algorithm", "algorithm")), []).append((size, t))
        b = _get(row, "bound_us")
        if b is not None:
            bounds[size] = max(float(b), bounds.get(size, 0.0))
    if not series and not bounds:
        raise ValueError("nothing to plot")

    def y(size: float, t: float) -> float:
        return t if metric == "time" else size / t / 1e3

    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    for k, name in enumerate(sorted(series)):
        pts = sorted(series[name])
        ax.plot([s for s, _ in pts], [y(s, t) for s, t in pts], marker=_MARKERS[k % len(_MARKERS)], ms=4,
                label=name)
    if bounds:
        pts = sorted((s, b) for s, b in bounds.items() if b > 0)
        ax.plot([s for s, _ in pts], [y(s, b) for s, b in pts], "k--", lw=1.2, label="lower bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({s for pts in series.values() for s, _ in pts} | set(bounds))
    if len(sizes) <= 12:
        ax.set_xticks(sizes)
        ax.set_xticklabels([_size_label(s) for s in sizes], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("buffer size (nccl-tests convention)")
    ax.set_ylabel("time (us)" if metric == "time" else "algbw (GB/s)")
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_timeline(result: Any, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Gantt chart of a simulation's messages: one row per link (src->dst), a bar per message from issue
    to delivery, coloured by sender. `result` is a SimResult or TransferResult simulated with
    timeline=True."""
    import matplotlib  # lazy: matplotlib takes ~0.5 s to import and only plots need it
    from matplotlib.figure import Figure

    entries = getattr(result, "timeline", None)
    if entries is None:
        raise ValueError("the result has no timeline: simulate with timeline=True")
    links = sorted({(e.src, e.dst) for e in entries})
    row = {l: i for i, l in enumerate(links)}
    fig = Figure(figsize=(8.0, min(0.3 * max(4, len(links)) + 1.2, 40.0)))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["tab10"]
    for e in sorted(entries, key=lambda e: (e.src, e.dst, e.start_us)):
        ax.broken_barh([(e.start_us, max(e.end_us - e.start_us, 0.0))], (row[(e.src, e.dst)] - 0.4, 0.8),
                       facecolors=cmap(e.src % 10), edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(links)))
    ax.set_yticklabels([f"{a}->{b}" for a, b in links], fontsize=7 if len(links) < 40 else 4)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_ylabel("link")
    ax.set_title(title or f"messages per link (issue to delivery), {getattr(result, 'time_us', 0):.1f} us")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
