"""`mlopt validate threads.plan.json [--model trace.json]`: a thread plan checked without a solver.

The plan's layers, options and contention parameters rebuild the problem; its groups must cover the layers in
order with threads from the thread set, and re-evaluating them with the stage model (eq. 7-15) must give the
backward time the plan predicts. With --model, the layers must be the trace's. The DDP bucket caps must
reproduce the groups' bytes.
"""

from __future__ import annotations

import math

from mlopt.errors import InputError
from mlopt.formats.loaders import load_trace_any
from mlopt.formats.plan import PlanFile
from mlopt.planners.threads.build import layers_from_trace
from mlopt.planners.threads.model import Group, evaluate
from mlopt.planners.threads.planner import ThreadsOptions, make_problem

REQUIRED = ("algorithm", "options", "contention", "layers", "groups", "predicted", "artifacts")


def _problem(payload: dict, source: str):
    options = dict(payload["options"])
    options["thread_set"] = tuple(options["thread_set"])
    try:
        threads_options = ThreadsOptions(**options)
        layers = [(l["name"], l["compute_us"], l["grad_bytes"]) for l in payload["layers"]]
        return threads_options, make_problem(layers, threads_options, payload["contention"]["parameters"])
    except (TypeError, KeyError, ValueError) as exc:
        raise InputError(source, "$.payload", f"cannot rebuild the problem: {exc}") from None


def _check_trace(payload: dict, source: str, model_path: str) -> None:
    traced = layers_from_trace(load_trace_any(model_path), model_path)
    planned = [(l["name"], l["compute_us"], l["grad_bytes"]) for l in payload["layers"]]
    if len(traced) != len(planned):
        raise InputError(source, "$.payload.layers", f"{len(planned)} layers but {model_path} has {len(traced)}")
    for i, (t, p) in enumerate(zip(traced, planned)):
        if t[0] != p[0] or t[2] != p[2] or not math.isclose(t[1], p[1], rel_tol=1e-9, abs_tol=1e-6):
            raise InputError(source, f"$.payload.layers[{i}]", f"{p} but {model_path} gives {t}")


def validate_threads_plan(plan: PlanFile, source: str, model_path: str | None, topology_spec: str | None) -> str:
    payload = plan.payload
    for key in REQUIRED:
        if key not in payload:
            raise InputError(source, f"$.payload.{key}", "missing required field")
    options, problem = _problem(payload, source)
    if model_path is not None:
        _check_trace(payload, source, model_path)
    groups = []
    for i, g in enumerate(payload["groups"]):
        if g.get("threads") not in options.thread_set and payload["algorithm"] in ("libra", "libra-m"):
            raise InputError(source, f"$.payload.groups[{i}].threads", f"{g.get('threads')} is not in the thread "
                                                                        f"set {list(options.thread_set)}")
        groups.append(Group(g["first"], g["last"], g["threads"]))
    try:
        evaluation = evaluate(problem, groups)
    except ValueError as exc:
        raise InputError(source, "$.payload.groups", str(exc)) from None
    predicted = payload["predicted"]["backward_us"]
    if not math.isclose(evaluation.backward_us, predicted, rel_tol=1e-9, abs_tol=1e-6):
        raise InputError(source, "$.payload.predicted.backward_us",
                         f"{predicted} but the groups re-evaluate to {evaluation.backward_us}")
    sizes = [g["bytes"] for g in payload["groups"] if g["bytes"] > 0]
    if payload["artifacts"]["ddp_bucket_bytes_list"] != sizes:
        raise InputError(source, "$.payload.artifacts.ddp_bucket_bytes_list",
                         f"{payload['artifacts']['ddp_bucket_bytes_list']} does not match the groups' bytes {sizes}")
    ddp = payload.get("baselines", {}).get("ddp")
    versus = f", {100 * (1 - predicted / ddp):.1f}% below DDP's buckets" if ddp else ""
    return (f"{len(groups)} groups cover {len(problem.layers)} layers; backward {predicted:.1f} us re-evaluated"
            f"{versus}")
