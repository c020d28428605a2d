"""Thread-plan artifacts: DDP bucket caps, NCCL channel counts, the example tuner's CSV, NCCL env."""

from __future__ import annotations

import inspect
import textwrap

import pytest

from mlopt.errors import InputError
from mlopt.planners.threads.artifacts import (
    COLLECTIVES,
    MIB,
    SIZE_MAX,
    TunerRow,
    bucket_bytes_from_cap_mb,
    channel_conflicts,
    choose_nthreads,
    ddp_bucket_bytes_list,
    ddp_bucket_cap_mb_list,
    match_config,
    nccl_env,
    nccl_tuner_csv,
    job_communicators,
    parse_nccl_tuner_csv,
    selected_channels,
    thread_plan_artifacts,
    threads_to_channels,
    tuner_rows,
)

# fusion groups in backward order: bytes per tensor (the last layers' gradients first)
GROUP_TENSORS = [[4 * 1000, 4 * 10], [4 * 250_000, 4 * 250, 4 * 3], [4 * 77_777], [2 * 1_000_001, 4 * 5]]
GROUPS = [sum(t) for t in GROUP_TENSORS]


def assign_by_size(tensor_bytes: list[int], limits: list[int]) -> list[list[int]]:
    """torch's _compute_bucket_assignment_by_size rule for one dtype/device: close the bucket once its bytes
    reach the current limit, then move to the next limit (the last one repeats)."""
    buckets, current, size, li = [], [], 0, 0
    for i, b in enumerate(tensor_bytes):
        current.append(i)
        size += b
        if size >= limits[li]:
            buckets.append(current)
            current, size, li = [], 0, min(li + 1, len(limits) - 1)
    if current:
        buckets.append(current)
    return buckets


def expected_buckets(group_tensors):
    out, i = [], 0
    for tensors in group_tensors:
        out.append(list(range(i, i + len(tensors))))
        i += len(tensors)
    return out


# --- DDP ---------------------------------------------------------------------------------------------------


def test_bucket_caps_are_the_group_sizes_in_mib_exactly():
    caps = ddp_bucket_cap_mb_list(GROUPS)
    assert caps == [g / MIB for g in GROUPS]
    assert bucket_bytes_from_cap_mb(caps) == GROUPS == ddp_bucket_bytes_list(GROUPS)
    flat = [b for t in GROUP_TENSORS for b in t]
    assert assign_by_size(flat, bucket_bytes_from_cap_mb(caps)) == expected_buckets(GROUP_TENSORS)
    # through mlopt's canonical JSON (12 significant digits) the caps still reproduce the groups
    rounded = [float(f"{c:.12g}") for c in caps]
    assert all(g - 1 <= b <= g for g, b in zip(GROUPS, bucket_bytes_from_cap_mb(rounded)))
    assert assign_by_size(flat, bucket_bytes_from_cap_mb(rounded)) == expected_buckets(GROUP_TENSORS)
    # rounding a cap up by more than a byte merges the next group's first tensor into the bucket
    bumped = [int(c * MIB) + 2 for c in caps]
    assert assign_by_size(flat, bumped) != expected_buckets(GROUP_TENSORS)


def test_bucket_caps_reject_empty_groups():
    for bad in ([], [0], [5, -1], [1.5]):
        with pytest.raises(ValueError):
            ddp_bucket_cap_mb_list(bad)


def _torch_dist():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not hasattr(dist, "_compute_bucket_assignment_by_size"):
        pytest.skip("torch.distributed has no _compute_bucket_assignment_by_size")
    return torch, dist


def test_bucket_caps_reproduce_the_groups_in_torch():
    torch, dist = _torch_dist()
    # one dtype (torch buckets each dtype/device separately); tensors in backward order
    tensors = [torch.empty(-(-b // 4), dtype=torch.float32) for group in GROUP_TENSORS for b in group]
    sizes = [t.numel() * t.element_size() for t in tensors]
    groups, i = [], 0
    for group in GROUP_TENSORS:
        groups.append(sum(sizes[i:i + len(group)]))
        i += len(group)
    limits = bucket_bytes_from_cap_mb(ddp_bucket_cap_mb_list(groups))
    assert limits == groups
    for kwargs in ({}, {"tensor_indices": list(range(len(tensors)))}):  # initial build / rebuild call forms
        buckets, per_bucket_limits = dist._compute_bucket_assignment_by_size(
            tensors, limits, [False] * len(tensors), **kwargs)
        assert [list(b) for b in buckets] == expected_buckets(GROUP_TENSORS)
        assert list(per_bucket_limits) == limits


def test_ddp_rebuilt_buckets_equal_the_groups(tmp_path):
    torch, dist = _torch_dist()
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "bucket_cap_mb_list" not in inspect.signature(DDP.__init__).parameters:
        pytest.skip("this torch's DDP has no bucket_cap_mb_list")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    shapes = [(64, 32), (32, 48), (48, 16), (16, 8)]
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in shapes])
    layer_bytes = [(a * b + b) * 4 for a, b in shapes][::-1]  # backward order
    groups = [layer_bytes[0] + layer_bytes[1], layer_bytes[2], layer_bytes[3]]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = DDP(model, bucket_cap_mb_list=ddp_bucket_cap_mb_list(groups))
        x = torch.randn(4, 64)
        for _ in range(3):  # buckets are rebuilt in gradient-ready order after the first iteration
            ddp(x).sum().backward()
        data = ddp._get_ddp_logging_data()
        assert data["has_rebuilt_buckets"] == 1
        assert [int(v) for v in data["rebuilt_bucket_sizes"].split(",")] == groups
    finally:
        dist.destroy_process_group()


# --- channels and NCCL_NTHREADS ---------------------------------------------------------------------------


def test_threads_to_channels():
    assert threads_to_channels(512) == 1
    assert threads_to_channels(513) == 2
    assert threads_to_channels(0) == 1
    assert threads_to_channels(128, 128) == 1
    assert threads_to_channels(4096, 128) == 32
    assert threads_to_channels(8192, 128) == 32  # clamped to MAXCHANNELS
    assert threads_to_channels(8192, 128, max_channels=64) == 64
    for bad in (96, 1024, 0):
        with pytest.raises(ValueError):
            threads_to_channels(512, bad)
    with pytest.raises(ValueError):
        threads_to_channels(-1)


def test_choose_nthreads_represents_every_thread_count_exactly_when_it_can():
    assert choose_nthreads([128, 256, 512, 1024, 2048, 4096]) == 128
    assert choose_nthreads([512, 1024, 2048]) == 512
    assert choose_nthreads([768, 1536]) == 256
    assert choose_nthreads([]) == 512
    n = choose_nthreads([100, 8192])  # nothing is exact: least excess threads
    assert n in (64, 128, 256, 512)


def test_nccl_env():
    assert nccl_env() == {"NCCL_NTHREADS": "512"}
    env = nccl_env(256, "/plans/tuner.conf", "/opt/nccl/libnccl-tuner-example.so", min_channels=4)
    assert env == {"NCCL_NTHREADS": "256", "NCCL_MIN_NCHANNELS": "4", "NCCL_TUNER_CONFIG_FILE": "/plans/tuner.conf",
                   "NCCL_TUNER_PLUGIN": "/opt/nccl/libnccl-tuner-example.so"}
    with pytest.raises(ValueError):
        nccl_env(100)
    with pytest.raises(ValueError):
        nccl_env(256, min_channels=0)


# --- the tuner CSV -----------------------------------------------------------------------------------------


def test_csv_round_trip_and_every_group_gets_its_channels():
    channels = [4, 2, 8, 1]
    rows = tuner_rows(GROUPS, channels)
    text = nccl_tuner_csv(rows, comment="model: test\ngroups: 4")
    assert text.startswith("# ") and text.endswith("\n")
    configs = parse_nccl_tuner_csv(text, "tuner.conf")
    assert [TunerRow(*(c[f] for f in ("collective", "min_bytes", "max_bytes", "algorithm", "protocol",
                                       "channels", "nNodes", "nRanks"))) for c in configs] == rows
    assert all(c["numPipeOps"] == -1 and c["regBuff"] == -1 for c in configs)
    # every non-comment line has exactly 8 fields
    data = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(data) == len(rows) and all(len(line.split(",")) == 8 for line in data)
    assert [c["collective"] for c in configs] == [c for c in COLLECTIVES for _ in GROUPS]
    for collective in COLLECTIVES:
        for size, ch in zip(GROUPS, channels):
            assert match_config(configs, collective, size, 8, 64)["channels"] == ch
        # nearest: contiguous, non-overlapping ranges covering every size
        lines = [c for c in configs if c["collective"] == collective]
        assert lines[0]["min_bytes"] == 0 and lines[-1]["max_bytes"] == SIZE_MAX
        for a, b in zip(lines, lines[1:]):
            assert a["max_bytes"] + 1 == b["min_bytes"]
    ordered = sorted(GROUPS)
    for small, large in zip(ordered, ordered[1:]):  # a size near a group maps to that group
        assert match_config(configs, "allreduce", small + 1, 1, 1)["channels"] == channels[GROUPS.index(small)]
        assert match_config(configs, "allreduce", large - 1, 1, 1)["channels"] == channels[GROUPS.index(large)]
    only_allreduce = parse_nccl_tuner_csv(nccl_tuner_csv(tuner_rows(GROUPS, channels, collectives=["allreduce"])))
    assert match_config(only_allreduce, "allgather", GROUPS[0], 1, 1) is None
    assert selected_channels(only_allreduce, "allgather", GROUPS[0], 1, 1) == 1  # the plugin's default


def test_exact_ranges_same_size_groups_and_fallback_rows():
    groups = [1000, 5000, 1000, 70000]
    channels = [2, 3, 6, 1]
    assert channel_conflicts(groups, channels) == {1000: [2, 6]}
    rows = tuner_rows(groups, channels, match="exact", collectives=["allreduce"], communicators=[(4, 32)],
                      fallback_channels=-1)
    allreduce = [r for r in rows if r.collective == "allreduce"]
    assert [(r.min_bytes, r.max_bytes, r.channels) for r in allreduce] == [
        (1000, 1000, 6), (5000, 5000, 3), (70000, 70000, 1)]  # same size: the larger channel count
    assert {r.collective for r in rows} == {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"}
    configs = parse_nccl_tuner_csv(nccl_tuner_csv(rows))
    assert match_config(configs, "allreduce", 1000, 4, 32)["channels"] == 6
    assert match_config(configs, "allreduce", 1001, 4, 32) is None
    assert match_config(configs, "allreduce", 1000, 2, 32) is None  # nNodes must match
    assert match_config(configs, "broadcast", 123, 4, 32)["channels"] == -1
    assert selected_channels(configs, "broadcast", 123, 4, 32) == 1  # -1 keeps the plugin's 1, not NCCL's


def test_lines_per_communicator_and_their_checks():
    assert job_communicators(16, 8) == [(16, 128)]
    assert job_communicators(16, None) == job_communicators(None, 8) == [(-1, -1)]
    with pytest.raises(ValueError):
        job_communicators(0, 8)
    rows = tuner_rows([100, 1000], [2, 4], collectives=["allreduce", "broadcast"], communicators=[(1, 8), (2, 16)])
    assert [(r.nNodes, r.nRanks, r.collective, r.channels) for r in rows] == [
        (1, 8, "allreduce", 2), (1, 8, "allreduce", 4), (1, 8, "broadcast", 2), (1, 8, "broadcast", 4),
        (2, 16, "allreduce", 2), (2, 16, "allreduce", 4), (2, 16, "broadcast", 2), (2, 16, "broadcast", 4)]
    for bad in ([(4, 2)], [(0, 8)], [], [(1, 1.5)]):
        with pytest.raises(ValueError):
            tuner_rows([100], [1], communicators=bad)
    with pytest.raises(ValueError):
        tuner_rows([100], [1], collectives=["allreduce", "allreduce"])


def test_parser_accepts_what_the_example_plugin_accepts():
    text = textwrap.dedent("""\
        # comment
        allreduce,0,65536,tree,simple,2,1,-1,-1,1

        allreduce, 65537 ,1048576,ring,simple,4,4,32,1,0\r
        allreduce,1048577,4294967295,ring,ll128,-1,-1,-1,4
        broadcast,0,32768,tree,simple,-1,1,-1
        reducescatter,0,18446744073709551615,pat,ll,1,-1,-1
    """)
    configs = parse_nccl_tuner_csv(text)
    assert len(configs) == 5
    assert configs[0]["regBuff"] == 1 and configs[1]["min_bytes"] == 65537 and configs[1]["regBuff"] == 0
    assert configs[2]["numPipeOps"] == 4 and configs[2]["regBuff"] == -1
    assert configs[3]["numPipeOps"] == -1 and configs[4]["max_bytes"] == SIZE_MAX


@pytest.mark.parametrize("line, where, text", [
    ("allreduce,0,100,ring,simple,2,-1", "line 2", "8 to 10"),
    ("allreduce,0,100,ring,simple,2,-1,-1,-1,-1,-1", "line 2", "8 to 10"),
    ("allreduce,0,100,ring,,simple,2,-1,-1", "line 2", "empty field"),
    ("all_reduce,0,100,ring,simple,2,-1,-1", "line 2 collective_type", "not one of"),
    ("allreduce,0,100,rings,simple,2,-1,-1", "line 2 algorithm", "not one of"),
    ("allreduce,0,100,ring,LL,2,-1,-1", "line 2 protocol", "not one of"),
    ("allreduce,0,1e6,ring,simple,2,-1,-1", "line 2 max_bytes", "not an integer"),
    ("allreduce,-5,100,ring,simple,2,-1,-1", "line 2 min_bytes", "out of range"),
    ("allreduce,0,18446744073709551616,ring,simple,2,-1,-1", "line 2 max_bytes", "out of range"),
    ("allreduce,200,100,ring,simple,2,-1,-1", "line 2 max_bytes", "below min_bytes"),
    ("allreduce,0,100,ring,simple,0,-1,-1", "line 2 channels", "out of range"),
    ("allreduce,0,100,ring,simple,2.5,-1,-1", "line 2 channels", "not an integer"),
    ("allreduce,0,100,ring,simple,2,-1,-1,1,2", "line 2 regBuff", "out of range"),
    (" # indented comment is not a comment to the plugin", "line 2", "8 to 10"),
    ("allreduce,0,100,ring,simple,2,-1," + "1" * 250, "line 2", "limit"),
])
def test_parser_rejects_malformed_lines(line, where, text):
    with pytest.raises(InputError) as info:
        parse_nccl_tuner_csv(f"# header\n{line}\n", "tuner.conf")
    assert info.value.file == "tuner.conf"
    assert info.value.field == where
    assert text in info.value.message


def test_writer_rejects_bad_rows():
    for row in [("allreduce", 0, 10, "ring", "simple", 0, -1, -1),
                ("allreduce", 10, 0, "ring", "simple", 1, -1, -1),
                ("gather", 0, 10, "ring", "simple", 1, -1, -1),
                ("allreduce", 0, 10, "ring", "simple", 1, -1)]:
        with pytest.raises(ValueError):
            nccl_tuner_csv([row])


def test_thread_plan_artifacts_bundle():
    threads = [1024, 256, 4096, 128]
    out = thread_plan_artifacts(GROUPS, threads, tuner_config_file="/plans/tuner.conf")
    assert out["nccl_nthreads"] == 128
    assert out["channels"] == [8, 2, 32, 1] and out["threads_effective"] == threads
    assert out["bucket_cap_mb_list"] == ddp_bucket_cap_mb_list(GROUPS)
    assert out["env"] == {"NCCL_NTHREADS": "128", "NCCL_MIN_NCHANNELS": "32",
                          "NCCL_TUNER_CONFIG_FILE": "/plans/tuner.conf"}
    configs = parse_nccl_tuner_csv(out["nccl_tuner_csv"])
    for collective in COLLECTIVES:
        assert [selected_channels(configs, collective, g, 1, 8) for g in GROUPS] == out["channels"]
    assert out["channel_conflicts"] == {}
