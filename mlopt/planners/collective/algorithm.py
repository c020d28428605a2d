"""Chunk-level collective algorithms: what synthesis and baselines produce and lowering turns into XML.

Chunks are numbered per collective (n ranks, k chunks per rank):

| collective    | chunks   | chunk c starts at                     | and must end at                          |
|---------------|----------|---------------------------------------|------------------------------------------|
| allgather     | n k      | rank c // k, input index c % k        | every rank, output index c               |
| alltoall      | n n k    | rank s, input index d k + j           | rank d, output index s k + j             |
|               |          | (c = (s n + d) k + j)                 |                                          |
| reducescatter | n k      | every rank, input index c (its part)  | rank c // k, output index c % k, summed  |
| allreduce     | n k      | every rank, input index c             | every rank, output index c, summed       |
| broadcast     | k        | root, input index c                   | every rank, output index c               |
| reduce        | k        | every rank, input index c             | root, output index c, summed             |

A transfer sends chunk `chunk` from `src` to `dst`. Its `step` orders the algorithm: a transfer carries
what `src` holds of the chunk after every transfer of that chunk into `src` with a smaller step (its own
part, plus partial sums received so far for reductions). With `reduce`, `dst` adds what arrives to what it
holds; without, `dst`'s copy is replaced. Transfers out of one rank are issued in step order.

The table only numbers the chunks (`sources`, `destinations`: where chunk c sits in each rank's input and
output buffer); what the buffers hold before and must hold after is `CollectiveSpec`'s (mlopt.sim.collectives),
the contract the MSCCL-EF checker and the simulator's schedule checker use too. `check_algorithm` replays the
transfers from `spec.initial` and judges every rank's output buffer with `postcondition_problems`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from mlopt.sim.collectives import CollectiveSpec, Symbol, combine, postcondition_problems


@dataclass(frozen=True)
class Transfer:
    chunk: int
    src: int
    dst: int
    step: int  # logical order (see module docstring)
    reduce: bool = False  # dst accumulates instead of overwriting (reducing collectives)
    start_us: float | None = None  # scheduled start from the synthesizer, if it computed one
    group: int | None = None  # same link and group: sent together as one message (contiguity)


@dataclass(frozen=True)
class Algorithm:
    name: str
    spec: CollectiveSpec
    transfers: tuple[Transfer, ...]

    @property
    def num_chunks(self) -> int:
        n, k = self.spec.num_ranks, self.spec.chunks_per_rank
        return {"alltoall": n * n * k, "broadcast": k, "reduce": k}.get(self.spec.kind, n * k)

    def sources(self, chunk: int) -> dict[int, int]:
        """rank -> input index of the chunk's initial copies (or contributions)."""
        n, k, kind = self.spec.num_ranks, self.spec.chunks_per_rank, self.spec.kind
        if kind == "allgather":
            return {chunk // k: chunk % k}
        if kind == "alltoall":
            s, rest = divmod(chunk, n * k)
            return {s: rest}
        if kind == "broadcast":
            return {self.spec.root: chunk}
        return {r: chunk for r in range(n)}  # reductions: every rank contributes

    def destinations(self, chunk: int) -> dict[int, int]:
        """rank -> output index where the chunk (or its full sum) must end up."""
        n, k, kind = self.spec.num_ranks, self.spec.chunks_per_rank, self.spec.kind
        if kind == "alltoall":
            s, rest = divmod(chunk, n * k)
            d, j = divmod(rest, k)
            return {d: s * k + j}
        if kind == "reducescatter":
            return {chunk // k: chunk % k}
        if kind == "reduce":
            return {self.spec.root: chunk}
        return {r: chunk for r in range(n)}  # allgather, allreduce, broadcast


def final_values(alg: Algorithm) -> dict[tuple[int, int], Symbol]:
    """(chunk, rank) -> value held at the end, replaying transfers in step order."""
    by_chunk: dict[int, list[Transfer]] = defaultdict(list)
    for t in alg.transfers:
        by_chunk[t.chunk].append(t)
    values: dict[tuple[int, int], Symbol] = {}
    for chunk in range(alg.num_chunks):
        held = {r: alg.spec.initial(r, i) for r, i in alg.sources(chunk).items()}
        transfers = sorted(by_chunk.get(chunk, ()), key=lambda t: t.step)
        i = 0
        while i < len(transfers):  # transfers of one step see the values from before that step
            j = i
            while j < len(transfers) and transfers[j].step == transfers[i].step:
                j += 1
            sent = [(t, held.get(t.src)) for t in transfers[i:j]]
            for t, value in sent:
                if value is None:
                    raise ValueError(f"chunk {chunk}: rank {t.src} sends at step {t.step} before holding it")
                held[t.dst] = combine(held.get(t.dst, ()), value) if t.reduce else value
            i = j
        for r, v in held.items():
            values[(chunk, r)] = v
    return values


def check_algorithm(alg: Algorithm) -> list[str]:
    """Problems with the algorithm (empty when it implements its collective)."""
    n = alg.spec.num_ranks
    problems = []
    for t in alg.transfers:
        if not (0 <= t.src < n and 0 <= t.dst < n) or t.src == t.dst:
            problems.append(f"transfer {t} has bad endpoints")
        if not 0 <= t.chunk < alg.num_chunks:
            problems.append(f"transfer {t} names chunk outside 0..{alg.num_chunks - 1}")
        if t.reduce and not alg.spec.reducing:
            problems.append(f"transfer {t} reduces in a {alg.spec.kind}")
    if problems:
        return problems
    try:
        values = final_values(alg)
    except ValueError as exc:
        return [str(exc)]
    chunk_at = {(r, j): chunk for chunk in range(alg.num_chunks) for r, j in alg.destinations(chunk).items()}

    def held(r: int, j: int) -> Symbol | None:
        chunk = chunk_at.get((r, j))
        return None if chunk is None else values.get((chunk, r))

    def where(r: int, j: int) -> str:
        chunk = chunk_at.get((r, j))
        return f"rank {r} output {j} (no chunk ends there)" if chunk is None else f"chunk {chunk} at rank {r}"

    return postcondition_problems(alg.spec, held, where=where)


def link_loads(alg: Algorithm) -> Counter:
    """(src, dst) -> number of chunks sent over that link."""
    return Counter((t.src, t.dst) for t in alg.transfers)
