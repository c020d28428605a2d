"""Reading and writing MSCCL-EF XML: the algorithm files the MSCCL executor loads.

Two dialects:

executor (the default; Azure/msccl-executor-nccl src/misc/msccl/msccl_parser.cc, also RCCL's copy) reads
every attribute below and fails without any of them; mlopt is stricter still: an unknown attribute or element
is an error too, integers must be plain decimal integers and flags 0 or 1::

    <algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

legacy: what msccl-tools (microsoft/msccl-tools msccl/language/ir.py `ir_to_xml(old_format=True)`, and the
older msccl/ncclize.py) writes and the first MSCCL runtime (microsoft/msccl src/graph/topo.cc,
`mscclGetAlgoFromXMLAndSetAlgo`; before it SCCL's `scclGetAlgoFromXMLAndSetComm`) reads. Differences found
there:

- algo has no `outofplace` (the old runtime never reads it: an algorithm served the calls whose in-placeness
  matched `inplace`), so it defaults to `not inplace`;
- `minBytes`/`maxBytes` are optional; the old runtime defaults them to 0 and 2**27 (128 MB);
- the reduce-scatter collective is spelled `reduce_scatter` (msccl-tools' collective name) where the executor
  wants `reducescatter`; both spellings are accepted in this dialect;
- optional algo attributes `redop` (SCCL: sum/prod/max/min/nop) and `nthreads` (multiple of 32), and tb
  attributes `rtype`/`stype` (p2p/shm/nic) exist there; they are accepted and dropped (mlopt has no use for
  them);
- `proto` is always written by msccl-tools and required by every runtime seen, but very early generators
  (microsoft/msccl src/xml_generator) wrote files without it: it is optional here and defaults to `Simple`, the
  only protocol msccl-tools' ncclize emits.
Everything below algo (gpu, tb, step and their attributes) is the same in both dialects; msccl-tools writes
nop steps with `srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0"`. The legacy writer omits
outofplace/minBytes/maxBytes when they hold the values a legacy reader would assume, so that
`parse(write(p, "legacy")) == p` for every program.

`dialect="auto"` reads a file as legacy when its algo element lacks one of outofplace/minBytes/maxBytes,
spells `reduce_scatter`, or carries a legacy-only attribute; otherwise as the executor dialect.

Structural rules checked while parsing (in both dialects): gpu ids are 0..ngpus-1, each once; tb ids are
0..n-1 on each gpu; steps are numbered by position (`s` = index in the threadblock); every `chan` is below
`nchannels`; peers are -1 or another gpu. Program.gpus and Gpu.tbs come out sorted by id. Executor limits
and the rules that are not about one attribute are checked by `check_limits`.

Errors are InputError(file, location, message) with an XPath-like location and the line, e.g.
`algo/gpu[@id=3]/tb[@id=1]/step[@s=4]@dstoff (line 57)`.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from xml.parsers import expat

from mlopt.errors import InputError
from mlopt.formats.io import atomic_write_text, read_bytes
from mlopt.formats.msccl import (
    BUFFERS,
    COLLECTIVES,
    MAX_CHANNELS,
    MAX_STEP_COUNT,
    MAX_STEPS_PER_THREADBLOCK,
    PROTOCOLS,
    RECEIVING_STEPS,
    SENDING_STEPS,
    STEP_TYPES,
    Gpu,
    Program,
    Step,
    Threadblock,
)

DIALECTS = ("executor", "legacy")

ALGO_ATTRS = (
    "name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes", "maxBytes",
)  # fmt: skip
GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
TB_ATTRS = ("id", "send", "recv", "chan")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")

# Legacy dialect (see module docstring).
LEGACY_ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")  # msccl-tools order
LEGACY_OPTIONAL_ALGO = ("proto", "outofplace", "minBytes", "maxBytes")
LEGACY_IGNORED_ALGO = ("redop", "nthreads")
LEGACY_IGNORED_TB = ("rtype", "stype")
LEGACY_DEFAULT_PROTO = "Simple"
LEGACY_DEFAULT_MIN_BYTES = 0
LEGACY_DEFAULT_MAX_BYTES = 1 << 27
LEGACY_COLL_NAMES = {"reducescatter": "reduce_scatter"}  # mlopt name -> legacy spelling

# Executor limits not in mlopt.formats.msccl (msccl_struct.h of the executor).
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL: send (recv) peers per channel on one GPU

_INT = re.compile(r"-?[0-9]+\Z")


# --------------------------------------------------------------------------------------------------------------
# A small element tree with line numbers (expat reports where each start tag begins).


@dataclass
class _Node:
    tag: str
    attrs: dict[str, str]
    line: int
    path: str = ""  # XPath-like location, filled in while converting
    children: list[_Node] = field(default_factory=list)


def _parse_tree(text: str | bytes, source: str) -> _Node:
    parser = expat.ParserCreate()
    parser.buffer_text = True
    root: list[_Node] = []
    stack: list[_Node] = []

    def fail(line: int, column: int | None, message: str) -> InputError:
        where = f"(line {line}" + (f", column {column})" if column is not None else ")")
        return InputError(source, where, f"malformed XML: {message}")

    def start(tag: str, attrs: dict[str, str]) -> None:
        node = _Node(tag, dict(attrs), parser.CurrentLineNumber)
        if stack:
            stack[-1].children.append(node)
        elif root:
            raise fail(node.line, parser.CurrentColumnNumber + 1, f"second root element <{tag}>")
        else:
            root.append(node)
        stack.append(node)

    def end(tag: str) -> None:
        stack.pop()

    def chars(data: str) -> None:
        if data.strip():
            text = data.strip()[:20]
            raise fail(parser.CurrentLineNumber, parser.CurrentColumnNumber + 1, f"unexpected text {text!r}")

    def doctype(*_args) -> None:
        raise fail(parser.CurrentLineNumber, None, "DOCTYPE declarations are not allowed")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.StartDoctypeDeclHandler = doctype
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise fail(exc.lineno, exc.offset + 1, expat.errors.messages.get(exc.code, str(exc))) from None
    if not root:
        raise InputError(source, "(line 1)", "malformed XML: no root element")
    return root[0]


# --------------------------------------------------------------------------------------------------------------
# Parsing


class _Reader:
    def __init__(self, source: str, dialect: str):
        self.source = source
        self.dialect = dialect

    def error(self, node: _Node, attr: str | None, message: str) -> InputError:
        location = node.path + (f"@{attr}" if attr else "") + f" (line {node.line})"
        return InputError(self.source, location, message)

    def check_attrs(self, node: _Node, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        for name in required:
            if name not in node.attrs:
                raise self.error(node, name, f"missing attribute {name!r} ({self.dialect} dialect)")
        allowed = set(required) | set(optional)
        for name in node.attrs:
            if name not in allowed:
                raise self.error(
                    node, name, f"unexpected attribute {name!r} on <{node.tag}> ({self.dialect} dialect)"
                )

    def int_attr(self, node: _Node, name: str, minimum: int | None = None) -> int:
        raw = node.attrs[name]
        if not _INT.match(raw):
            raise self.error(node, name, f"{raw!r} is not an integer")
        value = int(raw)
        if minimum is not None and value < minimum:
            raise self.error(node, name, f"{value} is below the minimum {minimum}")
        return value

    def flag_attr(self, node: _Node, name: str) -> bool:
        raw = node.attrs[name]
        if raw not in ("0", "1"):
            raise self.error(node, name, f"{raw!r} must be 0 or 1")
        return raw == "1"

    def enum_attr(self, node: _Node, name: str, allowed: tuple[str, ...], what: str) -> str:
        raw = node.attrs[name]
        if raw not in allowed:
            raise self.error(node, name, f"unknown {what} {raw!r} (expected one of {', '.join(allowed)})")
        return raw

    def children(self, node: _Node, tag: str) -> list[_Node]:
        for child in node.children:
            if child.tag != tag:
                raise self.error(
                    child, None, f"unexpected element <{child.tag}> inside <{node.tag}> (expected <{tag}>)"
                )
        return node.children


def _label(node: _Node, key: str, position: int) -> str:
    raw = node.attrs.get(key)
    if raw is not None and _INT.match(raw):
        return f"{node.tag}[@{key}={int(raw)}]"
    return f"{node.tag}[{position + 1}]"


def detect_dialect(text: str | bytes, source: str = "<xml>") -> str:
    """The dialect `parse_program(..., dialect="auto")` reads `text` in: "legacy" or "executor" (see module docstring)."""
    return _detect(_parse_tree(text, source))


def _detect(root: _Node) -> str:
    attrs = root.attrs
    if any(name not in attrs for name in ("outofplace", "minBytes", "maxBytes")):
        return "legacy"
    if attrs.get("coll") == "reduce_scatter" or any(name in attrs for name in LEGACY_IGNORED_ALGO):
        return "legacy"
    return "executor"


def parse_program(text: str | bytes, source: str, dialect: str = "auto") -> Program:
    """An MSCCL-EF XML document as a Program; InputError (with location and line) when it is not valid."""
    if dialect not in ("auto",) + DIALECTS:
        raise ValueError(f"unknown MSCCL XML dialect {dialect!r} (expected auto, executor or legacy)")
    root = _parse_tree(text, source)
    root.path = root.tag
    if dialect == "auto":
        dialect = _detect(root)
    r = _Reader(source, dialect)
    if root.tag != "algo":
        raise r.error(root, None, f"root element is <{root.tag}>, expected <algo>")

    if dialect == "executor":
        r.check_attrs(root, ALGO_ATTRS)
    else:
        required = tuple(a for a in ALGO_ATTRS if a not in LEGACY_OPTIONAL_ALGO)
        r.check_attrs(root, required, LEGACY_OPTIONAL_ALGO + LEGACY_IGNORED_ALGO)

    name = root.attrs["name"]
    proto = r.enum_attr(root, "proto", PROTOCOLS, "protocol") if "proto" in root.attrs else LEGACY_DEFAULT_PROTO
    nchannels = r.int_attr(root, "nchannels", 1)
    nchunksperloop = r.int_attr(root, "nchunksperloop", 1)
    ngpus = r.int_attr(root, "ngpus", 1)
    coll_raw = root.attrs["coll"]
    if dialect == "legacy" and coll_raw == "reduce_scatter":
        coll = "reducescatter"
    elif coll_raw == "reduce_scatter":
        raise r.error(
            root, "coll", "'reduce_scatter' is the legacy spelling; the executor dialect wants 'reducescatter'"
        )
    else:
        coll = r.enum_attr(root, "coll", COLLECTIVES, "collective")
    inplace = r.flag_attr(root, "inplace")
    outofplace = r.flag_attr(root, "outofplace") if "outofplace" in root.attrs else not inplace
    min_bytes = r.int_attr(root, "minBytes", 0) if "minBytes" in root.attrs else LEGACY_DEFAULT_MIN_BYTES
    max_bytes = r.int_attr(root, "maxBytes", 0) if "maxBytes" in root.attrs else LEGACY_DEFAULT_MAX_BYTES
    if "redop" in root.attrs:
        r.enum_attr(root, "redop", ("sum", "prod", "max", "min", "nop"), "reduction operator")
    if "nthreads" in root.attrs:
        r.int_attr(root, "nthreads", 0)

    gpus: dict[int, Gpu] = {}
    for gpos, gnode in enumerate(r.children(root, "gpu")):
        gnode.path = f"{root.path}/{_label(gnode, 'id', gpos)}"
        gpu = _parse_gpu(r, gnode, ngpus, nchannels)
        if gpu.id in gpus:
            raise r.error(gnode, "id", f"duplicate gpu id {gpu.id}")
        gpus[gpu.id] = gpu
    missing = [g for g in range(ngpus) if g not in gpus]
    if missing:
        raise r.error(root, "ngpus", f"ngpus={ngpus} but there is no <gpu> with id {_ids(missing)}")
    return Program(
        name=name,
        proto=proto,
        nchannels=nchannels,
        nchunksperloop=nchunksperloop,
        ngpus=ngpus,
        coll=coll,
        inplace=inplace,
        outofplace=outofplace,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        gpus=tuple(gpus[g] for g in range(ngpus)),
    )


def _ids(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:8])
    return shown + (f" (and {len(values) - 8} more)" if len(values) > 8 else "")


def _parse_gpu(r: _Reader, node: _Node, ngpus: int, nchannels: int) -> Gpu:
    r.check_attrs(node, GPU_ATTRS)
    gid = r.int_attr(node, "id", 0)
    if gid >= ngpus:
        raise r.error(node, "id", f"gpu id {gid} out of range 0..{ngpus - 1} (ngpus={ngpus})")
    i_chunks = r.int_attr(node, "i_chunks", 0)
    o_chunks = r.int_attr(node, "o_chunks", 0)
    s_chunks = r.int_attr(node, "s_chunks", 0)
    tbs: dict[int, Threadblock] = {}
    for tpos, tnode in enumerate(r.children(node, "tb")):
        tnode.path = f"{node.path}/{_label(tnode, 'id', tpos)}"
        tb = _parse_tb(r, tnode, gid, ngpus, nchannels)
        if tb.id in tbs:
            raise r.error(tnode, "id", f"duplicate tb id {tb.id} on gpu {gid}")
        tbs[tb.id] = tb
    missing = [t for t in range(len(tbs)) if t not in tbs]
    if missing:
        raise r.error(node, None, f"tb ids must be 0..{len(tbs) - 1}; missing {_ids(missing)}")
    return Gpu(gid, i_chunks, o_chunks, s_chunks, tuple(tbs[t] for t in range(len(tbs))))


def _parse_tb(r: _Reader, node: _Node, gid: int, ngpus: int, nchannels: int) -> Threadblock:
    r.check_attrs(node, TB_ATTRS, LEGACY_IGNORED_TB if r.dialect == "legacy" else ())
    tid = r.int_attr(node, "id", 0)
    peers = {}
    for attr in ("send", "recv"):
        peer = r.int_attr(node, attr, -1)
        if peer >= ngpus:
            raise r.error(node, attr, f"peer {peer} out of range (-1 or 0..{ngpus - 1})")
        if peer == gid:
            raise r.error(node, attr, f"peer {peer} is the gpu itself")
        peers[attr] = peer
    chan = r.int_attr(node, "chan", 0)
    if chan >= nchannels:
        raise r.error(node, "chan", f"channel {chan} is not below nchannels={nchannels}")
    for attr in LEGACY_IGNORED_TB:
        if attr in node.attrs:
            r.enum_attr(node, attr, ("p2p", "shm", "nic"), "connection type")
    steps = []
    for spos, snode in enumerate(r.children(node, "step")):
        snode.path = f"{node.path}/{_label(snode, 's', spos)}"
        steps.append(_parse_step(r, snode, spos))
    return Threadblock(tid, peers["send"], peers["recv"], chan, tuple(steps))


def _parse_step(r: _Reader, node: _Node, position: int) -> Step:
    r.check_attrs(node, STEP_ATTRS)
    s = r.int_attr(node, "s")
    if s != position:
        raise r.error(
            node, "s", f"s={s} but this is step {position} of its threadblock (steps are numbered by position)"
        )
    return Step(
        s=s,
        type=r.enum_attr(node, "type", STEP_TYPES, "step type"),
        srcbuf=r.enum_attr(node, "srcbuf", BUFFERS, "buffer"),
        srcoff=r.int_attr(node, "srcoff", -1),
        dstbuf=r.enum_attr(node, "dstbuf", BUFFERS, "buffer"),
        dstoff=r.int_attr(node, "dstoff", -1),
        cnt=r.int_attr(node, "cnt", 0),
        depid=r.int_attr(node, "depid", -1),
        deps=r.int_attr(node, "deps", -1),
        hasdep=r.flag_attr(node, "hasdep"),
    )


def load_program(path: str | os.PathLike, dialect: str = "auto") -> Program:
    """Read an MSCCL-EF XML file (optionally gzipped)."""
    return parse_program(read_bytes(path), str(path), dialect)


# --------------------------------------------------------------------------------------------------------------
# Writing


def _quote(value: str) -> str:
    return (
        value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        .replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    )


def _attrs(pairs: list[tuple[str, object]]) -> str:
    return " ".join(f'{k}="{_quote(str(v))}"' for k, v in pairs)


def _b(flag: bool) -> int:
    return 1 if flag else 0


def write_program(program: Program, dialect: str = "executor") -> str:
    """Deterministic XML text: attribute order as the executor's reference files, 2-space indent, final newline.

    `parse_program(write_program(p, d), src, d) == p` for both dialects.
    """
    if dialect not in DIALECTS:
        raise ValueError(f"unknown MSCCL XML dialect {dialect!r} (expected executor or legacy)")
    p = program
    if dialect == "executor":
        algo = [
            ("name", p.name), ("proto", p.proto), ("nchannels", p.nchannels), ("nchunksperloop", p.nchunksperloop),
            ("ngpus", p.ngpus), ("coll", p.coll), ("inplace", _b(p.inplace)), ("outofplace", _b(p.outofplace)),
            ("minBytes", p.min_bytes), ("maxBytes", p.max_bytes),
        ]  # fmt: skip
    else:
        algo = [
            ("name", p.name), ("proto", p.proto), ("nchannels", p.nchannels), ("nchunksperloop", p.nchunksperloop),
            ("ngpus", p.ngpus), ("coll", LEGACY_COLL_NAMES.get(p.coll, p.coll)), ("inplace", _b(p.inplace)),
        ]  # fmt: skip
        # Extensions a legacy reader ignores (outofplace) or reads when present (min/maxBytes), written only when
        # they differ from what a legacy reader assumes, so the round trip is exact.
        if p.outofplace != (not p.inplace):
            algo.append(("outofplace", _b(p.outofplace)))
        if p.min_bytes != LEGACY_DEFAULT_MIN_BYTES:
            algo.append(("minBytes", p.min_bytes))
        if p.max_bytes != LEGACY_DEFAULT_MAX_BYTES:
            algo.append(("maxBytes", p.max_bytes))
    lines = [f"<algo {_attrs(algo)}>"]
    for gpu in p.gpus:
        gattrs = _attrs(
            [("id", gpu.id), ("i_chunks", gpu.i_chunks), ("o_chunks", gpu.o_chunks), ("s_chunks", gpu.s_chunks)]
        )
        if not gpu.tbs:
            lines.append(f"  <gpu {gattrs}/>")
            continue
        lines.append(f"  <gpu {gattrs}>")
        for tb in gpu.tbs:
            tattrs = _attrs([("id", tb.id), ("send", tb.send), ("recv", tb.recv), ("chan", tb.chan)])
            if not tb.steps:
                lines.append(f"    <tb {tattrs}/>")
                continue
            lines.append(f"    <tb {tattrs}>")
            for st in tb.steps:
                sattrs = _attrs([
                    ("s", st.s), ("type", st.type), ("srcbuf", st.srcbuf), ("srcoff", st.srcoff),
                    ("dstbuf", st.dstbuf), ("dstoff", st.dstoff), ("cnt", st.cnt), ("depid", st.depid),
                    ("deps", st.deps), ("hasdep", _b(st.hasdep)),
                ])  # fmt: skip
                lines.append(f"      <step {sattrs}/>")
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def save_program(program: Program, path: str | os.PathLike, dialect: str = "executor") -> None:
    """write_program, written atomically."""
    atomic_write_text(path, write_program(program, dialect))


# --------------------------------------------------------------------------------------------------------------
# Executor limits and structural rules


def check_limits(program: Program) -> list[str]:
    """What the executor would refuse or mis-run that is not about one attribute's value, one line each.

    Limits (msccl_struct.h): at most 64 steps per threadblock, 32 channels, cnt below 72, 32 threadblocks
    sending (receiving) per channel on one GPU. Structure (for programs built in code; the parser enforces the
    same): gpu ids 0..ngpus-1 in order, tb ids 0..n-1 in order, s = position, chan < nchannels, peers valid.
    Executor rules (msccl_parser.cc): a sending step needs send != -1, a receiving one recv != -1; a nop is not
    stored, so a nop without a dependency shifts the numbering of later steps, its hasdep never signals, its
    dependency is carried by the next non-nop step, which must itself have a dependency, and the dependencies
    of trailing nops are dropped. One NCCL connection per (peer, channel): two threadblocks of one GPU sending
    to (receiving from) the same peer on the same channel would share a FIFO.
    """
    p = program
    out: list[str] = []
    if p.nchannels > MAX_CHANNELS:
        out.append(f"nchannels={p.nchannels} exceeds the executor's {MAX_CHANNELS} channels")
    if p.ngpus != len(p.gpus):
        out.append(f"ngpus={p.ngpus} but the program has {len(p.gpus)} gpus")
    for gpos, gpu in enumerate(p.gpus):
        g = gpu.id
        if gpu.id != gpos:
            out.append(f"gpu at position {gpos} has id {gpu.id} (gpu ids must be 0..ngpus-1 in order)")
        senders: dict[tuple[int, int], list[int]] = defaultdict(list)
        receivers: dict[tuple[int, int], list[int]] = defaultdict(list)
        for tpos, tb in enumerate(gpu.tbs):
            where = f"gpu {g} tb {tb.id}"
            if tb.id != tpos:
                out.append(f"gpu {g}: tb at position {tpos} has id {tb.id} (tb ids must be 0..n-1 in order)")
            if len(tb.steps) > MAX_STEPS_PER_THREADBLOCK:
                out.append(
                    f"{where}: {len(tb.steps)} steps, the executor allows at most {MAX_STEPS_PER_THREADBLOCK} "
                    "per threadblock"
                )
            if not 0 <= tb.chan < p.nchannels:
                out.append(f"{where}: channel {tb.chan} is not in 0..nchannels-1 (nchannels={p.nchannels})")
            for attr, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer < -1 or peer >= p.ngpus or peer == g:
                    out.append(f"{where}: {attr} peer {peer} is not -1 or another gpu")
            if tb.send >= 0:
                senders[(tb.send, tb.chan)].append(tb.id)
            if tb.recv >= 0:
                receivers[(tb.recv, tb.chan)].append(tb.id)
            pending_nop_deps = False
            for spos, st in enumerate(tb.steps):
                at = f"{where} step {spos} ({st.type})"
                if st.s != spos:
                    out.append(f"{at}: s={st.s}, steps must be numbered by position")
                if st.cnt >= MAX_STEP_COUNT:
                    out.append(f"{at}: cnt={st.cnt}, the executor needs cnt below {MAX_STEP_COUNT}")
                if st.cnt < 0:
                    out.append(f"{at}: cnt={st.cnt} is negative")
                if st.type in SENDING_STEPS and tb.send == -1:
                    out.append(f"{at}: sends but the threadblock has send=-1")
                if st.type in RECEIVING_STEPS and tb.recv == -1:
                    out.append(f"{at}: receives but the threadblock has recv=-1")
                if st.type == "nop":
                    if st.depid < 0:
                        out.append(
                            f"{at}: nop without a dependency; the executor drops it and numbers the later steps "
                            "one lower"
                        )
                    else:
                        pending_nop_deps = True
                    if st.hasdep:
                        out.append(f"{at}: nop with hasdep=1; the executor does not store nops, so it never signals")
                elif pending_nop_deps:
                    if st.depid < 0:
                        out.append(
                            f"{at}: follows nop dependencies but has no dependency itself; the executor rejects this"
                        )
                    pending_nop_deps = False
            if pending_nop_deps:
                out.append(f"{where}: ends with nop dependencies that the executor drops (no step after them)")
        for kind, table in (("send to", senders), ("receive from", receivers)):
            per_channel: dict[int, int] = defaultdict(int)
            for (peer, chan), tbs in sorted(table.items()):
                per_channel[chan] += len(tbs)
                if len(tbs) > 1:
                    out.append(
                        f"gpu {g}: tbs {', '.join(map(str, tbs))} all {kind} gpu {peer} on channel {chan}; "
                        f"one connection per (peer, channel) allows one threadblock"
                    )
            for chan, count in sorted(per_channel.items()):
                if count > MAX_TBS_PER_CHANNEL:
                    out.append(
                        f"gpu {g}: {count} threadblocks {kind} peers on channel {chan}, at most {MAX_TBS_PER_CHANNEL}"
                    )
    return out
