"""Links, switch ports and NICs as shared resources: the one network resource model of mlopt.

A message over the direct link a->b of a topology crosses these resources, in this order (`hop`):

| key                    | kind      | name                          | beta (us per MB)          | crossed by every link that |
|------------------------|-----------|-------------------------------|---------------------------|----------------------------|
| ("link", a, b)         | link      | link a->b                     | link.beta_us_per_MB       | is a->b (all lanes)        |
| ("tx", switch, r)      | switch_tx | switch S port r tx            | switch.port_beta_us_per_MB | goes through S and leaves r |
| ("rx", switch, r)      | switch_rx | switch S port r rx            | switch.port_beta_us_per_MB | goes through S and enters r |
| ("nic_tx", nic)        | nic_tx    | nic N tx                      | nic.beta_us_per_MB        | has src_nic == N           |
| ("nic_rx", nic)        | nic_rx    | nic N rx                      | nic.beta_us_per_MB        | has dst_nic == N           |

A resource's capacity is 1 / beta: `capacity_bytes_per_us` (1e6 / beta, the simulator's unit) or
`capacity_GBps` (1000 / beta, the tree-packing LP's unit); both are computed from the topology's beta, so
resources with the same beta have bit-identical capacities in either unit.

`mlopt.sim.network.NetworkModel` (the simulator) and `mlopt.planners.collective.trees_resources` (the
tree-packing LP and the trees planner's timing) both build on `TopologyResources`. Before they shared it,
the two described the same hardware differently:

* keys: the LP used ("port-out", S, r) / ("port-in", S, r) / ("nic-out", N) / ("nic-in", N), the simulator
  ("tx", S, r) / ("rx", S, r) / ("nic_tx", N) / ("nic_rx", N); both now use the simulator's keys.
* units: the LP GB/s (link.bandwidth_GBps = 1000 / beta), the simulator bytes/us (1e6 / beta).
* scope: the LP builds the resources of the links among a subset of ranks, all at once, in link order
  (sorted by (src, dst)); the simulator builds them lazily per route, in the order routes are asked for,
  and adds one memory resource per rank ("mem", r) for local copies (not a network resource, not here).
* pruning: both drop a resource that can never bind, by the same rule (`never_binds`): its set of links
  is contained in another resource's with no larger capacity. The simulator applies it per route (the
  dropped resource still counts bytes and busy time); the LP applies it to its constraint matrix
  (`trees_resources.dominated`), where an undirected allreduce atom uses two links, so it compares use
  counts per atom rather than link sets (the same rule on the LP's columns).
* contention: the LP is a fluid model (a resource's load summed over trees <= its capacity). The
  simulator's engine shares a resource max-min fairly between the messages crossing it, or, in its FIFO
  mode (`run_tasks_fifo`), serves one message at a time in request order. The trees planner's own list
  scheduler (one message at a time per resource, placed in step order with backfilling, alpha holding
  the resources) was replaced by the FIFO engine: see `trees_schedule.engine_schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlopt.formats.topology import Link, Topology

ResourceKey = tuple


@dataclass(frozen=True)
class Resource:
    """One shared network resource (see the module table)."""

    key: ResourceKey
    name: str
    kind: str  # link, switch_tx, switch_rx, nic_tx, nic_rx
    beta_us_per_MB: float

    @property
    def capacity_bytes_per_us(self) -> float:
        return 1e6 / self.beta_us_per_MB

    @property
    def capacity_GBps(self) -> float:
        return 1000.0 / self.beta_us_per_MB


class TopologyResources:
    """The resources each link of a topology crosses, and which links cross each resource."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self._switches = {s.name: s for s in topology.switches}
        self._nics = {x.name: x for x in topology.nics}
        self._out: dict[int, list[Link]] = {}
        self._in: dict[int, list[Link]] = {}
        for l in topology.links:
            self._out.setdefault(l.src, []).append(l)
            self._in.setdefault(l.dst, []).append(l)
        self._members: dict[ResourceKey, frozenset] = {}

    def hop(self, link: Link) -> tuple[Resource, ...]:
        """Every resource a message over `link` crosses: the link, then the switch ports, then the NICs."""
        src, dst = link.src, link.dst
        parts = [Resource(("link", src, dst), f"link {src}->{dst}", "link", link.beta_us_per_MB)]
        if link.switch is not None:
            sw = self._switches[link.switch]
            parts.append(Resource(("tx", sw.name, src), f"switch {sw.name} port {src} tx", "switch_tx",
                                  sw.port_beta_us_per_MB))
            parts.append(Resource(("rx", sw.name, dst), f"switch {sw.name} port {dst} rx", "switch_rx",
                                  sw.port_beta_us_per_MB))
        if link.src_nic is not None:
            nic = self._nics[link.src_nic]
            parts.append(Resource(("nic_tx", nic.name), f"nic {nic.name} tx", "nic_tx", nic.beta_us_per_MB))
        if link.dst_nic is not None:
            nic = self._nics[link.dst_nic]
            parts.append(Resource(("nic_rx", nic.name), f"nic {nic.name} rx", "nic_rx", nic.beta_us_per_MB))
        return tuple(parts)

    def members(self, key: ResourceKey) -> frozenset:
        """The (src, dst) links whose traffic crosses a resource."""
        got = self._members.get(key)
        if got is None:
            kind = key[0]
            if kind == "link":
                got = frozenset([(key[1], key[2])])
            elif kind == "tx":
                got = frozenset((l.src, l.dst) for l in self._out.get(key[2], ()) if l.switch == key[1])
            elif kind == "rx":
                got = frozenset((l.src, l.dst) for l in self._in.get(key[2], ()) if l.switch == key[1])
            elif kind == "nic_tx":
                got = frozenset((l.src, l.dst) for r in self._nics[key[1]].ranks
                                for l in self._out.get(r, ()) if l.src_nic == key[1])
            elif kind == "nic_rx":
                got = frozenset((l.src, l.dst) for r in self._nics[key[1]].ranks
                                for l in self._in.get(r, ()) if l.dst_nic == key[1])
            else:
                raise ValueError(f"unknown resource key {key!r}")
            self._members[key] = got
        return got

    def binding_mask(self, parts: tuple[Resource, ...]) -> list[bool]:
        """For the resources of one hop: True for those that can bind (see `never_binds`)."""
        members = [self.members(p.key) for p in parts]
        caps = [p.capacity_bytes_per_us for p in parts]
        return [not never_binds(i, members, caps) for i in range(len(parts))]


def never_binds(i: int, members: list[frozenset], capacities: list[float]) -> bool:
    """True when resource i can never be a bottleneck next to the others of its hop: some resource j carries
    every link that i carries (so all of i's traffic) at no larger capacity. Identical resources (same links,
    same capacity) keep the first. Examples: the link of a switched connection whose port is as slow as the
    link; an IB port behind its NIC."""
    for j in range(len(members)):
        if i == j or capacities[j] > capacities[i] or not members[i] <= members[j]:
            continue
        if members[i] == members[j] and capacities[j] == capacities[i] and j > i:
            continue  # identical resources: keep the first
        return True
    return False
