"""Topologies: presets, generators, composition, TACCL import, round trips and semantic checks."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import reference
from mlopt.errors import InputError
from mlopt.formats.importers.taccl import chunk_bytes_from_name, import_taccl_sketch, import_taccl_topology
from mlopt.formats.io import canonical_json, read_document
from mlopt.formats.loaders import TopologyOptions, resolve_topology
from mlopt.formats.topology import HYBRID_CUBE_MESH_LANES, Link, Topology, from_spec


def degree(topo: Topology) -> Counter:
    return Counter(l.src for l in topo.links)


def test_ndv2_is_hybrid_cube_mesh_with_double_and_single_nvlinks():
    topo = from_spec("ndv2")
    assert topo.num_ranks == 8 and topo.num_nodes == 1
    links = topo.link_map()
    assert len(links) == 32  # 4 neighbours per GPU, directed
    for a in range(8):
        lanes = sum(l.lanes for l in topo.links if l.src == a)
        assert lanes == 6, "every V100 has 6 NVLink lanes"
    assert links[(0, 1)].lanes == 2 and links[(0, 1)].beta_us_per_MB == pytest.approx(23.0)
    assert links[(0, 2)].lanes == 1 and links[(0, 2)].beta_us_per_MB == pytest.approx(46.0)
    assert links[(0, 1)].alpha_us == pytest.approx(0.7)
    assert (0, 5) not in links and (0, 6) not in links, "no PCIe peer-to-peer links on NDv2"
    assert all(links[(b, a)].lanes == l.lanes for (a, b), l in links.items()), "links are symmetric"
    assert len(topo.nics) == 1 and topo.nics[0].ranks == tuple(range(8))


def test_ndv2x2_joins_nodes_through_one_shared_nic_each():
    topo = from_spec("ndv2x2")
    assert topo.num_ranks == 16 and [n.ranks for n in topo.nodes] == [tuple(range(8)), tuple(range(8, 16))]
    ib = [l for l in topo.links if l.link_class == "ib"]
    assert len(ib) == 2 * 8 * 8
    assert all(l.alpha_us == pytest.approx(1.7) and l.beta_us_per_MB == pytest.approx(106.0) for l in ib)
    assert {l.src_nic for l in ib if l.src < 8} == {"node0/nic0"}
    assert {l.dst_nic for l in ib if l.dst >= 8} == {"node1/nic0"}
    assert len(topo.links) == 2 * 32 + 128


def test_dgx2_switch_and_nic_pairs():
    topo = from_spec("dgx2x4")
    assert topo.num_ranks == 64 and topo.num_nodes == 4
    nvswitch = [s for s in topo.switches if s.kind == "nvswitch"]
    assert len(nvswitch) == 4 and all(len(s.ranks) == 16 for s in nvswitch)
    assert all(s.port_beta_us_per_MB == pytest.approx(8.0) for s in nvswitch)
    assert len(topo.nics) == 32
    assert topo.nics[0].ranks == (0, 1) and topo.nics[9].ranks == (18, 19)
    intra = [l for l in topo.links if l.link_class == "nvswitch"]
    assert len(intra) == 4 * 16 * 15
    assert len(topo.links) == len(intra) + 64 * 48


@pytest.mark.parametrize("name, nvswitch_GBps, nic_GBps", [("dgx-a100", 300, 25), ("dgx-h100", 450, 50)])
def test_nvswitch_generations(name, nvswitch_GBps, nic_GBps):
    topo = from_spec(name + "x2")
    link = topo.link_map()[(0, 1)]
    assert link.bandwidth_GBps == pytest.approx(nvswitch_GBps)
    assert topo.link_map()[(0, 8)].bandwidth_GBps == pytest.approx(nic_GBps)
    assert all(len(n.ranks) == 1 for n in topo.nics)


def test_dgx1_is_an_alias_of_ndv2():
    assert from_spec("dgx1").links == from_spec("ndv2").links


@pytest.mark.parametrize(
    "spec, ranks, links, deg",
    [
        ("ring:4", 4, 8, 2),
        ("ring:2", 2, 2, 1),
        ("fully-connected:5", 5, 20, 4),
        ("switch:4", 4, 12, 3),
        ("torus:4x4", 16, 64, 4),
        ("torus:2x2x2", 8, 24, 3),
        ("torus:3x4x5", 60, 360, 6),
    ],
)
def test_generators(spec, ranks, links, deg):
    topo = from_spec(spec)
    assert topo.num_ranks == ranks and len(topo.links) == links
    assert set(degree(topo).values()) == {deg}


def test_torus_neighbours_wrap_around():
    links = from_spec("torus:4x4").link_map()
    assert (0, 3) in links and (0, 12) in links and (0, 5) not in links


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("ndv3", "unknown topology preset"),
        ("ring:1", "at least 2"),
        ("ring:x", "positive integer"),
        ("torus:4x0", "positive integer"),
        ("mesh:4", "unknown generator"),
        ("ndv2x0", "node count must be a positive integer"),
    ],
)
def test_bad_specs(spec, fragment):
    with pytest.raises(InputError) as info:
        from_spec(spec)
    assert fragment in str(info.value) and info.value.file == spec


@pytest.mark.parametrize("spec", ["ndv2x2", "dgx2x2", "dgx-h100x2", "ring:8", "torus:2x3", "switch:3"])
def test_round_trip_is_exact_and_canonical(spec):
    topo = from_spec(spec)
    again = Topology.from_dict(topo.to_dict())
    assert again == topo
    assert canonical_json(again.to_dict()) == canonical_json(topo.to_dict())


def test_a_call_overhead_round_trips_and_is_written_only_when_set():
    from dataclasses import replace

    plain = from_spec("ring:3")
    assert "call_overhead_us" not in plain.to_dict()  # files without one stay as they were
    profiled = replace(plain, call_overhead_us=42.5, reduce_GBps=7.5)
    assert profiled.to_dict()["call_overhead_us"] == 42.5 and profiled.to_dict()["reduce_GBps"] == 7.5
    assert Topology.from_dict(profiled.to_dict()) == profiled


def _topo_dict(**changes):
    d = from_spec("ring:3").to_dict()
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "mutate, field, fragment",
    [
        (lambda d: d["links"].append({**d["links"][0], "dst": 7}), "$.links[6].dst", "unknown rank 7"),
        (lambda d: d["links"].append({**d["links"][0]}), "$.links[6]", "second link"),
        (lambda d: d["links"][0].update(dst=d["links"][0]["src"]), "$.links[0].dst", "to itself"),
        (lambda d: d["links"][0].update(switch="sw9"), "$.links[0].switch", "unknown switch"),
        (lambda d: d["links"][0].update(alpha_us=-1), "$.links[0].alpha_us", ">= 0"),
        (lambda d: d["links"][0].pop("beta_us_per_MB"), "$.links[0].beta_us_per_MB", "missing"),
        (lambda d: d["nodes"][0].update(ranks=[0, 1, 1]), "$.nodes[0].ranks[2]", "already"),
        (lambda d: d["nodes"][0].update(ranks=[0, 2, 3]), "$.nodes", "missing [1]"),
        (lambda d: d.update(call_overhead_us=-3), "$.call_overhead_us", ">= 0"),
        (lambda d: d.update(reduce_GBps=0), "$.reduce_GBps", "> 0"),
    ],
)
def test_semantic_and_schema_errors_name_the_field(mutate, field, fragment):
    d = _topo_dict()
    mutate(d)
    with pytest.raises(InputError) as info:
        Topology.from_dict(d, "t.json")
    assert info.value.field == field and fragment in info.value.message and info.value.file == "t.json"


# --- TACCL ------------------------------------------------------------------------------------------------


def test_taccl_ndv2_profile_matches_tacccl_matrix_and_units():
    path = reference("taccl", "taccl_topo-ndv2-1MB.json")
    topo = import_taccl_topology(read_document(path), str(path), num_nodes=2)
    links = topo.link_map()
    assert topo.num_ranks == 16
    # TACCL's NDv2 file: alpha 0.3, node_betas_list [23, 46] (double, single NVLink) for 1 MB chunks.
    for a in range(8):
        for b in range(8):
            lanes = HYBRID_CUBE_MESH_LANES[a][b]
            if lanes:
                assert links[(a, b)].beta_us_per_MB == pytest.approx({2: 23.0, 1: 46.0}[lanes])
                assert links[(a, b)].alpha_us == pytest.approx(0.3)
            else:
                assert (a, b) not in links
    assert links[(3, 12)].alpha_us == pytest.approx(2.6) and links[(3, 12)].beta_us_per_MB == pytest.approx(105.0)
    # Same connectivity as our ndv2 preset.
    assert {(l.src, l.dst, l.lanes) for l in topo.links} == {(l.src, l.dst, l.lanes) for l in from_spec("ndv2x2").links}


def test_taccl_dgx2_profile_scaled_units():
    path = reference("taccl", "taccl_topo-dgx2-1KB.json")
    topo = resolve_topology(str(path), TopologyOptions(nodes=2, time_unit_us=0.01))
    # 1 KB chunks, costs in units of 0.01 us: alpha 30 -> 0.3 us; beta 1 per KB -> 10 us/MB;
    # remote alpha 260 -> 2.6 us; remote beta 10.25 per KB -> 102.5 us/MB.
    link = topo.link_map()[(0, 1)]
    assert link.alpha_us == pytest.approx(0.3) and link.beta_us_per_MB == pytest.approx(10.0)
    remote = topo.link_map()[(0, 16)]
    assert remote.alpha_us == pytest.approx(2.6) and remote.beta_us_per_MB == pytest.approx(102.5)
    assert len(topo.nics) == 16 and topo.nics[0].ranks == (0, 1)
    assert topo.source["chunk_bytes"] == 1000.0


def test_taccl_profile_errors():
    with pytest.raises(InputError, match=r"\$\.node_betas_list"):
        import_taccl_topology({"name": "NDv2_1MB", "gpus_per_node": 8, "alpha": 1, "node_betas_list": [1],
                               "remote_alpha": 1, "remote_beta": 1}, "x.json")
    with pytest.raises(InputError, match="chunk size unknown"):
        import_taccl_topology({"name": "NDv2", "gpus_per_node": 8, "alpha": 1, "node_betas_list": [1, 2],
                               "remote_alpha": 1, "remote_beta": 1}, "x.json")
    with pytest.raises(InputError, match="unknown TACCL base topology"):
        import_taccl_topology({"name": "Foo_1MB", "gpus_per_node": 4, "alpha": 1,
                               "remote_alpha": 1, "remote_beta": 1}, "x.json")
    assert chunk_bytes_from_name("NDv2_32KB") == 32000.0 and chunk_bytes_from_name("x") is None


def test_taccl_sketches_load():
    sk1 = import_taccl_sketch(read_document(reference("taccl", "taccl_sketch_sk1-dgx2-n2.json")), "sk1")
    assert sk1.nnodes == 2 and sk1.intranode_strategy == "switch"
    assert sk1.switches == (tuple(range(16)),) and sk1.switch_hyperedge_strategy == ("uc-min",)
    assert sk1.internode_conn == {k: (k - 1,) for k in range(1, 16, 2)}
    assert sk1.gpus_to_sender_rev_map[15] == (14, 15) and sk1.enforce_ordering
    assert sk1.symmetry_offsets == ((2, 16), (16, 32)) and sk1.input_chunkup == 2
    sk2 = import_taccl_sketch(read_document(reference("taccl", "taccl_sketch_sk2-ndv2-n2.json")), "sk2")
    assert sk2.internode_conn == "fully-connected" and sk2.intranode_strategy == "none"
    assert sk2.symmetry_offsets == ((8, 16),)


def test_sketch_errors_name_the_field():
    with pytest.raises(InputError) as info:
        import_taccl_sketch({"nnodes": 2, "intranode_sketch": {"strategy": "switch", "switches": [[0, 1]],
                                                               "switch_hyperedge_strategy": ["uc-mid"]}}, "s.json")
    assert info.value.field == "$.intranode_sketch.switch_hyperedge_strategy[0]"


def test_link_time_is_alpha_plus_beta_times_megabytes():
    link = Link(0, 1, alpha_us=0.7, beta_us_per_MB=46.0, link_class="nvlink")
    assert link.time_us(2e6) == pytest.approx(0.7 + 92.0)
    assert link.bandwidth_GBps == pytest.approx(1000 / 46)
