"""The "mlopt" torch.distributed backend (mlopt.pytorch) and the multi-process communicator under it.

Unit tests (no processes): plan index loading and hashing, plan choice (nearest size, roots, group sizes,
fallbacks reported once), explicit plans refused naming the file, the cross-rank plan check, the store
bootstrap's callbacks, reduce-op mapping and padding.

Multi-process tests (skipped unless torch and a runtime library with mlopt_comm_create are available): this
file is also the worker script (`python tests/pytorch/test_backend.py SCENARIO RANK WORLD DIR`); each test
starts one process per rank with a FileStore in its tmp_path, kills stragglers after a hard timeout, and checks
what each rank wrote to DIR/result-RANK.json. Every collective is compared with a reference each rank computes
from every rank's (deterministic) input, in every dtype, with plans from an index and with fallbacks, over
shared memory (2 ranks) and TCP (4 ranks, and 2-rank sub-groups); DDP of a tiny MLP against gloo in the same
processes; a schedule plan's comm-ops through the group's enforcer hook; the world created again on the same
store; a mismatched plan index; a plan of another group size; a rank that dies mid-run; ProcessComm over its
own TCP rendezvous; and that no shared-memory segment of these processes is left in /dev/shm.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
LAUNCH_TIMEOUT_S = 120
DEAD_RANK_WATCHDOG_MS = 5000

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def _multi_process_problem() -> str | None:
    if not HAS_TORCH:
        return "torch is not installed"
    from mlopt.native import binding as native

    try:
        return native.multi_process_problem()
    except native.RuntimeLibraryNotFound as exc:
        return str(exc)


@pytest.fixture(scope="module")
def multi_process():
    """Skip unless torch and a runtime library with multi-process communicators are here."""
    problem = _multi_process_problem()
    if problem:
        pytest.skip(f"multi-process backend unavailable: {problem}")


# ------------------------------------------------------------------------------------------------ plan fixtures


def _plan_collective(out: Path, collective: str, topology: str, size: str) -> Path:
    from mlopt.cli import main

    xml = out / f"collective-{collective}-{size}.xml"
    assert main(["plan", "collective", "--topology", topology, "--collective", collective, "--size", size,
                 "-o", str(xml)]) == 0
    return xml


def _write_index(folder: Path, sidecars: list[Path]) -> Path:
    """An index (mlopt.plan-index) listing collective sidecars, as `mlopt plan --model` writes one."""
    entries = []
    for sidecar in sidecars:
        provenance = json.loads(sidecar.read_text())["provenance"]
        entries.append({"file": sidecar.name, "kind": "collective", "status": provenance["status"],
                        "objective": provenance["objective"], "gap": provenance["gap"]})
    index = folder / "index.json"
    index.write_text(json.dumps({"format": "mlopt.plan-index", "schema_version": "1.0", "inputs": {},
                                 "plans": entries, "skipped": []}))
    return index


@pytest.fixture(scope="module")
def index2(ddp_example_trace, tmp_path_factory) -> Path:
    """The README's index: `mlopt plan --model` of the DDP example on fully-connected:2 (allreduce and
    broadcast plans among memory, threads and schedule plans)."""
    from mlopt.cli import main

    out = tmp_path_factory.mktemp("plans2")
    assert main(["plan", "--model", str(ddp_example_trace), "--topology", "fully-connected:2", "-o", str(out)]) == 0
    return out / "index.json"


@pytest.fixture(scope="module")
def index4(tmp_path_factory) -> Path:
    """Collective plans of every kind for fully-connected:4 (broadcast and reduce from root 0)."""
    out = tmp_path_factory.mktemp("plans4")
    sizes = {"allreduce": "4MiB", "allgather": "1MiB", "reducescatter": "1MiB", "alltoall": "1MiB",
             "broadcast": "1MiB", "reduce": "1MiB"}
    xmls = [_plan_collective(out, coll, "fully-connected:4", size) for coll, size in sizes.items()]
    return _write_index(out, [x.with_suffix(".json") for x in xmls])


# ------------------------------------------------------------------------------------------------ unit: plans


def test_index_hash_covers_the_index_and_every_file_it_names(index2, tmp_path):
    from mlopt.pytorch.plans import load_index

    index = load_index(index2.parent)  # the folder names its index.json
    names = [name for name, _ in index.files]
    assert names[0] == "index.json"
    assert {"memory.plan.json", "threads.plan.json", "schedule.plan.json"} <= set(names)
    xmls = [Path(x).name for x in index.collectives]
    assert xmls and all(x in names for x in xmls) and all(x.endswith(".xml") for x in xmls)
    copy = tmp_path / "copy"
    shutil.copytree(index2.parent, copy)
    assert load_index(copy).digest == index.digest  # contents, not paths
    edited = copy / xmls[0]
    edited.write_text(edited.read_text() + "\n")
    assert load_index(copy).digest != index.digest


def test_a_file_that_is_not_an_index_is_refused_naming_it(index4):
    from mlopt.errors import InputError
    from mlopt.pytorch.plans import load_index

    sidecar = next(index4.parent.glob("collective-allreduce-*.json"))
    with pytest.raises(InputError, match=rf"{sidecar.name}: \$\.format: expected an mlopt plan index"):
        load_index(sidecar)


def test_choice_takes_the_nearest_size_and_reports_each_fallback_once(index2, caplog):
    from mlopt.pytorch.plans import PlanBook, load_index

    book = PlanBook(2, load_index(index2))
    small, large = book.choose("allreduce", 1 << 20), book.choose("allreduce", 4 << 20)
    assert Path(small.source).name == "collective-allreduce-1028KiB.xml"
    assert Path(large.source).name == "collective-allreduce-4460800B.xml"
    assert Path(book.choose("broadcast", 8, root=0).source).name == "collective-broadcast-8B.xml"
    with caplog.at_level("WARNING"):
        for _ in range(3):
            assert book.choose("allgather", 4096).plan is None
        assert book.choose("broadcast", 8, root=1).plan is None
    assert len(book.fallbacks) == 2 and len(caplog.records) == 2
    assert "allgather over 2 ranks" in book.fallbacks[0] and "has none" in book.fallbacks[0]
    assert "from root 1" in book.fallbacks[1] and "root(s) [0]" in book.fallbacks[1]


def test_index_plans_of_another_group_size_are_no_candidates(index4):
    from mlopt.pytorch.plans import PlanBook, load_index

    book = PlanBook(2, load_index(index4))
    assert book.choose("allreduce", 1 << 20).plan is None
    assert "has it for 4 ranks" in book.fallbacks[0]
    assert PlanBook(4, load_index(index4)).choose("allreduce", 1 << 20).plan is not None


def test_an_explicit_plan_of_another_group_size_or_collective_is_refused(index4):
    from mlopt.errors import InputError
    from mlopt.pytorch.plans import PlanBook

    ar4 = str(next(index4.parent.glob("collective-allreduce-*.xml")))
    with pytest.raises(InputError, match=rf"{ar4}: ngpus: the program is for 4 ranks; the process group has 2"):
        PlanBook(2, explicit={"allreduce": ar4})
    with pytest.raises(InputError, match=rf"{ar4}: coll: the program is allreduce; it was given for allgather"):
        PlanBook(4, explicit={"allgather": ar4})
    book = PlanBook(4, explicit={"allreduce": ar4})
    assert book.choose("allreduce", 12).source == ar4
    assert [name for name, _ in book.files] == [f"allreduce={ar4}"]


def test_a_rooted_explicit_plan_runs_only_from_its_root(index4):
    from mlopt.pytorch.plans import PlanBook

    bc = str(next(index4.parent.glob("collective-broadcast-*.xml")))
    book = PlanBook(4, explicit={"broadcast": bc})
    assert book.choose("broadcast", 64, root=0).source == bc
    assert book.choose("broadcast", 64, root=2).plan is None
    assert f"{bc} is for root 0" in book.fallbacks[0]


# ------------------------------------------------------------------------------------------------ unit: backend


@needs_torch
def test_the_plan_check_names_the_files_that_differ():
    from mlopt.errors import InputError
    from mlopt.pytorch.backend import _check_same_plans

    mine = {"index": "/a/index.json", "files": {"index.json": "1" * 64, "ar.xml": "2" * 64}}
    same = {"index": "/elsewhere/index.json", "files": dict(mine["files"])}
    _check_same_plans(mine, same, 1, 0)
    other = {"index": "/b/index.json", "files": {"index.json": "1" * 64, "ar.xml": "3" * 64, "x.json": "4" * 64}}
    with pytest.raises(InputError) as raised:
        _check_same_plans(mine, other, 1, 0)
    text = str(raised.value)
    assert text.startswith("/a/index.json: plans: rank 1's plans differ from rank 0's (/b/index.json)")
    assert "ar.xml: sha256 222222222222 here, sha256 333333333333 on rank 0" in text
    assert "x.json: absent here" in text and "\n" not in text
    with pytest.raises(RuntimeError, match="rank 0 could not load its plans: boom"):
        _check_same_plans(mine, {"error": "boom"}, 1, 0)


@needs_torch
def test_options_come_from_pg_options_then_configure_then_the_environment(monkeypatch):
    from mlopt.pytorch import backend

    monkeypatch.setattr(backend, "_configured", backend.BackendOptions())
    monkeypatch.setenv(backend.INDEX_ENV, "/env/plans")
    assert backend.resolve_options().index == "/env/plans"
    backend.configure(index="/configured", watchdog_ms=5)
    assert backend.resolve_options().index == "/configured"
    given = backend.resolve_options(backend.BackendOptions(transport="tcp"))
    assert (given.transport, given.index, given.watchdog_ms) == ("tcp", "/env/plans", None)
    default_group = backend.BackendOptions(index="/world", plans={"allreduce": "ar.xml"}, transport="shm")
    inherited = backend.resolve_options(None, default_group)
    assert (inherited.index, inherited.plans, inherited.transport) == ("/world", None, "shm")
    with pytest.raises(TypeError, match="must be mlopt.pytorch.BackendOptions"):
        backend.resolve_options({"index": "x"})


@needs_torch
def test_each_creation_of_a_group_on_one_store_has_its_own_keys():
    import torch.distributed as dist

    from mlopt.pytorch.backend import _key_space

    store = dist.HashStore()
    assert [_key_space(store, 2) for _ in range(6)] == ["mlopt-0", "mlopt-0", "mlopt-1", "mlopt-1", "mlopt-2",
                                                         "mlopt-2"]


@needs_torch
def test_reduce_ops_and_padding():
    import torch.distributed as dist

    from mlopt.pytorch.backend import _padded, _reduce_op

    assert _reduce_op(dist.ReduceOp.PRODUCT) == ("prod", False)
    assert _reduce_op(dist.ReduceOp.AVG) == ("sum", True)
    with pytest.raises(ValueError, match="BAND is not supported"):
        _reduce_op(dist.ReduceOp.BAND)
    assert _padded(7, 1, 4, False) == 8  # allreduce, 4 chunks: whole elements per chunk
    assert _padded(7, 4, 8, False) == 8  # reducescatter over 4 ranks, 8 chunks: blocks of 2 chunks
    assert _padded(5, 2, 2, True) == 8  # bytes moved as int32: one word per chunk
    assert _padded(12, 1, 3, True) == 12


@needs_torch
def test_the_store_bootstrap_answers_and_never_raises_into_c():
    import torch.distributed as dist

    from mlopt.native.binding import StoreBootstrap

    boot = StoreBootstrap(dist.HashStore())
    assert boot.struct.set(None, b"k", b"value!", 6) == 0
    buffer, size = ctypes.create_string_buffer(4), ctypes.c_size_t()
    assert boot.struct.get(None, b"k", buffer, 4, ctypes.byref(size), 100) == 0
    assert (buffer.raw, size.value) == (b"valu", 6)
    started = time.monotonic()
    assert boot.struct.get(None, b"missing", buffer, 4, ctypes.byref(size), 50) == 1
    assert boot.struct.get(None, b"missing", buffer, 4, ctypes.byref(size), 0) == 1  # a look, not "forever"
    assert time.monotonic() - started < 5

    class Broken:
        def set(self, key, value):
            raise OSError("disk full")

        def get(self, key):
            raise OSError("gone")

        def wait(self, keys, timeout):
            raise TimeoutError

    broken = StoreBootstrap(Broken())
    assert broken.struct.set(None, b"k", b"v", 1) == 2
    assert broken.struct.get(None, b"k", buffer, 4, ctypes.byref(size), 10) == 1
    assert broken.errors == ["store.set('k') raised OSError: disk full"]
    with pytest.raises(TypeError, match=r"store: object has no set\(\)"):
        StoreBootstrap(object())


def test_a_library_without_the_multi_process_part_loads_but_refuses_process_comms(tmp_path, monkeypatch):
    from mlopt.native import binding as native

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a fake library")
    kept = [name for name in native._PROTOTYPES if name not in native.MULTI_PROCESS_FUNCTIONS | {"mlopt_version"}]
    source = tmp_path / "fake.c"
    source.write_text("".join(f"void {name}(void) {{}}\n" for name in kept) +
                      f"void mlopt_version(int* a, int* b, int* c) {{ *a = 0; *b = {native.EXPECTED_VERSION_MINOR}; "
                      f"*c = 0; }}\n")
    library = tmp_path / "libfake_0_4_partial.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    monkeypatch.setenv(native.LIBRARY_ENV, str(library))
    assert native.version()[1] == native.EXPECTED_VERSION_MINOR  # in-process use still loads it
    assert "no multi-process communicators (missing mlopt_comm_create, " in native.multi_process_problem()
    with pytest.raises(native.RuntimeLibraryNotFound, match="missing mlopt_comm_create"):
        native.ProcessComm(0, 2, address="127.0.0.1:1")


# ------------------------------------------------------------------------------------------------ launching


def _shm_segments(pids: list[int]) -> list[str]:
    """/dev/shm entries the runtime made for these processes (mlopt-<uid>-<pid>-...)."""
    folder = Path("/dev/shm")
    if not folder.is_dir():
        return []
    prefixes = tuple(f"mlopt-{os.getuid()}-{pid}-" for pid in pids)
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(prefixes))


def _launch(scenario: str, world: int, workdir: Path, config: dict) -> list[dict]:
    """Runs SCENARIO on `world` ranks (one process each), killed after LAUNCH_TIMEOUT_S; each rank's result."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(config))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = []
    try:
        for rank in range(world):
            log = open(workdir / f"log-{rank}.txt", "w")
            procs.append(subprocess.Popen([sys.executable, __file__, scenario, str(rank), str(world), str(workdir)],
                                          stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO))
            log.close()
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{scenario}: ranks still running after {LAUNCH_TIMEOUT_S} s; logs: {_logs(workdir, world)}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    left = _shm_segments([p.pid for p in procs])
    assert not left, f"{scenario}: shared memory left in /dev/shm: {left}"
    results = []
    for rank, proc in enumerate(procs):
        path = workdir / f"result-{rank}.json"
        if not path.exists():
            pytest.fail(f"{scenario}: rank {rank} exited {proc.returncode} without a result:\n{_logs(workdir, world)}")
        results.append(json.loads(path.read_text()))
    return results


def _logs(workdir: Path, world: int) -> str:
    return "\n".join(f"--- rank {r}\n" + (workdir / f"log-{r}.txt").read_text()[-3000:] for r in range(world)
                     if (workdir / f"log-{r}.txt").exists())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ multi-process


def test_two_ranks_collectives_ddp_enforcer_refused_plan_and_reinit(multi_process, index2, index4, tmp_path):
    from mlopt.formats.plan import load_plan
    from mlopt.native.enforcer import MotifTable

    ar4 = str(next(index4.parent.glob("collective-allreduce-*.xml")))
    schedule = MotifTable.from_plan(load_plan(index2.parent / "schedule.plan.json").payload)  # 2 broadcasts, 2 buckets
    results = _launch("collectives", 2, tmp_path, {"index": str(index2), "transport": "auto", "ddp": True,
                                                   "refuse": ar4, "reinit": True,
                                                   "schedule": str(index2.parent / "schedule.plan.json")})
    for rank, result in enumerate(results):
        assert result["error"] is None, f"rank {rank}: {result['error']}"
        assert result["transports"] == (["self", "shm"] if rank == 0 else ["shm", "self"])
        used = {(coll, Path(src).name) for coll, src, _ in result["sources"]}
        assert ("allreduce", "collective-allreduce-1028KiB.xml") in used  # from the index
        assert {("broadcast", "collective-broadcast-28B.xml"), ("broadcast", "collective-broadcast-8B.xml")} & used
        assert ("allgather", "mlopt ring allgather") in used and ("broadcast", "mlopt ring broadcast") in used
        assert sum(1 for line in result["fallbacks"] if "allgather over 2 ranks" in line) == 1
        assert result["ddp_max_difference"] < 1e-5 and result["ddp_steps"] == 3
        assert result["enforced_ops"] == len(schedule.ops)  # through create_enforcer's multi-process enforcer
        assert result["refused"] == f"InputError: {ar4}: ngpus: the program is for 4 ranks; the process group has 2"
        assert result["calls"] > 200
        assert result["key_spaces"] == ["mlopt-0", "mlopt-1"]  # the world again, on the same store


def test_four_ranks_over_tcp_every_collective_and_sub_groups(multi_process, index4, tmp_path):
    results = _launch("collectives", 4, tmp_path, {"index": str(index4), "transport": "tcp", "subgroups": True})
    for rank, result in enumerate(results):
        assert result["error"] is None, f"rank {rank}: {result['error']}"
        assert [t for p, t in enumerate(result["transports"]) if p != rank] == ["tcp"] * 3
        sources: dict[str, set[str]] = {}
        for coll, src, _ in result["sources"]:
            sources.setdefault(coll, set()).add(Path(src).name)
        for coll in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce"):
            assert any(name.startswith(f"collective-{coll}-") for name in sources[coll]), (coll, sources[coll])
        assert "mlopt ring broadcast" in sources["broadcast"]  # roots other than the plan's
        assert any("over 2 ranks" in line and "has it for 4 ranks" in line for line in result["subgroup_fallbacks"])


def _ring_xml(folder: Path, collective: str, modes: str) -> str:
    """A 2-rank ring program declaring `modes`: "in-place" only (lowered in place) or "both" (proven both ways)."""
    from mlopt.formats.msccl_xml import write_program
    from mlopt.formats.topology import fully_connected
    from mlopt.planners.collective.baselines import ring
    from mlopt.planners.collective.lowering import lower
    from mlopt.planners.collective.planner import declare_proven_modes
    from mlopt.sim.collectives import CollectiveSpec

    alg = ring(fully_connected(2), CollectiveSpec(collective, 2, 1), channels=1)
    program = lower(alg, inplace=True) if modes == "in-place" else declare_proven_modes(lower(alg))
    assert (program.inplace, program.outofplace) == ((True, False) if modes == "in-place" else (True, True))
    path = folder / f"{collective}-{modes}.xml"
    path.write_text(write_program(program))
    return str(path)


def test_in_place_programs_run_on_the_tensor_or_in_their_in_place_layout(multi_process, tmp_path):
    only = {c: _ring_xml(tmp_path, c, "in-place") for c in ("allreduce", "allgather", "reducescatter", "broadcast")}
    both = _ring_xml(tmp_path, "allreduce", "both")
    results = _launch("in-place", 2, tmp_path / "run", {"only": only, "both": both})
    for rank, result in enumerate(results):
        assert result["error"] is None, f"rank {rank}: {result['error']}"
        used = {(coll, src) for coll, src, _ in result["sources"]}
        assert {(c, path) for c, path in only.items()} <= used  # every in-place-only program ran (and was right)
        assert result["staged_on_the_tensor"] == 0  # both modes, no padding: the tensor is the program's buffer
        assert result["staged_padded"] == ["in-place"]  # a size the chunks do not divide: one staging buffer


def test_ranks_with_different_plan_indexes_fail_init_naming_the_files(multi_process, index2, tmp_path):
    other = tmp_path / "other-plans"
    shutil.copytree(index2.parent, other)
    edited = other / "collective-allreduce-1028KiB.xml"
    edited.write_text(edited.read_text() + "\n")
    indexes = [str(index2), str(other / "index.json")]
    results = _launch("mismatch", 2, tmp_path / "run", {"index_by_rank": indexes})
    for rank, result in enumerate(results):
        error = result["init_error"]
        assert error is not None, f"rank {rank} initialised with another rank's plans"
        assert error.startswith(f"InputError: {indexes[rank]}: plans: rank {rank}'s plans differ from rank "
                                f"{1 - rank}'s ({indexes[1 - rank]})")
        assert "collective-allreduce-1028KiB.xml: sha256" in error and "\n" not in error


def test_a_rank_that_dies_mid_run_fails_the_other_within_the_watchdog(multi_process, tmp_path):
    results = _launch("dead-rank", 2, tmp_path, {"watchdog_ms": DEAD_RANK_WATCHDOG_MS})
    survivor = results[0]
    assert survivor["first"] == "ok"
    assert survivor["error"] is not None and "mlopt backend (group 0, rank 0): allreduce" in survivor["error"]
    assert survivor["elapsed_s"] < DEAD_RANK_WATCHDOG_MS / 1000 + 3, survivor
    assert survivor["later"] == survivor["error"]  # the communicator stays broken
    assert results[1]["died"]


def test_process_comm_over_its_own_tcp_rendezvous_and_an_enforcer_owning_it(multi_process, tmp_path):
    results = _launch("process-comm", 2, tmp_path, {"address": f"127.0.0.1:{_free_port()}"})
    for rank, result in enumerate(results):
        assert result["error"] is None, f"rank {rank}: {result['error']}"
        assert result["rank"] == rank and result["size"] == 2 and result["transport"] == "tcp"
        assert result["steps"] > 0 and result["refused_while_enforced"] and result["enforcer_closed_first"]


# ------------------------------------------------------------------------------------------------ worker side


def _values(rank: int, salt: int, numel: int, dtype, small: bool):
    """Rank `rank`'s deterministic input. small: 1..3, so every sum, product and average over <= 4 ranks is
    exact in every dtype and any reduction order gives the same bits."""
    import torch

    base = torch.arange(numel, dtype=torch.int64) * 7 + rank * 5 + salt * 3
    return (base % 3 + 1).to(dtype) if small else (base % 2000).to(dtype)


def _reference(inputs, op: str, dtype):
    import torch

    stacked = torch.stack([x.to(torch.float64) for x in inputs])
    combined = {"sum": stacked.sum(0), "prod": stacked.prod(0), "max": stacked.amax(0), "min": stacked.amin(0),
                "avg": stacked.sum(0) / len(inputs)}[op]
    return combined.to(dtype)


def _expect(got, expected, what: str) -> None:
    import torch

    if not torch.equal(got, expected):
        raise AssertionError(f"{what}: got {got.flatten()[:8].tolist()}, expected {expected.flatten()[:8].tolist()}")


class _Checker:
    """Runs every collective on `group` and compares each rank's result with the reference."""

    def __init__(self, group, rank: int, n: int):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group, self.rank, self.n = torch, dist, group, rank, n
        self.salt = 0
        self.reductions = [torch.float32, torch.float16, torch.bfloat16, torch.int32]
        self.movable = self.reductions + [torch.int64, torch.uint8]
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
                    "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}

    def inputs(self, numel: int, dtype, small: bool = True):
        self.salt += 1
        return [_values(r, self.salt, numel, dtype, small) for r in range(self.n)]

    def ops_for(self, dtype, names=None):
        return [o for o in (names or self.ops) if not (o == "avg" and not dtype.is_floating_point)]

    def allreduce(self, sizes=(0, 1, 7, 1031)):
        for dtype in self.reductions:
            for op in self.ops_for(dtype):
                for numel in sizes:
                    everyone = self.inputs(numel, dtype)
                    mine = everyone[self.rank].clone()
                    self.dist.all_reduce(mine, op=self.ops[op], group=self.group)
                    _expect(mine, _reference(everyone, op, dtype), f"allreduce {dtype} {op} {numel}")
        everyone = self.inputs(70001, self.torch.float32)  # several loop slices
        mine = everyone[self.rank].clone()
        self.dist.all_reduce(mine, group=self.group)
        _expect(mine, _reference(everyone, "sum", self.torch.float32), "allreduce 70001")

    def reduce(self):
        for dtype in self.reductions:
            for op in self.ops_for(dtype, ["sum", "max", "avg"]):
                for root in range(self.n):
                    everyone = self.inputs(13, dtype)
                    mine = everyone[self.rank].clone()
                    self.dist.reduce(mine, op=self.ops[op], group=self.group, group_dst=root)
                    if self.rank == root:
                        _expect(mine, _reference(everyone, op, dtype), f"reduce {dtype} {op} root {root}")

    def broadcast(self):
        for dtype in self.movable:
            for numel in (1, 7, 1031):
                for root in range(self.n):
                    everyone = self.inputs(numel, dtype, small=False)
                    mine = everyone[self.rank].clone()
                    self.dist.broadcast(mine, group=self.group, group_src=root)
                    _expect(mine, everyone[root], f"broadcast {dtype} {numel} root {root}")

    def allgather(self):
        for dtype in self.movable:
            for numel in (1, 7, 1031):
                everyone = self.inputs(numel, dtype, small=False)
                outputs = [self.torch.empty(numel, dtype=dtype) for _ in range(self.n)]
                self.dist.all_gather(outputs, everyone[self.rank], group=self.group)
                _expect(self.torch.cat(outputs), self.torch.cat(everyone), f"all_gather {dtype} {numel}")
                output = self.torch.empty(self.n * numel, dtype=dtype)
                self.dist.all_gather_into_tensor(output, everyone[self.rank], group=self.group)
                _expect(output, self.torch.cat(everyone), f"all_gather_into_tensor {dtype} {numel}")

    def reduce_scatter(self):
        for dtype in self.reductions:
            for op in self.ops_for(dtype, ["sum", "prod", "min", "avg"]):
                for numel in (1, 7):
                    everyone = self.inputs(numel * self.n, dtype)
                    expected = _reference(everyone, op, dtype).chunk(self.n)[self.rank]
                    output = self.torch.empty(numel, dtype=dtype)
                    self.dist.reduce_scatter(output, list(everyone[self.rank].chunk(self.n)), op=self.ops[op],
                                             group=self.group)
                    _expect(output, expected, f"reduce_scatter {dtype} {op} {numel}")
                    output = self.torch.empty(numel, dtype=dtype)
                    self.dist.reduce_scatter_tensor(output, everyone[self.rank], op=self.ops[op], group=self.group)
                    _expect(output, expected, f"reduce_scatter_tensor {dtype} {op} {numel}")

    def alltoall(self):
        for dtype in self.movable:
            for numel in (1, 5):
                everyone = self.inputs(numel * self.n, dtype, small=False)
                expected = self.torch.cat([x.chunk(self.n)[self.rank] for x in everyone])
                outputs = [self.torch.empty(numel, dtype=dtype) for _ in range(self.n)]
                self.dist.all_to_all(outputs, list(everyone[self.rank].chunk(self.n)), group=self.group)
                _expect(self.torch.cat(outputs), expected, f"all_to_all {dtype} {numel}")
                output = self.torch.empty(numel * self.n, dtype=dtype)
                self.dist.all_to_all_single(output, everyone[self.rank], group=self.group)
                _expect(output, expected, f"all_to_all_single {dtype} {numel}")

    def asynchronous(self):
        """Several calls in flight at once complete in order with the right values."""
        batches = [self.inputs(257, self.torch.float32) for _ in range(4)]
        mine = [b[self.rank].clone() for b in batches]
        works = [self.dist.all_reduce(m, group=self.group, async_op=True) for m in mine]
        for work, got, everyone in zip(works, mine, batches):
            work.wait()
            _expect(got, _reference(everyone, "sum", self.torch.float32), "async allreduce")
        self.dist.barrier(group=self.group)

    def everything(self) -> None:
        self.allreduce()
        self.reduce()
        self.broadcast()
        self.allgather()
        self.reduce_scatter()
        self.alltoall()
        self.asynchronous()


def _ddp_against_gloo(rank: int) -> tuple[float, int]:
    """(largest parameter difference, steps) of a tiny MLP trained 3 steps with DDP over mlopt and over gloo."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())
    ours, theirs = DistributedDataParallel(model), DistributedDataParallel(twin, process_group=gloo)
    optimisers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(3):
        batch = torch.randn(8, 16, generator=generator)
        for ddp, optimiser in zip((ours, theirs), optimisers):
            ddp(batch).pow(2).mean().backward()
            optimiser.step()
            optimiser.zero_grad()
    difference = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    return difference, 3


def _enforce_schedule(group, rank: int, plan_path: str) -> int:
    """Runs one iteration of a schedule plan's comm-ops through the group's enforcer hook; ops checked."""
    import numpy as np

    from mlopt.formats.plan import load_plan
    from mlopt.native.enforcer import MotifTable, _check_output, input_values

    table = MotifTable.from_plan(load_plan(plan_path).payload)
    enforcer = group.create_enforcer(table)
    buffers = {}
    for op in table.ops:
        if op.involves(rank):
            source = input_values(rank, op.data_key, 0, op.nbytes // 4)
            buffers[op.index] = source, np.full_like(source, -1.0e9)
            enforcer.submit(rank, op.index, *buffers[op.index])
    enforcer.wait(rank)
    problems = [_check_output(table.ops[i], rank, 0, out) for i, (_, out) in buffers.items()]
    assert not any(problems), [p for p in problems if p]
    enforcer.close()
    return len(buffers)


def _scenario_collectives(rank: int, world: int, config: dict, result: dict) -> None:
    import torch.distributed as dist

    import mlopt.pytorch as mp

    store = dist.FileStore(config["store"], world)
    options = mp.BackendOptions(index=config["index"], transport=config["transport"], watchdog_ms=30000)
    dist.init_process_group("mlopt", store=store, rank=rank, world_size=world, pg_options=options)
    group = mp.backend_of()
    result["transports"] = [group.comm.peer_transport(p) for p in range(world)]
    checker = _Checker(None, rank, world)
    checker.everything()
    if config.get("ddp"):
        result["ddp_max_difference"], result["ddp_steps"] = _ddp_against_gloo(rank)
    if config.get("schedule"):
        result["enforced_ops"] = _enforce_schedule(group, rank, config["schedule"])
    if config.get("subgroups"):
        halves = [dist.new_group(list(range(0, world // 2))), dist.new_group(list(range(world // 2, world)))]
        mine = halves[rank // (world // 2)]
        sub = _Checker(mine, dist.get_group_rank(mine, rank), world // 2)
        sub.allreduce(sizes=(7,))
        sub.allgather()
        result["subgroup_fallbacks"] = mp.backend_of(mine).fallbacks
    result["sources"] = [[coll, src, count] for (coll, src), count in sorted(group.sources.items())]
    result["fallbacks"] = group.fallbacks
    result["calls"] = sum(group.sources.values())
    if config.get("refuse"):
        try:
            dist.new_group(list(range(world)), pg_options=mp.BackendOptions(plans={"allreduce": config["refuse"]}))
            result["refused"] = None
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            result["refused"] = f"{type(exc).__name__}: {exc}"
    dist.destroy_process_group()
    if config.get("reinit"):  # the same store again: torch restarts group names, the backend its key space
        dist.init_process_group("mlopt", store=store, rank=rank, world_size=world, pg_options=options)
        _Checker(None, rank, world).allreduce(sizes=(7,))
        result["key_spaces"] = [group._keys_at, mp.backend_of()._keys_at]
        dist.destroy_process_group()


def _scenario_mismatch(rank: int, world: int, config: dict, result: dict) -> None:
    import torch.distributed as dist

    import mlopt.pytorch as mp

    store = dist.FileStore(config["store"], world)
    options = mp.BackendOptions(index=config["index_by_rank"][rank], init_timeout_ms=60000)
    try:
        dist.init_process_group("mlopt", store=store, rank=rank, world_size=world, pg_options=options)
    except Exception as exc:  # noqa: BLE001 - the error is the result
        result["init_error"] = f"{type(exc).__name__}: {exc}"
        return
    result["init_error"] = None
    dist.destroy_process_group()


def _scenario_dead_rank(rank: int, world: int, config: dict, result: dict) -> None:
    import torch
    import torch.distributed as dist

    import mlopt.pytorch as mp

    store = dist.FileStore(config["store"], world)
    dist.init_process_group("mlopt", store=store, rank=rank, world_size=world,
                            pg_options=mp.BackendOptions(watchdog_ms=config["watchdog_ms"]))
    dist.all_reduce(torch.ones(1024))
    result["first"] = "ok"
    big = torch.ones(16 << 20)  # 64 MiB
    if rank == 1:  # dies while rank 0 is inside the all-reduce, waiting for its data (never in time to join)
        time.sleep(0.2)
        result["died"] = True
        _write_result(config, rank, result)
        os._exit(0)
    started = time.monotonic()
    try:
        dist.all_reduce(big)
        result["error"] = None
    except Exception as exc:  # noqa: BLE001 - the error is the result
        result["error"] = str(exc)
    result["elapsed_s"] = time.monotonic() - started
    try:
        dist.all_reduce(torch.ones(4))
        result["later"] = None
    except Exception as exc:  # noqa: BLE001 - the error is the result
        result["later"] = str(exc)
    dist.destroy_process_group()


def _scenario_process_comm(rank: int, world: int, config: dict, result: dict) -> None:
    import numpy as np

    from mlopt.native import binding as native
    from mlopt.native.enforcer import Enforcer, motif_program_xml

    plan = native.Plan.from_bytes(motif_program_xml("allreduce", world), "ring-allreduce")
    with native.ProcessComm(rank, world, address=config["address"], transport="tcp") as comm:
        result["rank"], result["size"], result["transport"] = comm.rank, comm.size, comm.peer_transport(1 - rank)
        data = np.arange(4 * 1000, dtype=np.float32) + rank
        output, stats = comm.run(plan, data)
        assert np.array_equal(output, 2 * np.arange(4000, dtype=np.float32) + 1), output[:4]
        result["steps"] = stats.steps_executed
        enforcer = Enforcer.over_comm(comm)
        try:
            comm.run(plan, data)
            result["refused_while_enforced"] = False
        except ValueError:
            result["refused_while_enforced"] = True
        comm.close()
        result["enforcer_closed_first"] = not enforcer._finalizer.alive


def _scenario_in_place(rank: int, world: int, config: dict, result: dict) -> None:
    import torch
    import torch.distributed as dist

    import mlopt.pytorch as mp

    store = dist.FileStore(config["store"], world)
    dist.init_process_group("mlopt", store=store, rank=rank, world_size=world,
                            pg_options=mp.BackendOptions(plans=config["only"], watchdog_ms=30000))
    checker = _Checker(None, rank, world)  # every call of these collectives runs an in-place-only program
    checker.allreduce(sizes=(1, 7, 1030))
    checker.allgather()
    checker.reduce_scatter()
    checker.broadcast()
    result["sources"] = [[coll, src, count] for (coll, src), count in sorted(mp.backend_of().sources.items())]
    both = dist.new_group(list(range(world)), pg_options=mp.BackendOptions(plans={"allreduce": config["both"]}))
    pg = mp.backend_of(both)
    everyone = checker.inputs(4096, torch.float32)
    mine = everyone[rank].clone()
    dist.all_reduce(mine, group=both)
    _expect(mine, _reference(everyone, "sum", torch.float32), "in-place allreduce 4096")
    result["staged_on_the_tensor"] = len(pg._staging_buffers)
    everyone = checker.inputs(4095, torch.float32)
    mine = everyone[rank].clone()
    dist.all_reduce(mine, group=both)
    _expect(mine, _reference(everyone, "sum", torch.float32), "padded allreduce 4095")
    result["staged_padded"] = sorted({key[0] for key in pg._staging_buffers})
    dist.destroy_process_group()


_SCENARIOS = {"in-place": _scenario_in_place, "collectives": _scenario_collectives, "mismatch": _scenario_mismatch, "dead-rank": _scenario_dead_rank,
              "process-comm": _scenario_process_comm}


def _write_result(config: dict, rank: int, result: dict) -> None:
    path = Path(config["workdir"]) / f"result-{rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(result))
    path.with_suffix(".tmp").replace(path)


def _worker(argv: list[str]) -> int:
    scenario, rank, world, workdir = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    config = json.loads((workdir / "config.json").read_text())
    config.update(workdir=str(workdir), store=str(workdir / "store"))
    result: dict = {"error": None}
    try:
        _SCENARIOS[scenario](rank, world, config, result)
    except Exception as exc:  # noqa: BLE001 - reported to the test through the result file
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    _write_result(config, rank, result)
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
