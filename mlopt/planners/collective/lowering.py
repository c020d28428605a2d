"""Lowering chunk-level Algorithms to MSCCL-EF Programs: TACCL's backend (thesis ch. 5.6.2).

`lower(alg)` turns the transfers of an `Algorithm` (which `check_algorithm` accepts) into a `Program`:
buffer allocation, instruction generation with fused instructions, threadblock and channel allocation,
dependency insertion, contiguity (cnt > 1) and instances. It is deterministic: the same algorithm and options
give the same program.

## Order

Transfers are numbered by (step, position in `alg.transfers`): the order `check_algorithm` replays them in.
Values (which version of a chunk a transfer carries) always follow that step semantics; the keys below only
decide in which order each threadblock issues its steps. Every threadblock issues its steps in key order.

- Step order (some transfer has no `start_us`): for transfer number g with step s, its send has key
  (s, 0, g) and its receive (s, 1, g): a rank issues all sends of a step before the receives of that step,
  which is exactly the replay's rule that a transfer carries what its source held *before* the step.
- Timed order (every transfer has `start_us`, e.g. a synthesized schedule): a send is keyed by its scheduled
  start, a receive by the latest time the schedule lets its data arrive: the next start on the same link (a
  link carries one message at a time) or the first start of a message that sends on, or reduces onto, what
  it delivers (for the last message of a link nothing bounds: the link's tightest such gap per chunk, or, when
  it fits in the executor's FIFO, the end of its threadblock). Keying receives by their step instead puts
  them at the *start* of their transfer: a threadblock that receives from p and sends to q then waits for each
  receive before sends the schedule starts while the data is still on its way (head-of-line blocking; on
  NDv2 x2 it cost 7 % of the allgather). A timed order that contradicts the step semantics somewhere (a
  value read after the schedule overwrites it) falls back to step order.

## Buffer allocation

Every (rank, chunk) value is a *version*: the initial one (a source's input) or one made by an incoming
transfer. Locations:

- an initial version lives in the input buffer `i` at its input index (in place, input and output alias as
  `check_program` has it: allgather's input is output [r k, r k + k), reducescatter's output is input
  [r k, r k + k), the others' input is the output);
- a version a transfer delivers lives at the chunk's *home* on that rank: `o` at the output index where the
  rank is one of the chunk's destinations, otherwise a scratch slot;
- the user's input is never written (out of place): a reduction's first incoming partial sum is combined
  with the input chunk into the home (`rrc src=i dst=o|s`), later ones accumulate in the home; a partial sum
  that is only forwarded is not stored at all (`rrs`, receive-reduce-send);
- a destination whose final value is its own input gets a local copy `i -> o` (allgather's own chunk, the
  alltoall self chunk, n = 1);
- scratch slots are numbered per rank in order of first arrival (step, sender, group, chunk), so chunks that
  arrive in one message are adjacent, then compacted (slots no step uses are dropped, order kept);
- in place, an input chunk that another chunk's value overwrites (in-place alltoall: the output slot of the
  chunk coming back from that peer) is first copied to scratch (a `cpy` at the start) and sent from there,
  so no receive waits for another threadblock's send (or would destroy a chunk not yet sent).

## Instructions

Each transfer is a send at its source and a receive at its destination. Transfers with the same `group` on
the same link and step whose source, destination (and, for reductions, accumulator) slots are consecutive
become one message of cnt > 1 (at most 71 chunks); a message is ordered by its first transfer, so transfers
that share their step with another write of the same (rank, chunk) stay alone (their order decides the
value). Local copies with consecutive slots are merged the same way. A receive whose delivered chunks are
exactly what a later send of that rank forwards (same chunks, same order, nothing arriving in between) is
fused with it when one threadblock can do both (recv peer = previous hop, send peer = next hop), and when
nothing else needs those chunks before the forward is done: a step that waits for a fused receive waits
for its send too (the executor signals a step when it is complete), so another send of the same chunk (or a
reduction onto it) would be serialised behind the forward. With a schedule, other uses that start after the
forward can have arrived are fine; without one, any other use prevents the fusion:

| receive                         | not fused | fused with the forwarding send                   |
|---------------------------------|-----------|--------------------------------------------------|
| overwrite (or reduce into none) | r         | rcs                                              |
| reduce with the held value      | rrc       | rrs if the sum is needed nowhere else, else rrcs |

Fields the executor reads are local: `s` reads src, `r` writes dst, `rcs` writes dst then sends it, `rrs`
sends src + received, `rrc`/`rrcs` write dst = src + received (`rrcs` also sends it), `cpy` copies src to
dst. The fields the executor ignores follow msccl-tools: a send names the receiver's landing slot as dst, a
receive the sender's slot as src. `nop` steps are `i -1 -> o -1`, cnt 0.

## Threadblocks and channels

On each rank, incoming peers are matched with outgoing peers greedily by the number of fusable (receive,
forward) pairs between them; each pair is one threadblock per channel holding every receive from p and
send to q on that channel, and a peer without fusions gets a threadblock of its own (send-only or
receive-only: a receive then never waits behind an unrelated send, which with the executor's bounded FIFOs
could close a cycle of full FIFOs). Fusions are accepted only when they keep
the threadblock's sends in key order, so the sender and the receiver of every FIFO (sender, receiver,
channel) issue its messages in the same order. Chains of fused messages stay on one channel.

With `channels=None`, a threadblock over the executor's 64 steps is split in time: channels are *phases*,
runs of consecutive steps (as few as keep every (recv peer, send peer) pair within 64 steps per phase;
fusions never cross a phase), phase c runs on channel c, and the first step of a pair's threadblock in a
phase waits for the last step of its threadblock in the previous phase. The phases of a pair thus run one
after the other, exactly as one threadblock would: a link keeps carrying one message at a time in the
algorithm's order. (Spreading chains over concurrently running channels instead splits a link between two
threadblocks at once; both messages then arrive late and the pipeline behind them stalls: 1.8x the
schedule for the DGX-2 x2 sketch-1 allgather.) When phases cannot fit (one step alone over 64 steps for a
pair, or more than 32 threadblocks on a channel), and whenever `channels` is given, chains are spread over
the channels greedily instead (least loaded threadblocks, then least loaded channel; the fewest channels
that fit when `channels` is None). Local copies run first, in threadblocks of their own (send = recv = -1,
at most 64 steps each).

## Dependencies

Per rank, steps are replayed in key order over the slots they read and write; a step waits for the last
writer of what it reads (RAW), and a writing step for the previous writer and for the readers since (WAW,
WAR), when those are in another threadblock. Dependencies already implied (the threadblock's own order, or
transitively through other dependencies: vector clocks) are dropped. The producer gets hasdep=1; a step
with m > 1 dependencies is preceded by m - 1 `nop` steps carrying the earlier ones. Nops never have hasdep.

## Why it is deadlock free

Every step has a key (with phases, the phase comes first); a threadblock's steps are in key order; a
dependency (a phase's wait for the previous one included) points to a step of smaller key; a message's send
is issued at a key (its own, or the earlier receive it is fused with) below its receive's key; sender and
receiver issue each FIFO's messages in the same (key) order (timed: a receive's key is at most the next
send's on its link, so receive keys follow send keys). So all waits point backwards in
one total order and, with FIFOs that buffer sends, the program cannot deadlock. With the executor's bounded
FIFOs (check_program's `bounded_fifo`) that also needs the algorithm to not pile up many chunks on one link
in one step while the receiver is busy sending; the baselines schedule one chunk per link and step.

## Instances

`instances=N` splits every chunk into N sub-chunks (chunk x of a buffer becomes sub-chunks x N .. x N + N - 1,
msccl-tools' interleaved policy, which keeps the collective's layout) and runs one copy of the program per
sub-chunk index on its own channels (channel = instance * C + c); scratch is instance-major. Because the
sub-chunks an instance touches in `i`/`o` are N apart, messages over `i`/`o` slots are not merged when N > 1
(scratch-to-scratch ones still are). The program implements `lowered_spec(alg.spec, N)` (k N chunks per
rank); nchunksperloop = max(input, output chunks) x N and nchannels = N x channels.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mlopt.formats.msccl import (
    COLLECTIVES,
    MAX_CHANNELS,
    MAX_STEP_COUNT,
    MAX_STEPS_PER_THREADBLOCK,
    PROTOCOLS,
    Gpu,
    Program,
    Step,
    Threadblock,
)
from mlopt.formats.msccl_xml import check_limits
from mlopt.planners.collective.algorithm import Algorithm, Transfer, check_algorithm
from mlopt.sim.collectives import CollectiveSpec

DEFAULT_MAX_BYTES = 1 << 40  # the program serves every size up to 1 TiB unless told otherwise

Slot = tuple[str, int]  # (buffer, index) in chunks, before instances


class LoweringError(ValueError):
    """An algorithm or option that cannot be lowered; the message says what and why."""


class _Inconsistent(LoweringError):
    """The operation order contradicts the algorithm's step semantics (a value read after it was overwritten)."""


DEFER_CHUNKS = 2  # a receive nothing bounds may wait until its threadblock is done if its message fits in the
# executor's FIFO (Simple: NCCL_STEPS / MSCCL_CHUNKSTEPS = 2 chunks in flight), so its sender never blocks on it


# --------------------------------------------------------------------------------------------------------------
# Plan: versions, locations, messages, fusion (independent of channels)


@dataclass(eq=False)
class _Version:
    rank: int
    chunk: int
    creator: int | None  # transfer number (in key order) that delivered it; None for the initial value
    base: _Version | None = None  # what the delivering reduce added to
    pot: Slot | None = None  # where it lives if stored
    readers: list[int] = field(default_factory=list)  # transfers that send it
    base_of: list[int] = field(default_factory=list)  # reduces that add to it
    final: bool = False  # the value a destination must end with
    stored: bool = True

    @property
    def loc(self) -> Slot | None:
        return self.pot if self.stored else None


@dataclass(eq=False)
class _Msg:
    id: int
    src: int
    dst: int
    step: int
    gs: list[int]  # transfer numbers in slot order
    reduce_base: bool  # the receive adds to a held value
    key: int
    fused_in: _Msg | None = None  # the incoming message whose receive step also sends this one
    fused_out: _Msg | None = None  # the outgoing message this one's receive step also sends
    stored: bool = True
    phase: int = 0  # channel phase (see "Threadblocks and channels")
    send_at: float | None = None  # timed order: scheduled start (None: order by step)
    recv_at: float | None = None  # timed order: latest arrival the schedule allows (None: right after the send)

    @property
    def sendkey(self) -> tuple:
        if self.send_at is None:
            return (0, self.phase, self.step, 0, self.key)
        return (0, self.phase, self.send_at, 1, self.key)

    @property
    def recvkey(self) -> tuple:
        if self.send_at is None:
            return (0, self.phase, self.step, 1, self.key)
        if self.recv_at is None:
            return (0, self.phase, self.send_at, 2, self.key)
        return (0, self.phase, self.recv_at, 0, self.key)


@dataclass(eq=False)
class _Op:
    rank: int
    type: str
    key: tuple
    cnt: int
    src: tuple[int, str, int] | None  # (rank owning the slot, buffer, index)
    dst: tuple[int, str, int] | None
    reads: list[Slot]
    writes: list[Slot]
    read_versions: list[_Version]
    write_versions: list[_Version]
    slot: tuple  # (rank, pairing index) or (rank, "local", phase, part)
    chain: int | None = None  # message chain (channel unit); None for local copies
    msgs: tuple = ()
    # filled per emission
    tb: int = -1
    seq: int = -1
    deps: list = field(default_factory=list)
    vc: dict = field(default_factory=dict)


def _adjacent(a: Slot | None, b: Slot | None, instances: int) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a[0] == b[0] and b[1] == a[1] + 1 and (a[0] == "s" or instances == 1)


class _Plan:
    def __init__(self, alg: Algorithm, instances: int, inplace: bool, precopy: frozenset, timed: bool = False,
                 phase_of: Callable[[int], int] | None = None):
        self.alg = alg
        self.spec = spec = alg.spec
        self.n = n = spec.num_ranks
        self.instances = instances
        self.inplace = inplace
        order = sorted(range(len(alg.transfers)), key=lambda i: (alg.transfers[i].step, i))
        self.ts: list[Transfer] = [alg.transfers[i] for i in order]
        ts = self.ts
        self.dests = [alg.destinations(c) for c in range(alg.num_chunks)]

        # scratch: precopies first, then homes in order of first arrival
        self.scratch_next = [0] * n
        self.home_slot: dict[tuple[int, int], Slot] = {}
        precopy_slot = {}
        for r, c in sorted(precopy):
            precopy_slot[(r, c)] = self._new_scratch(r)
        arrival = sorted(range(len(ts)), key=lambda g: (ts[g].step, ts[g].src, ts[g].dst, ts[g].group is None,
                                                         ts[g].group or 0, ts[g].chunk, g))
        for g in arrival:
            self.home(ts[g].dst, ts[g].chunk)

        # versions
        self.precopies: list[tuple[int, Slot, Slot, _Version]] = []
        cur: dict[tuple[int, int], _Version] = {}
        for c in range(alg.num_chunks):
            for r, x in alg.sources(c).items():
                orig = self.canon(r, "i", x)
                v = _Version(r, c, None, pot=orig)
                if (r, c) in precopy:
                    v.pot = precopy_slot[(r, c)]
                    self.precopies.append((r, orig, v.pot, v))
                cur[(r, c)] = v
        self.initials = list(cur.values())
        self.read: list[_Version] = [None] * len(ts)  # type: ignore[list-item]
        self.made: list[_Version] = [None] * len(ts)  # type: ignore[list-item]
        i = 0
        while i < len(ts):
            j = i
            while j < len(ts) and ts[j].step == ts[i].step:
                j += 1
            for g in range(i, j):
                t = ts[g]
                v = cur.get((t.src, t.chunk))
                if v is None:
                    raise LoweringError(f"transfer {t}: rank {t.src} sends chunk {t.chunk} before holding it")
                self.read[g] = v
                v.readers.append(g)
            for g in range(i, j):
                t = ts[g]
                prev = cur.get((t.dst, t.chunk))
                base = prev if (t.reduce and prev is not None) else None
                nv = _Version(t.dst, t.chunk, g, base, pot=self.home(t.dst, t.chunk))
                if base is not None:
                    base.base_of.append(g)
                self.made[g] = nv
                cur[(t.dst, t.chunk)] = nv
            i = j
        self.finals: list[tuple[int, int, int, _Version]] = []
        for c in range(alg.num_chunks):
            for r, y in sorted(self.dests[c].items()):
                v = cur.get((r, c))
                if v is None:
                    raise LoweringError(f"chunk {c} never reaches its destination rank {r}")
                v.final = True
                self.finals.append((r, c, y, v))

        self._messages()
        self.timed = timed and self._schedule_times()
        self.phased = phase_of is not None
        if phase_of is not None:
            for m in self.msgs:
                m.phase = phase_of(m.step)
        self._pair_and_fuse()
        self._storage()
        self._ops()

    # -- buffers ---------------------------------------------------------------------------------------------

    def _new_scratch(self, r: int) -> Slot:
        slot = ("s", self.scratch_next[r])
        self.scratch_next[r] += 1
        return slot

    def canon(self, r: int, buf: str, x: int) -> Slot:
        """The slot a logical buffer index names; in place, input and output alias (as check_program has it:
        allgather's input is output [r k, r k + k), reducescatter's output is input [r k, r k + k), the
        others' input is the output)."""
        if not self.inplace:
            return (buf, x)
        if self.spec.kind == "reducescatter":
            return ("i", r * self.spec.chunks_per_rank + x) if buf == "o" else (buf, x)
        return ("o", self.spec.input_window(r) + x) if buf == "i" else (buf, x)

    def home(self, r: int, c: int) -> Slot:
        y = self.dests[c].get(r)
        if y is not None:
            return self.canon(r, "o", y)
        slot = self.home_slot.get((r, c))
        if slot is None:
            slot = self.home_slot[(r, c)] = self._new_scratch(r)
        return slot

    # -- messages (contiguity) --------------------------------------------------------------------------------

    def _messages(self) -> None:
        ts = self.ts
        buckets: dict[tuple, list[int]] = defaultdict(list)
        singles: list[list[int]] = []
        # Transfers of one step that write the same (rank, chunk) make versions in transfer order; merging one of
        # them into a message (keyed by its first transfer) could reorder them, so they are never merged.
        writers = Counter((t.step, t.dst, t.chunk) for t in ts)
        for g, t in enumerate(ts):
            if t.group is None or writers[(t.step, t.dst, t.chunk)] > 1:
                singles.append([g])
            else:
                buckets[(t.src, t.dst, t.step, t.group, t.reduce)].append(g)
        groups: list[list[int]] = list(singles)
        limit = MAX_STEP_COUNT - 1
        for _, gs in sorted(buckets.items(), key=lambda kv: min(kv[1])):
            gs = sorted(gs, key=lambda g: (self.read[g].pot, ts[g].chunk, g))
            run = [gs[0]]
            for g in gs[1:]:
                p = run[-1]
                ok = (
                    len(run) < limit
                    and _adjacent(self.read[p].pot, self.read[g].pot, self.instances)
                    and _adjacent(self.made[p].pot, self.made[g].pot, self.instances)
                    and _adjacent(self._base_pot(p), self._base_pot(g), self.instances)
                )
                if ok:
                    run.append(g)
                else:
                    groups.append(run)
                    run = [g]
            groups.append(run)
        groups.sort(key=min)
        self.msgs: list[_Msg] = []
        self.msg_of: list[_Msg] = [None] * len(ts)  # type: ignore[list-item]
        for i, gs in enumerate(groups):
            t = ts[gs[0]]
            m = _Msg(i, t.src, t.dst, t.step, gs, self.made[gs[0]].base is not None, min(gs))
            self.msgs.append(m)
            for g in gs:
                self.msg_of[g] = m

    def _schedule_times(self) -> bool:
        """Timed order (every transfer has start_us): a message's send is keyed by its scheduled start, its
        receive by the latest arrival the schedule allows: the next start on the same link (a link carries one
        message at a time) or the first start of a message that reads or reduces onto what it delivers. A
        message nothing bounds gets the link's tightest such gap per chunk, else (when it fits in the
        executor's FIFO) the end of its threadblock. False (step order) when some transfer has no start."""
        ts = self.ts
        if not ts or any(t.start_us is None or not math.isfinite(t.start_us) for t in ts):
            return False
        send = {m.id: max(ts[g].start_us for g in m.gs) for m in self.msgs}  # type: ignore[type-var]
        bound = dict.fromkeys(send, math.inf)
        links: dict[tuple[int, int], list[_Msg]] = defaultdict(list)
        for m in self.msgs:
            links[(m.src, m.dst)].append(m)
        for lst in links.values():
            lst.sort(key=lambda m: (send[m.id], m.key))
            for a, b in zip(lst, lst[1:]):
                bound[a.id] = min(bound[a.id], send[b.id])
        for m2 in self.msgs:
            for g in m2.gs:
                for v in (self.read[g], self.made[g].base):
                    if v is not None and v.creator is not None:
                        m = self.msg_of[v.creator]
                        if m is not m2:
                            bound[m.id] = min(bound[m.id], send[m2.id])
        for lst in links.values():
            gap = min(((bound[m.id] - send[m.id]) / len(m.gs) for m in lst if math.isfinite(bound[m.id])),
                      default=math.inf)
            for m in lst:
                if math.isinf(bound[m.id]) and (math.isfinite(gap) or len(m.gs) > DEFER_CHUNKS):
                    bound[m.id] = send[m.id] + gap * len(m.gs) if math.isfinite(gap) else send[m.id]
        for m in self.msgs:
            m.send_at = send[m.id]
            m.recv_at = bound[m.id] if bound[m.id] > send[m.id] else None
        return True

    def _base_pot(self, g: int) -> Slot | None:
        base = self.made[g].base
        return base.pot if base is not None else None

    # -- threadblock pairing and fusion ---------------------------------------------------------------------

    def _pair_and_fuse(self) -> None:
        n = self.n
        candidates: list[tuple[_Msg, _Msg]] = []
        for m2 in self.msgs:
            vs = [self.read[g] for g in m2.gs]
            if vs[0].creator is None:
                continue
            m1 = self.msg_of[vs[0].creator]
            if len(m1.gs) == len(m2.gs) and all(v.creator == g for v, g in zip(vs, m1.gs)) \
                    and m1.phase == m2.phase and not self._waits_on_forward(m1, m2):
                candidates.append((m1, m2))
        in_peers = [set() for _ in range(n)]
        out_peers = [set() for _ in range(n)]
        for m in self.msgs:
            in_peers[m.dst].add(m.src)
            out_peers[m.src].add(m.dst)
        weights = [Counter() for _ in range(n)]
        for m1, m2 in candidates:
            weights[m1.dst][(m1.src, m2.dst)] += 1
        self.pairs: list[list[tuple[int, int]]] = []
        self.send_slot: list[dict[int, int]] = []
        self.recv_slot: list[dict[int, int]] = []
        for r in range(n):
            pairs: list[tuple[int, int]] = []
            used_in, used_out = set(), set()
            for (p, q), _w in sorted(weights[r].items(), key=lambda kv: (-kv[1], kv[0])):
                if p not in used_in and q not in used_out:
                    pairs.append((p, q))
                    used_in.add(p)
                    used_out.add(q)
            pairs += [(p, -1) for p in sorted(in_peers[r] - used_in)]
            pairs += [(-1, q) for q in sorted(out_peers[r] - used_out)]
            pairs.sort()
            self.pairs.append(pairs)
            self.send_slot.append({q: i for i, (p, q) in enumerate(pairs) if q >= 0})
            self.recv_slot.append({p: i for i, (p, q) in enumerate(pairs) if p >= 0})

        sends_to: dict[tuple[int, int], list[_Msg]] = defaultdict(list)
        for m in self.msgs:
            sends_to[(m.src, m.dst)].append(m)
        for lst in sends_to.values():
            lst.sort(key=lambda m: m.sendkey)  # the link's order
        position = {m.id: i for lst in sends_to.values() for i, m in enumerate(lst)}
        by_tb: dict[tuple[int, int], list[tuple[_Msg, _Msg]]] = defaultdict(list)
        for m1, m2 in candidates:
            r = m1.dst
            i = self.recv_slot[r][m1.src]
            if self.pairs[r][i][1] == m2.dst:
                by_tb[(r, i)].append((m1, m2))
        # A fused send is issued at its receive's key, earlier than its own: accept the fusion only when the
        # threadblock still issues its sends to q in key order, i.e. the previous send to q is issued before
        # (issue keys only move earlier, so the next one stays after).
        for (r, i), cands in sorted(by_tb.items()):
            sends = sends_to[(r, self.pairs[r][i][1])]
            for m1, m2 in sorted(cands, key=lambda mm: (mm[0].key, mm[1].key)):
                if m1.fused_out is not None or m2.fused_in is not None or m2.sendkey < m1.recvkey:
                    continue  # (a schedule whose times contradict its steps could issue the send later)
                j = position[m2.id]
                if j > 0 and not self._issued(sends[j - 1]) < m1.recvkey:
                    continue
                m1.fused_out, m2.fused_in = m2, m1

    def _waits_on_forward(self, m1: _Msg, m2: _Msg) -> bool:
        """Would fusing m1's receive with m2's send hold up another use of what m1 delivers? A step that needs
        the receive waits for the whole fused step, forward included (the executor signals a step when it is
        done), so another send (or reduction) of that data would wait for m2's transfer. Allowed only when the
        schedule starts every such use after m2 can have arrived; without a schedule, never."""
        mine = set(m2.gs)
        others = []
        for g in m1.gs:
            v = self.made[g]
            others += [x for x in v.readers if x not in mine] + list(v.base_of)
        if not others:
            return False
        if not self.timed or m2.recv_at is None:
            return True
        return any(self.msg_of[x].send_at < m2.recv_at for x in others)  # type: ignore[operator]

    @staticmethod
    def _issued(m: _Msg) -> tuple:
        return m.fused_in.recvkey if m.fused_in is not None else m.sendkey

    # -- storage --------------------------------------------------------------------------------------------

    def _storage(self) -> None:
        for m in self.msgs:
            if m.fused_out is None or not m.reduce_base:
                continue  # r, rrc and rcs always store what they receive
            out = set(m.fused_out.gs)
            need = False
            for g in m.gs:
                v = self.made[g]
                if v.final or v.base_of or len(v.readers) != 1 or v.readers[0] not in out:
                    need = True
            m.stored = need
            if not need:
                for g in m.gs:
                    self.made[g].stored = False

    # -- operations -----------------------------------------------------------------------------------------

    def _run(self, vs: list[_Version]) -> list[Slot]:
        return [v.loc for v in vs]  # type: ignore[misc]

    def _landing(self, m: _Msg) -> tuple[int, str, int]:
        """Where message m's data lands (or is consumed) at its receiver: for the send's dst field."""
        if m.stored:
            slot = self.made[m.gs[0]].loc
        else:
            slot = self.made[m.gs[0]].base.loc  # type: ignore[union-attr]
        return (m.dst, *slot)  # type: ignore[misc]

    def _origin(self, m: _Msg) -> tuple[int, str, int]:
        """Where message m's data comes from at its sender: for the receive's src field."""
        if m.fused_in is None:
            slot = self.read[m.gs[0]].loc
        else:
            slot = self._landing(m.fused_in)[1:]
        return (m.src, *slot)  # type: ignore[misc]

    def _ops(self) -> None:
        ops: list[_Op] = self._copies(self.precopies, -2)
        for m in self.msgs:
            r = m.dst
            made = [self.made[g] for g in m.gs]
            home = self._run(made) if m.stored else []
            bases = [v.base for v in made] if m.reduce_base else []
            base_locs = self._run(bases)  # type: ignore[arg-type]
            fused = m.fused_out
            if m.reduce_base:
                kind = ("rrcs" if m.stored else "rrs") if fused else "rrc"
            else:
                kind = "rcs" if fused else "r"
            if kind in ("r", "rcs"):
                src, dst = self._origin(m), (r, *home[0])
            elif kind == "rrs":
                src, dst = (r, *base_locs[0]), self._landing(fused)  # type: ignore[arg-type]
            else:  # rrc, rrcs
                src, dst = (r, *base_locs[0]), (r, *home[0])
            ops.append(_Op(
                r, kind, m.recvkey, len(m.gs), src, dst, base_locs, home, bases, made if m.stored else [],
                (r, self.recv_slot[r][m.src]), msgs=(m, fused) if fused else (m,),
            ))  # fmt: skip
            if m.fused_in is None:
                s = m.src
                read = [self.read[g] for g in m.gs]
                locs = self._run(read)
                ops.append(_Op(s, "s", m.sendkey, len(m.gs), (s, *locs[0]), self._landing(m), locs, [], read, [],
                               (s, self.send_slot[s][m.dst]), msgs=(m,)))
        finals = []
        for r, c, y, v in self.finals:
            out = self.canon(r, "o", y)
            if v.loc != out:
                finals.append((r, v.loc, out, v))
        ops += self._copies(finals, -1)
        self.ops = ops

    def _copies(self, copies: list[tuple[int, Slot, Slot, _Version]], phase: int) -> list[_Op]:
        """Local copies at the start (phase -2: in-place rescues, -1: input to output), adjacent ones merged;
        at most 64 steps per local threadblock."""
        ops: list[_Op] = []
        by_rank: dict[int, list] = defaultdict(list)
        for entry in copies:
            by_rank[entry[0]].append(entry)
        for r in sorted(by_rank):
            runs: list[list] = []
            for entry in sorted(by_rank[r], key=lambda e: (e[1], e[2])):
                last = runs[-1][-1] if runs else None
                if (
                    last is not None
                    and len(runs[-1]) < MAX_STEP_COUNT - 1
                    and _adjacent(last[1], entry[1], self.instances)
                    and _adjacent(last[2], entry[2], self.instances)
                ):
                    runs[-1].append(entry)
                else:
                    runs.append([entry])
            for i, run in enumerate(runs):
                vs = [e[3] for e in run]
                ops.append(_Op(r, "cpy", (phase, r, i), len(run), (r, *run[0][1]), (r, *run[0][2]),
                               [e[1] for e in run], [e[2] for e in run], vs, vs,
                               (r, "local", phase, i // MAX_STEPS_PER_THREADBLOCK)))
        return ops

    def _orig(self, v: _Version) -> Slot:
        return self.canon(v.rank, "i", self.alg.sources(v.chunk)[v.rank])

    def conflicts(self) -> set[tuple[int, int]]:
        """(rank, chunk) initial values that another chunk's value overwrites (in place only); raises when a
        value that is not an input would be read after being overwritten (a lowering bug)."""
        content = {(v.rank, self._orig(v)): v for v in self.initials}
        bad: set[tuple[int, int]] = set()
        for op in sorted(self.ops, key=lambda o: o.key):
            for slot, v in zip(op.reads, op.read_versions):
                if content.get((op.rank, slot)) is not v:
                    if v.creator is None:
                        bad.add((v.rank, v.chunk))
                    else:
                        raise _Inconsistent(
                            f"internal: rank {op.rank} reads {slot} for chunk {v.chunk} after it was overwritten"
                        )
            for slot, v in zip(op.writes, op.write_versions):
                old = content.get((op.rank, slot))
                if old is not None and old.creator is None and old.pot == slot and old.chunk != v.chunk and old.readers:
                    # another chunk's input, sent from here: copy it away first rather than make the receive
                    # wait for those sends (a cross-threadblock wait behind a send can hang bounded FIFOs)
                    bad.add((old.rank, old.chunk))
                content[(op.rank, slot)] = v
        if not bad:
            for r, c, y, v in self.finals:
                if content.get((r, self.canon(r, "o", y))) is not v:
                    raise _Inconsistent(f"internal: chunk {c} at rank {r} does not end in o[{y}]")
        return bad


# --------------------------------------------------------------------------------------------------------------
# Emission: channels, threadblocks, dependencies, instances


class _Retry(Exception):
    """More channels may help (a threadblock over 64 steps or a channel over 32 threadblocks)."""

    def __init__(self, message: str, peers: bool = False):
        super().__init__(message)
        self.peers = peers  # too many threadblocks on one channel (not too many steps in one)


def _emit(plan: _Plan, C: int, *, name: str, proto: str, min_bytes: int, max_bytes: int) -> Program:
    n = plan.n
    chain_chan = _assign_channels(plan, C)
    tb_meta, tb_ops = _threadblocks(plan, chain_chan)
    for r in range(n):
        _add_dependencies(plan, tb_ops[r])
    step_index = _step_indices(tb_meta, tb_ops, C)
    _check_threadblocks_per_channel(tb_meta)
    has_dep = {id(p) for r in range(n) for lst in tb_ops[r] for op in lst for p in op.deps}
    gpus = _gpus(plan, C, tb_meta, tb_ops, step_index, has_dep)
    spec, N = plan.spec, plan.instances
    return Program(
        name=name, proto=proto, nchannels=C * N,
        nchunksperloop=max(spec.input_chunks(), spec.output_chunks()) * N, ngpus=n, coll=spec.kind,
        inplace=plan.inplace, outofplace=not plan.inplace, min_bytes=min_bytes, max_bytes=max_bytes,
        gpus=tuple(gpus),
    )  # fmt: skip


def _assign_channels(plan: _Plan, C: int) -> dict[int, int]:
    """Chain (of fused messages, which travel on one channel) -> channel; sets each op's chain. Phased plans
    run phase p on channel p; others balance each chain's slots over the C channels."""
    parent = list(range(len(plan.msgs)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for m in plan.msgs:
        if m.fused_out is not None:
            a, b = find(m.id), find(m.fused_out.id)
            if a != b:
                parent[max(a, b)] = min(a, b)
    chain_ops: dict[int, list[_Op]] = defaultdict(list)
    for op in plan.ops:
        op.chain = find(op.msgs[0].id) if op.msgs else None
        if op.chain is not None:
            chain_ops[op.chain].append(op)
    chain_chan: dict[int, int] = {}
    if plan.phased:  # a chain is one phase (fusion never crosses phases): phase p runs on channel p
        for chain, lst in chain_ops.items():
            chain_chan[chain] = lst[0].msgs[0].phase
    else:
        load: Counter = Counter()
        chan_total = [0] * C
        for chain in sorted(chain_ops, key=lambda ch: min(o.key for o in chain_ops[ch])):
            touched = Counter(op.slot for op in chain_ops[chain])
            best = min(range(C), key=lambda c: (max(load[(s, c)] + k for s, k in touched.items()), chan_total[c], c))
            chain_chan[chain] = best
            for s, k in touched.items():
                load[(s, best)] += k
            chan_total[best] += len(chain_ops[chain])
    return chain_chan


def _threadblocks(plan: _Plan, chain_chan: dict[int, int]):
    """Per rank: threadblock (send peer, recv peer, channel) by id, and each threadblock's ops in key order
    (sets each op's tb and seq)."""
    per_rank_tbs: list[dict[tuple, list[_Op]]] = [defaultdict(list) for _ in range(plan.n)]
    for op in plan.ops:
        ch = chain_chan[op.chain] if op.chain is not None else 0
        per_rank_tbs[op.rank][(op.slot, ch)].append(op)
    tb_meta: list[list[tuple[int, int, int]]] = []  # per rank: (send, recv, chan) by tb id
    tb_ops: list[list[list[_Op]]] = []
    for r in range(plan.n):
        entries = []
        for (slot, ch), lst in per_rank_tbs[r].items():
            if slot[1] == "local":  # (rank, "local", phase, part)
                send, recv = -1, -1
            else:
                recv, send = plan.pairs[r][slot[1]]
            entries.append(((ch, send, recv), sorted(lst, key=lambda o: o.key)))
        entries.sort(key=lambda e: e[0])
        meta, lists = [], []
        for t, ((ch, send, recv), lst) in enumerate(entries):
            meta.append((send, recv, ch))
            for i, op in enumerate(lst):
                op.tb, op.seq = t, i
            lists.append(lst)
        tb_meta.append(meta)
        tb_ops.append(lists)
    return tb_meta, tb_ops


def _add_dependencies(plan: _Plan, rank_tbs: list[list[_Op]]) -> None:
    """Cross-threadblock dependencies of one rank's ops: replay them in key order over the slots, keeping
    only dependencies a vector clock does not already imply (sets each op's deps and vc)."""
    rank_ops = sorted((op for lst in rank_tbs for op in lst), key=lambda o: o.key)
    last_writer: dict[Slot, _Op] = {}
    readers: dict[Slot, list[_Op]] = defaultdict(list)
    tb_vc: dict[int, dict[int, int]] = defaultdict(dict)
    slot_last: dict[tuple, _Op] = {}
    for op in rank_ops:
        need: set[_Op] = set()
        if plan.phased and op.msgs:
            # phases of one (send peer, recv peer) pair run one after the other, as one threadblock would
            prev = slot_last.get(op.slot)
            if prev is not None and prev.tb != op.tb:
                need.add(prev)
            slot_last[op.slot] = op
        for s in op.reads:
            w = last_writer.get(s)
            if w is not None:
                need.add(w)
        for s in op.writes:
            w = last_writer.get(s)
            if w is not None:
                need.add(w)
            need.update(readers[s])
        need.discard(op)
        vc = dict(tb_vc[op.tb])
        deps = []
        for p in sorted((p for p in need if p.tb != op.tb), key=lambda p: p.key, reverse=True):
            if vc.get(p.tb, -1) >= p.seq:
                continue
            deps.append(p)
            for k, v in p.vc.items():
                if vc.get(k, -1) < v:
                    vc[k] = v
        vc[op.tb] = op.seq
        op.vc = vc
        tb_vc[op.tb] = vc
        op.deps = sorted(deps, key=lambda p: p.key)
        for s in op.reads:
            readers[s].append(op)
        for s in op.writes:
            last_writer[s] = op
            readers[s] = []


def _step_indices(tb_meta, tb_ops, C: int) -> dict[int, int]:
    """id(op) -> its step in its threadblock (a nop before it for every dependency but the last); _Retry when
    a threadblock exceeds MAX_STEPS_PER_THREADBLOCK."""
    step_index: dict[int, int] = {}
    for r in range(len(tb_ops)):
        for lst in tb_ops[r]:
            i = 0
            for op in lst:
                i += max(len(op.deps) - 1, 0)
                step_index[id(op)] = i
                i += 1
            if i > MAX_STEPS_PER_THREADBLOCK:
                send, recv, ch = tb_meta[r][lst[0].tb]
                raise _Retry(f"rank {r}: the threadblock sending to {send} and receiving from {recv} needs {i} steps "
                             f"(at most {MAX_STEPS_PER_THREADBLOCK}) with {C} channel(s) per instance")
    return step_index


def _check_threadblocks_per_channel(tb_meta) -> None:
    """_Retry when a rank has more than 32 threadblocks sending (or receiving) on one channel."""
    for r in range(len(tb_meta)):
        for kind, idx in (("sending to", 0), ("receiving from", 1)):
            per_chan = Counter(m[2] for m in tb_meta[r] if m[idx] >= 0)
            for ch, count in per_chan.items():
                if count > 32:
                    raise _Retry(f"rank {r}: {count} threadblocks {kind} peers on one channel (at most 32)", True)


def _gpus(plan: _Plan, C: int, tb_meta, tb_ops, step_index: dict[int, int], has_dep: set[int]) -> list[Gpu]:
    """The program's GPUs: every threadblock's steps, repeated per instance over compacted scratch (order
    kept) and interleaved buffer chunks."""
    n, N = plan.n, plan.instances
    used: list[set[int]] = [set() for _ in range(n)]
    for op in plan.ops:
        for s in op.reads + op.writes:
            if s[0] == "s":
                used[op.rank].add(s[1])
    renumber = [{old: new for new, old in enumerate(sorted(u))} for u in used]
    S = [len(u) for u in used]

    def place(ref: tuple[int, str, int], inst: int) -> tuple[str, int]:
        rank, buf, x = ref
        if buf == "s":
            return buf, inst * S[rank] + renumber[rank][x]
        return buf, x * N + inst

    gpus = []
    spec = plan.spec
    for r in range(n):
        tbs = []
        T = len(tb_meta[r])
        for inst in range(N):
            for t, lst in enumerate(tb_ops[r]):
                send, recv, ch = tb_meta[r][t]
                steps: list[Step] = []
                for op in lst:
                    for p in op.deps[:-1]:
                        steps.append(Step(len(steps), "nop", "i", -1, "o", -1, 0, inst * T + p.tb, step_index[id(p)]))
                    srcbuf, srcoff = place(op.src, inst)
                    dstbuf, dstoff = place(op.dst, inst)
                    depid, deps = (inst * T + op.deps[-1].tb, step_index[id(op.deps[-1])]) if op.deps else (-1, -1)
                    steps.append(Step(len(steps), op.type, srcbuf, srcoff, dstbuf, dstoff, op.cnt, depid, deps,
                                      id(op) in has_dep))
                tbs.append(Threadblock(inst * T + t, send, recv, inst * C + ch, tuple(steps)))
        gpus.append(Gpu(r, spec.input_chunks() * N, spec.output_chunks() * N, S[r] * N, tuple(tbs)))
    return gpus


# --------------------------------------------------------------------------------------------------------------


def lowered_spec(spec: CollectiveSpec, instances: int = 1) -> CollectiveSpec:
    """The collective a program lowered with `instances` implements: every chunk split in `instances`."""
    return replace(spec, chunks_per_rank=spec.chunks_per_rank * instances)


def _check_lower_args(alg: Algorithm, instances, channels, proto: str, min_bytes: int, max_bytes: int,
                      check: bool) -> None:
    """LoweringError for arguments `lower` cannot honour (and, with check, for an incorrect algorithm)."""
    spec = alg.spec
    if not isinstance(instances, int) or instances < 1:
        raise LoweringError(f"instances must be a positive integer, got {instances!r}")
    if channels is not None and (not isinstance(channels, int) or channels < 1):
        raise LoweringError(f"channels must be a positive integer or None, got {channels!r}")
    if proto not in PROTOCOLS:
        raise LoweringError(f"unknown protocol {proto!r} (expected one of {', '.join(PROTOCOLS)})")
    if spec.kind not in COLLECTIVES:
        raise LoweringError(f"collective {spec.kind!r} has no MSCCL-EF spelling")
    if min_bytes < 0 or max_bytes < min_bytes:
        raise LoweringError(f"need 0 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    if instances > MAX_CHANNELS:
        raise LoweringError(
            f"{instances} instances need at least {instances} channels; the executor has {MAX_CHANNELS}"
        )
    if channels is not None and channels * instances > MAX_CHANNELS:
        raise LoweringError(
            f"{channels} channels x {instances} instances = {channels * instances} channels; "
            f"the executor has {MAX_CHANNELS}"
        )
    if check:
        problems = check_algorithm(alg)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise LoweringError(f"algorithm {alg.name!r} does not implement its {spec.kind}: {problems[0]}{more}")


def lower(
    alg: Algorithm,
    *,
    instances: int = 1,
    channels: int | None = None,
    proto: str = "Simple",
    name: str | None = None,
    inplace: bool = False,
    min_bytes: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    check: bool = True,
) -> Program:
    """The MSCCL-EF program running `alg` (see the module docstring); LoweringError when it cannot be lowered.

    instances: copies of the program, each on sub-chunk i of every chunk and its own channels.
    channels: channels per instance (None: the fewest that fit the executor's limits, as consecutive phases of
    the algorithm when they fit; given: chains spread over that many concurrent channels); nchannels =
    channels * instances must stay within 32. check: first verify the algorithm with `check_algorithm`.
    """
    _check_lower_args(alg, instances, channels, proto, min_bytes, max_bytes, check)

    def build(timed: bool, phase_of: Callable[[int], int] | None) -> _Plan:
        precopy: frozenset = frozenset()
        while True:
            plan = _Plan(alg, instances, inplace, precopy, timed, phase_of)
            bad = plan.conflicts()
            if not bad:
                return plan
            if bad <= precopy:
                raise LoweringError(f"internal: in-place conflicts persist for {sorted(bad)[:3]}")
            precopy = precopy | frozenset(bad)

    def emit(plan: _Plan, C: int) -> Program:
        program = _emit(plan, C, name=name or alg.name, proto=proto, min_bytes=min_bytes, max_bytes=max_bytes)
        problems = check_limits(program)
        if problems:  # cannot happen: _emit keeps every limit; a guard against drift from the executor's rules
            raise LoweringError(f"internal: the lowered program breaks an executor limit: {problems[0]}")
        return program

    try:
        plan = build(True, None)
    except _Inconsistent:  # the schedule's times contradict its steps somewhere: order by step
        plan = build(False, None)
    if channels is None:
        program = _phased(plan, build, emit, instances)
        if program is not None:
            return program
    busiest = max(Counter(op.slot for op in plan.ops if op.msgs).values(), default=0)
    first = max(1, -(-busiest // MAX_STEPS_PER_THREADBLOCK))  # fewer channels cannot fit the busiest threadblock
    counts = [channels] if channels is not None else range(first, MAX_CHANNELS // instances + 1)
    reason = (
        f"a threadblock needs {busiest} steps, more than {MAX_STEPS_PER_THREADBLOCK} on each of "
        f"{MAX_CHANNELS // instances} channels"
    )
    for C in counts:
        try:
            return emit(plan, C)
        except _Retry as exc:
            reason = str(exc)
            continue
    raise LoweringError(f"cannot fit the executor's limits: {reason}")


def _phase_starts(plan: _Plan, budget: int) -> list[int] | None:
    """First step of each phase: consecutive steps, as few phases as keep every (send peer, recv peer) pair
    within `budget` steps per phase; None when one step alone is over the budget."""
    per_step: dict[int, Counter] = defaultdict(Counter)
    for op in plan.ops:
        if op.msgs:
            per_step[op.msgs[0].step][op.slot] += 1
    starts: list[int] = []
    cur: Counter = Counter()
    for step in sorted(per_step):
        add = per_step[step]
        if max(add.values()) > budget:
            return None
        if not starts or any(cur[s] + k > budget for s, k in add.items()):
            starts.append(step)
            cur = Counter()
        cur.update(add)
    return starts or [0]


def _phased(plan: _Plan, build, emit, instances: int) -> Program | None:
    """The program with channels as consecutive phases of the algorithm (None when that cannot fit)."""
    budget = MAX_STEPS_PER_THREADBLOCK
    while budget >= MAX_STEPS_PER_THREADBLOCK // 4:
        starts = _phase_starts(plan, budget)
        if starts is None or len(starts) * instances > MAX_CHANNELS:
            return None
        try:
            if len(starts) == 1:
                return emit(plan, 1)
            try:
                phased = build(plan.timed, lambda step: bisect_right(starts, step) - 1)
            except _Inconsistent:  # step order with phases is the plain step order: always consistent
                phased = build(False, lambda step: bisect_right(starts, step) - 1)
            return emit(phased, len(starts))
        except _Retry as exc:
            if exc.peers:  # too many peers on a channel: phases do not help
                return None
            budget -= 4
    return None
