"""Reading and writing MSCCL-EF XML: the algorithm files the MSCCL executor loads.

Two dialects:

executor (the default; Azure/msccl-executor-nccl src/misc/msccl/msccl_parser.cc, also RCCL's copy) reads
every attribute below and fails without any of them::

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

What the real parsers ignore is ignored here too, and recorded in `Program.origin.ignored`: they look
attributes up by name, so any other attribute (RCCL's `maxcount`, `nthreadblocks`, ...) is ignored; they walk
child elements by name, so an unknown element (TE-CCL's `<copy i_off o_off>` inside `<gpu>`) is skipped with
everything inside it. Refused although the executor would read on (it would mis-read or silently drop):
a known element in the wrong place (`<step>` inside `<gpu>`), elements inside `<step>` (the executor's parser
has no handler there and crashes), a required attribute after the first 16 of its element (the executor keeps
16), numbers that are not plain decimal integers or do not fit an int (strtol would read "0x10", "1.5" or
"abc" as something else), flags other than 0/1. minBytes/maxBytes are int64 read by strtoll, which saturates:
so does this loader (maxBytes="99999999999999999999" is 2**63-1). Collectives the executor runs but mlopt does
not model (send, recv, gather, scatter, alltoallv) are refused with status "unsupported".

`dialect="auto"` reads a file as legacy when its algo element lacks one of outofplace/minBytes/maxBytes,
spells `reduce_scatter`, or carries a legacy-only attribute; otherwise as the executor dialect.

Structural rules checked while parsing (in both dialects): gpu ids are 0..ngpus-1, each once; tb ids are
0..n-1 on each gpu; steps are numbered by position (`s` = index in the threadblock); every `chan` is below
`nchannels`; peers are -1 or another gpu. Program.gpus and Gpu.tbs come out sorted by id. Executor limits
are listed by `check_limits`; the whole input contract after parsing (the same as the C++ loader's, first
problem first) is mlopt.formats.msccl_contract.check_contract (docs/input-contract.md).

Errors are InputError(file, location, message, status) with an XPath-like location and the line, e.g.
`algo/gpu[@id=3]/tb[@id=1]/step[@s=4]@dstoff (line 57)`, and the status the C++ loader gives the same file
(runtime/src/msccl_xml.cpp): "parse" (malformed XML), "schema" (a missing, mistyped or misplaced attribute or
element), "semantic" (ids, peers, channels, numbering), "unsupported".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from xml.parsers import expat

from mlopt.errors import InputError
from mlopt.formats.io import atomic_write_text, read_bytes
from mlopt.formats.msccl import (
    BUFFERS,
    COLLECTIVES,
    PROTOCOLS,
    STEP_TYPES,
    Gpu,
    Origin,
    Program,
    Step,
    Threadblock,
)
from mlopt.formats.msccl_contract import MAX_TBS_PER_CHANNEL, label, limit_problems  # noqa: F401 (re-exported)

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

# What the real parsers read (see module docstring).
UNSUPPORTED_COLLECTIVES = ("send", "recv", "gather", "scatter", "alltoallv")  # the executor runs them, mlopt not
CHILD_ELEMENT = {"algo": "gpu", "gpu": "tb", "tb": "step"}  # the one element each level reads; <step>: none
MAX_ATTRIBUTES = 16  # MSCCL_MAX_ATTR_COUNT (RCCL msccl_parser.h; NCCL xml.h): the parser keeps the first 16
MAX_DEPTH = 256  # elements nested deeper are refused (as the C++ parser does, runtime/src/xml.hpp)
INT32 = (-(1 << 31), (1 << 31) - 1)  # strtol into an int
INT64 = (-(1 << 63), (1 << 63) - 1)  # strtoll, which saturates

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
        return InputError(source, where, f"malformed XML: {message}", "parse")

    def start(tag: str, attrs: dict[str, str]) -> None:
        if len(stack) >= MAX_DEPTH:
            raise fail(parser.CurrentLineNumber, parser.CurrentColumnNumber + 1,
                       f"elements nested deeper than {MAX_DEPTH}")
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
        raise InputError(source, "(line 1)", "malformed XML: no root element", "parse")
    return root[0]


# --------------------------------------------------------------------------------------------------------------
# Parsing


class _Reader:
    def __init__(self, source: str, dialect: str):
        self.source = source
        self.dialect = dialect
        self.ignored: dict[str, None] = {}  # what the executor would ignore, in order, each once
        self.lines: dict[tuple[int, ...], int] = {}

    def error(self, node: _Node, attr: str | None, message: str, status: str = "schema") -> InputError:
        location = node.path + (f"@{attr}" if attr else "") + f" (line {node.line})"
        return InputError(self.source, location, message, status)

    def structure_error(self, node: _Node, attr: str | None, message: str) -> InputError:
        return self.error(node, attr, message, "semantic")

    def check_attrs(self, node: _Node, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        """Required attributes among the first MAX_ATTRIBUTES (all the executor keeps); any attribute neither
        required nor optional is ignored, as the executor looks attributes up by name."""
        kept = list(node.attrs)[:MAX_ATTRIBUTES]
        for name in required:
            if name in kept:
                continue
            if name in node.attrs:
                raise self.error(node, name, f"attribute {name!r} comes after the first {MAX_ATTRIBUTES} attributes "
                                             f"of <{node.tag}>, the only ones the executor reads")
            raise self.error(node, name, f"missing attribute {name!r} ({self.dialect} dialect)")
        for name in node.attrs:
            if name not in required and name not in optional:
                self.ignored.setdefault(f"{node.tag}@{name}")

    def int_attr(self, node: _Node, name: str, minimum: int | None = None, bits: int = 32) -> int:
        """A plain decimal integer that fits an int (bits=32: the executor's strtol into an int) or saturated to
        int64 (bits=64: its strtoll), then at least `minimum`."""
        raw = node.attrs[name]
        if not _INT.match(raw):
            raise self.error(node, name, f"{raw!r} is not an integer")
        low, high = INT32 if bits == 32 else INT64
        value = _bounded_int(raw, low, high)
        if value is None:
            raise self.error(node, name, f"{_canonical(raw)} is out of range for a 32-bit integer (the executor "
                                         "reads it as an int)")
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

    def children(self, node: _Node, key: str) -> list[_Node]:
        """The children the executor reads (CHILD_ELEMENT), each labelled by `key`; unknown elements are skipped
        with their content, as the executor does; a known element in the wrong place is an error (the executor
        would drop it silently), and so is any element inside <step> (the executor's parser crashes there)."""
        tag = CHILD_ELEMENT.get(node.tag)
        out = []
        for position, child in enumerate(node.children):
            child.path = f"{node.path}/{_label(child, key, position)}"
            if child.tag == tag:
                out.append(child)
            elif tag is None:
                raise self.error(child, None, f"unexpected element <{child.tag}> inside <{node.tag}> (the executor "
                                              f"cannot read elements inside <{node.tag}>)")
            elif child.tag in CHILD_ELEMENT or child.tag == "step":
                raise self.error(child, None, f"unexpected element <{child.tag}> inside <{node.tag}> "
                                              f"(expected <{tag}>; the executor would skip it)")
            else:
                self.ignored.setdefault(f"{node.tag}/{child.tag}")
        return out


def _canonical(raw: str) -> str:
    """What int(raw) prints, for a plain integer of any length."""
    negative = raw.startswith("-")
    digits = raw.lstrip("-").lstrip("0") or "0"
    return ("-" if negative and digits != "0" else "") + digits


def _bounded_int(raw: str, low: int, high: int) -> int | None:
    """The value of a plain integer within [low, high]; None outside for 32 bits, saturated for 64 bits."""
    text = _canonical(raw)
    if len(text.lstrip("-")) > 20:  # beyond int64 either way (and int() of a huge string is slow or refused)
        value = low - 1 if text.startswith("-") else high + 1
    else:
        value = int(text)
    if low <= value <= high:
        return value
    if (low, high) == INT64:
        return max(low, min(high, value))
    return None


def _label(node: _Node, key: str, position: int) -> str:
    raw = node.attrs.get(key)
    if raw is not None and _INT.match(raw):
        return f"{node.tag}[@{key}={_canonical(raw)}]"
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
    """An MSCCL-EF XML document as a Program; InputError (with location, line and status) when it is not valid."""
    if dialect not in ("auto",) + DIALECTS:
        raise ValueError(f"unknown MSCCL XML dialect {dialect!r} (expected auto, executor or legacy)")
    root = _parse_tree(text, source)
    root.path = root.tag
    if dialect == "auto":
        dialect = _detect(root)
    r = _Reader(source, dialect)
    if root.tag != "algo":
        raise r.error(root, None, f"root element is <{root.tag}>, expected <algo>")
    header = _parse_algo(r, root)
    r.lines[()] = root.line
    gpus = _parse_gpus(r, root, header["ngpus"], header["nchannels"])
    origin = Origin(source, r.lines, tuple(r.ignored))
    return Program(**header, gpus=gpus, origin=origin)


def _parse_algo(r: _Reader, root: _Node) -> dict:
    if r.dialect == "executor":
        r.check_attrs(root, ALGO_ATTRS)
    else:
        required = tuple(a for a in ALGO_ATTRS if a not in LEGACY_OPTIONAL_ALGO)
        r.check_attrs(root, required, LEGACY_OPTIONAL_ALGO + LEGACY_IGNORED_ALGO)
    # Read in the C++ loader's order, so that the first bad attribute is the same one.
    header = {
        "name": root.attrs["name"],
        "proto": r.enum_attr(root, "proto", PROTOCOLS, "protocol") if "proto" in root.attrs else LEGACY_DEFAULT_PROTO,
        "nchannels": r.int_attr(root, "nchannels", 1),
        "nchunksperloop": r.int_attr(root, "nchunksperloop", 1),
        "ngpus": r.int_attr(root, "ngpus", 1),
        "coll": _parse_coll(r, root),
        "inplace": r.flag_attr(root, "inplace"),
    }
    header["outofplace"] = r.flag_attr(root, "outofplace") if "outofplace" in root.attrs else not header["inplace"]
    header["min_bytes"] = r.int_attr(root, "minBytes", 0, 64) if "minBytes" in root.attrs else LEGACY_DEFAULT_MIN_BYTES
    header["max_bytes"] = r.int_attr(root, "maxBytes", 0, 64) if "maxBytes" in root.attrs else LEGACY_DEFAULT_MAX_BYTES
    if r.dialect == "legacy" and "redop" in root.attrs:
        r.enum_attr(root, "redop", ("sum", "prod", "max", "min", "nop"), "reduction operator")
    if r.dialect == "legacy" and "nthreads" in root.attrs:
        r.int_attr(root, "nthreads", 0)
    return header


def _parse_coll(r: _Reader, root: _Node) -> str:
    raw = root.attrs["coll"]
    if r.dialect == "legacy" and raw == "reduce_scatter":
        return "reducescatter"
    if raw == "reduce_scatter":
        raise r.error(root, "coll", "'reduce_scatter' is the legacy spelling; the executor dialect wants 'reducescatter'")
    if raw in UNSUPPORTED_COLLECTIVES:
        raise r.error(root, "coll", f"mlopt does not support the collective {raw!r} (the MSCCL executor runs it; "
                                    f"mlopt models {', '.join(COLLECTIVES)})", "unsupported")
    return r.enum_attr(root, "coll", COLLECTIVES, "collective")


def _parse_gpus(r: _Reader, root: _Node, ngpus: int, nchannels: int) -> tuple[Gpu, ...]:
    gpus: dict[int, Gpu] = {}
    for gnode in r.children(root, "id"):
        gpu = _parse_gpu(r, gnode, ngpus, nchannels)
        if gpu.id in gpus:
            raise r.structure_error(gnode, "id", f"duplicate gpu id {gpu.id}")
        gpus[gpu.id] = gpu
    if len(gpus) < ngpus:  # ids are distinct and below ngpus: some are missing; list a few, in O(len(gpus))
        missing = [g for g in range(len(gpus) + 8) if g not in gpus and g < ngpus][:8]
        raise r.structure_error(root, "ngpus", f"ngpus={ngpus} but there is no <gpu> with id "
                                               f"{_ids(missing, ngpus - len(gpus))}")
    return tuple(gpus[g] for g in range(ngpus))


def _ids(shown: list[int], total: int) -> str:
    text = ", ".join(str(v) for v in shown[:8])
    return text + (f" (and {total - 8} more)" if total > 8 else "")


def _parse_gpu(r: _Reader, node: _Node, ngpus: int, nchannels: int) -> Gpu:
    r.check_attrs(node, GPU_ATTRS)
    gid = r.int_attr(node, "id", 0)
    if gid >= ngpus:
        raise r.structure_error(node, "id", f"gpu id {gid} out of range 0..{ngpus - 1} (ngpus={ngpus})")
    i_chunks = r.int_attr(node, "i_chunks", 0)
    o_chunks = r.int_attr(node, "o_chunks", 0)
    s_chunks = r.int_attr(node, "s_chunks", 0)
    tbs: dict[int, Threadblock] = {}
    for tnode in r.children(node, "id"):
        tb = _parse_tb(r, tnode, gid, ngpus, nchannels)
        if tb.id in tbs:
            raise r.structure_error(tnode, "id", f"duplicate tb id {tb.id} on gpu {gid}")
        tbs[tb.id] = tb
    missing = [t for t in range(len(tbs)) if t not in tbs]
    if missing:
        raise r.structure_error(node, None, f"tb ids must be 0..{len(tbs) - 1}; missing {_ids(missing, len(missing))}")
    r.lines[(gid,)] = node.line
    return Gpu(gid, i_chunks, o_chunks, s_chunks, tuple(tbs[t] for t in range(len(tbs))))


def _parse_tb(r: _Reader, node: _Node, gid: int, ngpus: int, nchannels: int) -> Threadblock:
    r.check_attrs(node, TB_ATTRS, LEGACY_IGNORED_TB if r.dialect == "legacy" else ())
    tid = r.int_attr(node, "id", 0)
    peers = {}
    for attr in ("send", "recv"):
        peer = r.int_attr(node, attr, -1)
        if peer >= ngpus:
            raise r.structure_error(node, attr, f"peer {peer} out of range (-1 or 0..{ngpus - 1})")
        if peer == gid:
            raise r.structure_error(node, attr, f"peer {peer} is the gpu itself")
        peers[attr] = peer
    chan = r.int_attr(node, "chan", 0)
    if chan >= nchannels:
        raise r.structure_error(node, "chan", f"channel {chan} is not below nchannels={nchannels}")
    for attr in LEGACY_IGNORED_TB if r.dialect == "legacy" else ():
        if attr in node.attrs:
            r.enum_attr(node, attr, ("p2p", "shm", "nic"), "connection type")
    steps = []
    for position, snode in enumerate(r.children(node, "s")):
        steps.append(_parse_step(r, snode, position))
        r.lines[(gid, tid, position)] = snode.line
    r.lines[(gid, tid)] = node.line
    return Threadblock(tid, peers["send"], peers["recv"], chan, tuple(steps))


def _parse_step(r: _Reader, node: _Node, position: int) -> Step:
    r.check_attrs(node, STEP_ATTRS)
    r.children(node, "")  # none allowed
    s = r.int_attr(node, "s")
    if s != position:
        raise r.structure_error(
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

    Limits (msccl_struct.h): at most 64 steps per threadblock, 32 channels, cnt below 72, buffers of at most
    32768 chunks (16-bit offsets), 32 threadblocks sending (receiving) per channel on one GPU. Structure (for
    programs built in code; the parser enforces the same): gpu ids 0..ngpus-1 in order, tb ids 0..n-1 in order,
    s = position, chan < nchannels, peers valid. Executor rules (msccl_parser.cc): a sending step needs
    send != -1, a receiving one recv != -1; a nop is not stored, so a nop without a dependency shifts the
    numbering of later steps, its hasdep never signals, its dependency is carried by the next non-nop step,
    which must itself have a dependency, and the dependencies of trailing nops are dropped. One NCCL connection
    per (peer, channel): two threadblocks of one GPU sending to (receiving from) the same peer on the same
    channel would share a FIFO. These are groups 1-4 of mlopt.formats.msccl_contract, all problems listed.
    """
    out = []
    for problem in limit_problems(program):
        where = label(program, problem.where)
        out.append(f"{where}: {problem.message}" if where else problem.message)
    return out
