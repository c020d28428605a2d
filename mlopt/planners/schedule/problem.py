"""Build a Syndicate `ScheduleProblem` from a workload and a topology (Syndicate §3-5).

Channels
--------
A channel is one *link class* of the topology ("nvlink", "nvswitch", "ib", "pcie", ...): Syndicate's
channels are NVLink and RDMA, and a motif holds the set of channels its messages cross. `channels_of`
returns one sub-topology per class (same nodes, only that class's links, the switches and NICs those links
reference). There is deliberately **no** extra "all" channel: a motif that needs several classes (e.g. a
ring across two nodes: NVLink inside a node, IB between nodes) simply holds the set of those classes, so
it excludes every motif on any of them, which is what an "all" channel would express, without making an
NVLink-only motif and an IB-only motif falsely conflict.

Timing a motif
--------------
Every motif is timed with `collective_time` (algorithm: ring; where the ring lacks a link, e.g. the
NDv2 hybrid cube-mesh has no 3->4 NVLink, the fastest other non-hierarchical algorithm that can run) on each
single-channel sub-topology that can carry it, and on the whole topology; the fastest wins (ties: a
single channel first, channels in sorted order). A single-channel timing holds only that channel; a
whole-topology timing holds the classes of the links the algorithm's messages cross (ring: consecutive
members of the group, wrapping; others: every ordered pair, an over-approximation). Direct is not
raced against ring: in mode "unaware" every message is timed alone, so direct's N-1 simultaneous sends
per rank ignore NIC/port sharing and look ~30x faster than ring on dgx2x2, which would make every
non-default plan spuriously dominate. A splined all-to-all motif (one with a
`pattern`) is timed as the all-to-all over its ranks scaled by its share of the (src, dst) pairs
(an approximation: the pattern is a subset of the full exchange).

Options per comm-op (`motif_options`; at most `MAX_OPTIONS`, deterministic):
0. default: the op as one motif, ring on the whole topology (if ring cannot run there: the fastest of
   the fallback algorithms that can); channels: the classes its messages cross;
then, each kept only when every motif can be timed and it differs from the options before it:
* ``seg{d}``: d segments, each timed on its best channel(s);
* ``seg{d}@a+b``: d segments dealt round-robin over the single channels that each connect the op's ranks
  alone (only when at least two do; none do in the presets, where IB links only join different nodes);
* ``spline{n}``: `motifs.spline` with group size n (allreduce: the tree RE || -> AR -> BC ||);
* ``ringAR`` (allreduce: RS -> AG), ``treeAR2`` (recursive binary tree), ``seg2.spline{n}``.
A collective-permute is timed like an all-to-all: its pairs' messages at once, mode "aware", on each single
channel that links every pair and on the whole topology; its ``spline{n}`` splits the pairs into those
inside groups of n ranks and those crossing them (motifs.spline_permute_motif).
Default spline sizes: the op's ranks per node when the op spans several nodes in whole-node runs, then 2.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from mlopt.errors import InputError
from mlopt.formats.topology import Topology
from mlopt.planners.schedule import motifs as M
from mlopt.planners.schedule.costs import WHOLE_TOPOLOGY, CostTable
from mlopt.planners.schedule.motifs import CommOp, Motif
from mlopt.planners.schedule.optsched import ExecutionPlan, MotifRun, ScheduleProblem, Task
from mlopt.sim.collective_algorithms import ALGORITHMS, collective_time, transfer_time
from mlopt.sim.network import Message, NetworkModel

MAX_OPTIONS = 16
# Segments are cut at multiples of 4 bytes, so that every piece holds whole float32 / fp16 / bf16 / int32
# elements (the runtime's enforcer reduces elements); an op too small for that keeps fewer options.
ALIGN = 4
TIMING_ALGORITHMS = ("ring",)
FALLBACK_ALGORITHMS = tuple(a for a in ALGORITHMS if a != "ring" and not a.startswith("hierarchical"))


# ----------------------------------------------------------------------------------------- channels


def channels_of(topology: Topology) -> dict[str, Topology]:
    """Link class -> sub-topology with only that class's links (sorted by class name)."""
    out: dict[str, Topology] = {}
    for cls in sorted({l.link_class for l in topology.links}):
        links = tuple(l for l in topology.links if l.link_class == cls)
        sw = {l.switch for l in links if l.switch is not None}
        nics = {n for l in links for n in (l.src_nic, l.dst_nic) if n is not None}
        out[cls] = Topology(
            name=f"{topology.name}/{cls}",
            nodes=topology.nodes,
            links=links,
            switches=tuple(s for s in topology.switches if s.name in sw),
            nics=tuple(n for n in topology.nics if n.name in nics),
            source={**topology.source, "channel": cls},
        )
    return out


# ----------------------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timed:
    duration_us: float
    channels: frozenset[str]
    algorithm: str


class _Timer:
    """Memoised motif timing on one topology and its channels."""

    def __init__(self, topology: Topology, channels: dict[str, Topology], mode: str, costs: CostTable | None = None):
        self.topology, self.channels, self.mode, self.costs = topology, channels, mode, costs
        self.link_class = {(l.src, l.dst): l.link_class for l in topology.links}
        self.memo: dict[tuple, Timed | None] = {}
        self.networks: dict[str | None, NetworkModel] = {}  # channel (None: whole topology) -> routes built once
        self.pairs: dict[str | None, frozenset[tuple[int, int]]] = {}  # channel -> the rank pairs it links

    def network(self, channel: str | None, topo: Topology) -> NetworkModel:
        if channel not in self.networks:
            self.networks[channel] = NetworkModel(topo)
        return self.networks[channel]

    def linked(self, channel: str | None, topo: Topology) -> frozenset[tuple[int, int]]:
        if channel not in self.pairs:
            self.pairs[channel] = frozenset((l.src, l.dst) for l in topo.links)
        return self.pairs[channel]

    def _crossed(self, algorithm: str, ranks: tuple[int, ...]) -> frozenset[str]:
        if algorithm in ("ring", "bidirectional-ring"):
            pairs = [(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))]
            if algorithm == "bidirectional-ring":
                pairs += [(b, a) for a, b in pairs]
        else:
            pairs = [(a, b) for a in ranks for b in ranks if a != b]
        found = {self.link_class[p] for p in pairs if p in self.link_class}
        return frozenset(found or self.channels)

    def _try(self, collective, algorithm, ranks, nbytes, topo) -> float | None:
        try:
            single = collective_time(collective, algorithm, ranks, nbytes, topo, mode=self.mode).time_us
        except (ValueError, InputError, KeyError, IndexError):
            return None
        if algorithm != "ring" or topo is not self.topology:
            return single
        multi = self._multi_ring(collective, ranks, nbytes)
        return single if multi is None else min(single, multi)

    def _multi_ring(self, collective, ranks, nbytes) -> float | None:
        """NCCL's rings across nodes: with the ranks in whole-node runs of g GPUs, g rings each carry 1/g of
        the payload, ring k visiting every node's run rotated by k, so each ring crosses between nodes at a
        different GPU pair (its own NICs). The rings share no inter-node link, so they run at once: the time
        is the slowest ring's. None when the ranks are not whole-node runs or a ring lacks a link."""
        node = self.topology.node_of()
        runs: list[list[int]] = [[ranks[0]]]
        for a, b in zip(ranks, ranks[1:]):
            if node.get(a) == node.get(b):
                runs[-1].append(b)
            else:
                runs.append([b])
        g = len(runs[0])
        if len(runs) < 2 or g < 2 or any(len(r) != g for r in runs):
            return None
        times = []
        for k in range(g):
            ring = tuple(r for run in runs for r in run[k:] + run[:k])
            try:
                times.append(collective_time(collective, "ring", ring, nbytes / g, self.topology,
                                             mode=self.mode).time_us)
            except (ValueError, InputError, KeyError, IndexError):
                return None
        return max(times)

    def time(self, collective: str, ranks: tuple[int, ...], nbytes: int, *, channel: str | None = None,
             algorithms: Sequence[str] = TIMING_ALGORITHMS) -> Timed | None:
        """Fastest timing; channel=None: best of every single channel and the whole topology;
        channel="*": the whole topology only; else that one channel only. None if nothing can carry it."""
        key = (collective, ranks, nbytes, channel, tuple(algorithms))
        if key in self.memo:
            return self.memo[key]
        if len(ranks) < 2:
            res = Timed(0.0, frozenset([channel]) if channel not in (None, "*") else
                        frozenset([sorted(self.channels)[0]]), "none")
            self.memo[key] = res
            return res
        best: Timed | None = None
        targets: list[tuple[str | None, Topology]] = []
        if channel is None or channel not in ("*",):
            for c, topo in self.channels.items():
                if channel is None or channel == c:
                    targets.append((c, topo))
        if channel in (None, "*"):
            targets.append((None, self.topology))
        for c, topo in targets:
            measured = self._measured(collective, len(ranks), nbytes, c)
            if measured is not None:
                if best is None or measured < best.duration_us:
                    chans = frozenset([c]) if c is not None else self._crossed("ring", ranks)
                    best = Timed(measured, chans, "measured")
                continue
            for alg in algorithms:
                t = self._try(collective, alg, ranks, nbytes, topo)
                if t is None:
                    continue
                if best is None or t < best.duration_us:
                    chans = frozenset([c]) if c is not None else self._crossed(alg, ranks)
                    best = Timed(t, chans, alg)
        self.memo[key] = best
        return best

    def _measured(self, collective: str, nranks: int, nbytes: float, channel: str | None) -> float | None:
        """The cost table's time on this channel (None: the whole topology), if it has that curve."""
        if self.costs is None:
            return None
        return self.costs.time_us(collective, nranks, nbytes, WHOLE_TOPOLOGY if channel is None else channel)

    def motif(self, m: Motif, channel: str | None = None) -> Timed | None:
        if m.collective == "alltoall":
            return self.alltoall(m, channel)
        if m.collective == "permute":
            return self.permute(m, channel)
        return self.best(m.collective, m.ranks, m.nbytes, channel=channel)

    def permute(self, m: Motif, channel: str | None = None) -> Timed | None:
        """A collective-permute (or a splined part of it): every pair's `length` bytes sent directly and at
        once, timed in mode "aware" like the all-to-all (its sends share NICs and switch ports). Cost tables
        have no permute curves: always alpha-beta."""
        pairs = tuple(sorted(m.pattern or ()))
        key = ("permute", pairs, m.length, channel)
        if key not in self.memo:
            self.memo[key] = self._direct(pairs, m.length, channel)
        return self.memo[key]

    def _direct(self, pairs: tuple[tuple[int, int], ...], length: int, channel: str | None,
                measured=lambda c: None) -> Timed | None:
        """Every pair's `length` bytes sent at once (mode "aware"), or `measured(channel)` where that is not
        None: the fastest of the single channels (channel None or that one) and the whole topology (None or
        "*") that link every pair; None when none does."""
        messages = [Message(a, b, float(length)) for a, b in pairs]
        targets = [(c, topo) for c, topo in self.channels.items() if channel in (None, c)]
        if channel in (None, "*"):
            targets.append((None, self.topology))
        best: Timed | None = None
        for c, topo in targets:
            links = self.linked(c, topo)
            if any(p not in links for p in pairs):
                continue
            t = measured(c)
            if t is None:
                t = transfer_time(messages, topo, mode="aware", model=self.network(c, topo))
            if best is None or t < best.duration_us:
                chans = frozenset([c]) if c is not None else frozenset(self.link_class[p] for p in pairs)
                best = Timed(t, chans, "direct")
        return best

    def alltoall(self, m: Motif, channel: str | None = None) -> Timed | None:
        """An all-to-all (or a splined part of one: its `pattern`) as NCCL runs it, every pair's block sent
        directly and at once, timed in mode "aware" whatever the problem's mode: the N-1 simultaneous sends
        of a rank share its NIC and switch port, which mode "unaware" would ignore (~N times too fast)."""
        pairs = tuple(sorted((a, b) for a, b in (m.pattern if m.pattern is not None else
                                                 ((a, b) for a in m.ranks for b in m.ranks)) if a != b))
        key = ("alltoall", pairs, m.length, channel)
        if key in self.memo:
            return self.memo[key]
        if not pairs:
            res = Timed(0.0, frozenset([channel]) if channel not in (None, "*") else
                        frozenset([sorted(self.channels)[0]]), "none")
            self.memo[key] = res
            return res
        n = len(m.ranks)
        share = len(pairs) / max(1, n * (n - 1))

        def measured(c: str | None) -> float | None:
            # a measured all-to-all over the motif's ranks, scaled by the share of the pairs its pattern moves
            t = self._measured("alltoall", n, m.length * n, c)
            return None if t is None else t * share

        self.memo[key] = self._direct(pairs, m.length, channel, measured)
        return self.memo[key]

    def best(self, collective: str, ranks: tuple[int, ...], nbytes: int, *, channel: str | None = None) -> Timed | None:
        """Ring where it can run; else the fastest fallback algorithm that can (missing ring links)."""
        t = self.time(collective, ranks, nbytes, channel=channel)
        if t is None:
            t = self.time(collective, ranks, nbytes, channel=channel, algorithms=FALLBACK_ALGORITHMS)
        return t


# ----------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Candidate:
    """An execution plan with the motifs it runs: `plan.motifs[i]` (one MotifRun, timed and scheduled as one)
    runs the motifs `parts[i]`, which are issued together; their `deps` index the flattened parts."""

    plan: ExecutionPlan
    parts: tuple[tuple[Motif, ...], ...]

    @property
    def motifs(self) -> tuple[Motif, ...]:
        return tuple(m for run in self.parts for m in run)


def pack_runs(motifs: Sequence[Motif]) -> list[list[int]]:
    """Group a decomposition's motifs into runs issued together: motifs of one stage and one collective on
    pairwise disjoint ranks (A.1's "||" over groups) share a run, so that e.g. the per-node reduces of a tree
    all-reduce run at once instead of queueing for the channel they both hold. Runs are in stage order (a
    motif's deps are in earlier stages, hence earlier runs); inside a run motifs keep their order."""
    runs: list[list[int]] = []
    for i in sorted(range(len(motifs)), key=lambda k: (motifs[k].stage, k)):
        m = motifs[i]
        for run in runs:
            head = motifs[run[0]]
            if (head.stage, head.collective) == (m.stage, m.collective) and \
                    not set(m.ranks) & {r for j in run for r in motifs[j].ranks}:
                run.append(i)
                break
        else:
            runs.append([i])
    return runs


def _runs(label: str, motifs: list[Motif], timer: _Timer,
          channel_of: Sequence[str | None] | None = None) -> Candidate | None:
    """The candidate running `motifs` as packed runs; a run lasts as long as its slowest motif (its motifs
    use disjoint ranks, so disjoint ports) and holds the union of their channels. None if a motif cannot run."""
    runs = pack_runs(motifs)
    if channel_of is not None and any(len({channel_of[i] for i in run}) > 1 for run in runs):
        runs = [[i] for run in runs for i in run]  # motifs bound to different channels stay apart
    flat = {i: k for k, i in enumerate(i for run in runs for i in run)}
    run_of = {i: r for r, run in enumerate(runs) for i in run}
    out_runs, parts = [], []
    for r, run in enumerate(runs):
        timed = [timer.motif(motifs[i], None if channel_of is None else channel_of[i]) for i in run]
        if any(t is None for t in timed):
            return None
        channels = frozenset().union(*(t.channels for t in timed))
        head = motifs[run[0]]
        what = f"{head.collective}x{len(head.ranks)}" if len(run) == 1 else \
            f"{len(run)}x{head.collective}x{len(head.ranks)}"
        deps = tuple(sorted({run_of[d] for i in run for d in motifs[i].deps}))
        out_runs.append(MotifRun(f"{label}[{r}]:{what}@{'+'.join(sorted(channels))}",
                                 max(t.duration_us for t in timed), channels, deps))
        parts.append(tuple(replace(motifs[i], deps=tuple(sorted(flat[d] for d in motifs[i].deps))) for i in run))
    return Candidate(ExecutionPlan(label, tuple(out_runs)), tuple(parts))


def _default_splines(op: CommOp, topology: Topology) -> tuple[int, ...]:
    n = len(op.ranks)
    node = topology.node_of()
    out: list[int] = []
    # ranks per node when the op's ranks come in whole-node runs over several nodes
    runs, cur = [], 1
    for a, b in zip(op.ranks, op.ranks[1:]):
        if node.get(a) == node.get(b):
            cur += 1
        else:
            runs.append(cur)
            cur = 1
    runs.append(cur)
    if len(runs) > 1 and len(set(runs)) == 1 and 1 < runs[0] < n:
        out.append(runs[0])
    if n % 2 == 0 and n > 2 and 2 not in out:
        out.append(2)
    return tuple(out)


def motif_candidates(op: CommOp, topology: Topology, channels: dict[str, Topology] | None = None, *,
                     segments: Iterable[int] = (1, 2, 4), splines: Iterable[int] | None = None,
                     mode: str = "unaware", _timer: _Timer | None = None) -> tuple[Candidate, ...]:
    """Candidate plans with their motif lists; see the module docstring. [0] is the default."""
    channels = channels_of(topology) if channels is None else channels
    timer = _timer or _Timer(topology, channels, mode)
    whole = M.as_motif(op)
    default = timer.motif(whole, "*")
    if default is None:
        default = timer.best(op.collective, op.ranks, op.nbytes, channel="*")
    if default is None and op.collective == "permute":
        linked = {(l.src, l.dst) for l in topology.links}
        missing = [p for p in op.pairs if p not in linked]
        raise InputError("<topology>", "links", f"permute pair {missing[0][0]}->{missing[0][1]}: topology "
                         f"{topology.name!r} has no link between them (a permute sends directly)")
    if default is None:
        raise InputError("<topology>", "links", f"{op.collective} over ranks {op.ranks}: no algorithm can run "
                         f"on topology {topology.name!r} (missing links)")
    out = [Candidate(ExecutionPlan("default", (MotifRun(f"default:{op.collective}x{len(op.ranks)}",
                                                        default.duration_us, default.channels),)), ((whole,),))]
    seen = {tuple((r.duration_us, r.channels, r.deps) for r in out[0].plan.motifs)}

    def add(label: str, build, channel_of_fn=None) -> None:
        if len(out) >= MAX_OPTIONS:
            return
        try:
            ms = build()
        except ValueError:
            return
        cand = _runs(label, ms, timer, None if channel_of_fn is None else channel_of_fn(ms))
        if cand is None:
            return
        sig = tuple((r.duration_us, r.channels, r.deps) for r in cand.plan.motifs)
        if sig in seen:
            return
        seen.add(sig)
        out.append(cand)

    # single channels that carry the whole op alone
    alone = [c for c in sorted(channels) if timer.motif(whole, c) is not None]
    splines = _default_splines(op, topology) if splines is None else tuple(splines)
    n = len(op.ranks)
    for d in segments:
        add(f"seg{d}", lambda d=d: M.segment(op, d, ALIGN))
        if len(alone) >= 2 and d >= 2:
            add(f"seg{d}@{'+'.join(alone)}", lambda d=d: M.segment(op, d, ALIGN),
                lambda ms: [alone[i % len(alone)] for i in range(len(ms))])
    for s in splines:
        if 1 < s < n and n % s == 0:
            if op.collective == "alltoall":
                add(f"gspline{s}", lambda s=s: M.group_spline_alltoall(op, s))
            if op.collective == "allreduce":
                add(f"hierAR{s}", lambda s=s: M.hierarchical_allreduce(op, s))
            add(f"spline{s}", lambda s=s: M.spline(op, s))
    if op.collective == "allreduce":
        add("ringAR", lambda: M.ring_allreduce(op))
        if n % 2 == 0 and n > 2:
            add("treeAR2", lambda: M.tree_allreduce(op, 2, recursive=True))
    for s in splines:
        if 1 < s < n and n % s == 0:
            if op.collective == "alltoall":
                add(f"seg2.gspline{s}", lambda s=s: M.compose(op, lambda m: M.segment_motif(m, 2, ALIGN),
                                                                lambda m: M.group_spline_alltoall_motif(m, s)))
            if op.collective == "allreduce":
                add(f"seg2.hierAR{s}", lambda s=s: M.compose(op, lambda m: M.segment_motif(m, 2, ALIGN),
                                                               lambda m: M.hierarchical_allreduce_motif(m, s)))
            add(f"seg2.spline{s}", lambda s=s: M.segment_then_spline(op, 2, s, align=ALIGN))
    return tuple(out)


def motif_options(op: CommOp, topology: Topology, channels: dict[str, Topology] | None = None, *,
                  segments: Iterable[int] = (1, 2, 4), splines: Iterable[int] | None = None,
                  mode: str = "unaware") -> tuple[ExecutionPlan, ...]:
    """Candidate execution plans of a comm-op; option 0 is the default (one ring motif)."""
    return tuple(c.plan for c in motif_candidates(op, topology, channels, segments=segments, splines=splines,
                                                  mode=mode))


# ----------------------------------------------------------------------------------------- problem


def schedule_problem(workload, topology: Topology, *, mode: str = "unaware", source: str = "<workload>",
                     segments: Iterable[int] = (1, 2, 4), splines: Iterable[int] | None = None,
                     costs: CostTable | None = None) -> ScheduleProblem:
    """ScheduleProblem of an (already unrolled) workload on a topology.

    Compute items become compute tasks; comm items comm tasks with `motif_options` (memoised per
    (collective, nbytes, group, pairs)); a comm item over one rank, of 0 bytes or a permute without pairs
    a compute task of 0 us.
    Raises InputError(source, ...) naming the op and the rank when a group has a rank outside the topology.
    """
    channels = channels_of(topology)
    if not channels:
        raise InputError(source, "topology", f"topology {topology.name!r} has no links")
    timer = _Timer(topology, channels, mode, costs)
    memo: dict[tuple, tuple[CommOp, tuple[ExecutionPlan, ...], tuple]] = {}
    tasks: list[Task] = []
    options: dict[int, tuple[ExecutionPlan, ...]] = {}
    ops: dict[int, CommOp] = {}
    decompositions: dict[int, tuple[tuple[tuple[Motif, ...], ...], ...]] = {}
    segments = tuple(segments)
    for it in workload.items:
        deps = tuple(it.deps)
        if it.kind != "comm":
            tasks.append(Task(it.id, "compute", float(it.duration_us), deps, it.name, it.iteration))
            continue
        group = tuple(int(r) for r in it.group)
        for r in group:
            if not 0 <= r < topology.num_ranks:
                raise InputError(source, f"items[{it.id}].group",
                                 f"comm op {it.name!r} ({it.collective}) uses rank {r}, but topology "
                                 f"{topology.name!r} has ranks 0..{topology.num_ranks - 1}")
        pairs = tuple((int(s), int(d)) for s, d in it.pairs) or None
        if len(group) <= 1 or it.nbytes <= 0 or (it.collective == "permute" and pairs is None):
            tasks.append(Task(it.id, "compute", 0.0, deps, it.name, it.iteration))  # moves nothing
            continue
        key = (it.collective, int(it.nbytes), group, pairs)
        if key not in memo:
            nbytes = int(it.nbytes)
            if it.collective in M.BLOCKED and nbytes % len(group):
                nbytes += len(group) - nbytes % len(group)  # round up to whole blocks
            try:
                op = CommOp(it.collective, nbytes, group, pairs=pairs)
            except ValueError as exc:
                raise InputError(source, f"items[{it.id}].pairs", f"comm op {it.name!r}: {exc}") from None
            candidates = motif_candidates(op, topology, channels, segments=segments, splines=splines, mode=mode,
                                          _timer=timer)
            memo[key] = op, tuple(c.plan for c in candidates), tuple(c.parts for c in candidates)
        tasks.append(Task(it.id, "comm", 0.0, deps, it.name, it.iteration))
        ops[it.id], options[it.id], decompositions[it.id] = memo[key]
    return ScheduleProblem(tuple(tasks), options, tuple(channels), ops, decompositions)
