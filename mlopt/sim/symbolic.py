"""Proving that an MSCCL-EF program implements its collective, by running it on symbolic chunk values.

Every rank starts with the collective's precondition (input chunk j of rank r holds {(r, j)}; output and
scratch hold nothing), every threadblock runs its steps in order, and at the end every output chunk must hold
the postcondition's multiset (mlopt.sim.collectives). Reductions add multisets, so a contribution counted
twice shows up as a multiplicity.

Step semantics (the executor's interpreter, Azure/msccl-executor-nccl src/collectives/device/msccl_kernel.cu
and prims `recvReduceCopySend` & co.; msccl-tools msccl/language/ir.py names them the same way). `recv` is the
message popped from the FIFO (recv peer -> this GPU, channel), `send` pushes onto (this GPU -> send peer,
channel); only the operands a type uses are read, checked and written:

| type | does                                  | reads       | writes |
|------|---------------------------------------|-------------|--------|
| s    | send(src)                             | src         |        |
| r    | dst = recv                            |             | dst    |
| rcs  | dst = recv; send(recv)                |             | dst    |
| rrs  | send(recv + src)                      | src         |        |
| rrc  | dst = recv + src                      | src         | dst    |
| rrcs | dst = recv + src; send(dst)           | src         | dst    |
| cpy  | dst = src                             | src         | dst    |
| re   | dst = dst + src                       | src, dst    | dst    |
| nop  | nothing (carries a dependency)        |             |        |

(`r` and `rcs` ignore srcbuf/srcoff, `s` and `rrs` ignore dstbuf/dstoff: the executor bounds-checks the same
operands, msccl_parser.cc `checkSrc`/`checkDst`.) A step with cnt=0 moves nothing: the interpreter's loop over
the count does not run, so it neither sends nor receives a message.

Dependencies (kernel: a threadblock sets its flag to (iteration, step) after every step marked hasdep, and a
step with depid/deps waits until flag[depid] >= deps): a step waiting for (tb X, step Z) may start once tb X
has completed a hasdep step with index >= Z. The executor only signals hasdep steps, so a dependency on a
step without hasdep=1 is a problem (it hangs unless a later hasdep step of X happens to release it); nops are
not stored by the executor and never signal. Dependencies on a missing tb or step, or on a later step of the
same tb, are problems and are ignored while simulating so that the rest can still be checked.

Messages match in FIFO order per (sender, receiver, channel), one message per sending step; the receiving
step's cnt must equal the message's. Correctness is judged with unbounded FIFOs (a Kahn process network: with
one threadblock per connection end, the messages and any deadlock do not depend on the schedule). The
executor's FIFOs are bounded: NCCL_STEPS = 8 slots per connection (NCCL src/include/devcomm.h), and a piece of
a transfer takes MSCCL_CHUNKSTEPS = NCCL_STEPS/2 = 4 slots with the Simple protocol, 1 with LL and LL128
(msccl_kernel.cu chunkSize, msccl_setup.cc chunkSteps); with large buffers every chunk of a step is one piece
(maxAllowedCount = 1), the worst case. So each run first executes with 2 (Simple) or 8 (LL, LL128) chunks in
flight per connection, streaming chunk by chunk (a step may stop half-way); threadblocks then stuck on a full
FIFO are reported as `bounded_fifo` (the program may deadlock on the executor), and the run goes on with the
bound lifted, which gives the unbounded result. (Bounded networks are deterministic too; one loop iteration
is enough, since later iterations cannot block earlier ones.)

Local races: two threadblocks of one GPU touching the same chunk, at least one of them writing, must be
ordered by program order and dependencies (vector clocks over that GPU's threadblocks); otherwise the result
depends on timing. Ordering through other GPUs' messages is not counted (msccl-tools inserts a local
dependency for every such pair, and GPU memory ordering across that path is not guaranteed).

Chunks per rank, when no spec is given (derive_spec): the executor splits the buffer it is given into
nchunksperloop chunks, the buffer being the output for allgather and the input for reducescatter (both times
n ranks' worth: sizeMultiplier = ngpus, msccl_parser.cc) and the common size otherwise. So with n = ngpus and
C = nchunksperloop: allgather k = C / n (input k, output C; the reference allgather: 4 and 16), reducescatter
k = C / n (input C, output k), alltoall k = C / n chunks per (source, destination) pair (input = output = C;
the reference alltoall: C = 8, n = 8, k = 1), allreduce k = C / n (input = output = C), broadcast and reduce
k = C. An allreduce whose C is not a multiple of n is checked with C chunks per buffer. The root of broadcast
(reduce) is the only rank that never receives (sends), else 0.

In place, input and output are one buffer: allgather's input is output chunks [r k, r k + k), reducescatter's
output is input chunks [r k, r k + k) (msccl-tools ReduceScatter.get_buffer_index), the others' input is the
output. check_program checks every variant the program declares (inplace/outofplace), or the one asked for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict, deque
from dataclasses import dataclass, field

from mlopt.formats.msccl import RECEIVING_STEPS, SENDING_STEPS, Program, Step
from mlopt.formats.msccl_xml import check_limits
from mlopt.sim.collectives import CollectiveSpec, Symbol

NCCL_STEPS = 8  # FIFO slots per connection (NCCL devcomm.h)
MSCCL_CHUNKSTEPS = NCCL_STEPS // 2  # slots one piece takes with the Simple protocol (msccl_struct.h)
MAX_LISTED = 10  # mismatches / unmatched sends / races listed one by one before a count

# Values are kept as "bags": the sorted tuple of contributions (origin rank, input index), a contribution
# repeated once per multiplicity. Reducing two bags is one C-level sort of two sorted runs; to_symbol() gives
# the Symbol of mlopt.sim.collectives. Uninitialised memory reads as the contribution UNINIT, which taints
# whatever it is reduced into, so garbage that reaches an output shows in the postcondition.
Bag = tuple[tuple[int, int], ...]
UNINIT = (-1, -1)
_UNINIT_BAG: Bag = (UNINIT,)

READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})


def fifo_capacity(proto: str) -> int:
    """Chunks (worst-case pieces) in flight per connection before a sender blocks."""
    return NCCL_STEPS // (MSCCL_CHUNKSTEPS if proto == "Simple" else 1)


@dataclass
class CheckReport:
    ok: bool  # no problems and no deadlock (bounded FIFOs and notes aside)
    problems: list[str]  # one line each, naming gpu/tb/step
    deadlock: list[str]  # blocked threadblocks with unbounded FIFOs: where and on what
    notes: list[str]  # warnings that do not make the program wrong (e.g. hasdep=1 nobody waits for)
    bounded_fifo: list[str]  # blocked threadblocks under the executor's bounded FIFOs ("may deadlock")
    steps_executed: int  # fewest steps run in any checked variant (== steps_total when nothing blocked)
    steps_total: int
    spec: CollectiveSpec | None
    variants: tuple[str, ...]  # "out-of-place", "in-place"
    # variant -> rank -> buffer ("i", "o", "s", in place aliased) -> bags (see to_symbol), None = never written
    final_buffers: dict[str, dict[int, dict[str, list[Bag | None]]]] = field(default_factory=dict, repr=False)

    @property
    def executor_safe(self) -> bool:
        """Correct, and no deadlock under the executor's bounded FIFOs either."""
        return self.ok and not self.bounded_fifo

    def summary(self) -> str:
        verdict = "correct" if self.ok else "NOT correct"
        spec = "no spec"
        if self.spec:
            spec = f"{self.spec.kind}, {self.spec.num_ranks} ranks, {self.spec.chunks_per_rank} chunk(s) per rank"
        parts = [
            f"{verdict} ({spec}; {', '.join(self.variants) or 'no variant'}; "
            f"{self.steps_executed}/{self.steps_total} steps executed)"
        ]
        for title, items in (("problem", self.problems), ("deadlock", self.deadlock),
                             ("bounded-FIFO deadlock", self.bounded_fifo), ("note", self.notes)):  # fmt: skip
            parts.extend(f"{title}: {line}" for line in items)
        return "\n".join(parts)


# --------------------------------------------------------------------------------------------------------------
# Spec


def derive_spec(program: Program) -> CollectiveSpec:
    """The collective a program claims to implement (see module docstring); ValueError when underivable."""
    n, c, kind = program.ngpus, program.nchunksperloop, program.coll
    if n < 1 or c < 1:
        raise ValueError(f"ngpus={n} and nchunksperloop={c} must be positive")
    if kind in ("broadcast", "reduce"):
        return CollectiveSpec(kind, n, c, _root(program, kind))
    if kind == "allreduce" and c % n:
        return CollectiveSpec(kind, n, 1)  # sizes overridden to C by _contract
    if c % n:
        raise ValueError(f"{kind}: nchunksperloop={c} is not a multiple of ngpus={n}")
    return CollectiveSpec(kind, n, c // n)


def _root(program: Program, kind: str) -> int:
    steps = SENDING_STEPS if kind == "reduce" else RECEIVING_STEPS
    candidates = [
        g.id for g in program.gpus if not any(st.type in steps and st.cnt > 0 for tb in g.tbs for st in tb.steps)
    ]
    return candidates[0] if len(candidates) == 1 else 0


@dataclass(frozen=True)
class _Contract:
    spec: CollectiveSpec
    in_size: int
    out_size: int


def _contract(program: Program, spec: CollectiveSpec, derived: bool) -> _Contract:
    if derived and spec.kind == "allreduce" and program.nchunksperloop % spec.num_ranks:
        return _Contract(spec, program.nchunksperloop, program.nchunksperloop)
    return _Contract(spec, spec.input_chunks(), spec.output_chunks())


# --------------------------------------------------------------------------------------------------------------
# Values


def _add(a: Bag, b: Bag) -> Bag:
    """combine() of mlopt.sim.collectives on bags."""
    if not a:
        return b
    if not b:
        return a
    return tuple(sorted(a + b))


def to_symbol(bag: Bag | None) -> Symbol | None:
    """A bag as the Symbol of mlopt.sim.collectives (None stays None: never written)."""
    if bag is None:
        return None
    out: list[tuple[tuple[int, int], int]] = []
    for item in bag:
        if out and out[-1][0] == item:
            out[-1] = (item, out[-1][1] + 1)
        else:
            out.append((item, 1))
    return tuple(out)


def to_bag(value: Symbol | None) -> Bag | None:
    if value is None:
        return None
    return tuple(key for key, mult in value for _ in range(mult))


def show(value: Bag | None) -> str:
    if value is None:
        return "nothing"
    items = []
    for (r, i), m in to_symbol(value):
        name = "uninit" if (r, i) == UNINIT else f"r{r}[{i}]"
        items.append(name + (f"x{m}" if m > 1 else ""))
    return "{" + ", ".join(items) + "}"


class _Values:
    """spec.initial / spec.expected as bags, computed directly for the known collectives (the spec's own
    methods build Counters, too slow for 10^5 chunks) and checked against the spec on sample points; any
    disagreement falls back to the spec's methods."""

    def __init__(self, spec: CollectiveSpec, in_size: int, out_size: int):
        self.spec = spec
        n, k, kind, root = spec.num_ranks, spec.chunks_per_rank, spec.kind, spec.root
        sums: dict[int, Bag] = {}

        def everyone(j: int) -> Bag:
            bag = sums.get(j)
            if bag is None:
                bag = sums[j] = tuple((s, j) for s in range(n))
            return bag

        def initial(r: int, j: int) -> Bag:
            return () if kind == "broadcast" and r != root else ((r, j),)

        fast = {
            "allgather": lambda r, j: ((j // k, j % k),),
            "alltoall": lambda r, j: ((j // k, r * k + j % k),),
            "reducescatter": lambda r, j: everyone(r * k + j),
            "allreduce": lambda r, j: everyone(j),
            "broadcast": lambda r, j: ((root, j),),
            "reduce": lambda r, j: everyone(j) if r == root else None,
        }.get(kind)
        self.initial, self.expected = initial, fast
        samples = {(r, j) for r in {0, n - 1, n // 2} for j in {0, max(in_size, out_size) - 1, k} if r >= 0 and j >= 0}
        for r, j in sorted(samples):
            if fast is None or (j < out_size and to_bag(spec.expected(r, j)) != fast(r, j)):
                self.expected = lambda r, j: to_bag(spec.expected(r, j))
            if j < in_size and to_bag(spec.initial(r, j)) != initial(r, j):
                self.initial = lambda r, j: to_bag(spec.initial(r, j))


# --------------------------------------------------------------------------------------------------------------
# Static analysis of the program (shared by all variants)


@dataclass
class _Tb:
    gid: int  # index in the flat list of threadblocks
    gpu: int
    pos: int  # position on its gpu (vector clock index)
    id: int
    steps: tuple[Step, ...]
    send_q: int  # FIFO index (this gpu -> send peer, chan), -1 for none
    recv_q: int  # FIFO index (recv peer -> this gpu, chan), -1 for none
    deps: list[tuple[int, int] | None]  # per step: (gid of tb waited for, step index) or None

    def at(self, index: int) -> str:
        st = self.steps[index]
        return f"gpu {self.gpu} tb {self.id} step {index} ({st.type})"


@dataclass
class _Static:
    tbs: list[_Tb]
    fifos: list[tuple[int, int, int]]  # FIFO index -> (sender gpu, receiver gpu, channel)
    problems: list[str]
    notes: list[str]


def _analyse(program: Program) -> _Static:
    problems: list[str] = []
    notes: list[str] = []
    tbs: list[_Tb] = []
    fifo_index: dict[tuple[int, int, int], int] = {}

    def fifo(key: tuple[int, int, int]) -> int:
        return fifo_index.setdefault(key, len(fifo_index))

    n = program.ngpus
    reads_src, writes_dst = READS_SRC, WRITES_DST
    for gpos, gpu in enumerate(program.gpus):
        sizes = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
        by_id: dict[int, int] = {}
        for tpos, tb in enumerate(gpu.tbs):
            by_id.setdefault(tb.id, tpos)
        base = len(tbs)
        for tpos, tb in enumerate(gpu.tbs):
            send_ok = 0 <= tb.send < n and tb.send != gpos
            recv_ok = 0 <= tb.recv < n and tb.recv != gpos
            tbs.append(
                _Tb(
                    gid=base + tpos, gpu=gpos, pos=tpos, id=tb.id, steps=tb.steps,
                    send_q=fifo((gpos, tb.send, tb.chan)) if send_ok else -1,
                    recv_q=fifo((tb.recv, gpos, tb.chan)) if recv_ok else -1,
                    deps=[None] * len(tb.steps),
                )
            )  # fmt: skip
        waited: set[tuple[int, int]] = set()  # (tb position, step) some step depends on
        for tpos, tb in enumerate(gpu.tbs):
            me = tbs[base + tpos]
            for idx, st in enumerate(tb.steps):
                kind, cnt = st.type, st.cnt
                for used, side, buf, off in ((reads_src, "src", st.srcbuf, st.srcoff),
                                             (writes_dst, "dst", st.dstbuf, st.dstoff)):
                    size = sizes[buf]
                    if kind in used and (off < 0 or off + max(cnt, 0) > size):
                        problems.append(f"{me.at(idx)}: {side}off={off} cnt={cnt} is out of range for buffer "
                                        f"{buf} ({size} chunks)")
                if cnt == 0 and kind != "nop":
                    notes.append(f"{me.at(idx)}: cnt=0 moves no data")
                if st.depid < 0:
                    if st.deps >= 0:
                        notes.append(f"{me.at(idx)}: deps={st.deps} without depid is ignored")
                    continue
                at = me.at(idx)
                target = by_id.get(st.depid)
                if target is None:
                    problems.append(f"{at}: depends on tb {st.depid}, which does not exist on gpu {gpos}")
                    continue
                tsteps = gpu.tbs[target].steps
                if not 0 <= st.deps < len(tsteps):
                    problems.append(
                        f"{at}: depends on step {st.deps} of tb {st.depid}, which has {len(tsteps)} steps"
                    )
                    continue
                if target == tpos and st.deps >= idx:
                    problems.append(
                        f"{at}: depends on step {st.deps} of its own threadblock, which runs later (never completes)"
                    )
                    continue
                if target == tpos:
                    notes.append(f"{at}: depends on its own earlier step {st.deps} (program order already ensures it)")
                waited.add((target, st.deps))
                dep_step = tsteps[st.deps]
                if dep_step.type == "nop":
                    problems.append(
                        f"{at}: depends on gpu {gpos} tb {st.depid} step {st.deps}, a nop, which never signals"
                    )
                elif not dep_step.hasdep:
                    problems.append(
                        f"{at}: depends on gpu {gpos} tb {st.depid} step {st.deps} ({dep_step.type}), which is not "
                        f"marked hasdep=1 (the executor only signals hasdep steps)"
                    )
                me.deps[idx] = (base + target, st.deps)
        for tpos, tb in enumerate(gpu.tbs):
            for idx, st in enumerate(tb.steps):
                if st.hasdep and st.type != "nop" and (tpos, idx) not in waited:
                    notes.append(f"{tbs[base + tpos].at(idx)}: hasdep=1 but no step depends on it")
    fifos = [key for key, _ in sorted(fifo_index.items(), key=lambda item: item[1])]
    return _Static(tbs, fifos, problems, notes)


# --------------------------------------------------------------------------------------------------------------
# One symbolic run


class _Run:
    """Execution of one variant, chunk by chunk: values, message matching, local races, deadlocks.

    Phase 1 runs with the executor's bounded FIFOs until nothing can move; if threadblocks are then stuck, that
    is the bounded-FIFO finding, and phase 2 lifts the bound and runs on. Both networks are deterministic
    (one producer and one consumer per FIFO, blocking reads and writes), so what is stuck after each phase
    does not depend on the schedule, and the final values are those of any schedule (races aside, which are
    reported).
    """

    def __init__(self, program: Program, contract: _Contract, values: _Values, static: _Static, inplace: bool):
        self.program = program
        self.contract = contract
        self.values = values
        self.static = static
        self.tbs = static.tbs
        self.inplace = inplace
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.deadlock: list[str] = []
        self.bounded: list[str] = []
        self.executed = 0
        self.races: list[str] = []
        self.race_count = 0
        self._raced: set[tuple[int, str, int]] = set()
        self._uninit: dict[tuple[int, int, str], list[int]] = {}
        self._mismatched: set[tuple[int, int]] = set()
        self._setup_buffers()

    # buffers -----------------------------------------------------------------------------------------------
    def _setup_buffers(self) -> None:
        spec = self.contract.spec
        self.phys: list[dict[str, list]] = []  # rank -> physical buffer -> values
        self.mem: list[dict[str, list]] = []  # rank -> physical buffer -> access state per chunk (races)
        self.view: list[dict[str, tuple[str, int, int]]] = []  # rank -> logical buffer -> (phys, offset, size)
        for r, gpu in enumerate(self.program.gpus):
            sizes = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
            view = {b: (b, 0, sizes[b]) for b in ("i", "o", "s")}
            if self.inplace:
                k = spec.chunks_per_rank
                if spec.kind == "reducescatter":
                    view["o"] = ("i", r * k, sizes["o"])
                else:
                    view["i"] = ("o", spec.input_window(r) if spec.kind == "allgather" else 0, sizes["i"])
            phys = {b: [None] * max(sizes[b], 0) for b in ("i", "o", "s")}
            for b, (pb, off, size) in view.items():
                if pb != b and off + size > len(phys[pb]):
                    self.problems.append(
                        f"in place, gpu {r} buffer {b} ({size} chunks at {pb}[{off}]) does not fit in buffer {pb} "
                        f"({len(phys[pb])} chunks)"
                    )
                    phys[pb].extend([None] * (off + size - len(phys[pb])))
            self.phys.append(phys)
            self.mem.append({b: [None] * len(values) for b, values in phys.items()})
            self.view.append(view)
            pb, off, _ = view["i"]
            initial = self.values.initial
            target = phys[pb]
            for j in range(min(self.contract.in_size, sizes["i"])):
                target[off + j] = initial(r, j)

    def _race(self, t: _Tb, idx: int, pb: str, j: int, other_pos: int, other_step: int, did: str, does: str) -> None:
        key = (t.gpu, pb, j)
        if key in self._raced:
            return
        self._raced.add(key)
        self.race_count += 1
        if len(self.races) < MAX_LISTED:
            other = self.tbs[t.gid - t.pos + other_pos]
            self.races.append(
                f"race on gpu {t.gpu} {pb}[{j}]: {other.at(other_step)} {did} it and {t.at(idx)} {does} it, "
                f"with no dependency ordering them"
            )

    # execution ---------------------------------------------------------------------------------------------
    def run(self, capacity: int) -> None:
        tbs = self.tbs
        ntb = len(tbs)
        nq = len(self.static.fifos)
        per_gpu: dict[int, int] = defaultdict(int)
        for t in tbs:
            per_gpu[t.gpu] += 1
        pcs = self.pc = [0] * ntb
        part = self.part = [-1] * ntb  # chunks of the current step done; -1: the step has not started
        flag = [-1] * ntb
        blocked: list[tuple | None] = [None] * ntb
        self.blocked = blocked
        clocks = [[0] * per_gpu[t.gpu] for t in tbs]  # vector clock over the tbs of the same gpu
        snapshots: list[tuple[list[int], list[tuple[int, ...]]]] = [([], []) for _ in tbs]
        fifos: list[deque] = [deque() for _ in range(nq)]
        self.fifos = fifos
        data_waiters: list[list[int]] = [[] for _ in range(nq)]
        space_waiters: list[list[int]] = [[] for _ in range(nq)]
        flag_waiters: list[list[int]] = [[] for _ in range(ntb)]
        ready = deque(range(ntb))
        queued = [True] * ntb
        phys, mem, views, race, uninit = self.phys, self.mem, self.view, self._race, self._uninit
        executed = 0
        limit = capacity

        receiving, sending = RECEIVING_STEPS, SENDING_STEPS

        def operand(t: _Tb, buf: str, off: int) -> tuple:
            """(physical buffer name, values, access states, physical index of the step's chunk 0, the step's
            offset in the logical buffer, that buffer's size)."""
            pb, base, size = views[t.gpu][buf]
            return pb, phys[t.gpu][pb], mem[t.gpu][pb], base + off, off, size

        def read(t: _Tb, idx: int, where: tuple, c: int, clock: list[int]) -> Bag:
            pb, arr, states, loc, off, size = where
            if not 0 <= off + c < size:
                return _UNINIT_BAG  # out of range: reported statically
            loc += c
            value = arr[loc]
            if value is None:
                uninit.setdefault((t.gid, idx, pb), []).append(loc)
                value = _UNINIT_BAG
            state = states[loc]  # [writer pos, writer epoch, {reader pos: epoch} or None]
            pos = t.pos
            if state is None:
                states[loc] = [-1, 0, {pos: idx + 1}]
                return value
            wpos = state[0]
            if wpos >= 0 and wpos != pos and clock[wpos] < state[1]:
                race(t, idx, pb, loc, wpos, state[1] - 1, "writes", "reads")
            if state[2] is None:
                state[2] = {pos: idx + 1}
            else:
                state[2][pos] = idx + 1
            return value

        def write(t: _Tb, idx: int, where: tuple, c: int, value: Bag, clock: list[int]) -> None:
            pb, arr, states, loc, off, size = where
            if not 0 <= off + c < size:
                return
            loc += c
            arr[loc] = value
            state = states[loc]
            pos = t.pos
            if state is None:
                states[loc] = [pos, idx + 1, None]
                return
            wpos = state[0]
            if wpos >= 0 and wpos != pos and clock[wpos] < state[1]:
                race(t, idx, pb, loc, wpos, state[1] - 1, "writes", "writes")
            if state[2]:
                for rpos, repoch in state[2].items():
                    if rpos != pos and clock[rpos] < repoch:
                        race(t, idx, pb, loc, rpos, repoch - 1, "reads", "writes")
                        break
            state[0], state[1], state[2] = pos, idx + 1, None

        def wake(waiting: list[int]) -> None:
            for w in waiting:
                if not queued[w]:
                    queued[w] = True
                    ready.append(w)
            waiting.clear()

        for phase in (1, 2):
            while ready:
                g = ready.popleft()
                queued[g] = False
                t = tbs[g]
                steps = t.steps
                nsteps = len(steps)
                deps = t.deps
                clock = clocks[g]
                pc = pcs[g]
                while pc < nsteps:
                    st = steps[pc]
                    c = part[g]
                    if c < 0:  # start the step: dependency, then the clock
                        dep = deps[pc]
                        if dep is not None:
                            if flag[dep[0]] < dep[1]:
                                blocked[g] = ("flag", dep[0], dep[1])
                                flag_waiters[dep[0]].append(g)
                                break
                            idxs, snaps = snapshots[dep[0]]
                            for i, v in enumerate(snaps[bisect_left(idxs, dep[1])]):
                                if v > clock[i]:
                                    clock[i] = v
                        clock[t.pos] = pc + 1
                        c = 0
                    kind, cnt = st.type, st.cnt
                    rq = t.recv_q
                    sq = t.send_q
                    if kind == "s" and sq >= 0:  # fast paths for the two commonest steps
                        src = operand(t, st.srcbuf, st.srcoff)
                        queue = fifos[sq]
                        while c < cnt:
                            if len(queue) >= limit:
                                blocked[g] = ("space", sq)
                                space_waiters[sq].append(g)
                                break
                            queue.append((read(t, pc, src, c, clock), (g, pc), c, cnt))
                            c += 1
                        if data_waiters[sq]:
                            wake(data_waiters[sq])
                    elif kind == "r" and rq >= 0:
                        dst = operand(t, st.dstbuf, st.dstoff)
                        queue = fifos[rq]
                        while c < cnt:
                            if not queue:
                                blocked[g] = ("data", rq)
                                data_waiters[rq].append(g)
                                break
                            entry = queue.popleft()
                            if entry[2] != c or entry[3] != cnt:
                                self._mismatch(t, pc, entry)
                            write(t, pc, dst, c, entry[0], clock)
                            c += 1
                        if space_waiters[rq]:
                            wake(space_waiters[rq])
                    elif c < cnt:  # every other step, chunk by chunk
                        if kind not in receiving:
                            rq = -1
                        if kind not in sending:
                            sq = -1
                        src = operand(t, st.srcbuf, st.srcoff)
                        dst = operand(t, st.dstbuf, st.dstoff)
                        if kind == "cpy" and src[0] == dst[0] and src[3] == dst[3]:
                            kind = "self-cpy"  # a copy onto itself is a no-op (in place)
                        while c < cnt:
                            if rq >= 0 and not fifos[rq]:
                                blocked[g] = ("data", rq)
                                data_waiters[rq].append(g)
                                break
                            if sq >= 0 and len(fifos[sq]) >= limit:
                                blocked[g] = ("space", sq)
                                space_waiters[sq].append(g)
                                break
                            received = _UNINIT_BAG  # stays so without a recv peer (reported by check_limits)
                            if rq >= 0:
                                entry = fifos[rq].popleft()
                                if space_waiters[rq]:
                                    wake(space_waiters[rq])
                                received = entry[0]
                                if entry[2] != c or entry[3] != cnt:
                                    self._mismatch(t, pc, entry)
                            out = None
                            if kind == "cpy":
                                write(t, pc, dst, c, read(t, pc, src, c, clock), clock)
                            elif kind == "rcs":
                                write(t, pc, dst, c, received, clock)
                                out = received
                            elif kind == "rrs" or kind == "rrc" or kind == "rrcs":
                                value = read(t, pc, src, c, clock)
                                out = tuple(sorted(received + value)) if received and value else received or value
                                if kind != "rrs":
                                    write(t, pc, dst, c, out, clock)
                            elif kind == "re":
                                value = read(t, pc, src, c, clock)
                                old = read(t, pc, dst, c, clock)
                                new = tuple(sorted(old + value)) if old and value else old or value
                                write(t, pc, dst, c, new, clock)
                            elif kind == "s":  # (no send peer)
                                read(t, pc, src, c, clock)
                            elif kind == "r":  # (no recv peer)
                                write(t, pc, dst, c, received, clock)
                            elif kind == "self-cpy":
                                read(t, pc, src, c, clock)
                            if sq >= 0:
                                fifos[sq].append((out, (g, pc), c, cnt))
                                if data_waiters[sq]:
                                    wake(data_waiters[sq])
                            c += 1
                    if c < cnt:
                        part[g] = c
                        break
                    # the step is done
                    blocked[g] = None
                    part[g] = -1
                    pc += 1
                    pcs[g] = pc
                    executed += 1
                    if st.hasdep and kind != "nop":
                        flag[g] = pc - 1
                        snapshots[g][0].append(pc - 1)
                        snapshots[g][1].append(tuple(clock))
                        if flag_waiters[g]:
                            wake(flag_waiters[g])
            if phase == 1:
                stuck_on_space = [g for g in range(ntb) if blocked[g] is not None and blocked[g][0] == "space"]
                if stuck_on_space:
                    self.bounded = self._describe_blocked(capacity, bounded=True)
                limit = 1 << 62  # phase 2: unbounded FIFOs
                for g in stuck_on_space:
                    space_waiters[blocked[g][1]].clear()
                    queued[g] = True
                    ready.append(g)
        self.executed = executed
        self._finish()

    def _mismatch(self, t: _Tb, idx: int, entry) -> None:
        sender, sidx = entry[1]
        key = (t.gid, idx)
        if key in self._mismatched:
            return
        self._mismatched.add(key)
        self.problems.append(
            f"{t.at(idx)} receives cnt={t.steps[idx].cnt} but the matching send {self.tbs[sender].at(sidx)} "
            f"has cnt={entry[3]}"
        )

    def _describe_blocked(self, capacity: int, bounded: bool) -> list[str]:
        tbs = self.tbs
        fifos = self.static.fifos
        done = [self.pc[g] >= len(t.steps) for g, t in enumerate(tbs)]
        senders: dict[int, list[int]] = defaultdict(list)
        for t in tbs:
            if t.send_q >= 0:
                senders[t.send_q].append(t.gid)

        def state(g: int) -> str:
            t = tbs[g]
            if done[g]:
                return f"gpu {t.gpu} tb {t.id} has finished"
            return f"{t.at(self.pc[g])} is blocked too"

        out = []
        for g, t in enumerate(tbs):
            if done[g]:
                continue
            why = self.blocked[g]
            at = t.at(self.pc[g])
            if self.part[g] > 0:
                at += f" (after {self.part[g]} of {t.steps[self.pc[g]].cnt} chunks)"
            if why is None:  # cannot happen: a runnable tb is always queued
                out.append(f"{at}: did not run")
            elif why[0] == "flag":
                other = tbs[why[1]]
                out.append(
                    f"{at}: waits for gpu {other.gpu} tb {other.id} to signal step {why[2]} (hasdep); "
                    + state(why[1])
                    + (" without signalling it" if done[why[1]] else "")
                )
            elif why[0] == "data":
                src, dst, chan = fifos[why[1]]
                who = senders.get(why[1], [])
                detail = "; ".join(state(s) for s in who)
                if not who:
                    detail = f"no threadblock on gpu {src} sends to gpu {dst} on channel {chan}"
                out.append(f"{at}: waits for a message from gpu {src} on channel {chan} (FIFO empty); {detail}")
                if not bounded and all(done[s] for s in who):
                    self.problems.append(
                        f"unmatched receive: {at} expects a message from gpu {src} on channel {chan} that is never sent"
                    )
            else:
                src, dst, chan = fifos[why[1]]
                out.append(
                    f"{at}: cannot send to gpu {dst} on channel {chan}: FIFO full ({capacity} chunks in flight with "
                    f"{self.program.proto}, {NCCL_STEPS} slots per connection)"
                )
        return out

    def _finish(self) -> None:
        tbs = self.tbs
        self.deadlock = self._describe_blocked(0, bounded=False)
        if self.deadlock:
            self.bounded = []  # the unbounded deadlock says it all
        done = [self.pc[g] >= len(t.steps) for g, t in enumerate(tbs)]
        receivers: dict[int, list[int]] = defaultdict(list)
        for t in tbs:
            if t.recv_q >= 0:
                receivers[t.recv_q].append(t.gid)
        unmatched = []
        for q, (src, dst, chan) in sorted(enumerate(self.static.fifos), key=lambda item: item[1]):
            queue = self.fifos[q]
            if not queue or any(not done[r] for r in receivers.get(q, [])):
                continue  # empty, or the receiver is stuck (the deadlock report covers it)
            seen = set()
            for _, (sender, sidx), _, _ in queue:
                if (sender, sidx) not in seen:
                    seen.add((sender, sidx))
                    unmatched.append(
                        f"unmatched send: {tbs[sender].at(sidx)} sends to gpu {dst} on channel {chan}; "
                        "nothing receives it"
                    )
        self.problems.extend(unmatched[:MAX_LISTED])
        if len(unmatched) > MAX_LISTED:
            more = len(unmatched) - MAX_LISTED
            self.problems.append(f"... and {more} more unmatched sends ({len(unmatched)} in all)")
        self.problems.extend(self.races)
        if self.race_count > len(self.races):
            self.problems.append(
                f"... and {self.race_count - len(self.races)} more racy chunks ({self.race_count} in all)"
            )
        for (gid, idx, pb), locs in self._uninit.items():
            self.notes.append(f"{tbs[gid].at(idx)}: reads uninitialised {pb}[{_ranges(locs)}]")

    # postcondition -----------------------------------------------------------------------------------------
    def check_outputs(self) -> None:
        expected = self.values.expected
        mismatches = []
        for r in range(len(self.program.gpus)):
            pb, base, size = self.view[r]["o"]
            arr = self.phys[r][pb]
            for j in range(min(self.contract.out_size, size)):
                want = expected(r, j)
                if want is not None and arr[base + j] != want:
                    mismatches.append(f"gpu {r} o[{j}]: holds {show(arr[base + j])}, needs {show(want)}")
        self.problems.extend(mismatches[:MAX_LISTED])
        if len(mismatches) > MAX_LISTED:
            self.problems.append(
                f"... and {len(mismatches) - MAX_LISTED} more wrong output chunks ({len(mismatches)} in all)"
            )

    def buffers(self) -> dict[int, dict[str, list[Bag | None]]]:
        out = {}
        for r in range(len(self.program.gpus)):
            out[r] = {b: self.phys[r][pb][base : base + size] for b, (pb, base, size) in self.view[r].items()}
        return out


def _ranges(indices: list[int]) -> str:
    if len(indices) == 1:
        return str(indices[0])
    if indices[-1] - indices[0] == len(indices) - 1:
        return f"{indices[0]}..{indices[-1]}"
    return ",".join(map(str, indices))


# --------------------------------------------------------------------------------------------------------------
# Entry point


def check_program(program: Program, spec: CollectiveSpec | None = None, inplace: bool | None = None) -> CheckReport:
    """Check that `program` implements `spec` (derived from the program when None; see derive_spec).

    inplace: None checks every variant the program declares (inplace/outofplace flags), True only the in-place
    one, False only the out-of-place one. Problems of the executor's limits (check_limits) are included.
    """
    problems: list[str] = []
    notes: list[str] = []
    steps_total = sum(len(tb.steps) for g in program.gpus for tb in g.tbs)

    def report(deadlock=(), bounded=(), executed=0, variants=(), buffers=None, used_spec=spec) -> CheckReport:
        deadlock, bounded = list(deadlock), list(bounded)
        return CheckReport(
            ok=not problems and not deadlock,
            problems=problems, deadlock=deadlock, notes=notes, bounded_fifo=bounded,
            steps_executed=executed, steps_total=steps_total, spec=used_spec, variants=tuple(variants),
            final_buffers=buffers or {},
        )  # fmt: skip

    derived = spec is None
    if spec is None:
        try:
            spec = derive_spec(program)
        except ValueError as exc:
            problems.append(f"cannot derive the collective: {exc}")
            return report()
    elif spec.kind != program.coll:
        problems.append(f"the program is a {program.coll}, checked as a {spec.kind}")
    if spec.num_ranks != program.ngpus or len(program.gpus) != program.ngpus:
        problems.append(
            f"the collective has {spec.num_ranks} ranks, the program ngpus={program.ngpus} and {len(program.gpus)} gpus"
        )
        return report(used_spec=spec)
    contract = _contract(program, spec, derived)
    if spec.kind == "allreduce" and contract.in_size != spec.input_chunks():
        notes.append(
            f"allreduce with nchunksperloop={program.nchunksperloop} not a multiple of ngpus={program.ngpus}: "
            f"checked with {contract.in_size} chunks per buffer"
        )
    if max(contract.in_size, contract.out_size) != program.nchunksperloop:
        problems.append(
            f"nchunksperloop={program.nchunksperloop} but a {spec.kind} of {spec.num_ranks} ranks x "
            f"{spec.chunks_per_rank} chunk(s) moves {max(contract.in_size, contract.out_size)} chunks per loop"
        )
    for gpu in program.gpus:
        if gpu.i_chunks != contract.in_size or gpu.o_chunks != contract.out_size:
            problems.append(
                f"gpu {gpu.id}: i_chunks={gpu.i_chunks} o_chunks={gpu.o_chunks}, the {spec.kind} needs "
                f"{contract.in_size} and {contract.out_size}"
            )

    problems.extend(check_limits(program))
    static = _analyse(program)
    problems.extend(static.problems)
    notes.extend(static.notes)

    if inplace is None:
        variants = [v for v, on in (("out-of-place", program.outofplace), ("in-place", program.inplace)) if on]
        if not variants:
            notes.append("the program declares neither inplace nor outofplace; checked out of place")
            variants = ["out-of-place"]
    else:
        variants = ["in-place" if inplace else "out-of-place"]
    values = _Values(spec, contract.in_size, contract.out_size)
    tag_needed = len(variants) > 1
    deadlock: list[str] = []
    bounded: list[str] = []
    executed = steps_total
    buffers = {}
    for n, variant in enumerate(variants):
        run = _Run(program, contract, values, static, inplace=variant == "in-place")
        run.run(fifo_capacity(program.proto))
        run.check_outputs()
        tag = f"{variant}: " if tag_needed else ""
        problems.extend(tag + line for line in run.problems)
        deadlock.extend(tag + line for line in run.deadlock)
        notes.extend(tag + line for line in run.notes)
        if n == 0:
            bounded = run.bounded  # the same for every variant: values do not steer the flow
        executed = min(executed, run.executed)
        buffers[variant] = run.buffers()
    if deadlock:
        bounded = []
    return report(deadlock, bounded, executed, variants, buffers, spec)
