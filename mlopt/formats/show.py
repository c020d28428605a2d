"""`mlopt show`: human-readable tables of topologies, traces, sketches and plans (rich)."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter, defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from mlopt.formats.loaders import Loaded
from mlopt.formats.topology import Topology
from mlopt.formats.trace import ROLES, ModelTrace

PIPED_WIDTH = 160  # columns when stdout is not a terminal
FULL_LINK_TABLE_MAX = 256  # above this many links, show one row per link class unless --all-links


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def stdout_console() -> Console:
    """Piped output is not cut to 80 columns: a file or a pager gets whole rows."""
    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)


def as_dict(loaded: Loaded) -> Any:
    value = loaded.value
    if loaded.kind in ("topology", "trace"):
        return value.to_dict()
    if loaded.kind == "plan":
        return {"kind": value.kind, "provenance": value.provenance, "payload": value.payload}
    if loaded.kind == "taccl-sketch":
        return value.raw
    if loaded.kind == "msccl":
        return dataclasses.asdict(value)
    return value


def _via(link) -> str:
    if link.src_nic:
        return f"{link.src_nic}>{link.dst_nic}"
    return link.switch or ""



def _brief(value, limit: int = 80) -> str:
    """A source value in one short line: nested records (e.g. a profiled topology's whole fit report, see
    `mlopt profile hardware --json` for it) are summarised by their keys."""
    if isinstance(value, dict):
        text = "{" + ", ".join(map(str, value)) + "}"
    elif isinstance(value, list):
        text = f"[{len(value)} items]"
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

def topology_tables(topo: Topology, all_links: bool = False) -> list[Table]:
    head = Table(title=f"topology {topo.name}", show_header=False)
    head.add_row("ranks", str(topo.num_ranks))
    head.add_row("nodes", ", ".join(f"{n.name}: {n.ranks[0]}-{n.ranks[-1]}" for n in topo.nodes))
    head.add_row("source", ", ".join(f"{k}={_brief(v)}" for k, v in topo.source.items() if k != "description"))
    if "description" in topo.source:
        head.add_row("description", topo.source["description"])
    tables = [head]

    classes: dict[tuple, list] = defaultdict(list)
    for link in topo.links:
        classes[(link.link_class, link.lanes, link.alpha_us, link.beta_us_per_MB)].append(link)
    summary = Table("class", "lanes", "links", "alpha_us", "beta_us_per_MB", "GBps", title="link classes")
    for (cls, lanes, alpha, beta), links in sorted(classes.items()):
        summary.add_row(cls, str(lanes), str(len(links)), _num(alpha), _num(beta), _num(1000 / beta))
    tables.append(summary)

    if all_links or len(topo.links) <= FULL_LINK_TABLE_MAX:
        links = Table("src", "dst", "class", "lanes", "alpha_us", "beta_us_per_MB", "GBps", "via", title="links")
        for l in topo.links:
            links.add_row(str(l.src), str(l.dst), l.link_class, str(l.lanes), _num(l.alpha_us),
                          _num(l.beta_us_per_MB), _num(l.bandwidth_GBps), _via(l))
        tables.append(links)
    if topo.switches:
        sw = Table("switch", "kind", "ranks", "alpha_us", "port_beta_us_per_MB", "port GBps", title="switches")
        for s in topo.switches:
            sw.add_row(s.name, s.kind, str(len(s.ranks)), _num(s.alpha_us), _num(s.port_beta_us_per_MB),
                       _num(1000 / s.port_beta_us_per_MB))
        tables.append(sw)
    if topo.nics:
        nics = Table("nic", "node", "shared by ranks", "alpha_us", "beta_us_per_MB", "GBps", title="NICs")
        for n in topo.nics:
            nics.add_row(n.name, n.node, ",".join(map(str, n.ranks)), _num(n.alpha_us), _num(n.beta_us_per_MB),
                         _num(1000 / n.beta_us_per_MB))
        tables.append(nics)
    return tables


def trace_tables(trace: ModelTrace) -> list[Table]:
    head = Table(title=f"trace {trace.name}", show_header=False)
    head.add_row("rank / world", f"{trace.rank} / {trace.world_size}")
    head.add_row("source", ", ".join(f"{k}={v}" for k, v in trace.source.items() if k != "inputs"))
    roles = Table("role", "ops", "compute_us", "timed ops", title="ops by role")
    for role in ROLES:
        ops = trace.ops_by_role(role)
        if ops:
            timed = [op.compute_us for op in ops if op.compute_us is not None]
            roles.add_row(role, str(len(ops)), _num(sum(timed), 6), f"{len(timed)}/{len(ops)}")
    kinds = Table("tensor kind", "count", "bytes", title="tensors")
    by_kind: dict[str, list[int]] = defaultdict(list)
    for t in trace.tensors:
        by_kind[t.kind].append(t.bytes)
    for kind, sizes in sorted(by_kind.items()):
        kinds.add_row(kind, str(len(sizes)), _bytes(sum(sizes)))
    names = Table("op", "count", title="most frequent ops")
    for name, count in Counter(op.name for op in trace.ops).most_common(12):
        names.add_row(name, str(count))
    tables = [head, roles, kinds, names]
    comm = [op for op in trace.ops if op.comm is not None]
    if comm:
        ct = Table("op", "name", "collective", "bytes", "group", title="communication")
        for op in comm:
            ct.add_row(str(op.id), op.name, op.comm.collective, _bytes(op.comm.bytes), op.comm.group)
        tables.append(ct)
    return tables


def plan_tables(loaded: Loaded) -> list[Table]:
    plan = loaded.value
    prov = plan.provenance
    head = Table(title=f"{plan.kind} plan {loaded.source}", show_header=False)
    for key in ("status", "objective", "best_bound", "gap", "wall_time_s"):
        if key in prov:
            head.add_row(key, str(prov[key]))
    head.add_row("solver", f"{prov['solver']['name']} {prov['solver']['version']}")
    head.add_row("mlopt", prov["mlopt_version"])
    for name, digest in prov["inputs"].items():
        head.add_row(f"input {name}", digest[:16])
    head.add_row("payload", ", ".join(sorted(plan.payload)))
    return [head]


def index_tables(loaded: Loaded) -> list[Table]:
    table = Table("kind", "status", "file / reason", title=f"plan index {loaded.source}")
    for p in loaded.value["plans"]:
        table.add_row(p["kind"], p["status"], p["file"])
    for s in loaded.value["skipped"]:
        table.add_row(s["kind"], "skipped", s["reason"])
    return [table]


def msccl_tables(loaded: Loaded) -> list[Table]:
    program = loaded.value
    head = Table(title=f"MSCCL-EF program {loaded.source}", show_header=False)
    head.add_row("name / collective", f"{program.name} / {program.coll}")
    head.add_row("ranks, channels, protocol", f"{program.ngpus}, {program.nchannels}, {program.proto}")
    head.add_row("chunks per loop", str(program.nchunksperloop))
    head.add_row("in place / out of place", f"{int(program.inplace)} / {int(program.outofplace)}")
    head.add_row("bytes", f"{program.min_bytes}..{program.max_bytes}")
    gpus = Table("gpu", "i/o/s chunks", "threadblocks", "steps", "step types", title="per GPU")
    for gpu in program.gpus:
        types = Counter(step.type for tb in gpu.tbs for step in tb.steps)
        gpus.add_row(str(gpu.id), f"{gpu.i_chunks}/{gpu.o_chunks}/{gpu.s_chunks}", str(len(gpu.tbs)),
                     str(sum(types.values())), " ".join(f"{t}:{n}" for t, n in sorted(types.items())))
    return [head, gpus]


def sketch_tables(loaded: Loaded) -> list[Table]:
    sk = loaded.value
    table = Table(title=f"TACCL sketch {loaded.source}", show_header=False)
    table.add_row("nodes", str(sk.nnodes))
    table.add_row("intranode", f"{sk.intranode_strategy} switches={len(sk.switches)} {','.join(sk.switch_hyperedge_strategy)}")
    table.add_row("internode", f"{sk.internode_strategy} conn={sk.internode_conn}")
    table.add_row("symmetry", str(list(sk.symmetry_offsets)))
    table.add_row("input_chunkup", str(sk.input_chunkup))
    return [table]


def render(loaded: Loaded, all_links: bool = False, console: Console | None = None) -> None:
    console = console or stdout_console()
    footer = ""
    if loaded.kind == "topology":
        tables = topology_tables(loaded.value, all_links)
        if not all_links and len(loaded.value.links) > FULL_LINK_TABLE_MAX:
            footer = f"({len(loaded.value.links)} links: --all-links lists each)"
    elif loaded.kind == "trace":
        tables = trace_tables(loaded.value)
    elif loaded.kind == "plan":
        tables = plan_tables(loaded)
    elif loaded.kind == "plan-index":
        tables = index_tables(loaded)
    elif loaded.kind == "msccl":
        tables = msccl_tables(loaded)
    else:
        tables = sketch_tables(loaded)
    for table in tables:
        console.print(table)
    if footer:
        console.print(footer)
