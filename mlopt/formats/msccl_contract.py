"""The MSCCL-EF input contract after parsing: the rules every loaded program must pass, in one fixed order.

The C++ runtime checks the same rules in the same order (runtime/src/validate.cpp, `validate_program`), so that
a file gets the same verdict, and the first problem the same location, in both languages; the conformance
corpus (tests/conformance/msccl_xml, docs/input-contract.md) holds them to it. Groups, in order:

1. structure: nchannels 1..32, gpu ids = positions, buffer sizes 0..32768 chunks (the executor keeps offsets in
   int16_t), tb ids = positions, chan < nchannels, peers -1 or another gpu, s = position;
2. step limits: at most 64 steps per threadblock, cnt in 0..71, a sending (receiving) step needs a send (recv)
   peer;
3. nops: the executor does not store them (see check_limits in msccl_xml.py);
4. connections: one threadblock per (peer, channel) and direction on a gpu, at most 32 per channel;
5. chunk sizes: every gpu the same i_chunks/o_chunks, equal to what the collective needs (symbolic.py "Chunks
   per rank"), except that an in-place-only program (inplace=1 outofplace=0) may declare 0 for the buffer that
   in place is a window of the other one (allgather's input, reducescatter's output, either one for the
   others), as real files do; `effective_program` then gives that buffer its window's size;
6. size (status "unsupported"): ngpus x the chunks of every rank's buffers at most PROOF_BUDGET, so that the
   symbolic proof stays bounded in memory;
7. operands: the offsets a step type uses (only those: msccl_parser.cc checkSrc/checkDst) are in its buffer;
8. dependencies: on an existing tb and step, not later in the same tb, and on a hasdep=1 step that is no nop;
9. FIFOs: per (sender, receiver, channel) the n-th message (a sending step with cnt > 0) meets the n-th
   receiving step with cnt > 0, with the same cnt, and none is left over;
10. deadlock: the steps, run with unbounded FIFOs, all finish. With one threadblock at each end of a connection
    and a step's chunk c depending only on chunk c of its message, running whole steps gives the same verdict
    as symbolic.py's chunk-by-chunk run (a step's last chunk always comes after its sender's last chunk).

What the post-condition proof adds (mlopt.sim.symbolic.check_program, run by `mlopt validate`, Python only):
the outputs hold the collective's result, no local races, and the bounded-FIFO warning.

Each problem names its location as the loaders do: "algo/gpu[@id=0]/tb[@id=1]/step[@s=4]@cnt", then
"(line N)" when the program was read from a file.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from mlopt.errors import InputError
from mlopt.formats.msccl import (
    MAX_BUFFER_CHUNKS,
    MAX_CHANNELS,
    MAX_STEP_COUNT,
    MAX_STEPS_PER_THREADBLOCK,
    RECEIVING_STEPS,
    SENDING_STEPS,
    Gpu,
    Program,
)

MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL: send (recv) peers per channel on one GPU
# ngpus x (chunks of all buffers of all ranks): symbolic.py keeps one value per chunk holding up to ngpus
# contributions; 2**25 keeps its memory to a few hundred MB. The real files use at most 2e5.
PROOF_BUDGET = 1 << 25

READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
ALIASED_COLLECTIVES = {"allgather": ("i_chunks",), "reducescatter": ("o_chunks",)}  # others: either buffer


@dataclass(frozen=True)
class Problem:
    where: tuple[int, ...]  # positions: () the algo, (g,) a gpu, (g, t) a threadblock, (g, t, s) a step
    attr: str | None
    message: str
    status: str = "semantic"


# --------------------------------------------------------------------------------------------------------------
# Entry points


def first_problem(program: Program) -> Problem | None:
    """The first problem of the first group that has one; a group runs only once the earlier ones found none
    (later groups index what earlier ones checked)."""
    for rule in CONTRACT_RULES:
        problem = next(rule(program), None)
        if problem is not None:
            return problem
    return None


def check_contract(program: Program, source: str | None = None) -> None:
    """InputError (exit 2) naming the first problem's location, with its status; nothing when the program passes."""
    problem = first_problem(program)
    if problem is not None:
        raise contract_error(program, problem, source)


def contract_error(program: Program, problem: Problem, source: str | None = None) -> InputError:
    origin = program.origin
    file = source or (origin.source if origin else "<program>")
    field = location(program, problem.where) + (f"@{problem.attr}" if problem.attr else "")
    line = origin.line(_ids(program, problem.where)) if origin else None
    return InputError(file, field + (f" (line {line})" if line else ""), problem.message, problem.status)


def limit_problems(program: Program) -> Iterator[Problem]:
    """All problems of the executor-limit groups (1-4), for check_limits."""
    for rule in LIMIT_RULES:
        yield from rule(program)


def effective_program(program: Program) -> Program:
    """The program as it runs in place: a buffer declared with 0 chunks (allowed by group 5) gets the size of
    its window; anything else is returned unchanged."""
    need = chunk_contract(program)
    if need is None or not in_place_only(program):
        return program
    gpus = tuple(_widened(program, gpu, need) for gpu in program.gpus)
    return program if gpus == program.gpus else replace(program, gpus=gpus)


def in_place_only(program: Program) -> bool:
    return program.inplace and not program.outofplace


def chunk_contract(program: Program) -> tuple[int, int] | None:
    """(input chunks, output chunks) per rank that the collective needs, None when underivable."""
    need, _ = _contract(program)
    return need


# --------------------------------------------------------------------------------------------------------------
# Locations


def location(program: Program, where: tuple[int, ...]) -> str:
    """"algo/gpu[@id=3]/tb[@id=1]/step[@s=4]" for positions (g, t, s), with the ids the program has."""
    out = "algo"
    if not where:
        return out
    gpu = program.gpus[where[0]]
    out += f"/gpu[@id={gpu.id}]"
    if len(where) == 1:
        return out
    tb = gpu.tbs[where[1]]
    out += f"/tb[@id={tb.id}]"
    return out if len(where) == 2 else out + f"/step[@s={tb.steps[where[2]].s}]"


def label(program: Program, where: tuple[int, ...]) -> str:
    """"gpu 0 tb 1 step 4 (s)", as messages name a step."""
    if not where:
        return ""
    gpu = program.gpus[where[0]]
    if len(where) == 1:
        return f"gpu {gpu.id}"
    tb = gpu.tbs[where[1]]
    if len(where) == 2:
        return f"gpu {gpu.id} tb {tb.id}"
    return f"gpu {gpu.id} tb {tb.id} step {where[2]} ({tb.steps[where[2]].type})"


def _ids(program: Program, where: tuple[int, ...]) -> tuple[int, ...]:
    if not where:
        return ()
    gpu = program.gpus[where[0]]
    if len(where) == 1:
        return (gpu.id,)
    tb = gpu.tbs[where[1]]
    return (gpu.id, tb.id) if len(where) == 2 else (gpu.id, tb.id, tb.steps[where[2]].s)


def _steps(program: Program) -> Iterator[tuple[tuple[int, int, int], Gpu, object, object]]:
    for g, gpu in enumerate(program.gpus):
        for t, tb in enumerate(gpu.tbs):
            for s, st in enumerate(tb.steps):
                yield (g, t, s), gpu, tb, st


# --------------------------------------------------------------------------------------------------------------
# 1-4: executor limits (also check_limits)


def _structure(p: Program) -> Iterator[Problem]:
    if p.nchannels < 1:
        yield Problem((), "nchannels", f"nchannels={p.nchannels} must be positive")
    if p.nchannels > MAX_CHANNELS:
        yield Problem((), "nchannels", f"nchannels={p.nchannels} exceeds the executor's {MAX_CHANNELS} channels")
    if p.ngpus != len(p.gpus):
        yield Problem((), "ngpus", f"ngpus={p.ngpus} but the program has {len(p.gpus)} gpus")
    for g, gpu in enumerate(p.gpus):
        if gpu.id != g:
            yield Problem((g,), "id", f"gpu at position {g} has id {gpu.id} (gpu ids must be 0..ngpus-1 in order)")
        yield from _buffer_sizes(gpu, g)
        for t, tb in enumerate(gpu.tbs):
            yield from _tb_structure(p, gpu, g, t, tb)


def _buffer_sizes(gpu: Gpu, g: int) -> Iterator[Problem]:
    for attr in ("i_chunks", "o_chunks", "s_chunks"):
        value = getattr(gpu, attr)
        if value < 0:
            yield Problem((g,), attr, "buffer sizes must not be negative")
        elif value > MAX_BUFFER_CHUNKS:
            yield Problem((g,), attr, f"{attr}={value} exceeds the {MAX_BUFFER_CHUNKS} chunks the executor can "
                                      "address (it keeps offsets in 16 bits)")


def _tb_structure(p: Program, gpu: Gpu, g: int, t: int, tb) -> Iterator[Problem]:
    if tb.id != t:
        yield Problem((g, t), "id", f"tb at position {t} has id {tb.id} (tb ids must be 0..n-1 in order)")
    if not 0 <= tb.chan < p.nchannels:
        yield Problem((g, t), "chan", f"channel {tb.chan} is not in 0..nchannels-1 (nchannels={p.nchannels})")
    for attr, peer in (("send", tb.send), ("recv", tb.recv)):
        if peer < -1 or peer >= p.ngpus or peer == gpu.id:
            yield Problem((g, t), attr, f"{attr} peer {peer} is not -1 or another gpu")
    for s, st in enumerate(tb.steps):
        if st.s != s:
            yield Problem((g, t, s), "s", f"s={st.s}, steps must be numbered by position")


def _step_limits(p: Program) -> Iterator[Problem]:
    for g, gpu in enumerate(p.gpus):
        for t, tb in enumerate(gpu.tbs):
            if len(tb.steps) > MAX_STEPS_PER_THREADBLOCK:
                yield Problem((g, t), None, f"{len(tb.steps)} steps, the executor allows at most "
                                            f"{MAX_STEPS_PER_THREADBLOCK} per threadblock")
    for where, _gpu, tb, st in _steps(p):
        if st.cnt < 0:
            yield Problem(where, "cnt", f"cnt={st.cnt} is negative")
        if st.cnt >= MAX_STEP_COUNT:
            yield Problem(where, "cnt", f"cnt={st.cnt}, the executor needs cnt below {MAX_STEP_COUNT}")
        if st.type in SENDING_STEPS and tb.send < 0:
            yield Problem(where, "type", f"a {st.type} step sends but the threadblock has send=-1")
        if st.type in RECEIVING_STEPS and tb.recv < 0:
            yield Problem(where, "type", f"a {st.type} step receives but the threadblock has recv=-1")


def _nops(p: Program) -> Iterator[Problem]:
    """The executor does not store nops (msccl_parser.cc): a nop only carries a dependency over to the next
    step, which must then wait itself; anything else silently changes what runs."""
    for g, gpu in enumerate(p.gpus):
        for t, tb in enumerate(gpu.tbs):
            pending = False
            for s, st in enumerate(tb.steps):
                if st.type == "nop":
                    if st.depid < 0:
                        yield Problem((g, t, s), "depid", "nop without a dependency; the executor drops it and "
                                                          "numbers the later steps one lower")
                    else:
                        pending = True
                    if st.hasdep:
                        yield Problem((g, t, s), "hasdep", "nop with hasdep=1; the executor does not store nops, "
                                                           "so it never signals")
                elif pending:
                    if st.depid < 0:
                        yield Problem((g, t, s), "depid", "follows nop dependencies but has no dependency itself; "
                                                          "the executor rejects this")
                    pending = False
            if pending:
                yield Problem((g, t, len(tb.steps) - 1), "type", "the threadblock ends with nop dependencies that "
                                                                 "the executor drops (no step after them)")


def _connections(p: Program) -> Iterator[Problem]:
    """One NCCL connection per (peer, channel) and direction: one threadblock at each end of it, and at most
    MAX_TBS_PER_CHANNEL threadblocks per channel and direction on one gpu."""
    for g, gpu in enumerate(p.gpus):
        for attr, kind in (("send", "send to"), ("recv", "receive from")):
            first_tb: dict[tuple[int, int], int] = {}
            per_channel: dict[int, int] = defaultdict(int)
            for t, tb in enumerate(gpu.tbs):
                peer = getattr(tb, attr)
                if peer < 0:
                    continue
                other = first_tb.setdefault((peer, tb.chan), t)
                if other != t:
                    yield Problem((g, t), attr, f"tbs {gpu.tbs[other].id} and {tb.id} both {kind} gpu {peer} on "
                                                f"channel {tb.chan}; one connection per (peer, channel) allows one "
                                                "threadblock")
                per_channel[tb.chan] += 1
                if per_channel[tb.chan] == MAX_TBS_PER_CHANNEL + 1:
                    yield Problem((g, t), attr, f"more than {MAX_TBS_PER_CHANNEL} threadblocks {kind} peers on "
                                                f"channel {tb.chan}")


# --------------------------------------------------------------------------------------------------------------
# 5-6: chunk sizes and the proof's budget


def _contract(p: Program) -> tuple[tuple[int, int] | None, Problem | None]:
    n, c, kind = p.ngpus, p.nchunksperloop, p.coll
    if n < 1 or c < 1:
        return None, Problem((), "nchunksperloop", f"cannot derive the collective: ngpus={n} and nchunksperloop={c} "
                                                   "must be positive")
    if kind in ("broadcast", "reduce", "allreduce"):
        return (c, c), None
    if kind not in ("allgather", "reducescatter", "alltoall"):
        return None, Problem((), "coll", f"unknown collective {kind!r}")
    if c % n:
        return None, Problem((), "nchunksperloop", f"cannot derive the collective: {kind}: nchunksperloop={c} is not "
                                                   f"a multiple of ngpus={n}")
    k = c // n
    return {"allgather": (k, c), "reducescatter": (c, k)}.get(kind, (c, c)), None


def _may_leave_out(p: Program, gpu: Gpu, attr: str, need: tuple[int, int]) -> bool:
    """A buffer declared with 0 chunks that in place is a window of the other buffer (which must be whole)."""
    aliased = ALIASED_COLLECTIVES.get(p.coll)
    if aliased is not None:
        return attr in aliased
    return gpu.o_chunks == need[1] if attr == "i_chunks" else gpu.i_chunks == need[0]


def _widened(p: Program, gpu: Gpu, need: tuple[int, int]) -> Gpu:
    sizes = {}
    for attr, needed in (("i_chunks", need[0]), ("o_chunks", need[1])):
        if getattr(gpu, attr) == 0 and needed and _may_leave_out(p, gpu, attr, need):
            sizes[attr] = needed
    return replace(gpu, **sizes) if sizes else gpu


def _chunk_sizes(p: Program) -> Iterator[Problem]:
    """One i_chunks/o_chunks for the whole program (the runtime takes one count), equal to the collective's."""
    need, problem = _contract(p)
    if problem is not None:
        yield problem
        return
    if not p.gpus:
        return
    first = p.gpus[0]
    for g, gpu in enumerate(p.gpus[1:], start=1):
        for attr in ("i_chunks", "o_chunks"):
            mine, theirs = getattr(gpu, attr), getattr(first, attr)
            if mine != theirs:
                yield Problem((g,), attr, f"{attr}={mine} but gpu {first.id} has {attr}={theirs}; every gpu needs "
                                          "the same buffer sizes (the runtime takes one count)")
    for g, gpu in enumerate(p.gpus):
        yield from _gpu_chunk_sizes(p, g, gpu, need)


def _gpu_chunk_sizes(p: Program, g: int, gpu: Gpu, need: tuple[int, int]) -> Iterator[Problem]:
    for attr, needed in (("i_chunks", need[0]), ("o_chunks", need[1])):
        declared = getattr(gpu, attr)
        if declared == needed:
            continue
        if declared == 0 and _may_leave_out(p, gpu, attr, need):
            if not in_place_only(p):
                buffer = "input" if attr == "i_chunks" else "output"
                yield Problem((g,), attr, f"{attr}=0 but the {p.coll} needs {needed}: only an in-place-only program "
                                          f"(inplace=1 outofplace=0) may leave out the {buffer}, which in place is "
                                          "a window of the other buffer")
            continue
        yield Problem((g,), attr, f"i_chunks={gpu.i_chunks} o_chunks={gpu.o_chunks}, the {p.coll} needs {need[0]} "
                                  f"and {need[1]} (nchunksperloop={p.nchunksperloop}, ngpus={p.ngpus})")
        return


def _budget(p: Program) -> Iterator[Problem]:
    eff = effective_program(p)
    work = p.ngpus * sum(g.i_chunks + g.o_chunks + g.s_chunks for g in eff.gpus)
    if work > PROOF_BUDGET:
        yield Problem((), None, f"mlopt does not support programs this large: ngpus x the chunks of every rank's "
                                f"buffers = {work} exceeds {PROOF_BUDGET} (mlopt's symbolic proof keeps up to ngpus "
                                "contributions per chunk)", "unsupported")


# --------------------------------------------------------------------------------------------------------------
# 7-9: operands, dependencies, FIFOs


def _operands(p: Program) -> Iterator[Problem]:
    """Only the operands a step type uses are checked (r/rcs ignore src, s/rrs ignore dst), as the executor's
    checkSrc/checkDst do; against the declared sizes, so that an in-place-only program touches only the buffer
    it declares."""
    for where, gpu, _tb, st in _steps(p):
        sizes = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
        operands = ((READS_SRC, "src", st.srcbuf, st.srcoff), (WRITES_DST, "dst", st.dstbuf, st.dstoff))
        for used, side, buf, off in operands:
            if st.type in used and (off < 0 or off + max(st.cnt, 0) > sizes[buf]):
                yield Problem(where, f"{side}off", f"{side}off={off} cnt={st.cnt} is out of range for buffer {buf} "
                                                   f"({sizes[buf]} chunks)")


def _dependencies(p: Program) -> Iterator[Problem]:
    """A step waiting for (tb X, step Z) of its gpu: X and Z must exist, not be later in its own threadblock,
    and Z must signal (hasdep=1, not a nop): the executor only signals hasdep steps."""
    for (g, t, s), gpu, _tb, st in _steps(p):
        if st.depid < 0:
            continue  # deps without depid is ignored (symbolic.py notes it)
        where = (g, t, s)
        if st.depid >= len(gpu.tbs):
            yield Problem(where, "depid", f"depends on tb {st.depid}, which does not exist on gpu {gpu.id}")
            continue
        target = gpu.tbs[st.depid]
        if not 0 <= st.deps < len(target.steps):
            yield Problem(where, "deps", f"depends on step {st.deps} of tb {st.depid}, which has {len(target.steps)} "
                                         "steps")
            continue
        if st.depid == t and st.deps >= s:
            yield Problem(where, "deps", f"depends on step {st.deps} of its own threadblock, which runs later (never "
                                         "completes)")
            continue
        awaited = target.steps[st.deps]
        name = label(p, (g, st.depid, st.deps))
        if awaited.type == "nop":
            yield Problem(where, "deps", f"depends on {name}, a nop, which never signals")
        elif not awaited.hasdep:
            yield Problem(where, "deps", f"depends on {name}, which is not marked hasdep=1 (the executor only "
                                         "signals hasdep steps)")


Connection = tuple[int, int, int]  # sender, receiver, channel


def _messages(p: Program) -> tuple[dict[Connection, list], dict[Connection, list]]:
    """Per connection, the sending and the receiving steps that move data (cnt > 0), in step order."""
    sent: dict[Connection, list] = defaultdict(list)
    received: dict[Connection, list] = defaultdict(list)
    for where, gpu, tb, st in _steps(p):
        if st.cnt <= 0:
            continue  # moves nothing: neither pushes nor pops a message
        if st.type in SENDING_STEPS:
            sent[(gpu.id, tb.send, tb.chan)].append((where, st.cnt))
        if st.type in RECEIVING_STEPS:
            received[(tb.recv, gpu.id, tb.chan)].append((where, st.cnt))
    return sent, received


def _fifos(p: Program) -> Iterator[Problem]:
    """Messages match in FIFO order per (sender, receiver, channel); the n-th receive takes the n-th message
    and must have its cnt. One threadblock at each end of a connection (group 4): step order is message order."""
    sent, received = _messages(p)
    for c in sorted(set(sent) | set(received)):
        sends, recvs = sent.get(c, []), received.get(c, [])
        text = f"gpu {c[0]} -> gpu {c[1]} on channel {c[2]}"
        for i, ((out, out_cnt), (into, in_cnt)) in enumerate(zip(sends, recvs)):
            if out_cnt != in_cnt:
                yield Problem(into, "cnt", f"receives cnt={in_cnt} but the matching send {label(p, out)} has "
                                           f"cnt={out_cnt} (message {i + 1} of {text})")
        matched = min(len(sends), len(recvs))
        if len(sends) > matched:
            yield Problem(sends[matched][0], "type", f"unmatched send: message {matched + 1} of {text}, but gpu {c[1]} "
                                                     f"receives only {len(recvs)} message(s) on that connection")
        if len(recvs) > matched:
            yield Problem(recvs[matched][0], "type", f"unmatched receive: expects message {matched + 1} of {text}, "
                                                     f"but gpu {c[0]} sends only {len(sends)} message(s) on that "
                                                     "connection")


# --------------------------------------------------------------------------------------------------------------
# 10: deadlock


class _Flow:
    """The threadblocks run step by step with unbounded FIFOs: a step waits for its dependency (the awaited
    tb has finished a hasdep step at or after it), then for a message when it receives (cnt > 0), then sends
    (cnt > 0) and signals when hasdep. Waiters are woken by the event they wait for, so the work is linear."""

    def __init__(self, p: Program):
        self.p = p
        self.tbs = [(g, t) for g, gpu in enumerate(p.gpus) for t in range(len(gpu.tbs))]
        self.index = {key: i for i, key in enumerate(self.tbs)}
        self.pc = [0] * len(self.tbs)
        self.flag = [-1] * len(self.tbs)
        self.available: dict[Connection, int] = defaultdict(int)
        self.on_message: dict[Connection, list[int]] = defaultdict(list)
        self.on_flag: dict[int, list[int]] = defaultdict(list)
        self.ready = deque(range(len(self.tbs)))

    def run(self) -> list[int]:
        """The threadblocks that never finish, in (gpu, tb) order."""
        while self.ready:
            self._advance(self.ready.popleft())
        return [i for i, (g, t) in enumerate(self.tbs) if self.pc[i] < len(self.p.gpus[g].tbs[t].steps)]

    def _wake(self, waiters: list[int]) -> None:
        self.ready.extend(waiters)
        waiters.clear()

    def _advance(self, i: int) -> None:
        g, t = self.tbs[i]
        gpu = self.p.gpus[g]
        tb = gpu.tbs[t]
        while self.pc[i] < len(tb.steps):
            st = tb.steps[self.pc[i]]
            if st.depid >= 0 and self.flag[self.index[(g, st.depid)]] < st.deps:
                self.on_flag[self.index[(g, st.depid)]].append(i)
                return
            moves = st.cnt > 0
            if moves and st.type in RECEIVING_STEPS:
                inbox = (tb.recv, gpu.id, tb.chan)
                if not self.available[inbox]:
                    self.on_message[inbox].append(i)
                    return
                self.available[inbox] -= 1
            if moves and st.type in SENDING_STEPS:
                outbox = (gpu.id, tb.send, tb.chan)
                self.available[outbox] += 1
                self._wake(self.on_message[outbox])
            if st.hasdep and st.type != "nop":
                self.flag[i] = self.pc[i]
                self._wake(self.on_flag[i])
            self.pc[i] += 1

    def describe(self, i: int, stuck: int) -> Problem:
        g, t = self.tbs[i]
        gpu = self.p.gpus[g]
        tb = gpu.tbs[t]
        s = self.pc[i]
        st = tb.steps[s]
        tail = f" ({stuck} threadblock(s) never finish)"
        if st.depid >= 0 and self.flag[self.index[(g, st.depid)]] < st.deps:
            return Problem((g, t, s), "deps", f"deadlock: waits for gpu {gpu.id} tb {st.depid} to signal step "
                                              f"{st.deps}, which never happens" + tail)
        return Problem((g, t, s), "type", f"deadlock: waits for a message from gpu {tb.recv} on channel {tb.chan} "
                                          "that never arrives" + tail)


def _deadlock(p: Program) -> Iterator[Problem]:
    flow = _Flow(p)
    stuck = flow.run()
    if stuck:
        yield flow.describe(stuck[0], len(stuck))


LIMIT_RULES: tuple[Callable[[Program], Iterator[Problem]], ...] = (_structure, _step_limits, _nops, _connections)
CONTRACT_RULES = LIMIT_RULES + (_chunk_sizes, _budget, _operands, _dependencies, _fifos, _deadlock)
