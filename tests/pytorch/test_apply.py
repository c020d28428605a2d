"""mlopt.pytorch.apply: a plan index applied to a DDP job (examples/train_ddp's MLP, planned for 2 ranks).

The plans come from examples/train_ddp/make_plans.sh (trace, thread plan, DDP buckets into the trace, `mlopt
plan --model`), once per module. Single-process tests use a 1-rank gloo group in this process; the training
runs spawn 2 processes (FileStore rendezvous, hard timeout) and compare the parameters with gloo + DDP
defaults trained on the same batches.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from mlopt.errors import InputError  # noqa: E402
from mlopt.formats.plan import load_plan  # noqa: E402
from mlopt.planners.threads.artifacts import MIB  # noqa: E402
from mlopt.native.enforcer import ProgramUse  # noqa: E402
from mlopt.pytorch.apply import apply_plans, motif_programs_summary, schedule_mismatch, schedule_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp"
sys.path.insert(0, str(EXAMPLE))
import models  # noqa: E402

RANKS = 2
STEPS = 4
TOLERANCE = 1e-5
JOB_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> Path:
    """make_plans.sh's output for the MLP on 2 ranks: OUT/mlp/{trace.json, ddp.trace.json, plans/}."""
    if shutil.which("mlopt") is None:
        pytest.skip("the mlopt command is not installed (pip install -e .)")
    out = tmp_path_factory.mktemp("train_ddp")
    subprocess.run(["bash", str(EXAMPLE / "make_plans.sh"), str(out), str(RANKS), "mlp"], cwd=REPO, check=True,
                   capture_output=True, timeout=120)
    return out / "mlp"


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    """A 1-rank gloo default group in this process (apply_plans needs a process group)."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def outcomes(applied) -> dict[str, tuple[bool, str]]:
    return {Path(o.file).name: (o.applied, o.detail) for o in applied.outcomes}


def fresh_model() -> "torch.nn.Module":
    torch.manual_seed(0)
    return models.mlp()


def step(model, applied, inputs, targets) -> None:
    with applied.forward():
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()


def test_which_plans_apply_on_one_gloo_rank(plans, one_rank_group):
    model = fresh_model()
    applied = apply_plans(plans / "plans", model, trace=plans / "ddp.trace.json")
    try:
        got = outcomes(applied)
        artifacts = load_plan(plans / "plans" / "threads.plan.json").payload["artifacts"]
        assert got["threads.plan.json"][0], got["threads.plan.json"]
        assert applied.ddp_kwargs["bucket_cap_mb_list"] == [b / MIB for b in artifacts["ddp_bucket_bytes_list"]]
        assert [int(c * MIB) for c in applied.ddp_kwargs["bucket_cap_mb_list"]] == artifacts["ddp_bucket_bytes_list"]
        assert got["memory.plan.json"][0], got["memory.plan.json"]
        collectives = [v for k, v in got.items() if k.startswith("collective-")]
        assert collectives and all(not ok and "'gloo'" in why for ok, why in collectives)
        ok, why = got["schedule.plan.json"]
        assert not ok and "over all 1 ranks" in why  # planned for 2 ranks, this group has 1
        assert len(applied.report()) == len(applied.outcomes)
    finally:
        applied.close()


def test_ddp_rebuilds_the_thread_plan_buckets_and_the_memory_plan_runs(plans, one_rank_group):
    model, reference = fresh_model(), fresh_model()
    applied = apply_plans(plans / "plans", model, trace=plans / "ddp.trace.json")
    try:
        generator = torch.Generator().manual_seed(1)
        for _ in range(2):  # DDP rebuilds its buckets before the second forward pass
            inputs, targets = torch.randn(models.BATCH, 256, generator=generator), torch.randint(0, 10, (32,))
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
            step(applied.model, applied, inputs, targets)
            torch.nn.functional.cross_entropy(reference(inputs), targets).backward()
        buckets = load_plan(plans / "plans" / "threads.plan.json").payload["artifacts"]["ddp_bucket_bytes_list"]
        assert applied.observed_buckets == buckets
        assert "DDP's rebuilt buckets are the plan's" in outcomes(applied)["threads.plan.json"][1]
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    finally:
        applied.close()


def test_bad_fields_are_reported_with_file_and_field(plans, one_rank_group, tmp_path):
    folder = tmp_path / "plans"
    shutil.copytree(plans / "plans", folder)
    doc = json.loads((folder / "threads.plan.json").read_text())
    doc["payload"]["artifacts"]["ddp_bucket_bytes_list"][0] = -5
    (folder / "threads.plan.json").write_text(json.dumps(doc))
    applied = apply_plans(folder, fresh_model(), wrap=False)  # no trace: the memory plan cannot be rebuilt
    got = outcomes(applied)
    ok, why = got["threads.plan.json"]
    assert not ok and "threads.plan.json: $.payload.artifacts.ddp_bucket_bytes_list[0]:" in why
    ok, why = got["memory.plan.json"]
    assert not ok and "memory.plan.json: $.payload.schedule:" in why and "trace=PATH" in why
    ok, why = got["schedule.plan.json"]
    assert not ok  # without the thread plan nothing says what DDP's buckets will be
    with pytest.raises(InputError) as error:
        apply_plans(folder, fresh_model(), wrap=False, strict=True)
    assert error.value.field == "$.payload.artifacts.ddp_bucket_bytes_list[0]"


def test_another_trace_is_refused(plans, one_rank_group):
    with pytest.raises(InputError) as error:
        apply_plans(plans / "plans", fresh_model(), trace=plans / "trace.json", wrap=False)  # not the planned one
    assert error.value.field == "$.inputs.model"


def test_schedule_mismatch_says_why(plans):
    source = str(plans / "plans" / "schedule.plan.json")
    table = schedule_table(load_plan(source), source)
    sizes = [op.nbytes for op in table.ops]
    assert schedule_mismatch(table, RANKS, sizes) is None
    why = schedule_mismatch(table, RANKS, sizes + [4096])
    assert f"{len(sizes)} comm-op(s) of {sizes} bytes" in why and f"{len(sizes) + 1} of" in why
    assert "over all 4 ranks" in schedule_mismatch(table, 4, sizes)


def test_the_schedule_table_carries_the_plans_programs(plans):
    source = str(plans / "plans" / "schedule.plan.json")
    plan = load_plan(source)
    table = schedule_table(plan, source)
    assert table.programs == {e["id"]: e["xml"] for e in plan.payload["programs"]}
    assert all(m.program in table.programs for op in table.ops for m in op.motifs)
    plan.payload["programs"][0]["xml"] += " "  # no longer the program its sha256 names
    with pytest.raises(InputError, match="xml_sha256"):
        schedule_table(plan, source)


# ------------------------------------------------------------------------------------------------ 2 processes


class StandInEnforcer:
    """The enforcer's submit/wait over a gloo group (for the hook machinery where the runtime has no
    multi-process enforcer): wait all-reduces what was submitted, in submission order."""

    def __init__(self, group):
        self.group = group
        self.submitted = {}

    def submit(self, rank, op, tensor):
        self.submitted[op] = tensor

    def wait(self, rank, op):
        dist.all_reduce(self.submitted.pop(op), group=self.group)


def _train(mode: str, rank: int, plans: str) -> dict:
    """STEPS steps of the planned models and of gloo + DDP defaults on the same batches; what happened. Two
    planned models: every plan ("all"), and the communication plans without the schedule ("no-schedule")."""
    from torch.nn.parallel import DistributedDataParallel

    gloo = dist.new_group(backend="gloo")
    factory = None
    if mode == "stand-in":
        stand_in_group = dist.new_group(backend="gloo")
        factory = lambda table, group: StandInEnforcer(stand_in_group)  # noqa: E731
    index, trace = Path(plans) / "plans", Path(plans) / "ddp.trace.json"
    runs = {"all": apply_plans(index, fresh_model(), trace=trace, enforcer_factory=factory),
            "no-schedule": apply_plans(index, fresh_model(), trace=trace, skip=("schedule", "memory"))}
    reference = fresh_model()
    ddp = DistributedDataParallel(reference, process_group=gloo)
    generator = torch.Generator().manual_seed(100 + rank)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
                  for m in (*(a.module for a in runs.values()), reference)]
    for _ in range(STEPS):
        inputs, targets = torch.randn(models.BATCH, 256, generator=generator), torch.randint(0, 10, (32,))
        for applied in runs.values():
            step(applied.model, applied, inputs, targets)
        torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    result = {}
    for name, applied in runs.items():
        hook = applied.schedule_hook
        pairs = zip(applied.module.parameters(), reference.parameters())
        result[name] = {
            "report": applied.report(), "outcomes": {Path(o.file).name: o.applied for o in applied.outcomes},
            "details": {Path(o.file).name: o.detail for o in applied.outcomes},
            "diff": max((p - q).abs().max().item() for p, q in pairs),
            "enforced": hook.enforced_iterations if hook else None,
            "motif_programs": _motif_programs(hook)}
        applied.close()
    return result


def _motif_programs(hook) -> dict[str, dict]:
    """"op/motif" -> the program the hook's enforcer runs it with (Enforcer.motif_programs; none: {})."""
    uses = getattr(hook.enforcer, "motif_programs", {}) if hook else {}
    return {f"{op}/{k}": {"collective": u.collective, "ranks": list(u.ranks), "planned": u.planned,
                          "source": Path(u.source).name if u.planned else u.source, "reason": u.reason,
                          "origin": u.origin}
            for (op, k), u in uses.items()}


def _rank_main(rank: int, mode: str, plans: str, store: str, out: str) -> None:
    try:
        if mode == "mlopt":
            os.environ["MLOPT_PLAN_INDEX"] = str(Path(plans) / "plans")
            import mlopt.pytorch  # noqa: F401 - registers the backend
        dist.init_process_group("mlopt" if mode == "mlopt" else "gloo", store=dist.FileStore(store, RANKS),
                                rank=rank, world_size=RANKS)
        result = _train(mode, rank, plans)
        dist.barrier()
        gc.collect()
        time.sleep(0.2)  # gloo's workers finish releasing tensors before its destructor joins them (GIL)
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(out).write_text(json.dumps(result))


def run_ranks(mode: str, plans: Path) -> list[dict]:
    """Both ranks' results; fails when a rank hangs past JOB_TIMEOUT_S (then killed) or raised."""
    context = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}.json" for r in range(RANKS)]
        procs = [context.Process(target=_rank_main, args=(r, mode, str(plans), str(Path(tmp) / "store"), str(outs[r])))
                 for r in range(RANKS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(JOB_TIMEOUT_S)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
        assert not hung, f"rank(s) {hung} still running after {JOB_TIMEOUT_S} s"
        results = [json.loads(o.read_text()) if o.is_file() else {"error": "no result"} for o in outs]
    errors = [f"rank {r}: {x['error']}" for r, x in enumerate(results) if "error" in x]
    assert not errors, errors
    return results


def test_the_report_groups_motifs_by_program():
    """One clause per program and collective (not per motif): buckets, rank groups and sizes summed up, the
    reasons without their per-motif ranks and sizes."""
    def use(collective, ranks, nbytes, source, planned=False):
        reason = "" if planned else f"no planned {collective} program for ranks {list(ranks)} and {nbytes} bytes"
        return ProgramUse("where", collective, ranks, nbytes, source, planned, reason, "plan")

    programs = {(b, m): use("allreduce", ranks, nbytes, "plan program p1")
                for b, nbytes in enumerate((4096, 8192, 2048)) for m, ranks in enumerate(((0, 2), (1, 3)))}
    programs[(0, 9)] = use("allgather", (0, 1, 2, 3), 4096, "/plans/collective-allgather-4KiB.xml", planned=True)
    assert motif_programs_summary(programs) == (
        "plan program p1 for 6 allreduce motifs (buckets 0-2; ranks [0, 2], [1, 3]; 2048-8192 bytes) "
        "[no planned allreduce program for those ranks and sizes]; "
        "collective-allgather-4KiB.xml for motif 9 of bucket 0 (allgather of 4096 bytes)")
    assert motif_programs_summary({}) == "nothing (no motifs)"


def test_schedule_hook_with_a_stand_in_enforcer_equals_gloo(plans):
    for r in run_ranks("stand-in", plans):
        every = r["all"]
        assert every["outcomes"]["schedule.plan.json"], every["report"]
        assert every["enforced"] == STEPS - 1  # the first iteration runs DDP's provisional buckets through gloo
        assert every["diff"] <= TOLERANCE and r["no-schedule"]["diff"] <= TOLERANCE, (every["diff"], r["no-schedule"])


def _multi_process_problem() -> str | None:
    try:
        from mlopt.native import binding as native

        return native.multi_process_problem()
    except Exception as exc:  # noqa: BLE001 - no library at all
        return str(exc)


def test_all_plans_applied_with_the_mlopt_backend_equal_gloo(plans):
    problem = _multi_process_problem()
    if problem:
        pytest.skip(problem)
    for r in run_ranks("mlopt", plans):
        every, no_schedule = r["all"], r["no-schedule"]
        collectives = [k for k in every["outcomes"] if k.startswith("collective-")]
        assert collectives
        assert all(ok for k, ok in every["outcomes"].items() if k not in collectives), every["report"]
        assert every["enforced"] == STEPS - 1
        # the enforcer's all-reduce motifs over both ranks run the collective plans the backend chooses for them
        programs = every["motif_programs"]
        whole = [p for p in programs.values() if p["collective"] == "allreduce" and p["ranks"] == list(range(RANKS))]
        assert whole and all(p["planned"] and p["source"].startswith("collective-allreduce-") for p in whole), programs
        # every other motif runs the schedule plan's own program (proven when planned), none made in the job
        assert all(p["origin"] == "plan" and p["source"].startswith("plan program p")
                   for p in programs.values() if not p["planned"]), programs
        through_motifs = {p["source"] for p in programs.values() if p["planned"]}
        for k in collectives:  # applied through the motifs, else through DDP's first-iteration buckets, else not
            ok, detail = every["outcomes"][k], every["details"][k]
            if k.replace(".json", ".xml") in through_motifs:
                assert ok and "runs as the program of schedule.plan.json's motif" in detail, detail
            elif ok:
                assert "the mlopt backend ran DDP's first-iteration bucket(s)" in detail, detail
            else:
                assert "nothing of DDP's runs it: no motif of schedule.plan.json" in detail, detail
        assert "its motifs run collective-allreduce-" in every["details"]["schedule.plan.json"]
        # without the schedule plan the backend runs the collective plans for DDP's buckets
        assert all(no_schedule["outcomes"][k] for k in collectives), no_schedule["report"]
        assert every["diff"] <= TOLERANCE and no_schedule["diff"] <= TOLERANCE, (every["diff"], no_schedule["diff"])
