"""Syndicate's plan enforcer (Pseudocode 2) on the C++ runtime: binding, motif table and a multi-rank harness.

The enforcer itself lives in the runtime library (runtime/src/enforcer.cpp, `mlopt_enforcer_*` in mlopt.h;
docs/enforcer.md). This module

* binds it (`Enforcer`, a context manager like `native.LocalComm`);
* turns a schedule plan's payload (`mlopt plan schedule`) into a `MotifTable`: the comm-ops of one unrolled
  training iteration, numbered by submission order, each split into motifs with dense sequence numbers
  (`MotifTable.from_plan`), or the FIFO baseline where every op is one motif on every channel
  (`MotifTable.fifo`), or the plan's steady-state period with the next iteration's prefetched comm-ops and the
  prologue run once before it (`MotifTable.steady_state`);
* makes an MSCCL-EF program per motif (`ProgramCache`: the ring baseline lowered for a fully connected
  topology of the motif's size, or a direct send/receive program for a splined all-to-all's pattern or a
  permute's (source, destination) pairs; or, with a chooser, a planned XML such as a collective plan when it
  is usable for the motif) and the staging layout that maps the op's buffers onto the program's buffers
  (`stage`);
* runs a "real iteration" with one Python thread per rank acting as the application (`run_iteration_harness`;
  a steady-state period after its prologue, items from `period_items`).

Buffer model (mlopt/planners/schedule/motifs.py): every rank holds an input and an output buffer of the op's
`nbytes`; the output starts as the input, every motif but all-to-all and permute works in place on the output,
all-to-all and permute read the input (a permute writes the destinations' outputs only). A motif's `regions`
say which bytes of the op buffer it covers; staging buffers are padded to the program's chunk count (the
padding is zero and never scattered back).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from mlopt.formats.io import sha256_bytes
from mlopt.planners.schedule.motifs import BLOCKED, ROOTED, CommOp, Motif, as_motif
from mlopt.planners.schedule.programs import motif_program_xml, program_collective  # noqa: F401 - re-exported
from mlopt.native import binding as native

SOURCE_OUTPUT = 0  # mlopt_motif_source
SOURCE_INPUT = 1
MAX_CHANNELS = 64  # bits of mlopt_motif_desc.channel_mask
_log = logging.getLogger(__name__)
REDUCING = frozenset({"allreduce", "reducescatter", "reduce"})
FROM_INPUT = frozenset({"alltoall", "permute"})  # motifs that read the op's input (SOURCE_INPUT)


# ------------------------------------------------------------------------------------------------ table


@dataclass(frozen=True)
class TableMotif:
    """One motif of one comm-op: what it does (`motif`, regions in the op's buffer), when (`seq`, dense from
    0 within the iteration; equal = issued together) and where (`channel_mask`, bit c = channel c)."""

    op: int
    index: int
    seq: int
    motif: Motif
    channel_mask: int
    name: str = ""
    program: str | None = None  # the id of the plan's program it runs (payload["programs"]); None: made here


@dataclass(frozen=True)
class TableOp:
    """A comm-op of the iteration; `index` is its FIFO submission index on every rank."""

    index: int
    name: str
    collective: str
    nbytes: int
    ranks: tuple[int, ...]
    root: int | None
    motifs: tuple[TableMotif, ...]
    pairs: tuple[tuple[int, int], ...] = ()  # permute only: (source, destination) global ranks
    # Steady-state period tables (`MotifTable.steady_state`): 0 = the op carries the period's own iteration's
    # data, 1 = the next iteration's (a prefetch: submitted in period k with iteration k+1's data).
    offset: int = 0
    # The op's place among its iteration's comm-ops (plan row order, = `from_plan`'s index): its identity
    # across tables whose indices differ (prologue, period). None: `index`.
    position: int | None = None

    def involves(self, rank: int) -> bool:
        return any(rank in m.motif.ranks for m in self.motifs)

    @property
    def data_key(self) -> int:
        """The op number its data is keyed by (`input_values`): its position in the iteration, so a prologue's
        op and the period's op it stands for get the same inputs and expected outputs."""
        return self.index if self.position is None else self.position


@dataclass(frozen=True)
class MotifTable:
    """Every comm-op of one training iteration with its motifs; iterations repeat it."""

    ops: tuple[TableOp, ...]
    channels: tuple[str, ...]
    nranks: int
    # The plan's motif programs (payload["programs"]: id -> MSCCL-EF XML, proven when planned); None when the
    # plan carries none (written before schedule payload 1.1): the enforcer then makes them (`ProgramCache`).
    programs: Mapping[str, str | None] | None = None

    @classmethod
    def from_plan(cls, payload: Mapping[str, Any], iteration: int = 1, nranks: int | None = None) -> "MotifTable":
        """The comm-ops of unrolled iteration `iteration` of a schedule plan's payload, numbered 0..ops-1 in
        list (issue) order, their motifs' seqs renumbered densely from 0 (order and ties kept)."""
        channels, rows = _plan_rows(payload, iteration)
        dense = _dense_seqs(rows)
        ops = [_planned_op(index, row, dense, channels, position=index) for index, row in enumerate(rows)]
        return cls(tuple(ops), channels, nranks or _nranks(ops), carried_programs(payload))

    @classmethod
    def fifo(cls, payload: Mapping[str, Any], iteration: int = 1, nranks: int | None = None) -> "MotifTable":
        """The FIFO baseline of the same comm-ops: each op one motif (its whole collective over its ranks) on
        every channel, with seq = its submission index."""
        channels, rows = _plan_rows(payload, iteration)
        every = (1 << len(channels)) - 1 if channels else 1
        ops = []
        for index, row in enumerate(rows):
            op = _comm_op(row)
            motif = TableMotif(index, 0, index, as_motif(op), every, f"{row.get('name', '')}:fifo")
            ops.append(_table_op(index, row, (motif,), position=index))
        # whole-op motifs are not the plan's: their programs are made here, whatever the plan carries
        return cls(tuple(ops), channels, nranks or _nranks(ops), carried_programs(payload))

    @classmethod
    def steady_state(cls, payload: Mapping[str, Any], nranks: int | None = None,
                     iteration: int = 0) -> "SteadyState":
        """The plan's steady-state period and its prologue, from unrolled iterations `iteration` (i) and i+1.

        Rows of the two iterations correspond by position (the k-th comm-op of each, in row order; name,
        collective, bytes, ranks, root and pairs must match, else ValueError). An iteration-(i+1) op is
        *prefetched* when every one of its motifs has a seq at most the largest seq of iteration i: the plan
        issues it before (or together with) iteration i's last motif, i.e. during iteration i (see
        `prefetched_positions`). The period holds, per position, the iteration-i op (offset 0) or, when its
        counterpart is prefetched, the iteration-(i+1) op (offset 1: the application submits it with the NEXT
        iteration's data), numbered 0.. in the plan's seq order (first motif's seq, then position), seqs
        renumbered densely over the period (order and ties kept), each op's motifs as planned for the
        iteration it was taken from. The prologue holds the iteration-i ops of the prefetched positions
        (offset 0, seqs dense in their plan order): what must run once before the first period; None when
        nothing is prefetched (the period is then iteration i's ops in seq order, `from_plan(payload, i)` up
        to renumbering). Every op keeps its `position`, so prologue and period ops of one position share
        their data (`TableOp.data_key`). Both tables have the same nranks (the union of their ranks).
        """
        channels, first = _plan_rows(payload, iteration)
        _, second = _plan_rows(payload, iteration + 1)
        _check_counterparts(first, second, iteration)
        ahead = prefetched_positions(first, second)
        period_rows = [(second[p], 1) if p in ahead else (first[p], 0) for p in range(len(first))]
        period = _ordered_ops(period_rows, channels)
        prologue = _ordered_ops([(first[p], 0) if p in ahead else None for p in range(len(first))], channels)
        n = nranks or _nranks(period + prologue)
        carried = carried_programs(payload)
        return SteadyState(cls(period, channels, n, carried), cls(prologue, channels, n, carried) if prologue else None)


class SteadyState(NamedTuple):
    """`MotifTable.steady_state`: the table every period repeats and the one run once before the first."""

    period: MotifTable
    prologue: MotifTable | None


def prefetched_positions(first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Positions whose next-iteration op (`second`, rows in position order) the plan issues during the
    iteration of `first`: all of its motifs' seqs at most the largest seq of `first` (ties are issued together,
    so with iteration i's last motif). Seqs number the whole plan (as `mlopt plan schedule` writes them); an
    op that starts before iteration i's end and ends after it is not prefetched (the table runs it at its
    iteration-i place: that overlap is lost, as in `from_plan`). The payload carries no data dependencies, so
    the rule cannot tell a prefetch from a postponed tail of iteration i overlapping iteration i+1's first ops:
    either way the next iteration's ops come out prefetched, and the application must be able to submit
    them one iteration early (a data loader can)."""
    end = max(_seqs(first))
    if max(_seqs(second)) <= end:
        raise ValueError(f"the next iteration's motifs end (seq {max(_seqs(second))}) no later than this "
                         f"iteration's (seq {end}): the seqs do not number the plan across iterations")
    return frozenset(p for p, row in enumerate(second) if max(_seqs([row])) <= end)


def payload_row(op: CommOp, motifs: Sequence[Motif], seqs: Sequence[int], channels: Sequence[Sequence[str]], *,
                name: str = "", iteration: int = 1, op_id: int = 0) -> dict[str, Any]:
    """A schedule plan's comm-op row (payload["comm_ops"][i]) for `op` decomposed into `motifs`, motif i with
    sequence number seqs[i] on the channels named channels[i] (for hand-made payloads)."""
    rows = []
    for i, m in enumerate(motifs):
        rows.append({"name": f"{name or op.collective}#{i}", "collective": m.collective, "ranks": list(m.ranks),
                     "regions": [[list(r) for r in region] for region in m.regions], "root": m.root,
                     "deps": list(m.deps), "pattern": None if m.pattern is None else [list(p) for p in m.pattern],
                     "channels": list(channels[i]), "seq": int(seqs[i]), "duration_us": 0.0, "start_us": 0.0,
                     "end_us": 0.0})
    row = {"id": op_id, "name": name or op.collective, "iteration": iteration, "collective": op.collective,
           "nbytes": op.nbytes, "ranks": list(op.ranks), "root": op.root}
    if op.collective == "permute":  # only then: other rows stay as they were
        row["pairs"] = [list(p) for p in op.pairs]
    return {**row, "option": 0, "plan": "", "motifs": rows}


def carried_programs(payload: Mapping[str, Any]) -> dict[str, str | None] | None:
    """payload["programs"] as id -> XML (None: the plan carries none; an id -> None: no program fits); ValueError when an XML is not the one
    its entry's sha256 names (`mlopt validate` proves the programs; this only refuses a changed one)."""
    entries = payload.get("programs")
    if entries is None:
        return None
    out = {}
    for entry in entries:
        if entry.get("xml") is None:  # no program fits the executor: a motif naming it is refused when run
            out[str(entry["id"])] = None
            continue
        xml = str(entry["xml"])
        if sha256_bytes(xml.encode("utf-8")) != entry.get("xml_sha256"):
            raise ValueError(f"the plan's program {entry.get('id')!r} is not the one its xml_sha256 names: "
                             f"the plan was edited after it was made (re-plan, then `mlopt validate` it)")
        out[str(entry["id"])] = xml
    return out


def _plan_rows(payload: Mapping[str, Any], iteration: int) -> tuple[tuple[str, ...], list[Mapping[str, Any]]]:
    channels = tuple(payload.get("channels") or ())
    if len(channels) > MAX_CHANNELS:
        raise ValueError(f"the plan has {len(channels)} channels; the enforcer handles at most {MAX_CHANNELS}")
    rows = [row for row in payload.get("comm_ops") or () if int(row.get("iteration", 0)) == iteration]
    if not rows:
        found = sorted({int(row.get("iteration", 0)) for row in payload.get("comm_ops") or ()})
        raise ValueError(f"the plan has no comm-ops in iteration {iteration} (iterations present: {found})")
    return channels, rows


def _comm_op(row: Mapping[str, Any]) -> CommOp:
    missing = [k for k in ("collective", "nbytes", "ranks") if row.get(k) is None]
    if missing:
        raise ValueError(f"comm-op {row.get('name') or row.get('id')}: the plan row lacks {', '.join(missing)} "
                         f"(written by an mlopt older than the enforcer: re-plan)")
    pairs = row.get("pairs")
    if row["collective"] == "permute" and pairs is None:
        raise ValueError(f"comm-op {row.get('name') or row.get('id')}: the permute row lacks pairs (re-plan)")
    try:
        return CommOp(str(row["collective"]), int(row["nbytes"]), tuple(int(r) for r in row["ranks"]),
                      None if row.get("root") is None else int(row["root"]),
                      pairs=None if pairs is None else tuple((int(s), int(d)) for s, d in pairs))
    except ValueError as exc:
        raise ValueError(f"comm-op {row.get('name') or row.get('id')}: {exc}") from None


def _table_op(index: int, row: Mapping[str, Any], motifs: tuple[TableMotif, ...], *, offset: int = 0,
              position: int | None = None) -> TableOp:
    op = _comm_op(row)
    return TableOp(index, str(row.get("name", f"op{index}")), op.collective, op.nbytes, op.ranks, op.root, motifs,
                   tuple(op.pairs or ()), offset, position)


def _seqs(rows: Iterable[Mapping[str, Any]]) -> list[int]:
    return [int(m["seq"]) for row in rows for m in row.get("motifs") or ()]


def _dense_seqs(rows: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Plan seq -> dense seq from 0 (order and ties kept)."""
    return {s: i for i, s in enumerate(sorted(set(_seqs(rows))))}


def _planned_op(index: int, row: Mapping[str, Any], dense: Mapping[int, int], channels: Sequence[str], *,
                offset: int = 0, position: int | None = None) -> TableOp:
    """Table op `index` from a plan row, its motifs' seqs mapped through `dense`."""
    where = f"comm-op {row.get('name') or row.get('id')} (op {index})"
    motifs = tuple(
        TableMotif(index, k, dense[int(m["seq"])], _motif_of(m, f"{where} motif {k}"),
                   _mask(m.get("channels") or [], channels, f"{where} motif {k}"), str(m.get("name", "")),
                   None if m.get("program") is None else str(m["program"]))
        for k, m in enumerate(row["motifs"]))
    if not motifs:
        raise ValueError(f"{where} has no motifs")
    return _table_op(index, row, motifs, offset=offset, position=position)


def _ordered_ops(slots: Sequence[tuple[Mapping[str, Any], int] | None], channels: Sequence[str]) -> tuple[TableOp, ...]:
    """Table ops of (row, offset) per position (None: not in this table), numbered in the plan's seq order
    (first motif, then position), seqs dense over these rows."""
    taken = sorted(((p, *slot) for p, slot in enumerate(slots) if slot is not None),
                   key=lambda t: (min(_seqs([t[1]])), t[0]))
    dense = _dense_seqs(row for _, row, _ in taken)
    return tuple(_planned_op(index, row, dense, channels, offset=offset, position=p)
                 for index, (p, row, offset) in enumerate(taken))


def _check_counterparts(first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]],
                        iteration: int) -> None:
    """The k-th comm-op of both iterations must be the same op (what a steady state repeats)."""
    if len(first) != len(second):
        raise ValueError(f"iterations {iteration} and {iteration + 1} have {len(first)} and {len(second)} comm-ops")
    for p, (a, b) in enumerate(zip(first, second)):
        for row in (a, b):
            if not row.get("motifs"):
                raise ValueError(f"comm-op {row.get('name') or row.get('id')} (position {p}) has no motifs")
        x, y = _comm_op(a), _comm_op(b)
        if (a.get("name"), x) != (b.get("name"), y):
            raise ValueError(f"comm-op {p} differs between iterations {iteration} and {iteration + 1}: "
                             f"{a.get('name')!r} {x.collective} {x.nbytes} B over {list(x.ranks)} vs "
                             f"{b.get('name')!r} {y.collective} {y.nbytes} B over {list(y.ranks)}")


def _motif_of(m: Mapping[str, Any], where: str) -> Motif:
    missing = [k for k in ("collective", "ranks", "regions") if m.get(k) is None]
    if missing:
        raise ValueError(f"{where}: the plan's motif lacks {', '.join(missing)} (re-plan with a newer mlopt)")
    pattern = m.get("pattern")
    return Motif(str(m["collective"]), tuple(int(r) for r in m["ranks"]),
                 tuple(tuple((int(o), int(n)) for o, n in region) for region in m["regions"]),
                 None if m.get("root") is None else int(m["root"]), deps=tuple(int(d) for d in m.get("deps") or ()),
                 pattern=None if pattern is None else tuple((int(s), int(d)) for s, d in pattern))


def _mask(names: Iterable[str], channels: Sequence[str], where: str) -> int:
    mask = 0
    for name in names:
        if name not in channels:
            raise ValueError(f"{where}: channel {name!r} is not one of the plan's channels {list(channels)}")
        mask |= 1 << channels.index(name)
    if not mask:
        raise ValueError(f"{where}: no channels")
    return mask


def _nranks(ops: Sequence[TableOp]) -> int:
    return 1 + max(r for op in ops for m in op.motifs for r in m.motif.ranks)


# ------------------------------------------------------------------------------------------------ programs


# (collective, ranks, root position, nbytes) -> the MSCCL-EF XML to run the motif with, or None
PlannedChooser = Callable[[str, tuple[int, ...], int, int], str | os.PathLike | None]


@dataclass(frozen=True)
class ProgramUse:
    """Which program a staged motif runs: a chooser's planned MSCCL-EF XML (`planned`, `source` its path), the
    schedule plan's own program for the motif (`source` "plan program p0"), or one made at run time (`source`
    "mlopt ring allreduce", ...), and why not a chooser's (`reason`; "" when planned or when the cache has no
    chooser). `origin` says where it came from: "chooser", "plan" or "generated"."""

    where: str  # the motif, as stage() names it ("op 1 (name) motif 0")
    collective: str
    ranks: tuple[int, ...]
    nbytes: int  # the motif's size in the nccl-tests convention of its collective (Motif.nbytes)
    source: str
    planned: bool
    reason: str = ""
    origin: str = "generated"


def _own_source(collective: str, n: int, pattern: frozenset[tuple[int, int]] | None) -> str:
    """How `ProgramUse.source` names mlopt's own motif programs (`motif_program_xml`)."""
    kind = "copy" if n == 1 else "pattern" if pattern is not None else "ring"
    return f"mlopt {kind} {program_collective(collective, pattern is not None)}"


class ProgramCache:
    """Loaded motif programs, memoised per (collective, ranks, root position, pattern); a permute shares the
    pattern all-to-all program of its pairs (the same program: key ("alltoall", n, 0, pattern)).

    `planned(collective, ranks, root_position, nbytes)`, when given, may name an MSCCL-EF XML for a motif
    without a pattern (None: no planned program); the cache loads each file once and runs it when it is usable
    as the motif's program (that collective, ngpus = the motif's ranks, outofplace="1", a rooted program's
    root = the motif's root position), else mlopt's own program. `uses` records every motif staged through
    `for_motif`, `used` counts the motifs per planned file, `fallback_reasons` says why a motif the chooser
    was asked about runs mlopt's own program. A motif without a usable chooser's program runs the schedule
    plan's program for it when `for_motif` is given one (`carried`), else one made here (`get`); `origins`
    counts the motifs per origin.
    """

    def __init__(self, planned: PlannedChooser | None = None):
        self.planned = planned
        self.uses: list[ProgramUse] = []
        self._plans: dict[tuple, tuple[native.Plan, dict[str, Any]]] = {}
        self._files: dict[str, tuple[native.Plan, dict[str, Any]] | str] = {}  # path -> loaded, or why not
        self._carried: dict[tuple[str, str], tuple[native.Plan, dict[str, Any]]] = {}  # (id, XML) -> loaded

    @property
    def used(self) -> dict[str, int]:
        """Planned XML path -> motifs staged with it."""
        return dict(Counter(u.source for u in self.uses if u.planned))

    @property
    def origins(self) -> dict[str, int]:
        """Where the staged motifs' programs came from ("chooser", "plan", "generated") -> motifs."""
        return dict(Counter(u.origin for u in self.uses))

    @property
    def fallback_reasons(self) -> dict[str, str]:
        """Motif (`ProgramUse.where`) -> why it runs mlopt's own program instead of a planned one."""
        return {u.where: u.reason for u in self.uses if u.reason}

    def get(self, collective: str, n: int, root: int = 0,
            pattern: frozenset[tuple[int, int]] | None = None) -> tuple[native.Plan, dict[str, Any]]:
        """(plan, its program_info) of mlopt's own program."""
        collective = program_collective(collective, pattern is not None)
        key = (collective, n, root if collective in ROOTED else 0, pattern)
        if key not in self._plans:
            name = f"enforcer-{collective}-{n}" + (f"-root{key[2]}" if collective in ROOTED else "")
            plan = native.Plan.from_bytes(motif_program_xml(collective, n, key[2], pattern), name)
            info = plan.program_info
            if collective in ROOTED and n > 1 and info["root"] != key[2]:
                raise AssertionError(f"{name}: the program's root is {info['root']}")  # a bug, not user input
            self._plans[key] = plan, info
        return self._plans[key]

    def for_motif(self, m: Motif, root: int, pattern: frozenset[tuple[int, int]] | None,
                  where: str = "motif", carried: tuple[str, str] | None = None
                  ) -> tuple[native.Plan, dict[str, Any], ProgramUse]:
        """(plan, program_info, what was chosen) of motif `m` (root: its root position; pattern: position
        pairs): the chooser's program when usable, else the plan's (`carried`: its id and XML; ValueError
        when it cannot run the motif), else mlopt's own (`get`); the choice is added to `uses`."""
        n = len(m.ranks)
        ask = self.planned is not None and pattern is None
        path, loaded, reason = self._choose(m, root) if ask else (None, None, "")
        planned = loaded is not None
        origin = "chooser"
        if not planned and carried is not None:
            loaded = self._carried_program(m, root, pattern, where, *carried)
            path, origin = f"plan program {carried[0]}", "plan"
        elif not planned:
            loaded = self.get(m.collective, n, root, pattern)
            path, origin = _own_source(m.collective, n, pattern), "generated"
        use = ProgramUse(where, m.collective, tuple(m.ranks), m.nbytes, path, planned, reason, origin)
        self.uses.append(use)
        return (*loaded, use)

    def _carried_program(self, m: Motif, root: int, pattern: frozenset[tuple[int, int]] | None, where: str,
                         program_id: str, xml: str) -> tuple[native.Plan, dict[str, Any]]:
        """The plan's program `program_id` (loaded once), checked to be runnable as `m`'s (collective, ranks,
        out of place, root; `mlopt validate` proves the rest, the pattern included)."""
        key = (program_id, xml)
        if key not in self._carried:
            plan = native.Plan.from_bytes(xml, f"plan-program-{program_id}")
            self._carried[key] = plan, plan.program_info
        why = _unusable(self._carried[key][1], program_collective(m.collective, pattern is not None), len(m.ranks),
                        root)
        if why:
            raise ValueError(f"{where}: the plan's program {program_id} cannot run it: {why}")
        return self._carried[key]

    def _choose(self, m: Motif, root: int) -> tuple[str | None, tuple[native.Plan, dict[str, Any]] | None, str]:
        """(the chooser's file, its program when usable for `m`, else why not: "FILE: FIELD: ...")."""
        named = self.planned(m.collective, tuple(m.ranks), root, m.nbytes)
        if named is None:
            return None, None, f"no planned {m.collective} program for ranks {list(m.ranks)} and {m.nbytes} bytes"
        path = os.fspath(named)
        if path not in self._files:
            self._files[path] = _load_program(path)
        loaded = self._files[path]
        if isinstance(loaded, str):
            return path, None, loaded
        why = _unusable(loaded[1], m.collective, len(m.ranks), root)
        return (path, None, f"{path}: {why}") if why else (path, loaded, "")

    def close(self) -> None:
        for plan, _ in self._plans.values():
            plan.close()
        self._plans.clear()
        for loaded in self._files.values():
            if not isinstance(loaded, str):
                loaded[0].close()
        self._files.clear()
        for plan, _ in self._carried.values():
            plan.close()
        self._carried.clear()


def _load_program(path: str) -> tuple[native.Plan, dict[str, Any]] | str:
    """(the runnable program at `path`, its program_info), or why not ("FILE: ...")."""
    def naming(exc: Exception) -> str:  # the library's messages mostly name the file already
        return str(exc) if str(exc).startswith(path) else f"{path}: {exc}"

    try:
        plan = native.Plan.load(path)
    except (native.RuntimeLibraryError, OSError) as exc:
        return naming(exc)
    try:
        return plan, plan.program_info
    except native.RuntimeLibraryError as exc:  # a JSON plan envelope, not an MSCCL-EF program
        plan.close()
        return naming(exc)


def _unusable(info: Mapping[str, Any], collective: str, n: int, root: int) -> str:
    """Why a program (its program_info) cannot run a motif ("FIELD: ..."; "" when it can)."""
    if info["coll"] != collective:
        return f"coll: the program is {info['coll']}, the motif {collective}"
    if info["ngpus"] != n:
        return f"ngpus: the program is for {info['ngpus']} ranks, the motif has {n}"
    if not info["outofplace"]:
        return "outofplace: the program does not declare outofplace=\"1\"; motifs run out of place"
    if collective in ROOTED and info["root"] != root:
        return f"root: the program's root is {info['root']}, the motif's root position {root}"
    return ""


# ------------------------------------------------------------------------------------------------ staging


@dataclass(frozen=True)
class Staged:
    """A motif's program and how the op's buffers map onto its buffers: per position, gather ranges (op
    buffer -> program input) and scatter ranges (program output -> op output), each (op offset, staging
    offset, length) in bytes."""

    program: native.Plan
    count: int  # program input elements per position
    source: int  # SOURCE_INPUT (all-to-all, permute) or SOURCE_OUTPUT
    gather: tuple[tuple[tuple[int, int, int], ...], ...]
    scatter: tuple[tuple[tuple[int, int, int], ...], ...]
    use: ProgramUse | None = None  # which program it is (None: a stand-in cache without `for_motif`)


def _local(region, base: int) -> list[tuple[int, int, int]]:
    """The region's ranges laid end to end in a staging buffer from byte `base`."""
    out, at = [], base
    for offset, length in region:
        out.append((offset, at, length))
        at += length
    return out


def _pad(elements: int, multiple: int) -> int:
    return -(-elements // multiple) * multiple


def _check_aligned(m: Motif, elem: int, where: str) -> None:
    if m.collective not in REDUCING:
        return
    for region in m.regions:
        for offset, length in region:
            if offset % elem or length % elem:
                raise ValueError(f"{where}: {m.collective} byte range ({offset}, {length}) is not a multiple of the "
                                 f"{elem}-byte elements it reduces")


def stage(m: Motif, programs: ProgramCache, dtype: str = "float32", where: str = "motif",
          carried: tuple[str, str] | None = None) -> Staged:
    """The program and staging layout of motif `m` for elements of `dtype` (see the module docstring): the
    cache's planned program for it when its chooser names a usable one (`ProgramCache.for_motif`), else the
    plan's (`carried`: (id, XML)) when given, else mlopt's own."""
    elem = native.DTYPE_BYTES[dtype]
    _check_aligned(m, elem, where)
    n = len(m.ranks)
    root = m.ranks.index(m.root) if m.collective in ROOTED else 0
    pattern = None
    if m.pattern is not None:
        pos = {r: p for p, r in enumerate(m.ranks)}
        pattern = frozenset((pos[s], pos[d]) for s, d in m.pattern)
    layout = _LAYOUTS.get(m.collective)
    if layout is None:
        raise ValueError(f"{where}: the enforcer cannot stage a {m.collective!r} motif")
    if m.collective == "permute" and (pattern is None or len(m.regions) != 1):
        raise ValueError(f"{where}: a permute motif needs its pairs (pattern) and exactly one region")
    pick = getattr(programs, "for_motif", None)  # a ProgramCache; stand-ins may have get() only
    if pick is not None:
        plan, info, use = pick(m, root, pattern, where, carried)
    else:
        (plan, info), use = programs.get(m.collective, n, root, pattern), None
    length = sum(size for _, size in m.regions[0])
    count, gather, scatter = layout(m, n, -(-length // elem), info, elem, root, pattern)
    source = SOURCE_INPUT if m.collective in FROM_INPUT else SOURCE_OUTPUT
    return Staged(plan, count, source, tuple(map(tuple, gather)), tuple(map(tuple, scatter)), use)


def _shared(m, n, elems, info, elem, root, pattern):
    """allreduce / broadcast / reduce: one region, the program's whole input and output."""
    count = _pad(elems, info["i_chunks"])
    ranges = _local(m.regions[0], 0)
    gather = [ranges if m.collective != "broadcast" or p == root else [] for p in range(n)]
    if m.collective == "allreduce":
        scatter = [ranges] * n
    elif m.collective == "broadcast":
        scatter = [[] if p == root else ranges for p in range(n)]
    else:  # reduce: only the root's output is defined
        scatter = [ranges if p == root else [] for p in range(n)]
    return count, gather, scatter


def _allgather(m, n, elems, info, elem, root, pattern):
    block = _pad(elems, info["i_chunks"])  # the own block in, every block out
    gather = [_local(m.regions[p], 0) for p in range(n)]
    scatter = [[r for j in range(n) if j != p for r in _local(m.regions[j], j * block * elem)] for p in range(n)]
    return block, gather, scatter


def _reducescatter(m, n, elems, info, elem, root, pattern):
    block = _pad(elems, info["o_chunks"])  # every block in, the own block out
    every = [r for j in range(n) for r in _local(m.regions[j], j * block * elem)]
    return n * block, [every] * n, [_local(m.regions[p], 0) for p in range(n)]


def _alltoall(m, n, elems, info, elem, root, pattern):
    """Block q of position p's input goes to position q, block p of its output comes from position p."""
    block = _pad(elems, info["i_chunks"] // n)
    moves = pattern if pattern is not None else frozenset((s, d) for s in range(n) for d in range(n))
    gather = [[r for q in range(n) if (p, q) in moves for r in _local(m.regions[q], q * block * elem)]
              for p in range(n)]
    scatter = [[r for q in range(n) if (q, p) in moves for r in _local(m.regions[q], q * block * elem)]
               for p in range(n)]
    return n * block, gather, scatter


def _permute(m, n, elems, info, elem, root, pattern):
    """The pattern all-to-all program moves block q of position p's input to block p of position q's output
    for every pair (p, q): the source p gathers the motif's one region (of its input) into block q, the
    destination q scatters block p into the same region of its output. Positions in no pair move nothing."""
    block = _pad(elems, info["i_chunks"] // n)
    gather = [[r for q in range(n) if (p, q) in pattern for r in _local(m.regions[0], q * block * elem)]
              for p in range(n)]
    scatter = [[r for q in range(n) if (q, p) in pattern for r in _local(m.regions[0], q * block * elem)]
               for p in range(n)]
    return n * block, gather, scatter


_LAYOUTS = {"allreduce": _shared, "broadcast": _shared, "reduce": _shared, "allgather": _allgather,
            "reducescatter": _reducescatter, "alltoall": _alltoall, "permute": _permute}


NO_PLANNED_PROGRAMS = ("the schedule plan carries no motif programs (payload 1.0, or a hand-made table): the "
                       "enforcer makes them at run time, unproven before the job; re-plan to carry proven ones")
_said_no_programs = False  # NO_PLANNED_PROGRAMS is logged once per process


def _note_generated_programs() -> str:
    global _said_no_programs
    if not _said_no_programs:
        _said_no_programs = True
        _log.warning(NO_PLANNED_PROGRAMS)
    return NO_PLANNED_PROGRAMS


def _carried(table: MotifTable, tm: TableMotif, where: str) -> tuple[str, str] | None:
    """(id, XML) of the plan's program for `tm`, None when the plan names none for it."""
    if tm.program is None or table.programs is None:
        return None
    if tm.program not in table.programs:
        raise ValueError(f"{where}: names program {tm.program!r}, which the plan does not carry "
                         f"(it has {sorted(table.programs)})")
    if table.programs[tm.program] is None:
        raise ValueError(f"{where}: the plan has no runnable program for it (program {tm.program} is marked "
                         f"unrunnable: no program for it fits the MSCCL executor's limits)")
    return tm.program, table.programs[tm.program]


# ------------------------------------------------------------------------------------------------ binding


@dataclass(frozen=True)
class EnforcerStats:
    """mlopt_enforcer_stats of one rank."""

    iterations: int
    motifs_issued: int
    motifs_completed: int
    wait_us: float  # total time ENFORCEORDER waited for an expected motif while others were queued
    last_wait_us: float  # the last completed iteration's
    last_wall_us: float  # its first submission to its last motif's completion
    replan_suggested: bool  # last_wait_us > replan_threshold * last_wall_us


@dataclass(frozen=True)
class IssuedMotif:
    op: int
    index: int
    iteration: int


def _address(value: Any, what: str) -> tuple[int, int]:
    """(address, bytes) of a writable C-contiguous numpy array or a contiguous CPU torch tensor (any dtype:
    the enforcer moves bytes; the motifs' dtype says how they are reduced)."""
    if native._is_torch(value):
        if value.device.type != "cpu" or not value.is_contiguous():
            raise ValueError(f"{what}: needs a contiguous CPU tensor")
        return value.data_ptr(), value.numel() * value.element_size()

    if not isinstance(value, np.ndarray) or not value.flags.c_contiguous or not value.flags.writeable:
        raise ValueError(f"{what}: needs a writable C-contiguous numpy array, got {type(value).__name__}")
    return value.ctypes.data, value.nbytes


class Enforcer(native._Owned):
    """The runtime's enforcer over `nranks` in-process ranks (mlopt.h, "enforcer").

    Add the motif table (`load`, or `add_motif` one by one), `start`, then each rank's application thread
    calls `submit(rank, op, input, output)` (non-blocking) and `wait(rank, op)`. Submitted buffers are kept
    alive here until a wait covering them returns.
    """

    _what = "enforcer"

    def __init__(self, nranks: int, *, enforce_order: bool = True, watchdog_ms: int = 10000,
                 replan_threshold: float = 0.05, threads: int = 1, executors: int = 0,
                 _comm: native.ProcessComm | None = None):
        lib = native.library()
        options = native._EnforcerOptions()
        lib.mlopt_enforcer_options_init(ctypes.byref(options))
        options.watchdog_ms, options.replan_threshold = int(watchdog_ms), float(replan_threshold)
        options.threads, options.executors = int(threads), int(executors)
        options.enforce_order = int(bool(enforce_order))
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        if _comm is None:
            status = lib.mlopt_enforcer_create(int(nranks), ctypes.byref(options), ctypes.byref(handle),
                                               ctypes.byref(err))
        else:
            native._require_multi_process(lib)
            status = lib.mlopt_enforcer_create_comm(_comm.handle, ctypes.byref(options), ctypes.byref(handle),
                                                    ctypes.byref(err))
        native._raise_for(lib, status, err)
        super().__init__(lib, handle, lib.mlopt_enforcer_free)
        self.nranks = int(nranks)
        self.comm = _comm  # kept alive: the enforcer is freed before its communicator
        if _comm is not None:
            _comm.attach(self)
        self._op_bytes: dict[int, int] = {}
        self.motif_programs: dict[tuple[int, int], ProgramUse] = {}  # (op, motif index) -> its program (load)
        self.program_note = ""  # why the motifs' programs were made at run time (`load`), "" when not
        self._kept: dict[tuple[int, int], list[Any]] = {}  # (rank, op) -> buffers of unfinished submissions
        self._kept_lock = threading.Lock()

    @classmethod
    def over_comm(cls, comm: native.ProcessComm, **options) -> "Enforcer":
        """The enforcer of this process's rank of a multi-process communicator (mlopt_enforcer_create_comm;
        options as for the constructor): every rank loads the same table, then submits and waits with rank
        `comm.rank` only. The communicator is the enforcer's until it is closed (closing the communicator
        closes it first)."""
        return cls(comm.size, _comm=comm, **options)

    def close(self) -> None:
        super().close()
        with self._kept_lock:
            self._kept.clear()

    def _call(self, function, *args) -> None:
        err = ctypes.c_void_p()
        native._raise_for(self._lib, function(self.handle, *args, ctypes.byref(err)), err)

    def add_motif(self, *, op: int, index: int, seq: int, program: native.Plan, ranks: Sequence[int],
                  count: int, op_bytes: int, gather: Sequence[Sequence[tuple[int, int, int]]],
                  scatter: Sequence[Sequence[tuple[int, int, int]]], deps: Sequence[int] = (),
                  channel_mask: int = 1, dtype: str = "float32", redop: str = "sum", source: int = SOURCE_OUTPUT,
                  name: str = "") -> None:
        """One motif (mlopt_motif_desc); the library copies everything, the program included."""
        n = len(ranks)
        if len(gather) != n or len(scatter) != n:
            raise ValueError(f"op {op} motif {index}: gather and scatter need one list per rank ({n})")
        def ranges(items):  # the arrays stay alive as long as the structs they are assigned to
            return (native._ByteRange * max(1, len(items)))(*[native._ByteRange(*r) for r in items]), len(items)

        positions = (native._MotifPosition * n)()
        for p in range(n):
            (positions[p].gather, positions[p].gather_count) = ranges(gather[p])
            (positions[p].scatter, positions[p].scatter_count) = ranges(scatter[p])
        desc = native._MotifDesc()
        desc.struct_size = ctypes.sizeof(native._MotifDesc)
        desc.name = name.encode("utf-8")
        desc.op, desc.index, desc.seq = int(op), int(index), int(seq)
        desc.program = program.handle.value
        desc.nranks = n
        desc.ranks = (ctypes.c_int32 * n)(*ranks)
        desc.deps = (ctypes.c_int32 * max(1, len(deps)))(*deps)
        desc.deps_count = len(deps)
        desc.channel_mask = int(channel_mask)
        desc.dtype, desc.redop = native.DTYPES[dtype], native.OPS[redop]
        desc.count, desc.op_bytes, desc.source = int(count), int(op_bytes), int(source)
        desc.positions = positions
        self._call(self._lib.mlopt_enforcer_add_motif, ctypes.byref(desc))
        self._op_bytes[int(op)] = int(op_bytes)

    def load(self, table: MotifTable, dtype: str = "float32", redop: str = "sum",
             programs: ProgramCache | None = None) -> None:
        """Adds every motif of `table` (programs from `programs`, or a cache of its own without a chooser; a
        motif the plan names a program for runs it unless the chooser's is usable) and records which program
        each runs (`motif_programs`). A table whose plan carries no programs has them made here, said once
        per process (a log warning) and in `program_note`."""
        own = programs is None
        programs = programs or ProgramCache()
        if table.programs is None:
            self.program_note = _note_generated_programs()
        try:
            for op in table.ops:
                for tm in op.motifs:
                    where = f"op {op.index} ({op.name}) motif {tm.index}"
                    staged = stage(tm.motif, programs, dtype, where, _carried(table, tm, where))
                    self.add_motif(op=op.index, index=tm.index, seq=tm.seq, program=staged.program,
                                   ranks=tm.motif.ranks, count=staged.count, op_bytes=op.nbytes,
                                   gather=staged.gather, scatter=staged.scatter, deps=tm.motif.deps,
                                   channel_mask=tm.channel_mask, dtype=dtype, redop=redop, source=staged.source,
                                   name=tm.name)
                    if staged.use is not None:
                        self.motif_programs[(op.index, tm.index)] = staged.use
        finally:
            if own:
                programs.close()  # the library holds copies

    def start(self) -> None:
        self._call(self._lib.mlopt_enforcer_start)

    def submit(self, rank: int, op: int, input: Any, output: Any | None = None) -> None:
        """Rank `rank` submits op `op` (non-blocking): `input` and `output` (None: in place) are contiguous
        buffers of at least the op's bytes, left alone until a wait covering this submission returns."""
        output = input if output is None else output
        in_address, in_bytes = _address(input, f"op {op} input")
        out_address, out_bytes = _address(output, f"op {op} output")
        need = self._op_bytes.get(int(op), 0)
        if min(in_bytes, out_bytes) < need:
            raise ValueError(f"op {op}: buffers of {in_bytes} and {out_bytes} bytes; the op needs {need}")
        with self._kept_lock:
            self._kept.setdefault((int(rank), int(op)), []).append((input, output))
        self._call(self._lib.mlopt_enforcer_submit, int(rank), int(op), in_address, out_address)

    def wait(self, rank: int, op: int = -1) -> None:
        """Until rank's latest submission of `op` (-1: all of the rank's) completed; RuntimeLibraryError
        (status_name MLOPT_ERR_DEADLOCK, ...) when it never will."""
        self._call(self._lib.mlopt_enforcer_wait, int(rank), int(op))
        with self._kept_lock:
            if op < 0:
                for key in [k for k in self._kept if k[0] == rank]:
                    del self._kept[key]
            else:
                self._kept.pop((int(rank), int(op)), None)

    def drain(self) -> None:
        self._call(self._lib.mlopt_enforcer_drain)
        with self._kept_lock:
            self._kept.clear()

    def stats(self, rank: int) -> EnforcerStats:
        out = native._EnforcerStats()
        out.struct_size = ctypes.sizeof(native._EnforcerStats)
        self._call(self._lib.mlopt_enforcer_get_stats, int(rank), ctypes.byref(out))
        return EnforcerStats(out.iterations, out.motifs_issued, out.motifs_completed, out.wait_us, out.last_wait_us,
                             out.last_wall_us, bool(out.replan_suggested))

    def issue_log(self, rank: int) -> list[IssuedMotif]:
        count = ctypes.c_size_t()
        self._call(self._lib.mlopt_enforcer_issue_log, int(rank), None, None, None, 0, ctypes.byref(count))
        n = count.value
        ops, indices, iterations = (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)()
        self._call(self._lib.mlopt_enforcer_issue_log, int(rank), ops, indices, iterations, n, ctypes.byref(count))
        return [IssuedMotif(ops[i], indices[i], iterations[i]) for i in range(min(n, count.value))]


# ------------------------------------------------------------------------------------------------ harness


@dataclass(frozen=True)
class Item:
    """One workload item of an application thread: compute (`duration_us` of sleep, after waiting for the
    comm-ops in `waits`) or comm (submit table op `op`)."""

    kind: str  # "compute" | "comm"
    name: str = ""
    duration_us: float = 0.0
    op: int | None = None
    waits: tuple[int, ...] = ()


@dataclass
class HarnessResult:
    iteration_us: list[float]  # per iteration (period): first rank's start to last rank's end
    stats: list[EnforcerStats]  # per rank, after the run
    logs: list[list[IssuedMotif]]  # per rank
    mismatches: list[str] = field(default_factory=list)  # when verifying: "iteration i rank r op o: ..."
    prologue_us: float = 0.0  # the prologue's first rank's start to last rank's end (0: no prologue)
    prologue_logs: list[list[IssuedMotif]] = field(default_factory=list)  # per rank, when a prologue ran

    @property
    def mean_iteration_us(self) -> float:
        return sum(self.iteration_us) / len(self.iteration_us) if self.iteration_us else 0.0


def input_values(rank: int, op: int, iteration: int, elements: int):
    """Rank's input of `op` in `iteration` (float32): small integers, so sums are exact in any order."""
    return ((rank + 1) * (op + 1) + np.arange(elements) % 13 + iteration).astype(np.float32)


def expected_output(op: TableOp, rank: int, iteration: int):
    """(values, mask of the elements the collective defines) of rank's output of `op` (float32) when it
    carries `iteration`'s data (a steady-state period's offset-1 op in period k: k + 1); inputs are keyed by
    `op.data_key` (its position in the iteration), so they do not depend on which table the op is in."""
    n, elements = len(op.ranks), op.nbytes // 4
    ins = {r: input_values(r, op.data_key, iteration, elements) for r in op.ranks}
    out, defined = np.zeros(elements, np.float32), np.ones(elements, bool)
    block, pos = elements // n, op.ranks.index(rank)
    total = sum(ins.values())
    if op.collective == "allreduce":
        out[:] = total
    elif op.collective == "broadcast":
        out[:] = ins[op.root]
    elif op.collective == "reduce":
        out[:], defined[:] = total, rank == op.root
    elif op.collective == "allgather":
        for j, r in enumerate(op.ranks):
            out[j * block:(j + 1) * block] = ins[r][j * block:(j + 1) * block]
    elif op.collective == "permute":  # a destination gets its source's whole input; other outputs: undefined
        source = {d: s for s, d in op.pairs}.get(rank)
        if source is None:
            defined[:] = False
        else:
            out[:] = ins[source]
    elif op.collective == "reducescatter":
        defined[:] = False
        defined[pos * block:(pos + 1) * block] = True
        out[pos * block:(pos + 1) * block] = total[pos * block:(pos + 1) * block]
    else:  # alltoall: block j comes from rank j, which sent its block `pos`
        for j, r in enumerate(op.ranks):
            out[j * block:(j + 1) * block] = ins[r][pos * block:(pos + 1) * block]
    return out, defined


def _check_output(op: TableOp, rank: int, iteration: int, got, what: str = "iteration") -> str:
    want, defined = expected_output(op, rank, iteration)
    bad = np.flatnonzero(defined & (got != want))
    if not bad.size:
        return ""
    i = int(bad[0])
    return (f"{what} {iteration} rank {rank} op {op.index} ({op.collective}): element {i} is {got[i]}, expected "
            f"{want[i]} ({bad.size} bad)")


def period_items(period: MotifTable, items: Sequence[Item]) -> list[Item]:
    """One iteration's application program (`items`, naming comm-ops by their position in the iteration:
    `from_plan`'s index, plan row order) as a steady-state period's (`MotifTable.steady_state`): ops named by
    period index, and the comm items of prefetched ops (offset 1) moved to the start, where a prefetching data
    loader hands over the next batch (the enforcer still issues them at their seq, so a plan that orders the
    prefetch after this iteration's first ops keeps it there). Everything else keeps its place; compute items
    keep their waits (the harness skips waits on offset-1 ops, see `run_iteration_harness`)."""
    index = {op.data_key: op.index for op in period.ops}

    def at(position: int | None, item: Item) -> int:
        if position not in index:
            raise ValueError(f"item {item.name!r}: comm-op position {position} is not in the period "
                             f"(positions 0..{len(index) - 1})")
        return index[position]

    moved = [replace(item, op=at(item.op, item) if item.kind == "comm" else item.op,
                     waits=tuple(at(w, item) for w in item.waits)) for item in items]
    ahead = [item.kind == "comm" and period.ops[item.op].offset != 0 for item in moved]
    return [i for i, a in zip(moved, ahead) if a] + [i for i, a in zip(moved, ahead) if not a]


def run_iteration_harness(table: MotifTable, items: Sequence[Item] | Mapping[int, Sequence[Item]], iterations: int,
                          *, enforce_order: bool = True, verify: bool = True, watchdog_ms: int = 10000,
                          threads: int = 1, executors: int = 0, prologue: MotifTable | None = None) -> HarnessResult:
    """Runs `iterations` training iterations of `table` with one Python thread per rank as its application.

    `items` is the issue order of every rank (or rank -> its own order): a comm item submits its op (ranks
    the op does not involve skip it), a compute item first waits for the ops in `waits`, then sleeps for its
    duration. It sleeps rather than spins: this machine may have two cores, which the enforcer's threads and
    the interpreter need. At the end of each iteration a rank waits for all its submissions. Buffers are
    float32 (ops' nbytes must be multiples of 4 and blocked ops' of 4 x ranks to verify); each rank refills
    its inputs before submitting and, with `verify`, checks its outputs against `expected_output` after every
    iteration. Raises RuntimeLibraryError from the library (a deadlock: MLOPT_ERR_DEADLOCK), e.g. when the
    table orders an op before one a rank waits for before submitting it (no enforcer can issue it earlier).

    Steady state (`MotifTable.steady_state`, items from `period_items`): `table` is the period, and
    `prologue`, when given, runs first in an enforcer of its own: every rank submits its prologue ops (index
    order, iteration 0's data), waits for them and checks them. Period k then submits offset-0 ops with
    iteration k's inputs and offset-1 ops (prefetches) with iteration k+1's, and checks every output against
    the iteration its data belongs to. A compute item's wait on an offset-1 op is skipped: what it consumes
    in period k was prefetched by period k-1 (or the prologue), which the rank waited for at its end; the
    op's submission in period k carries the next batch. The end-of-period wait covers the prefetch too (so
    it can be checked), which a real data loader would defer to its consumer.
    """
    if prologue is not None and prologue.nranks != table.nranks:
        raise ValueError(f"the prologue has {prologue.nranks} ranks, the table {table.nranks}")
    if verify:
        for t in (table, prologue):
            if t is not None:
                _check_verifiable(t)
    per_rank = items if isinstance(items, Mapping) else {r: items for r in range(table.nranks)}
    buffers, early_buffers = _buffers(table), (_buffers(prologue) if prologue is not None else {})
    starts = [[0.0] * iterations for _ in range(table.nranks)]
    ends = [[0.0] * iterations for _ in range(table.nranks)]
    early_span = [[0.0, 0.0] for _ in range(table.nranks)]
    errors: list[BaseException] = []
    mismatches: list[str] = []

    def make(t: MotifTable) -> Enforcer:
        return Enforcer(t.nranks, enforce_order=enforce_order, watchdog_ms=watchdog_ms, threads=threads,
                        executors=executors)

    with contextlib.ExitStack() as stack:
        enforcer = stack.enter_context(make(table))
        enforcer.load(table)
        enforcer.start()
        early = None
        if prologue is not None:  # the C++ enforcer repeats one table: the prologue needs its own
            early = stack.enter_context(make(prologue))
            early.load(prologue)
            early.start()

        def application(rank: int) -> None:
            if early is not None:
                early_span[rank][0] = time.perf_counter()
                for op in prologue.ops:
                    if op.involves(rank):
                        _submit(early, early_buffers, rank, op, 0)
                early.wait(rank)
                early_span[rank][1] = time.perf_counter()
                if verify:
                    mismatches.extend(filter(None, (
                        _check_output(op, rank, 0, early_buffers[(rank, op.index)][1], "prologue: iteration")
                        for op in prologue.ops if op.involves(rank))))
            mine = [op for op in table.ops if op.involves(rank)]
            for it in range(iterations):
                starts[rank][it] = time.perf_counter()
                for item in per_rank.get(rank, ()):
                    _run_item(enforcer, table, buffers, rank, it, item)
                enforcer.wait(rank)
                ends[rank][it] = time.perf_counter()
                if verify:
                    mismatches.extend(filter(None, (
                        _check_output(op, rank, it + op.offset, buffers[(rank, op.index)][1]) for op in mine)))

        def guarded(rank: int) -> None:
            try:
                application(rank)
            except BaseException as exc:  # re-raised on the calling thread
                errors.append(exc)

        workers = [threading.Thread(target=guarded, args=(r,), name=f"rank{r}") for r in range(table.nranks)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        stats = [enforcer.stats(r) for r in range(table.nranks)]
        logs = [enforcer.issue_log(r) for r in range(table.nranks)]
        early_logs = [early.issue_log(r) for r in range(table.nranks)] if early is not None else []
    iteration_us = [(max(e[i] for e in ends) - min(s[i] for s in starts)) * 1e6 for i in range(iterations)]
    early_us = (max(s[1] for s in early_span) - min(s[0] for s in early_span)) * 1e6 if early is not None else 0.0
    return HarnessResult(iteration_us, stats, logs, mismatches, early_us, early_logs)


def _check_verifiable(table: MotifTable) -> None:
    for op in table.ops:
        if op.nbytes % (4 * (len(op.ranks) if op.collective in BLOCKED else 1)):
            raise ValueError(f"op {op.index}: nbytes={op.nbytes} cannot be verified as float32 blocks")


def _buffers(table: MotifTable) -> dict[tuple[int, int], tuple[Any, Any]]:
    """(rank, op index) -> (input, output) float32 buffers of every op the rank takes part in."""
    return {(r, op.index): (np.zeros(-(-op.nbytes // 4), np.float32), np.zeros(-(-op.nbytes // 4), np.float32))
            for op in table.ops for r in range(table.nranks) if op.involves(r)}


def _run_item(enforcer: Enforcer, table: MotifTable, buffers, rank: int, iteration: int, item: Item) -> None:
    if item.kind == "compute":
        for op in item.waits:
            # an offset-1 op's data for this iteration came from the previous period (already waited for)
            if table.ops[op].involves(rank) and not table.ops[op].offset:
                enforcer.wait(rank, op)
        time.sleep(item.duration_us / 1e6)
        return
    if item.kind != "comm" or item.op is None:
        raise ValueError(f"item {item.name!r}: kind must be 'compute' or 'comm' (with an op)")
    op = table.ops[item.op]
    if op.involves(rank):
        _submit(enforcer, buffers, rank, op, iteration + op.offset)


def _submit(enforcer: Enforcer, buffers, rank: int, op: TableOp, data_iteration: int) -> None:
    """Rank submits `op` with the inputs of `data_iteration` (keyed by `op.data_key`)."""
    source, output = buffers[(rank, op.index)]
    source[: op.nbytes // 4] = input_values(rank, op.data_key, data_iteration, op.nbytes // 4)
    output[:] = -1.0e9  # what no collective computes here: stale results show
    enforcer.submit(rank, op.index, source, output)
