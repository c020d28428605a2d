"""Measured collective costs for the schedule planner (`--cost-table`), the role PARAM's microbenchmarks play in
Syndicate (section 6.6): where a table has a collective at a group size on a channel, motifs are timed from
it instead of the alpha-beta model.

Format: CSV with the header ``collective,ranks,bytes,channel,time_us`` (extra columns are ignored, e.g. PARAM's
or nccl-tests' algbw): ``ranks`` is the group size, ``bytes`` the size in nccl-tests' convention, ``channel`` a
link class of the topology ("nvswitch", "ib", ...) or ``*`` for the whole topology, ``time_us`` the measured
time. Rows of one (collective, ranks, channel) form a curve; a size between two measured sizes is
interpolated linearly, above the largest it is extrapolated along the last segment (bandwidth-bound), below
the smallest it takes the smallest's time (latency-bound). One measured size gives a constant.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from mlopt.errors import InputError
from mlopt.formats.io import check_regular_file
from mlopt.planners.schedule.motifs import COLLECTIVES

COLUMNS = ("collective", "ranks", "bytes", "channel", "time_us")
WHOLE_TOPOLOGY = "*"


@dataclass(frozen=True)
class CostTable:
    source: str
    # (collective, ranks, channel) -> sorted ((bytes, time_us), ...)
    curves: dict[tuple[str, int, str], tuple[tuple[int, float], ...]] = field(default_factory=dict)

    def time_us(self, collective: str, nranks: int, nbytes: float, channel: str) -> float | None:
        """Measured (interpolated) time, or None when the table has no curve for it."""
        curve = self.curves.get((collective, nranks, channel))
        if not curve:
            return None
        sizes = [b for b, _ in curve]
        if len(curve) == 1 or nbytes <= sizes[0]:
            return curve[0][1]
        k = min(max(bisect.bisect_left(sizes, nbytes), 1), len(curve) - 1)
        (b0, t0), (b1, t1) = curve[k - 1], curve[k]
        return max(0.0, t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0))


def load_cost_table(path: str | Path, channels: tuple[str, ...] | None = None) -> CostTable:
    """Read a cost table; InputError (exit 2) naming the file, row and column of the first bad value.
    `channels`: the topology's link classes, to reject a channel it does not have."""
    source = str(path)
    check_regular_file(path)  # a FIFO would block the read, a device never end it
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise InputError(source, "file", f"cannot read the cost table: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(source, "file", f"not UTF-8 text (byte {exc.start}): not a CSV cost table") from None
    rows = list(csv.DictReader(text.splitlines()))
    header = tuple(rows[0].keys()) if rows else tuple(next(csv.reader(text.splitlines()), ()))
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise InputError(source, "header", f"missing column(s) {', '.join(missing)} (need {','.join(COLUMNS)})")
    curves: dict[tuple[str, int, str], dict[int, float]] = {}
    for i, row in enumerate(rows, start=2):
        key, nbytes, time_us = _parse_row(row, source, i, channels)
        points = curves.setdefault(key, {})
        if nbytes in points:
            raise InputError(source, f"row {i}.bytes", f"{key[0]} over {key[1]} ranks on {key[2]!r} at {nbytes} "
                                                       "bytes is measured twice")
        points[nbytes] = time_us
    return CostTable(source, {k: tuple(sorted(v.items())) for k, v in sorted(curves.items())})


def _parse_row(row: dict, source: str, i: int, channels: tuple[str, ...] | None):
    # A permute's time depends on its pairs, not on a group size: it has no curves (always alpha-beta).
    measurable = tuple(c for c in COLLECTIVES if c != "permute")
    collective = (row.get("collective") or "").strip()
    if collective not in measurable:
        raise InputError(source, f"row {i}.collective", f"{collective!r} is not one of {', '.join(measurable)}")
    channel = (row.get("channel") or "").strip()
    if not channel or (channels is not None and channel != WHOLE_TOPOLOGY and channel not in channels):
        known = ", ".join(channels or ()) or "the topology's link classes"
        raise InputError(source, f"row {i}.channel", f"{channel!r} is not a channel of the topology ({known}) "
                                                     f"or {WHOLE_TOPOLOGY!r}")
    nranks = _number(row, "ranks", source, i, int)
    nbytes = _number(row, "bytes", source, i, int)
    time_us = _number(row, "time_us", source, i, float)
    if nranks < 2 or nbytes <= 0 or time_us < 0:
        raise InputError(source, f"row {i}", "need ranks >= 2, bytes > 0 and time_us >= 0")
    return (collective, nranks, channel), nbytes, time_us


def _number(row: dict, column: str, source: str, i: int, kind):
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise InputError(source, f"row {i}.{column}", f"{text!r} is not a number") from None
    if not math.isfinite(value) or (kind is int and value != int(value)):
        raise InputError(source, f"row {i}.{column}", f"{text!r} is not a finite {kind.__name__}")
    return kind(value)
