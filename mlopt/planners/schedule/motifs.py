"""Motifs: a comm-op broken into smaller collectives by segmentation and splining (Syndicate §4.2, App. A.1).

A comm-op (`CommOp`) is one collective over `ranks` with a payload of `nbytes` (nccl-tests convention:
allreduce/broadcast/reduce the buffer, allgather/alltoall the output per rank, reducescatter the input
per rank). A decomposition is a list of `Motif`s, each a smaller collective over a subset of the ranks
(or, for a splined all-to-all, a subset of the (source, destination) pairs) acting on a part of the
payload; `deps` make the list a DAG (always listed in a topological order).

Buffer model (used by the motifs' regions and by the verifier `implements`). Every rank holds two
buffers of `nbytes` bytes in the op's coordinates: `in` (the op's input) and `out`. The output starts as
a copy of the input (in-place semantics), every motif but all-to-all and permute works in place on
`out`, and those two read `in` and write `out` (an in-place splined all-to-all would race on itself). For the
collectives whose payload is per peer (alltoall, allgather, reducescatter) the buffer is N blocks of
B = nbytes / N bytes, block j belonging to the rank at position j of `ranks`: allgather's input of rank
j sits in block j; reducescatter's result for rank j goes to block j (nccl's in-place layout); alltoall's
block j of `in` goes to rank j and block j of `out` comes from rank j.

A motif's `regions` say which bytes it touches: for allreduce/broadcast/reduce one region shared by all
its ranks; for alltoall/allgather/reducescatter one region per position of its `ranks` (all of equal
length), the motif's block p. A region is a tuple of (offset, length) byte ranges, concatenated.

Rules implemented (my reading of App. A.1 and Figs. 8-9; n is a group size, groups are consecutive runs
of n ranks in the given order, n must divide the number of ranks):

* segmentation, any collective: split every block into d contiguous pieces; d independent, parallel
  motifs of the same collective (A.1 "Segmented All-Reduce", §4.2.1 "Segmented All-To-All").
  Note: the paper's d is the segment *size* (D/d motifs); here d is the number of pieces.
* splining all-to-all: N/n parallel all-to-all motifs; in motif c rank at position i sends to positions
  (i + c n) % N .. (i + (c+1) n - 1) % N (§4.2.1 / A.1 "Splined All-To-All").
* splining all-reduce: tree all-reduce (A.1): RE_{c n} within each group || -> AR over the group
  leaders (position c n) -> BC_{c n} within each group ||; optionally applied recursively to the middle
  all-reduce. `ring_allreduce` is A.1's other all-reduce spline: RS -> AG over all ranks.
* splining broadcast (Fig. 9): N/n parallel broadcasts from the root, each to one group.
* splining reduce (the convergent half of the tree all-reduce): RE within each group to its leader
  (the root in the root's group, the first rank elsewhere) || -> RE over the leaders to the root.
* collective-permute (XLA's; "permute"): every source sends its `in` to its destination's `out`, for
  the op's (source, destination) `pairs` (each source and destination once); the motif's `pattern` holds
  the pairs it moves. Segmentation as above; splining splits the pairs by groups of n ranks, motif c
  moving those whose destination group is the source's + c (mod N/n), in parallel (as the all-to-all's
  group splining). A rank that is no destination has an undefined output.
* splining allgather / reducescatter (not in A.1; the 2-D hierarchical form "over sub-groups, then
  across"): AG within each group || -> AG across groups between same-index members ||; reducescatter is
  the mirror, RS across groups || -> RS within each group ||.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from math import gcd
from typing import Callable, Iterable

from mlopt.formats.trace import pairs_problem

COLLECTIVES = ("allreduce", "alltoall", "allgather", "reducescatter", "broadcast", "reduce", "permute")
ROOTED = frozenset({"broadcast", "reduce"})
BLOCKED = frozenset({"alltoall", "allgather", "reducescatter"})  # payload per peer: one region per position
PATTERNED = frozenset({"alltoall", "permute"})  # motifs that may move only some (source, destination) pairs

Range = tuple[int, int]  # (offset, length) in bytes of the op's buffer
Region = tuple[Range, ...]


@dataclass(frozen=True)
class CommOp:
    """One collective over `ranks` (order matters: it defines positions, blocks and groups)."""

    collective: str
    nbytes: int
    ranks: tuple[int, ...]
    root: int | None = None  # broadcast / reduce only; defaults to ranks[0]
    pairs: tuple[tuple[int, int], ...] | None = None  # permute only: (source, destination) ranks

    def __post_init__(self):
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if self.pairs is not None:
            object.__setattr__(self, "pairs", tuple((int(s), int(d)) for s, d in self.pairs))
        problem = _pairs_problem(self.collective, self.pairs, self.ranks)
        if problem:
            raise ValueError(problem)
        if self.collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {self.collective!r}; expected one of {COLLECTIVES}")
        if not self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ranks must be a non-empty tuple of distinct ranks, got {self.ranks}")
        if not isinstance(self.nbytes, int) or self.nbytes <= 0:
            raise ValueError(f"nbytes must be a positive int, got {self.nbytes!r}")
        if self.collective in BLOCKED and self.nbytes % len(self.ranks):
            raise ValueError(
                f"{self.collective} nbytes={self.nbytes} is not divisible by {len(self.ranks)} ranks"
            )
        if self.collective in ROOTED:
            if self.root is None:
                object.__setattr__(self, "root", self.ranks[0])
            elif self.root not in self.ranks:
                raise ValueError(f"root {self.root} is not one of the ranks {self.ranks}")
        elif self.root is not None:
            raise ValueError(f"{self.collective} takes no root (got root={self.root})")

    @property
    def block(self) -> int:
        """Bytes per peer block (alltoall/allgather/reducescatter), else the whole buffer."""
        return self.nbytes // len(self.ranks) if self.collective in BLOCKED else self.nbytes


def _pairs_problem(collective: str, pairs, ranks: tuple[int, ...]) -> str:
    """Why `pairs` cannot be a comm-op's permutation ("" when it can): the trace's rules
    (`mlopt.formats.trace.pairs_problem`) on the ranks' positions, and a permute must move something."""
    position = {r: p for p, r in enumerate(ranks)}
    if pairs is not None and any(r not in position for pair in pairs for r in pair):
        return f"permute pairs {pairs} name ranks outside {ranks}"
    if collective == "permute" and not pairs:
        return "permute needs a non-empty tuple of (source, destination) pairs"
    at_positions = None if pairs is None else [[position[s], position[d]] for s, d in pairs]
    problem = pairs_problem(collective, at_positions, len(ranks))
    return "" if problem is None else f"permute pairs {pairs} (as positions in {ranks}): {problem}"


@dataclass(frozen=True)
class Motif:
    """A smaller collective of a decomposition; `deps` index earlier motifs of the same list."""

    collective: str
    ranks: tuple[int, ...]
    regions: tuple[Region, ...]  # one shared region, or one per position for BLOCKED collectives
    root: int | None = None
    stage: int = 0  # longest dependency path from a source of the DAG
    deps: tuple[int, ...] = ()
    # alltoall: the (src, dst) pairs it moves, None = all; permute: always its (src, dst) pairs
    pattern: tuple[tuple[int, int], ...] | None = None

    @property
    def length(self) -> int:
        """Bytes of one region (per position for BLOCKED collectives)."""
        return _region_len(self.regions[0])

    @property
    def nbytes(self) -> int:
        """The motif's size in the nccl-tests convention of its own collective."""
        return self.length * (len(self.ranks) if self.collective in BLOCKED else 1)

    def region_of(self, position: int) -> Region:
        return self.regions[position] if self.collective in BLOCKED else self.regions[0]


# ----------------------------------------------------------------------------------------- regions


def _region_len(region: Region) -> int:
    return sum(length for _, length in region)


def _sub_region(region: Region, start: int, stop: int) -> Region:
    """Bytes [start, stop) of the concatenation of `region`'s ranges."""
    out, base = [], 0
    for offset, length in region:
        lo, hi = max(start, base), min(stop, base + length)
        if lo < hi:
            out.append((offset + lo - base, hi - lo))
        base += length
    return tuple(out)


def _split_balanced(region: Region, d: int, align: int) -> list[Region]:
    """d contiguous pieces whose sizes (in units of `align` bytes) differ by at most one unit."""
    total = _region_len(region)
    if total % align:
        raise ValueError(f"payload of {total} bytes is not a multiple of align={align}")
    units = total // align
    if d > units:
        raise ValueError(f"cannot segment {total} bytes into d={d} non-empty pieces of {align}-byte units")
    q, r = divmod(units, d)
    cuts = [align * (i * q + min(i, r)) for i in range(d + 1)]
    return [_sub_region(region, cuts[i], cuts[i + 1]) for i in range(d)]


def _split_equal(region: Region, parts: int) -> list[Region]:
    total = _region_len(region)
    if total % parts:
        raise ValueError(f"payload of {total} bytes is not divisible into {parts} equal blocks")
    step = total // parts
    return [_sub_region(region, i * step, (i + 1) * step) for i in range(parts)]


def _concat(regions: Iterable[Region]) -> Region:
    return tuple(rng for region in regions for rng in region)


# ------------------------------------------------------------------------------------ DAG helpers


def as_motif(op: CommOp) -> Motif:
    """The comm-op as a single motif (A.1: a collective is the special case d = D, n = N)."""
    if op.collective in BLOCKED:
        regions = tuple(((j * op.block, op.block),) for j in range(len(op.ranks)))
    else:
        regions = (((0, op.nbytes),),)
    return Motif(op.collective, op.ranks, regions, op.root, pattern=op.pairs)


def _staged(stages: list[list[Motif]]) -> list[Motif]:
    """Chain stages (A.1's "->"): a motif depends on every earlier-stage motif sharing a rank with it."""
    out: list[Motif] = []
    for stage in (s for s in stages if s):
        earlier = list(enumerate(out))
        for m in stage:
            deps = tuple(i for i, e in earlier if set(e.ranks) & set(m.ranks))
            out.append(replace(m, deps=deps))
    return _restage(out)


def _restage(motifs: list[Motif]) -> list[Motif]:
    """Set each motif's stage to its longest dependency path (motifs are in topological order)."""
    stages: list[int] = []
    for m in motifs:
        stages.append(1 + max((stages[d] for d in m.deps), default=-1))
    return [replace(m, stage=s) for m, s in zip(motifs, stages)]


def expand(motifs: list[Motif], fn: Callable[[Motif], list[Motif]]) -> list[Motif]:
    """Replace every motif by the sub-DAG `fn(motif)`, keeping the outer dependencies (composition).

    Sources of a sub-DAG inherit the replaced motif's deps, pointed at the sinks of the sub-DAGs that
    replaced those deps.
    """
    out: list[Motif] = []
    sinks: list[list[int]] = []
    for i, m in enumerate(motifs):
        if any(d >= i or d < 0 for d in m.deps):
            raise ValueError(f"motif {i} has deps {m.deps}: motifs must be listed in topological order")
        sub = fn(m)
        if not sub:
            raise ValueError(f"decomposition of motif {i} is empty")
        base = len(out)
        outer = tuple(sorted({s for d in m.deps for s in sinks[d]}))
        used = {d for s in sub for d in s.deps}
        for s in sub:
            deps = tuple(base + d for d in s.deps) if s.deps else outer
            out.append(replace(s, deps=deps))
        sinks.append([base + k for k in range(len(sub)) if k not in used])
    return _restage(out)


def _groups(ranks: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"group size n must be a positive int, got {n!r}")
    if len(ranks) % n:
        raise ValueError(f"group size n={n} does not divide the number of ranks {len(ranks)}")
    return [ranks[c : c + n] for c in range(0, len(ranks), n)]


# ----------------------------------------------------------------------------- motif transformations


def segment_motif(m: Motif, d: int, align: int = 1) -> list[Motif]:
    """Segmentation (A.1 "Segmented All-Reduce", §4.2.1 "Segmented All-To-All"): d independent motifs.

    Every region (every block for per-peer collectives) is cut into d contiguous pieces whose sizes in
    `align`-byte units differ by at most one (so the last pieces may be one unit shorter); piece s of
    each block forms motif s. All pieces run in parallel ("||").
    """
    if not isinstance(d, int) or d <= 0:
        raise ValueError(f"number of segments d must be a positive int, got {d!r}")
    if not isinstance(align, int) or align <= 0:
        raise ValueError(f"align must be a positive int, got {align!r}")
    pieces = [_split_balanced(region, d, align) for region in m.regions]
    return _restage([replace(m, regions=tuple(p[s] for p in pieces), deps=()) for s in range(d)])


def ring_allreduce_motif(m: Motif) -> list[Motif]:
    """A.1 "Ring All-Reduce": AR = RS -> AG over the same ranks; block p of the buffer is rank p's."""
    _expect(m, "allreduce")
    blocks = tuple(_split_equal(m.regions[0], len(m.ranks)))
    rs = Motif("reducescatter", m.ranks, blocks)
    ag = Motif("allgather", m.ranks, blocks)
    return _staged([[rs], [ag]])


def _tree_stages(ranks: tuple[int, ...], region: Region, n: int, recursive: bool) -> list[list[Motif]]:
    groups = _groups(ranks, n)
    leaders = tuple(g[0] for g in groups)
    reduce_ = [Motif("reduce", g, (region,), g[0]) for g in groups if len(g) > 1]
    bcast = [Motif("broadcast", g, (region,), g[0]) for g in groups if len(g) > 1]
    if recursive and 1 < n < len(leaders) and len(leaders) % n == 0:
        middle = _tree_stages(leaders, region, n, recursive)
    else:
        middle = [[Motif("allreduce", leaders, (region,))]] if len(leaders) > 1 else []
    return [reduce_, *middle, bcast]


def tree_allreduce_motif(m: Motif, n: int, recursive: bool = False) -> list[Motif]:
    """A.1 "Tree All-Reduce": ||_c RE_{cn}(PG[cn:(c+1)n]) -> AR(PG[{cn}]) -> ||_c BC_{cn}(PG[cn:(c+1)n]).

    With `recursive`, the same rule is applied to the middle all-reduce while n still divides (and is
    smaller than) the number of leaders, giving A.1's hierarchical tree.
    """
    _expect(m, "allreduce")
    stages = _tree_stages(m.ranks, m.regions[0], n, recursive)
    if not any(stages):  # a single rank: nothing to communicate
        return [replace(m, deps=())]
    return _staged(stages)


def _spline_alltoall(m: Motif, n: int) -> list[Motif]:
    """§4.2.1 / A.1 "Splined All-To-All": motif c, rank at position i sends to positions (i+cn)%N..+n-1."""
    size = len(_groups(m.ranks, n)) * n
    allowed = None if m.pattern is None else set(m.pattern)
    out = []
    for c in range(size // n):
        pairs = tuple(
            (m.ranks[i], m.ranks[(i + c * n + t) % size])
            for i in range(size)
            for t in range(n)
            if allowed is None or (m.ranks[i], m.ranks[(i + c * n + t) % size]) in allowed
        )
        if pairs:
            out.append(replace(m, pattern=pairs, deps=()))
    return _restage(out)


def _leader(group: tuple[int, ...], root: int) -> int:
    return root if root in group else group[0]


def _spline_reduce(m: Motif, n: int) -> list[Motif]:
    groups = _groups(m.ranks, n)
    leaders = tuple(_leader(g, m.root) for g in groups)
    inner = [Motif("reduce", g, m.regions, _leader(g, m.root)) for g in groups if len(g) > 1]
    outer = [Motif("reduce", leaders, m.regions, m.root)] if len(leaders) > 1 else []
    return _staged([inner, outer]) or [replace(m, deps=())]


def _spline_broadcast(m: Motif, n: int) -> list[Motif]:
    """Fig. 9: N/n parallel broadcasts of the same payload from the root, each to one group of ranks."""
    out = []
    for g in _groups(m.ranks, n):
        ranks = tuple(r for r in m.ranks if r == m.root or r in g)
        if len(ranks) > 1:
            out.append(Motif("broadcast", ranks, m.regions, m.root))
    return _staged([out]) or [replace(m, deps=())]


def _spline_gather_scatter(m: Motif, n: int) -> list[Motif]:
    """Hierarchical AG (within groups, then across) and RS (across groups, then within)."""
    groups = _groups(m.ranks, n)
    pos = {r: p for p, r in enumerate(m.ranks)}
    within = [
        Motif(m.collective, g, tuple(m.regions[pos[r]] for r in g)) for g in groups if len(g) > 1
    ]
    group_regions = tuple(_concat(m.regions[pos[r]] for r in g) for g in groups)
    across = [
        Motif(m.collective, tuple(g[t] for g in groups), group_regions)
        for t in range(n)
        if len(groups) > 1
    ]
    stages = [within, across] if m.collective == "allgather" else [across, within]
    return _staged(stages) or [replace(m, deps=())]


def hierarchical_allreduce_motif(m: Motif, n: int) -> list[Motif]:
    """2-D all-reduce (NCCL's hierarchical form; the ring all-reduce's RS -> AG with an all-reduce across
    groups in between): ||_c RS(PG[cn:(c+1)n]) -> ||_t AR({member t of every group}) on block t ->
    ||_c AG(PG[cn:(c+1)n]). Block t (1/n of the buffer) is reduced by member t of each group, so the
    across-group all-reduces move 1/n of the buffer each, on disjoint ranks (their own NICs)."""
    _expect(m, "allreduce")
    groups = _groups(m.ranks, n)
    blocks = tuple(_split_equal(m.regions[0], n))
    within_rs = [Motif("reducescatter", g, blocks) for g in groups if len(g) > 1]
    across = [Motif("allreduce", tuple(g[t] for g in groups), (blocks[t],)) for t in range(n) if len(groups) > 1]
    within_ag = [Motif("allgather", g, blocks) for g in groups if len(g) > 1]
    return _staged([within_rs, across, within_ag]) or [replace(m, deps=())]


def _group_offset_pairs(m: Motif, n: int, pairs) -> list[tuple[tuple[int, int], ...]]:
    """`pairs` split by the offset c = (destination group - source group) mod G of groups of n consecutive
    ranks, c = 0..G-1 (empty classes left out): c = 0 stays inside every group, the others cross groups."""
    groups = _groups(m.ranks, n)
    group_of = {r: k for k, g in enumerate(groups) for r in g}
    classes = [tuple(p for p in pairs if (group_of[p[1]] - group_of[p[0]]) % len(groups) == c)
               for c in range(len(groups))]
    return [c for c in classes if c]


def spline_permute_motif(m: Motif, n: int) -> list[Motif]:
    """Splined collective-permute (the all-to-all's group splining applied to a permutation): with groups of
    n consecutive ranks, motif c moves the pairs whose destination group is the source's group + c (mod G),
    all in parallel, over the ranks of those pairs only; c = 0 stays inside the groups (e.g. NVLink), the
    others cross them (e.g. RDMA)."""
    _expect(m, "permute")
    out = []
    for part in _group_offset_pairs(m, n, m.pattern):
        members = {r for pair in part for r in pair}  # only the ranks that send or receive take part
        out.append(replace(m, ranks=tuple(r for r in m.ranks if r in members), pattern=part, deps=()))
    return _restage(out)


def group_spline_alltoall_motif(m: Motif, n: int) -> list[Motif]:
    """Splined all-to-all by whole groups (the node-aligned form of §4.2.1's splining): with G = N/n groups
    of n consecutive ranks, motif c carries the pairs whose destination group is the source's group + c
    (mod G); motif 0 stays inside every group (e.g. NVLink only), the others cross groups (e.g. RDMA)."""
    _expect(m, "alltoall")
    groups = _groups(m.ranks, n)
    group_of = {r: k for k, g in enumerate(groups) for r in g}
    allowed = None if m.pattern is None else set(m.pattern)
    out = []
    for c in range(len(groups)):
        pairs = tuple((a, b) for a in m.ranks for b in m.ranks
                      if (group_of[b] - group_of[a]) % len(groups) == c and (allowed is None or (a, b) in allowed))
        if pairs:
            out.append(replace(m, pattern=pairs, deps=()))
    return _restage(out)


def spline_motif(m: Motif, n: int, recursive: bool = False) -> list[Motif]:
    """Splining with group size n (App. A.1; see the module docstring for the rule per collective).

    allreduce splines to the tree all-reduce (its only n-parameterised rule in A.1; `ring_allreduce`
    is the other); `recursive` only matters for allreduce.
    """
    _groups(m.ranks, n)  # validates n
    if m.collective == "allreduce":
        return tree_allreduce_motif(m, n, recursive)
    if m.collective == "alltoall":
        return _spline_alltoall(m, n)
    if m.collective == "permute":
        return spline_permute_motif(m, n)
    if m.pattern is not None:
        raise ValueError(f"only alltoall and permute motifs carry a pattern, got one on {m.collective}")
    if m.collective == "reduce":
        return _spline_reduce(m, n)
    if m.collective == "broadcast":
        return _spline_broadcast(m, n)
    return _spline_gather_scatter(m, n)


def _expect(m: Motif, collective: str) -> None:
    if m.collective != collective:
        raise ValueError(f"expected a {collective} motif, got {m.collective}")


# --------------------------------------------------------------------------- comm-op level API


def segment(op: CommOp, d: int, align: int = 1) -> list[Motif]:
    """`op` segmented into d parallel motifs of the same collective (see `segment_motif`)."""
    return segment_motif(as_motif(op), d, align)


def spline(op: CommOp, n: int, recursive: bool = False) -> list[Motif]:
    """`op` splined with group size n (see `spline_motif`)."""
    return spline_motif(as_motif(op), n, recursive)


def ring_allreduce(op: CommOp) -> list[Motif]:
    """A.1 ring all-reduce: RS -> AG."""
    return ring_allreduce_motif(as_motif(op))


def tree_allreduce(op: CommOp, n: int = 2, recursive: bool = True) -> list[Motif]:
    """A.1 tree all-reduce: RE || -> AR (recursively a tree) -> BC ||, groups of n ranks."""
    return tree_allreduce_motif(as_motif(op), n, recursive)


def hierarchical_allreduce(op: CommOp, n: int) -> list[Motif]:
    """2-D all-reduce over groups of n ranks: RS within || -> AR across || -> AG within ||."""
    return hierarchical_allreduce_motif(as_motif(op), n)


def group_spline_alltoall(op: CommOp, n: int) -> list[Motif]:
    """All-to-all splined by whole groups of n ranks (motif c: destination group = source group + c)."""
    return group_spline_alltoall_motif(as_motif(op), n)


def compose(op: CommOp, *steps: Callable[[Motif], list[Motif]]) -> list[Motif]:
    """Apply transformation steps in turn, each to every motif of the previous result (A.1 composition).

    Example: ``compose(op, lambda m: segment_motif(m, 4), lambda m: spline_motif(m, 2))``.
    """
    motifs = [as_motif(op)]
    for step in steps:
        motifs = expand(motifs, step)
    return motifs


def segment_then_spline(op: CommOp, d: int, n: int, recursive: bool = False, align: int = 1) -> list[Motif]:
    """Segment into d pieces (cut at multiples of `align` bytes), then spline every piece with group size n."""
    return compose(op, lambda m: segment_motif(m, d, align), lambda m: spline_motif(m, n, recursive))


# ------------------------------------------------------------------------------------- verifier

# A symbolic value: Counter of contributions (origin rank, element index of the origin's input).
_State = dict[tuple[str, int], list[Counter]]


def _motif_errors(op: CommOp, i: int, m: Motif) -> list[str]:
    errs = []
    where = f"motif {i} ({m.collective} over {m.ranks})"
    if m.collective not in COLLECTIVES:
        return [f"{where}: unknown collective"]
    if not m.ranks or len(set(m.ranks)) != len(m.ranks):
        errs.append(f"{where}: ranks must be non-empty and distinct")
    if not set(m.ranks) <= set(op.ranks):
        errs.append(f"{where}: ranks {sorted(set(m.ranks) - set(op.ranks))} are not in the op's ranks")
    if m.collective in ROOTED and m.root not in m.ranks:
        errs.append(f"{where}: root {m.root} is not one of its ranks")
    want = len(m.ranks) if m.collective in BLOCKED else 1
    if len(m.regions) != want:
        errs.append(f"{where}: has {len(m.regions)} regions, expected {want}")
    elif len({_region_len(r) for r in m.regions}) > 1:
        errs.append(f"{where}: its blocks differ in length")
    for region in m.regions:
        for off, length in region:
            if off < 0 or length <= 0 or off + length > op.nbytes:
                errs.append(f"{where}: range ({off}, {length}) is outside [0, {op.nbytes})")
    if m.pattern is not None:
        if m.collective not in PATTERNED:
            errs.append(f"{where}: only alltoall and permute motifs carry a pattern")
        elif not all(s in m.ranks and t in m.ranks for s, t in m.pattern):
            errs.append(f"{where}: pattern pairs outside its ranks")
        elif m.collective == "permute" and not set(m.pattern) <= set(op.pairs or ()):
            errs.append(f"{where}: moves pairs {sorted(set(m.pattern) - set(op.pairs or ()))} that are not the op's")
    elif m.collective == "permute":
        errs.append(f"{where}: a permute motif needs its (source, destination) pattern")
    if any(not 0 <= d < 10**9 for d in m.deps):
        errs.append(f"{where}: bad deps {m.deps}")
    return errs


def _topo_order(motifs: list[Motif]) -> list[int] | None:
    """Kahn's order of the deps DAG; None on a cycle or a dangling dep."""
    count = len(motifs)
    if any(d >= count for m in motifs for d in m.deps):
        return None
    indeg = [len(set(m.deps)) for m in motifs]
    users: list[list[int]] = [[] for _ in motifs]
    for i, m in enumerate(motifs):
        for d in set(m.deps):
            users[d].append(i)
    ready = [i for i in range(count) if not indeg[i]]
    order = []
    while ready:
        i = ready.pop(0)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if not indeg[u]:
                ready.append(u)
    return order if len(order) == count else None


def _elements(region: Region, g: int) -> list[int]:
    return [e for off, length in region for e in range(off // g, (off + length) // g)]


def _transfers(m: Motif, g: int):
    """Yield (dst rank, dst buf, element, [(src rank, src buf, element), ...]) the motif computes."""
    ranks = m.ranks
    if m.collective in ("allreduce", "reduce", "broadcast"):
        for e in _elements(m.regions[0], g):
            sources = [(m.root, "out", e)] if m.collective == "broadcast" else [(r, "out", e) for r in ranks]
            targets = [m.root] if m.collective == "reduce" else ranks
            for r in targets:
                if not (m.collective == "broadcast" and r == m.root):
                    yield r, "out", e, sources
        return
    if m.collective == "permute":  # the source's `in` bytes to the same bytes of the destination's `out`
        for s, t in m.pattern:
            for e in _elements(m.regions[0], g):
                yield t, "out", e, [(s, "in", e)]
        return
    blocks = [_elements(region, g) for region in m.regions]
    if m.collective == "alltoall":
        pos = {r: p for p, r in enumerate(ranks)}
        pairs = m.pattern if m.pattern is not None else [(s, t) for s in ranks for t in ranks]
        for s, t in pairs:
            for k, e in enumerate(blocks[pos[s]]):
                yield t, "out", e, [(s, "in", blocks[pos[t]][k])]
        return
    for p, block in enumerate(blocks):
        for e in block:
            if m.collective == "allgather":
                for r in ranks:
                    if r != ranks[p]:
                        yield r, "out", e, [(ranks[p], "out", e)]
            else:  # reducescatter
                yield ranks[p], "out", e, [(r, "out", e) for r in ranks]


def _footprint(m: Motif, g: int) -> tuple[set, set]:
    reads, writes = set(), set()
    for r, buf, e, sources in _transfers(m, g):
        writes.add((r, buf, e))
        reads.update(sources)
    return reads, writes


def _expected(op: CommOp, rank: int, e: int, g: int) -> Counter | None:
    pos = {r: p for p, r in enumerate(op.ranks)}
    everyone = Counter((s, e) for s in op.ranks)
    block = op.block // g
    if op.collective == "allreduce":
        return everyone
    if op.collective == "broadcast":
        return Counter([(op.root, e)])
    if op.collective == "reduce":
        return everyone if rank == op.root else None
    if op.collective == "permute":  # a rank that is no destination: undefined
        source = next((s for s, d in op.pairs if d == rank), None)
        return None if source is None else Counter([(source, e)])
    j, o = divmod(e, block)
    if op.collective == "allgather":
        return Counter([(op.ranks[j], e)])
    if op.collective == "reducescatter":
        return everyone if j == pos[rank] else None
    return Counter([(op.ranks[j], pos[rank] * block + o)])  # alltoall


def implements(op: CommOp, motifs: list[Motif], max_elements: int = 1 << 15) -> list[str]:
    """Problems with `motifs` as an implementation of `op`; an empty list means it is correct.

    Checks every motif's shape (ranks a subset of op.ranks, root, regions inside the buffer), that the
    deps form a DAG, that no two motifs unordered by the DAG touch the same bytes of a rank where one of
    them writes (so every topological order gives the same result), then runs the motifs symbolically in
    a topological order at the granularity of the gcd of all offsets and lengths and compares every
    rank's output with the op's postcondition (contributions counted, so double reduction is caught).
    """
    errs = [e for i, m in enumerate(motifs) for e in _motif_errors(op, i, m)]
    if errs:
        return errs
    order = _topo_order(motifs)
    if order is None:
        return ["motif deps are not an acyclic graph over the list"]
    g = op.nbytes if op.collective not in BLOCKED else op.block
    for m in motifs:
        for region in m.regions:
            for off, length in region:
                g = gcd(g, gcd(off, length))
    needed = (op.nbytes // g) * len(op.ranks)
    if needed > max_elements:
        raise ValueError(f"verification needs {needed} symbolic elements > max_elements={max_elements}")
    errs = _race_errors(motifs, order, g)
    if errs:
        return errs
    size = op.nbytes // g
    state: _State = {}
    for r in op.ranks:
        state[("in", r)] = [Counter([(r, e)]) for e in range(size)]
        state[("out", r)] = [Counter([(r, e)]) for e in range(size)]
    for i in order:
        writes = [
            (r, buf, e, sum((state[(sb, sr)][se] for sr, sb, se in srcs), Counter()))
            for r, buf, e, srcs in _transfers(motifs[i], g)
        ]
        for r, buf, e, value in writes:
            state[(buf, r)][e] = value
    for r in op.ranks:
        for e in range(size):
            want = _expected(op, r, e, g)
            got = state[("out", r)][e]
            if want is not None and got != want:
                span = f"[{e * g}, {(e + 1) * g})"
                errs.append(f"rank {r} bytes {span} hold {dict(got)}, expected {dict(want)}")
    return errs


def _race_errors(motifs: list[Motif], order: list[int], g: int) -> list[str]:
    ancestors: dict[int, set[int]] = {}
    for i in order:
        ancestors[i] = set(motifs[i].deps).union(*(ancestors[d] for d in motifs[i].deps))
    prints = [_footprint(m, g) for m in motifs]
    errs = []
    for a in range(len(motifs)):
        for b in range(a + 1, len(motifs)):
            if a in ancestors[b] or b in ancestors[a]:
                continue
            (ra, wa), (rb, wb) = prints[a], prints[b]
            if wa & (rb | wb) or wb & ra:
                errs.append(f"motifs {a} and {b} are unordered but touch the same bytes (race)")
    return errs
