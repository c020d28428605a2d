"""Reading the Kineto (torch.profiler Chrome-trace JSON) files that accompany a PyTorch Execution Trace.

Only what the ET importer needs is read:

- host events (`ph: "X"`, categories such as `cpu_op` and `user_annotation`) that carry
  `args["Record function id"]`: that id is the ET node attribute `rf_id`, the join key between the two
  files. Their `ts` and `dur` are in microseconds.
- device events (`kernel`, `gpu_memcpy`, `gpu_memset`) linked to the host op that launched them through
  `args["External id"]` (the host op carries the same `External id`). On GPU traces an op's time is the
  sum of its kernels, not the host-side dispatch time.
- `distributedInfo` (rank, world size, process groups) when the trace was taken in a distributed job.

`[memory]` instant events, flow events (`fwdbwd`, `ac2g`) and metadata are ignored.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.io import read_document

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


@dataclass(frozen=True)
class KinetoEvent:
    """One host-side op or annotation, keyed in `KinetoTrace.events` by its record function id."""

    name: str
    ts: float  # us
    dur: float  # us
    external_id: int | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def contains(self, other: "KinetoEvent") -> bool:
        return self.ts <= other.ts and other.end <= self.end


@dataclass(frozen=True)
class KinetoTrace:
    events: dict[int, KinetoEvent]  # record function id -> host event
    device_us: dict[int, float] = field(default_factory=dict)  # External id -> summed device time (us)
    rank: int | None = None
    world_size: int | None = None

    def device_time(self, rf_id: int) -> float:
        """Device time (us) of the kernels launched directly by the host op with this record function id."""
        event = self.events.get(rf_id)
        if event is None or event.external_id is None:
            return 0.0
        return self.device_us.get(event.external_id, 0.0)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def parse_kineto(doc: Any, source: str) -> KinetoTrace:
    """A `KinetoTrace` from an already parsed Kineto document (see `read_kineto`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(source, "$.traceEvents", "not a Kineto trace: no `traceEvents` list")
    events: dict[int, KinetoEvent] = {}
    device_us: dict[int, float] = {}
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args = ev.get("args")
        if not isinstance(args, dict):
            continue
        ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
        if ts is None or dur is None:
            raise InputError(source, f"$.traceEvents[{i}]", "complete event (ph \"X\") without numeric `ts` and `dur`")
        for key, value in (("ts", ts), ("dur", dur)):
            if not math.isfinite(value):  # NaN/Infinity tokens or 1e400: would become op times
                raise InputError(source, f"$.traceEvents[{i}].{key}", f"{value} is not a finite number")
        if dur < 0:
            raise InputError(source, f"$.traceEvents[{i}].dur", f"negative duration {dur}")
        ext = _int(args.get("External id"))
        if isinstance(ev.get("cat"), str) and ev["cat"] in DEVICE_CATEGORIES:
            if ext is not None:
                device_us[ext] = device_us.get(ext, 0.0) + dur
            continue
        rf = _int(args.get("Record function id"))
        if rf is None:
            continue
        # Record function ids are unique per host op; keep the first event should a trace repeat one.
        events.setdefault(rf, KinetoEvent(str(ev.get("name", "")), ts, dur, ext))
    rank, world = _distributed(doc.get("distributedInfo"), source)
    return KinetoTrace(events, device_us, rank, world)


def _distributed(info: Any, source: str) -> tuple[int | None, int | None]:
    """(rank, world size) from `distributedInfo`, each None when absent; a negative rank, an empty world or a
    rank outside it is bad input, not something to carry into the trace."""
    if not isinstance(info, dict):
        return None, None
    rank, world = _int(info.get("rank")), _int(info.get("world_size"))
    if world is not None and world < 1:
        raise InputError(source, "$.distributedInfo.world_size", f"{world}: a world has at least one rank")
    if rank is not None and (rank < 0 or (world is not None and rank >= world)):
        span = f"0..{world - 1}" if world is not None else ">= 0"
        raise InputError(source, "$.distributedInfo.rank", f"{rank} is outside the world ({span})")
    return rank, world


def read_kineto(path: str | os.PathLike) -> KinetoTrace:
    """Read a Kineto trace (plain or gzipped JSON); InputError when it is unreadable or not a Kineto trace."""
    return parse_kineto(read_document(path), str(path))


def read_kineto_durations(path: str | os.PathLike) -> dict[int, float]:
    """Record function id -> host-side duration in microseconds, for every host op in the trace."""
    return {rf: ev.dur for rf, ev in read_kineto(path).events.items()}
