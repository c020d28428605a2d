"""mlopt's NCCL tuner CSV read by a C driver that follows NCCL's example tuner plugin's rules
(tests/data/nccl_tuner/driver.c, which names the upstream file and version), and mlopt's Python parser held
to the same rules on a shared corpus (tests/data/nccl_tuner/corpus.json)."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlopt.errors import InputError
from mlopt.formats.plan import PlanStatus
from mlopt.planners.options import PlannerOptions
from mlopt.planners.threads import artifacts
from mlopt.planners.threads.artifacts import (
    COLLECTIVES,
    SIZE_MAX,
    job_communicators,
    job_env,
    nccl_tuner_csv,
    parse_nccl_tuner_csv,
    selected_channels,
    thread_plan_artifacts,
    tuner_rows,
)
from mlopt.planners.threads.contention import DEFAULT_PARAMETERS
from mlopt.planners.threads.planner import ThreadsOptions, make_problem, plan_threads

DATA = Path(__file__).resolve().parents[2] / "data" / "nccl_tuner"
FIELDS = ("collective", "min_bytes", "max_bytes", "algorithm", "protocol", "channels", "nNodes", "nRanks",
          "numPipeOps", "regBuff")

GROUPS = [4_040, 1_000_762, 311_108, 2_000_022]  # backward order, distinct sizes
THREADS = [1024, 256, 4096, 128]  # NCCL_NTHREADS 128: channels 8, 2, 32, 1


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("nccl_tuner") / "driver"
    subprocess.run([gcc, "-std=c99", "-O1", "-Wall", "-Werror", "-o", str(out), str(DATA / "driver.c")],
                   check=True)
    return out


def run_driver(driver: Path, mode: str, config_env: str | None, cwd: Path, queries: str = "") -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "NCCL_TUNER_CONFIG_FILE"}
    if config_env is not None:
        env["NCCL_TUNER_CONFIG_FILE"] = config_env
    done = subprocess.run([str(driver), mode], input=queries, env=env, cwd=cwd, capture_output=True, text=True,
                          check=True)
    return done.stdout.splitlines()


def plugin_channels(driver: Path, config_env: str | None, cwd: Path,
                    calls: list[tuple[str, int, int, int]]) -> list[int]:
    """Channels the plugin hands NCCL for each (collective, nBytes, nNodes, nRanks) call."""
    answers = run_driver(driver, "query", config_env, cwd, "".join(f"{c} {b} {n} {r}\n" for c, b, n, r in calls))
    assert len(answers) == len(calls)
    return [int(a.split()[0]) for a in answers]


def canonical(config: dict) -> str:
    return ",".join(str(config[f]) for f in FIELDS)


# --- the parsing rules: driver and Python agree --------------------------------------------------------------


CORPUS = json.loads((DATA / "corpus.json").read_text())["cases"]


@pytest.mark.parametrize("case", CORPUS, ids=[c["note"][:40] for c in CORPUS])
def test_driver_and_python_parser_agree_on_the_corpus(driver, tmp_path, case):
    path = tmp_path / "nccl_tuner.conf"
    path.write_bytes((case["line"] + "\n").encode())
    assert run_driver(driver, "load", str(path), tmp_path) == case["plugin"]
    text = path.read_bytes().decode()
    if case["verdict"] == "rejected":
        with pytest.raises(InputError):
            parse_nccl_tuner_csv(text)
        return
    configs = parse_nccl_tuner_csv(text)
    loaded = [v.removeprefix("load ") for v in case["plugin"] if v.startswith("load ")]
    assert [canonical(c) for c in configs] == loaded
    assert case["verdict"] == ("config" if configs else "skip")


def test_driver_and_python_select_the_same_line(driver, tmp_path):
    """First match in file order, inclusive bounds, -1 wildcards, numPipeOps/regBuff, -1 channels -> 1."""
    text = "\n".join([
        "# overlapping and constrained lines: order decides",
        "allreduce,0,1000,ring,simple,3,2,-1,2",
        "allreduce,0,1000,tree,simple,5,-1,16,-1,1",
        "allreduce,500,2000,ring,ll128,7,2,16",
        "allreduce,0,18446744073709551615,ring,simple,-1,-1,-1",
        "broadcast,100,100,ring,simple,4,1,8",
        "reducescatter,0,4096,ring,simple,6,-1,8,1,0",
    ]) + "\n"
    path = tmp_path / "tuner.conf"
    path.write_text(text)
    configs = parse_nccl_tuner_csv(text)
    calls = []
    for collective, nbytes, (n_nodes, n_ranks), pipe_ops, reg_buff in itertools.product(
            ("allreduce", "broadcast", "reducescatter", "allgather"), (0, 99, 100, 101, 499, 500, 1000, 1001,
                                                                      2000, 2001, 4096, SIZE_MAX),
            ((1, 8), (2, 16), (2, 8), (16, 128)), (1, 2), (0, 1)):
        calls.append((collective, nbytes, n_nodes, n_ranks, pipe_ops, reg_buff))
    answers = run_driver(driver, "query", str(path), tmp_path, "".join(" ".join(map(str, c)) + "\n" for c in calls))
    expected = [str(selected_channels(configs, *c)) for c in calls]
    assert [a.split()[0] for a in answers] == expected
    assert {a.split()[0] for a in answers} == {"1", "3", "4", "5", "6", "7"}  # every line is reached


# --- mlopt's CSV: the planned channels are what the plugin selects ---------------------------------------------


def planned_calls(n_nodes: int, n_ranks: int) -> list[tuple[str, int, int, int]]:
    """Every collective at every group size, as a job on (n_nodes, n_ranks) issues them."""
    return [(c, g, n_nodes, n_ranks) for c in COLLECTIVES for g in GROUPS]


def planned(made: dict) -> list[int]:
    return [ch for _ in COLLECTIVES for ch in made["channels"]]


@pytest.mark.parametrize("nodes, gpus_per_node", [(1, 8), (16, 8), (2, 1), (4, 4)])
def test_the_plugin_selects_the_planned_channels_on_the_planned_communicator(driver, tmp_path, nodes,
                                                                            gpus_per_node):
    made = thread_plan_artifacts(GROUPS, THREADS, tuner_config_file="x",
                                 communicators=job_communicators(nodes, gpus_per_node))
    assert made["channels"] == [8, 2, 32, 1]
    path = tmp_path / "nccl_tuner.conf"
    path.write_text(made["nccl_tuner_csv"])
    ranks = nodes * gpus_per_node
    assert plugin_channels(driver, str(path), tmp_path, planned_calls(nodes, ranks)) == planned(made)
    # a communicator the job does not make is left to the plugin's default of one channel
    assert set(plugin_channels(driver, str(path), tmp_path, planned_calls(nodes + 1, ranks + gpus_per_node))) == {1}


def test_without_gpus_per_node_the_lines_hold_for_any_communicator(driver, tmp_path):
    made = thread_plan_artifacts(GROUPS, THREADS, tuner_config_file="x", communicators=job_communicators(16, None))
    path = tmp_path / "nccl_tuner.conf"
    path.write_text(made["nccl_tuner_csv"])
    for n_nodes, n_ranks in ((1, 8), (16, 128), (16, 16), (2, 2)):
        assert plugin_channels(driver, str(path), tmp_path, planned_calls(n_nodes, n_ranks)) == planned(made)


def test_nearby_sizes_of_every_collective_get_the_nearest_groups_channels(driver, tmp_path):
    channels = [8, 2, 32, 1]
    path = tmp_path / "nccl_tuner.conf"
    path.write_text(nccl_tuner_csv(tuner_rows(GROUPS, channels, communicators=[(16, 128)])))
    calls, expected = [], []
    for collective in COLLECTIVES:
        for nbytes in (0, 1, 4_041, 300_000, 1_000_000, 1_500_000, 3_000_000, SIZE_MAX):
            # nearest on a log scale (ranges split at geometric midpoints; 0 falls in the first)
            nearest = min(range(len(GROUPS)), key=lambda i: abs(math.log(max(nbytes, 1) / GROUPS[i])))
            calls.append((collective, nbytes, 16, 128))
            expected.append(channels[nearest])
    assert plugin_channels(driver, str(path), tmp_path, calls) == expected


# --- a plan, its env, and a job started somewhere else ---------------------------------------------------------


def small_plan(options: ThreadsOptions):
    layers = [("l0", 900.0, 4_000_000), ("l1", 700.0, 1_000_000), ("l2", 800.0, 8_000_000), ("l3", 600.0, 400_000)]
    problem = make_problem(layers, options, DEFAULT_PARAMETERS)
    inputs = {"model": "test"}
    return plan_threads(problem, options, PlannerOptions(), inputs, {"source": "default"}, "t.plan.nccl-tuner.csv")


def test_a_job_started_elsewhere_loads_the_plans_csv_through_job_env(driver, tmp_path):
    plan, csv = small_plan(ThreadsOptions(nodes=16, thread_set=(1024, 2048, 4096), gpus_per_node=8))
    assert plan.status in (PlanStatus.FEASIBLE, PlanStatus.HEURISTIC)
    plan_dir = tmp_path / "plans"
    plan_dir.mkdir()
    (plan_dir / "t.plan.nccl-tuner.csv").write_text(csv)
    doc = plan.to_dict(False)
    recorded = doc["payload"]["artifacts"]["env"]
    assert recorded["NCCL_TUNER_CONFIG_FILE"] == "t.plan.nccl-tuner.csv"  # relative: the plan is portable
    assert doc["payload"]["artifacts"]["nccl_communicators"] == [{"nNodes": 16, "nRanks": 128}]
    groups = [g for g in doc["payload"]["groups"] if g["bytes"]]
    calls = [(c, g["bytes"], 16, 128) for c in COLLECTIVES for g in groups]
    want = [g["channels"] for _ in COLLECTIVES for g in groups]
    elsewhere = tmp_path / "job"
    elsewhere.mkdir()
    # the recorded env as such: NCCL opens the CSV from the job's cwd and finds nothing (one channel)
    assert set(plugin_channels(driver, recorded["NCCL_TUNER_CONFIG_FILE"], elsewhere, calls)) == {1}
    env = job_env(doc, plan_dir / "t.plan.json", tuner_plugin="lib/libnccl-tuner-example.so")
    assert Path(env["NCCL_TUNER_CONFIG_FILE"]).is_absolute() and Path(env["NCCL_TUNER_PLUGIN"]).is_absolute()
    assert plugin_channels(driver, env["NCCL_TUNER_CONFIG_FILE"], elsewhere, calls) == want
    # the communicator holds at least the planned channels, else NCCL would bound them lower
    most = max(g["channels"] for g in groups)
    assert most > 1 and env["NCCL_MIN_NCHANNELS"] == str(most)


def test_job_env_leaves_absolute_paths_and_other_variables_alone(tmp_path):
    doc = {"payload": {"artifacts": {"env": {"NCCL_NTHREADS": "256", "NCCL_TUNER_CONFIG_FILE": "/abs/t.csv"}}}}
    assert job_env(doc, tmp_path / "p.json") == {"NCCL_NTHREADS": "256", "NCCL_TUNER_CONFIG_FILE": "/abs/t.csv"}
    doc["payload"]["artifacts"]["env"]["NCCL_TUNER_CONFIG_FILE"] = "sub/t.csv"
    assert job_env(doc, tmp_path / "p.json")["NCCL_TUNER_CONFIG_FILE"] == str(tmp_path.resolve() / "sub" / "t.csv")


def test_one_channel_plans_set_no_min_nchannels():
    made = thread_plan_artifacts([1000, 2000], [128, 128], tuner_config_file="x")
    assert made["channels"] == [1, 1] and "NCCL_MIN_NCHANNELS" not in made["env"]
    assert artifacts.min_nchannels([1, 4, 2]) == 4 and artifacts.min_nchannels([1]) is None
