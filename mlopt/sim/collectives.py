"""Collectives defined by pre- and postconditions over symbolic chunk values.

A symbolic value is the multiset of contributions it holds, each contribution being (origin rank, index
in that rank's input buffer). A copy collective moves singletons; a reduction adds multisets, so a
postcondition that wants every rank's contribution exactly once also catches double counting.

Buffer sizes in chunks, with n ranks and k = chunks per rank (msccl-tools' convention):

| collective    | input  | output | rank r's output index j must hold                                  |
|---------------|--------|--------|--------------------------------------------------------------------|
| allgather     | k      | n k    | {(j // k, j % k)}                                                  |
| alltoall      | n k    | n k    | {(j // k, r k + j % k)}                                            |
| reducescatter | n k    | k      | {(s, r k + j) for every rank s}                                    |
| allreduce     | n k    | n k    | {(s, j) for every rank s}                                          |
| broadcast     | k      | k      | {(root, j)}                                                        |
| reduce        | k      | k      | at the root only: {(s, j) for every rank s}                        |

In place, the input is a window of the output: allgather's input is output chunks [r k, r k + k), all
others' input is the whole output buffer.

This spec is the one contract of every form a collective takes in mlopt; each form's checker runs the form
on these symbolic values, starting from `initial`, and judges the result with `postcondition_problems`:

| form                                   | checker                                 | runs                           |
|----------------------------------------|-----------------------------------------|--------------------------------|
| chunk-level `Algorithm` (planners)     | `collective.algorithm.check_algorithm`  | transfers per chunk, in step   |
|                                        |                                         | order; chunk c's copies map to |
|                                        |                                         | buffer indices (sources and    |
|                                        |                                         | destinations)                  |
| MSCCL-EF program                       | `mlopt.sim.symbolic.check_program`      | threadblock steps, FIFOs, deps |
| message schedule (system layer)        | `collective_algorithms.verify_schedule` | messages in index order; its   |
|                                        |                                         | pieces map to buffer indices   |

What each checks besides the postcondition: `check_algorithm`: endpoints and chunk ids in range, no reducing
transfer in a copy collective, no chunk sent before its sender holds it. `check_program`: matched sends and
receives, counts, dependencies, deadlock (unbounded and the executor's bounded FIFOs), races between a GPU's
threadblocks, executor limits. `verify_schedule`: dependencies point into earlier steps, conflicting accesses
to a (rank, piece) are ordered, joins are local, pieces match the bytes, no piece sent before it is held.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

Symbol = tuple[tuple[tuple[int, int], int], ...]  # sorted ((origin rank, input index), multiplicity)

KINDS = ("allgather", "alltoall", "reducescatter", "allreduce", "broadcast", "reduce")
REDUCING = frozenset({"reducescatter", "allreduce", "reduce"})


def symbol(contributions: Counter | dict | list) -> Symbol:
    counts = Counter(contributions) if not isinstance(contributions, Counter) else contributions
    return tuple(sorted((k, v) for k, v in counts.items() if v))


def combine(a: Symbol, b: Symbol) -> Symbol:
    """The value of reducing a with b: contributions add up."""
    total = Counter(dict(a))
    total.update(dict(b))
    return symbol(total)


@dataclass(frozen=True)
class CollectiveSpec:
    kind: str  # one of KINDS
    num_ranks: int
    chunks_per_rank: int  # k
    root: int = 0  # broadcast and reduce

    @property
    def reducing(self) -> bool:
        return self.kind in REDUCING

    def input_chunks(self) -> int:
        n, k = self.num_ranks, self.chunks_per_rank
        return k if self.kind in ("allgather", "broadcast", "reduce") else n * k

    def output_chunks(self) -> int:
        n, k = self.num_ranks, self.chunks_per_rank
        return k if self.kind in ("reducescatter", "broadcast", "reduce") else n * k

    def input_window(self, rank: int) -> int:
        """Output index where the input starts when running in place."""
        return rank * self.chunks_per_rank if self.kind == "allgather" else 0

    def initial(self, rank: int, index: int) -> Symbol:
        """Value of input chunk `index` at `rank` before the collective."""
        if self.kind == "broadcast" and rank != self.root:
            return ()
        return symbol([(rank, index)])

    def expected(self, rank: int, index: int) -> Symbol | None:
        """Value output chunk `index` of `rank` must hold afterwards; None when anything goes."""
        n, k = self.num_ranks, self.chunks_per_rank
        if self.kind == "allgather":
            return symbol([(index // k, index % k)])
        if self.kind == "alltoall":
            return symbol([(index // k, rank * k + index % k)])
        if self.kind == "reducescatter":
            return symbol([(s, rank * k + index) for s in range(n)])
        if self.kind == "allreduce":
            return symbol([(s, index) for s in range(n)])
        if self.kind == "broadcast":
            return symbol([(self.root, index)])
        if self.kind == "reduce":
            return symbol([(s, index) for s in range(n)]) if rank == self.root else None
        raise ValueError(f"unknown collective {self.kind!r}")


def show_symbol(value: Symbol | None) -> str:
    """A value as {r0[3], r1[3]x2} (origin rank, input index, multiplicity); None: "nothing"."""
    if value is None:
        return "nothing"
    return "{" + ", ".join(f"r{r}[{i}]" + (f"x{m}" if m > 1 else "") for (r, i), m in value) + "}"


def postcondition_problems(spec: CollectiveSpec, held: Callable[[int, int], Symbol | None], *,
                           output_chunks: int | None = None, where: Callable[[int, int], str] | None = None,
                           limit: int | None = None) -> list[str]:
    """Every (rank, output index) whose final value `held(rank, index)` (None: never written) is not what
    `spec.expected` asks, one line each: "WHERE: holds {...}, needs {...}", WHERE being `where(rank, index)`
    (default "rank r output j"). output_chunks: the output buffer's size when it is not the spec's (an
    allreduce checked with a buffer that is not a multiple of the ranks). limit: stop after that many lines."""
    size = spec.output_chunks() if output_chunks is None else output_chunks
    problems: list[str] = []
    for r in range(spec.num_ranks):
        for j in range(size):
            want = spec.expected(r, j)
            if want is None:
                continue
            got = held(r, j)
            if got != want:
                name = where(r, j) if where is not None else f"rank {r} output {j}"
                problems.append(f"{name}: holds {show_symbol(got)}, needs {show_symbol(want)}")
                if limit is not None and len(problems) >= limit:
                    return problems
    return problems
