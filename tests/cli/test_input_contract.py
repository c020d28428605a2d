"""Issue 24, one input contract: bad input exits 2 with one line naming the file and the field, Ctrl-C exits 130
with one line and no partial file, a failing command leaves nothing behind. One or two representative cases per
rule (the corpus in bench/input_contract.py has the rest), a bounded run of that corpus, and a fuzz test of the
JSON loaders."""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import REPO
from mlopt.errors import InputError
from mlopt.formats.io import write_json

TOPO = "fully-connected:2"


# ---------------------------------------------------------------------------------------------------------
# helpers


def refused(result, *names: str) -> str:
    """The one error line of an exit-2 refusal; it must contain every name (file, field)."""
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err
    lines = [line for line in result.err.splitlines() if line.startswith(("mlopt: error:", "Error:"))]
    assert len(lines) == 1, result.err
    assert result.err.strip().splitlines()[-1] == lines[0], result.err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def raw_json(doc, **tokens: str) -> str:
    """JSON of doc with the string values "@NAME@" replaced by the raw token NAME=... (NaN, 1e400)."""
    text = json.dumps(doc)
    for key, token in tokens.items():
        text = text.replace(f'"@{key}@"', token)
    return text


@pytest.fixture(scope="module")
def example(tmp_path_factory, ddp_example_trace):
    """The README's example: the trace and `mlopt plan --model` plans on fully-connected:2."""
    from mlopt.cli import main

    folder = tmp_path_factory.mktemp("contract")
    assert main(["-q", "plan", "--model", str(ddp_example_trace), "--topology", TOPO, "-o", str(folder / "plans")]) == 0
    return {"trace": ddp_example_trace, "plans": folder / "plans",
            "doc": json.loads(Path(ddp_example_trace).read_text())}


def trace_with(tmp_path, example, mutate, **tokens) -> Path:
    doc = copy.deepcopy(example["doc"])
    mutate(doc)
    path = tmp_path / "trace.json"
    path.write_text(raw_json(doc, **tokens))
    return path


def first_forward(doc) -> int:
    return next(i for i, op in enumerate(doc["ops"]) if op["role"] == "forward")


# ---------------------------------------------------------------------------------------------------------
# traces: non-finite, negative, dangling, ranks


def test_nan_op_time_is_refused_naming_its_json_path(run_cli, tmp_path, example):
    i = first_forward(example["doc"])
    bad = trace_with(tmp_path, example, lambda d: d["ops"][i]["implementations"][0].update(compute_us="@X@"), X="NaN")
    refused(run_cli("validate", bad), str(bad), f"$.ops[{i}].implementations[0].compute_us", "finite")
    # and it never reaches HiGHS: the memory planner refuses it the same way, writing nothing
    out = tmp_path / "m.plan.json"
    refused(run_cli("plan", "memory", "--model", bad, "--budget-ratio", "1", "-o", out), "compute_us")
    assert not out.exists()


def test_number_beyond_float_range_is_refused(run_cli, tmp_path, example):
    bad = trace_with(tmp_path, example, lambda d: d["tensors"][0].update(bytes="@X@"), X="1e400")
    refused(run_cli("plan", "threads", "--model", bad, "--nodes", "2", "-o", tmp_path / "t.json"),
            "$.tensors[0].bytes")


def test_empty_trace_is_refused_not_divided_by(run_cli, tmp_path, example):
    bad = trace_with(tmp_path, example, lambda d: d.update(ops=[], tensors=[], process_groups=[]))
    refused(run_cli("plan", "memory", "--model", bad, "--budget-ratio", "1", "-o", tmp_path / "m.json"),
            str(bad), "$.ops", "no ops")


def test_negative_tensor_id_is_refused(run_cli, tmp_path, example):
    bad = trace_with(tmp_path, example, lambda d: d["tensors"][2].update(id=-7))
    refused(run_cli("validate", bad), "$.tensors[2].id", ">= 0")


@pytest.mark.parametrize("ranks, field, fragment", [([0, 5], "$.process_groups[0].ranks[1]", "outside the world"),
                                                    ([0, 0], "$.process_groups[0].ranks", "non-unique")])
def test_process_group_ranks_are_distinct_and_inside_the_world(run_cli, tmp_path, example, ranks, field, fragment):
    bad = trace_with(tmp_path, example, lambda d: d["process_groups"][0].update(ranks=ranks))
    refused(run_cli("simulate", "--model", bad, "--topology", TOPO), field, fragment)


def test_backward_op_must_pair_with_a_forward_op(run_cli, tmp_path, example):
    doc = example["doc"]
    b = next(i for i, op in enumerate(doc["ops"]) if op["forward_op"] is not None)
    optimizer = next(op["id"] for op in doc["ops"] if op["role"] == "optimizer")
    bad = trace_with(tmp_path, example, lambda d: d["ops"][b].update(forward_op=optimizer))
    refused(run_cli("validate", bad), f"$.ops[{b}].forward_op", "not a forward op")


def test_deeply_nested_json_is_refused_not_a_recursion_error(run_cli, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    refused(run_cli("validate", deep), str(deep), "nested too deeply")


def test_yaml_alias_bomb_is_checked_in_linear_time(tmp_path):
    from mlopt.formats.io import check_finite, parse_document

    lines = ['a0: &a0 [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]']
    lines += [f"a{k}: &a{k} [" + ",".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 9)]  # 9**9 leaves
    doc = parse_document("\n".join(lines), "bomb.yaml")
    check_finite(doc, "bomb.yaml")  # visits each of the ~90 distinct lists once: instant, not 387 million leaves


def test_a_fifo_is_refused_without_blocking(run_cli, tmp_path):
    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    done = {}
    worker = threading.Thread(target=lambda: done.update(result=run_cli("validate", fifo)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert "result" in done, "mlopt validate blocked on a FIFO"
    refused(done["result"], str(fifo), "not a regular file")


# ---------------------------------------------------------------------------------------------------------
# sizes and numeric options


@pytest.mark.parametrize("size", ["1e400", "9" * 400, "1e30"])
def test_sizes_beyond_any_buffer_are_refused(run_cli, tmp_path, size):
    out = tmp_path / "a.xml"
    refused(run_cli("plan", "collective", "--topology", TOPO, "--collective", "allreduce", "--size", size, "-o", out),
            "--size")
    assert not out.exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_options_are_refused(run_cli, tmp_path, ddp_example_trace, value):
    refused(run_cli("plan", "memory", "--model", ddp_example_trace, "--budget-ratio", value, "-o", tmp_path / "m.json"),
            "--budget-ratio", "not a finite number")


def test_non_finite_sweep_ratio_is_refused(run_cli, tmp_path, ddp_example_trace):
    refused(run_cli("plan", "memory", "--model", ddp_example_trace, "--sweep", "0.5,nan", "-o", tmp_path / "sw"),
            "--sweep", "finite")
    assert not (tmp_path / "sw").exists()


# ---------------------------------------------------------------------------------------------------------
# outputs: file-system errors, whole outputs or none, Ctrl-C


def test_output_through_a_regular_file_exits_2_naming_it(run_cli, tmp_path, ddp_example_trace):
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "m.plan.json"
    refused(run_cli("plan", "memory", "--model", ddp_example_trace, "--budget-ratio", "1", "-o", out),
            str(out), "cannot write")


def test_output_folder_that_is_a_file_exits_2_and_keeps_the_file(run_cli, tmp_path, ddp_example_trace):
    out = tmp_path / "plans"
    out.write_text("keep me")
    refused(run_cli("plan", "--model", ddp_example_trace, "--topology", TOPO, "-o", out), str(out), "is a file")
    assert out.read_text() == "keep me"


def test_umbrella_plan_writes_every_plan_or_none(run_cli, tmp_path, ddp_example_trace):
    out = tmp_path / "plans"
    (out / "threads.plan.json").mkdir(parents=True)  # the threads planner runs after memory and collective
    refused(run_cli("-q", "plan", "--model", ddp_example_trace, "--topology", TOPO, "-o", out),
            "threads.plan.json", "is a directory")
    assert sorted(p.name for p in out.iterdir()) == ["threads.plan.json"], "no plan of the failed run may stay"


def test_threads_plan_and_its_tuner_csv_are_written_together(run_cli, tmp_path, ddp_example_trace):
    out = tmp_path / "t.plan.json"
    (tmp_path / "t.plan.nccl-tuner.csv").mkdir()
    refused(run_cli("plan", "threads", "--model", ddp_example_trace, "--nodes", "2", "-o", out), "nccl-tuner.csv")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.plan.nccl-tuner.csv"]


def test_ctrl_c_exits_130_with_one_line_and_no_partial_folder(run_cli, tmp_path, ddp_example_trace, monkeypatch):
    """KeyboardInterrupt after the memory plan was written into the staging folder: nothing may appear."""
    from mlopt.planners import umbrella

    real = umbrella.write_plan_index

    def interrupted(out_dir, *args, **kwargs):
        assert any(Path(out_dir).iterdir()), "plans were staged before the index"
        raise KeyboardInterrupt

    monkeypatch.setattr(umbrella, "write_plan_index", interrupted)
    out = tmp_path / "plans"
    result = run_cli("-q", "plan", "--model", ddp_example_trace, "--topology", TOPO, "-o", out)
    assert (result.code, result.err.strip()) == (130, "mlopt: interrupted")
    assert list(tmp_path.iterdir()) == [], "no output folder, no staging folder"
    monkeypatch.setattr(umbrella, "write_plan_index", real)


def test_a_swallowed_interrupt_still_stops_the_output(tmp_path):
    """Python drops a KeyboardInterrupt raised inside a weakref callback; the flag the handler sets stops the
    next write anyway."""
    from mlopt.formats import io

    io.clear_interrupt()
    io.note_interrupt()
    try:
        with pytest.raises(KeyboardInterrupt):
            io.write_json(tmp_path / "x.json", {"a": 1})
    finally:
        io.clear_interrupt()
    assert list(tmp_path.iterdir()) == []


def test_unwritable_dump_model_fails_before_planning(run_cli, tmp_path, ddp_example_trace):
    out = tmp_path / "plans"
    refused(run_cli("plan", "--model", ddp_example_trace, "--topology", TOPO, "-o", out, "--dump-model",
                    "/proc/mlopt-no-such/m.mps"), "m.mps")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# plans, indexes, recorded inputs


def test_plan_index_naming_a_missing_file_is_refused(run_cli, tmp_path, example):
    index = json.loads((example["plans"] / "index.json").read_text())
    index["plans"][0]["file"] = "gone.plan.json"
    path = tmp_path / "index.json"
    write_json(path, index)
    refused(run_cli("validate", path), str(path), "$.plans[0].file", "missing")


def test_plan_index_listing_itself_is_refused_not_a_hang(run_cli, tmp_path, example):
    index = json.loads((example["plans"] / "index.json").read_text())
    index["plans"][0]["file"] = "index.json"
    path = tmp_path / "index.json"
    write_json(path, index)
    refused(run_cli("simulate", path, "--model", example["trace"], "--topology", TOPO), "$.plans[0].file")


def test_memory_plan_with_a_dangling_backward_op_is_refused(run_cli, tmp_path, example):
    plan = json.loads((example["plans"] / "memory.plan.json").read_text())
    plan["payload"]["schedule"]["backward"][0]["op_id"] = 99999
    path = tmp_path / "m.plan.json"
    write_json(path, plan)
    for args in (("validate", path, "--model", example["trace"]), ("simulate", path, "--model", example["trace"])):
        refused(run_cli(*args), "$.payload.schedule.backward[0].op_id")


def test_threads_plan_missing_a_field_is_refused_naming_it(run_cli, tmp_path, example):
    plan = json.loads((example["plans"] / "threads.plan.json").read_text())
    del plan["payload"]["groups"][0]["first"]
    path = tmp_path / "t.plan.json"
    write_json(path, plan)
    refused(run_cli("simulate", path, "--model", example["trace"], "--topology", TOPO),
            "$.payload.groups[0].first", "missing")


def test_schedule_plan_with_a_repeated_comm_op_is_refused(run_cli, tmp_path, example):
    plan = json.loads((example["plans"] / "schedule.plan.json").read_text())
    plan["payload"]["comm_ops"].append(copy.deepcopy(plan["payload"]["comm_ops"][0]))
    path = tmp_path / "s.plan.json"
    write_json(path, plan)
    refused(run_cli("validate", path), f"$.payload.comm_ops[{len(plan['payload']['comm_ops']) - 1}].id")


def test_changed_trace_warns_and_strict_refuses(run_cli, tmp_path, example):
    doc = copy.deepcopy(example["doc"])
    doc["name"] = "renamed"  # other bytes, same ops: every replay still agrees
    trace = tmp_path / "trace.json"
    write_json(trace, doc)
    plan = example["plans"] / "memory.plan.json"
    result = run_cli("validate", plan, "--model", trace)
    assert result.code == 0
    assert "mlopt: warning:" in result.err and "$.provenance.inputs.model" in result.err
    refused(run_cli("validate", plan, "--model", trace, "--strict"), str(plan), "$.provenance.inputs.model",
            "--strict")
    refused(run_cli("simulate", example["plans"] / "index.json", "--model", trace, "--topology", TOPO, "--strict"),
            "index.json", "$.inputs.model")


def test_simulate_runs_the_program_checks_of_validate(run_cli, tmp_path, example):
    """An XML whose send reads outside its input: validate refuses it, and simulate too, before timing."""
    xml = next(example["plans"].glob("collective-allreduce-*.xml")).read_text()
    bad = tmp_path / "x.xml"
    bad.write_text(xml.replace('type="s" srcbuf="i" srcoff="1"', 'type="s" srcbuf="i" srcoff="9"', 1))
    assert 'srcoff="9"' in bad.read_text()
    refused(run_cli("validate", bad), str(bad))
    refused(run_cli("simulate", bad, "--topology", TOPO, "--size", "1MiB"), str(bad))
    refused(run_cli("simulate", bad, "--model", example["trace"], "--topology", TOPO), str(bad))


def test_topology_file_with_a_rank_cut_off_is_refused(run_cli, tmp_path):
    from mlopt.formats.topology import from_spec

    doc = from_spec(TOPO).to_dict()
    doc["links"] = [link for link in doc["links"] if link["src"] != 1]  # rank 1 can no longer send
    path = tmp_path / "topo.json"
    write_json(path, doc)
    refused(run_cli("simulate", "--workload", "dp:ranks=2,layers=2,bytes=1MiB", "--topology", path),
            str(path), "$.links", "disconnected")


def test_sweep_with_a_missing_model_is_refused_before_any_cell(run_cli, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("planner: memory\noptions:\n  model: gone.json\ngrid:\n  budget-ratio: [1.0]\n")
    out = tmp_path / "sw"
    refused(run_cli("sweep", spec, "-o", out, "--no-cache", "--workers", "1"), str(spec), "model", "no such file")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# the corpus generator on a tiny subset


def test_corpus_runs_and_classifies_a_small_subset(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import input_contract as ic
    finally:
        sys.path.remove(str(REPO / "bench"))
    base = ic.make_base(tmp_path / "base")
    corpus = ic.build_corpus(base)
    assert len(corpus) >= 700
    wanted = ["trace/nan-compute/validate", "trace/unicode-names/validate", "size/1e400/plan-collective",
              "output/through-a-file/plan-memory"]
    cases = [c for c in corpus if c.id in wanted]
    assert len(cases) == len(wanted)
    outcomes = {o.id: o for o in ic.run_corpus(cases, tmp_path, base.folder, jobs=2, progress=False)}
    assert {i: outcomes[i].cls for i in wanted} == {
        "trace/nan-compute/validate": "correctly-refused", "trace/unicode-names/validate": "ok-accepted",
        "size/1e400/plan-collective": "correctly-refused", "output/through-a-file/plan-memory": "correctly-refused"}


def test_corpus_classifier_catches_each_failure_class():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import input_contract as ic
    finally:
        sys.path.remove(str(REPO / "bench"))
    bad = ic.Case("x", "trace", "validate", [], "refuse", "bad", ("t.json", "$.ops"))
    good = ic.Case("y", "good", "validate", [], "ok", "good")
    line = "mlopt: error: t.json: $.ops: no ops\n"
    assert ic.classify(bad, 2, line, False, False)[0] == "correctly-refused"
    assert ic.classify(bad, 2, "mlopt: error: t.json: $: no\n", False, False)[0] == "unclear-refusal"
    assert ic.classify(bad, 2, line + "more\n", False, False)[0] == "unclear-refusal"
    assert ic.classify(bad, 0, "", False, False)[0] == "wrongly-accepted"
    assert ic.classify(bad, 1, "Traceback (most recent call last):\n", False, False)[0] == "internal-error"
    assert ic.classify(bad, None, "", True, False)[0] == "hang"
    assert ic.classify(bad, 2, line, False, True)[0] == "partial-output"
    assert ic.classify(bad, 3, line, False, False)[0] == "unclear-refusal"  # bad input is not infeasible
    assert ic.classify(good, 2, line, False, False)[0] == "wrongly-refused"
    assert ic.classify(good, 0, "", False, False)[0] == "ok-accepted"
