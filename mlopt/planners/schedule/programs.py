"""The MSCCL-EF program each schedule motif runs in the enforcer, made and proven when the plan is made.

A motif's program depends on what it does, not on where or how much: its collective over its n positions
(`ranks` in order), its root position (broadcast, reduce) and, for a splined all-to-all or a permute, the
(source, destination) position pairs it moves (`ProgramKey`). The enforcer stages the motif's byte ranges
onto the program's chunks (padding to the chunk count; mlopt/native/enforcer.py `stage`), so one program
serves motifs of any size and of any ranks of that many positions.

Programs (as the enforcer has always made them at run time):

* one position: a copy (the output is the input);
* a pattern: one send/receive per (source, destination) pair, block d of the source's input to block s of
  the destination's output, as an all-to-all (a permute runs the all-to-all program of its pairs);
* otherwise the ring baseline for the collective, lowered on a fully connected topology of n ranks, one
  channel, declaring in place too when the checker proves it so.

`prove` checks a program against its motif's collective with mlopt.sim.symbolic.check_program (the
collective's pre- and post-conditions, deadlock, races, executor limits); a pattern program must deliver
exactly its pairs' blocks, the other output blocks being undefined. `mlopt plan schedule` writes every
distinct program into the plan (`carried_programs`: payload["programs"], each motif naming its program's
id) and `mlopt validate` proves them again from the XML (planners/schedule/validate.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, MutableMapping

from mlopt.formats.io import sha256_bytes
from mlopt.formats.msccl import MAX_CHANNELS, MAX_STEPS_PER_THREADBLOCK, Gpu, Program, Step, Threadblock
from mlopt.formats.msccl_xml import check_limits, write_program
from mlopt.formats.topology import fully_connected
from mlopt.planners.collective.baselines import ring
from mlopt.planners.collective.lowering import LoweringError, lower
from mlopt.planners.collective.planner import declare_proven_modes
from mlopt.planners.schedule.motifs import ROOTED
from mlopt.sim.collectives import CollectiveSpec
from mlopt.sim.symbolic import check_program, derive_spec

Pattern = tuple[tuple[int, int], ...]  # (source, destination) positions, sorted

# check_program's lines about output chunks (postcondition): a pattern program leaves the blocks of pairs it
# does not move undefined, so these lines are replaced by a check of the pairs it does move.
_OUTPUT_LINE = re.compile(r"^(?:(?:in|out-of)-place: )?(?:gpu \d+ o\[\d+\]: holds |\.\.\. and \d+ more wrong output)")


@dataclass(frozen=True, order=True)
class ProgramKey:
    """What a motif's program depends on. `collective` is the program's (a permute's is "alltoall")."""

    collective: str
    ngpus: int
    root: int = 0  # position of the root for broadcast and reduce, else 0
    pattern: Pattern | None = None

    def describe(self) -> str:
        what = f"{self.collective} over {self.ngpus} position(s)"
        if self.collective in ROOTED:
            what += f", root position {self.root}"
        if self.pattern is not None:
            what += f", pairs {[list(p) for p in self.pattern]}"
        return what


def program_collective(collective: str, has_pattern: bool) -> str:
    """The collective whose program a motif runs: a permute runs the pattern all-to-all program of its pairs
    (block d of the source's staging input to block s of the destination's staging output)."""
    if collective != "permute":
        return collective
    if not has_pattern:
        raise ValueError("a permute motif needs its (source, destination) pairs (pattern)")
    return "alltoall"


def program_key(collective: str, ranks: Iterable[int], root: int | None = None,
                pattern: Iterable[Iterable[int]] | None = None) -> ProgramKey:
    """The key of a motif's program from the motif's fields (global ranks: root and pattern name ranks)."""
    ranks = tuple(int(r) for r in ranks)
    position = {r: p for p, r in enumerate(ranks)}
    pairs = None if pattern is None else tuple(sorted((position[int(s)], position[int(d)]) for s, d in pattern))
    root_position = position[int(root)] if collective in ROOTED and root is not None else 0
    return ProgramKey(program_collective(collective, pairs is not None), len(ranks), root_position, pairs)


def motif_key(motif: Mapping[str, Any]) -> ProgramKey:
    """`program_key` of a plan's motif row (payload["comm_ops"][i]["motifs"][j])."""
    return program_key(str(motif["collective"]), motif["ranks"], motif.get("root"), motif.get("pattern"))


# ------------------------------------------------------------------------------------------------ making


def _checked(name: str, coll: str, chunks: int, gpus: list[Gpu]) -> Program:
    program = Program(name, "Simple", 1, chunks, len(gpus), coll, False, True, 0, 1 << 40, tuple(gpus))
    problems = check_limits(program)
    if problems:
        raise LoweringError(f"{name}: {problems[0]}")
    return program


def _copy_program(collective: str) -> Program:
    """One position: the output is the input."""
    tb = Threadblock(0, -1, -1, 0, (Step(0, "cpy", "i", 0, "o", 0, 1),))
    return _checked(f"enforcer_{collective}1", collective, 1, [Gpu(0, 1, 1, 0, (tb,))])


def _pattern_alltoall_program(n: int, pairs: frozenset[tuple[int, int]]) -> Program:
    """An all-to-all moving only `pairs` of positions (source, destination): block d of the source's input to
    block s of the destination's output, one send/receive per pair (a copy when source == destination)."""
    gpus = []
    for g in range(n):
        tbs = []
        if (g, g) in pairs:
            tbs.append((-1, -1, Step(0, "cpy", "i", g, "o", g, 1)))
        tbs += [(d, -1, Step(0, "s", "i", d, "o", 0, 1)) for d in range(n) if d != g and (g, d) in pairs]
        tbs += [(-1, s, Step(0, "r", "i", 0, "o", s, 1)) for s in range(n) if s != g and (s, g) in pairs]
        gpus.append(Gpu(g, n, n, 0, tuple(Threadblock(t, send, recv, 0, (step,))
                                          for t, (send, recv, step) in enumerate(tbs))))
    return _checked(f"enforcer_alltoall{n}_pattern", "alltoall", n, gpus)


def _too_many_ring_steps(collective: str, n: int) -> None:
    """LoweringError, before any lowering, when a ring program over n ranks cannot fit the executor: a ring
    all-to-all sends n (n - 1) / 2 messages over each link, at least one step each in the sending threadblock,
    and a threadblock spread over every channel holds at most MAX_STEPS_PER_THREADBLOCK steps per channel.
    (Lowering a 128-rank ring all-to-all only to learn this takes about a minute.)"""
    if collective != "alltoall":
        return  # the other rings take at most 2 (n - 1) steps per link
    least, most = n * (n - 1) // 2, MAX_STEPS_PER_THREADBLOCK * MAX_CHANNELS
    if least > most:
        raise LoweringError(f"cannot fit the executor's limits: a threadblock needs at least {least} steps, more "
                            f"than {MAX_STEPS_PER_THREADBLOCK} on each of {MAX_CHANNELS} channels")


def _ring_program(collective: str, n: int, root: int) -> Program:
    _too_many_ring_steps(collective, n)
    alg = ring(fully_connected(n), CollectiveSpec(collective, n, 1, root=root), channels=1)
    name = f"enforcer_{collective}{n}" + (f"_root{root}" if collective in ROOTED else "")
    return declare_proven_modes(lower(alg, name=name))


@lru_cache(maxsize=None)  # pure: every plan and run asks for few distinct keys, each often
def motif_program(key: ProgramKey) -> Program:
    """The program of motifs with this key (see the module docstring)."""
    if key.ngpus == 1:
        return _copy_program(key.collective)
    if key.pattern is not None:
        return _pattern_alltoall_program(key.ngpus, frozenset(key.pattern))
    return _ring_program(key.collective, key.ngpus, key.root)


def motif_program_xml(collective: str, n: int, root: int = 0,
                      pattern: Iterable[tuple[int, int]] | None = None) -> str:
    """MSCCL-EF XML of the program a motif runs: `collective` over n positions (root: a position), or a
    splined all-to-all (or a permute) moving only the position pairs of `pattern`."""
    pairs = None if pattern is None else tuple(sorted((int(s), int(d)) for s, d in pattern))
    key = ProgramKey(program_collective(collective, pairs is not None), n,
                     root if collective in ROOTED else 0, pairs)
    return write_program(motif_program(key))


# ------------------------------------------------------------------------------------------------ proving


def prove(program: Program, key: ProgramKey) -> list[str]:
    """Why `program` cannot run motifs of `key` ([] when it is proven to): the checker's findings against
    the key's collective, ranks and root; a pattern program is held to its pairs only. The enforcer runs
    motifs out of place, so the program must declare outofplace="1"."""
    if not program.outofplace:
        return ['the program does not declare outofplace="1"; motifs run out of place']
    if (program.coll, program.ngpus) != (key.collective, key.ngpus):
        return [f"the program is a {program.coll} over {program.ngpus} ranks, the motif a {key.collective} over "
                f"{key.ngpus}"]
    try:
        chunks_per_rank = derive_spec(program).chunks_per_rank
    except ValueError as exc:
        return [f"cannot derive the collective: {exc}"]
    report = check_program(program, CollectiveSpec(key.collective, key.ngpus, chunks_per_rank, root=key.root))
    if key.pattern is None:
        return report.problems + report.deadlock
    others = [line for line in report.problems if not _OUTPUT_LINE.match(line)]
    return others + report.deadlock + _missing_pairs(report.final_buffers, key.pattern, chunks_per_rank)


def _missing_pairs(final_buffers: Mapping[str, Mapping[int, Mapping[str, list]]], pattern: Pattern,
                   chunks_per_rank: int) -> list[str]:
    """A pattern all-to-all's postcondition: for every pair (s, d), block s of d's output holds block d of
    s's input (all-to-all chunk j of rank r: chunk r k + j % k of rank j // k)."""
    k, problems = chunks_per_rank, []
    for variant, ranks in final_buffers.items():
        for s, d in pattern:
            out = ranks[d]["o"]
            for j in range(s * k, (s + 1) * k):
                if out[j] != ((s, d * k + j % k),):
                    problems.append(f"{variant}: position {d} output chunk {j} does not hold chunk {d * k + j % k} "
                                    f"of position {s}'s input (pair ({s}, {d}))")
    return problems


@lru_cache(maxsize=None)  # the proof runs once per key and process
def proven_program_xml(key: ProgramKey) -> str:
    """The XML of `motif_program(key)`, proven; AssertionError when the checker refutes it (a bug in mlopt's
    program generation, not in anyone's input)."""
    problems = prove(motif_program(key), key)
    if problems:
        raise AssertionError(f"mlopt's program for a {key.describe()} fails its proof: {problems[0]}")
    return write_program(motif_program(key))


# ------------------------------------------------------------------------------------------------ plan


def program_entry(program_id: str, key: ProgramKey, xml: str | None, unrunnable: str | None = None
                  ) -> dict[str, Any]:
    """payload["programs"][i]: what the program runs (checked against each motif naming it) and its XML, or
    (xml None) why no program for it fits the executor's limits."""
    entry = {"id": program_id, "collective": key.collective, "ngpus": key.ngpus,
             "root": key.root if key.collective in ROOTED else None,
             "pattern": None if key.pattern is None else [list(p) for p in key.pattern],
             "xml_sha256": None if xml is None else sha256_bytes(xml.encode("utf-8")), "xml": xml}
    if unrunnable is not None:
        entry["unrunnable"] = unrunnable
    return entry


def _entry_for(program_id: str, key: ProgramKey) -> dict[str, Any]:
    """The entry of `key`'s program; a motif whose program cannot fit the MSCCL executor's limits (a ring over
    more ranks than a threadblock has steps) gets an entry saying so instead of failing the whole plan: the
    enforcer refuses such a motif, naming the reason, when a job reaches it."""
    try:
        return program_entry(program_id, key, proven_program_xml(key))
    except LoweringError as exc:
        return program_entry(program_id, key, None, f"no {key.describe()} program fits the executor: {exc}")


def entry_key(entry: Mapping[str, Any]) -> ProgramKey:
    """The key a payload["programs"] entry declares."""
    pattern = entry.get("pattern")
    return ProgramKey(str(entry["collective"]), int(entry["ngpus"]), int(entry.get("root") or 0),
                      None if pattern is None else tuple(sorted((int(s), int(d)) for s, d in pattern)))


def carried_programs(rows: Iterable[MutableMapping[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct program of the comm-op rows' motifs, proven, ids "p0", "p1", ... in order of first use
    (rows, then motifs); each motif with a collective gets `program` = its program's id (in place)."""
    ids: dict[ProgramKey, str] = {}
    entries = []
    for row in rows:
        for motif in row.get("motifs") or ():
            if motif.get("collective") is None or motif.get("ranks") is None:
                continue  # an abstract problem's motif: no collective to run
            key = motif_key(motif)
            if key not in ids:
                ids[key] = f"p{len(ids)}"
                entries.append(_entry_for(ids[key], key))
            motif["program"] = ids[key]
    return entries
