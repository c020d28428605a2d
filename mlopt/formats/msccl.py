"""MSCCL-EF programs: the collective algorithms mlopt writes as XML and the runtime executes.

The structure mirrors the XML one to one (algo > gpu > tb > step). Buffers are `i` (input), `o` (output)
and `s` (scratch), indexed in chunks; a program moves `nchunksperloop` chunks per loop iteration, and the
runtime repeats the loop over the whole buffer. Each threadblock runs its steps in order, sends to at most
one peer (`send`) and receives from at most one (`recv`) on channel `chan`; a step may wait for step
`deps` of threadblock `depid` on the same GPU, which must then be marked `hasdep`.

Step types: s (send), r (receive), rcs (receive, copy, send), rrs (receive, reduce, send), rrc (receive,
reduce, copy), rrcs (receive, reduce, copy, send), cpy (local copy), re (local reduce), nop (only carries
a dependency).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SENDING_STEPS = frozenset({"s", "rcs", "rrs", "rrcs"})
RECEIVING_STEPS = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
REDUCING_STEPS = frozenset({"rrs", "rrc", "rrcs", "re"})
BUFFERS = ("i", "o", "s")
PROTOCOLS = ("Simple", "LL", "LL128")
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce")

# Limits of the MSCCL executor, checked before a program is written.
MAX_STEPS_PER_THREADBLOCK = 64
MAX_CHANNELS = 32
MAX_STEP_COUNT = 72  # cnt must be below this
MAX_BUFFER_CHUNKS = 32768  # the executor keeps offsets in int16_t (msccl_struct.h): chunks 0..32767 only


@dataclass(frozen=True)
class Step:
    s: int  # position in its threadblock
    type: str  # one of STEP_TYPES
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int  # chunks moved
    depid: int = -1  # threadblock this step waits for (-1: none)
    deps: int = -1  # step of that threadblock
    hasdep: bool = False  # some other step waits for this one


@dataclass(frozen=True)
class Threadblock:
    id: int
    send: int  # peer rank this threadblock sends to, -1 for none
    recv: int  # peer rank it receives from, -1 for none
    chan: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[Threadblock, ...]


@dataclass(frozen=True)
class Origin:
    """Where a parsed program came from, for messages: the file, the line of each element (keys: () for
    <algo>, (gpu,), (gpu, tb), (gpu, tb, step) by id) and what the loader ignored as the executor does
    ("algo@maxcount", "gpu/copy": attribute names and element names, each once)."""

    source: str
    lines: Mapping[tuple[int, ...], int]
    ignored: tuple[str, ...] = ()

    def line(self, key: tuple[int, ...]) -> int | None:
        return self.lines.get(key)


@dataclass(frozen=True)
class Program:
    name: str
    proto: str  # one of PROTOCOLS
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str  # one of COLLECTIVES ("reducescatter" spelled as the executor wants)
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    gpus: tuple[Gpu, ...]
    # Set by the XML loader; not part of the program (equality and hashing ignore it).
    origin: Origin | None = field(default=None, compare=False, repr=False)

    def gpu(self, rank: int) -> Gpu:
        return self.gpus[rank]
