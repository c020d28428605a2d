"""`mlopt plan threads`: LIBRA's communication thread allocation co-optimised with tensor fusion.

`plan_threads(problem, options)` runs the chosen algorithm (LIBRA's DP, LIBRA-M, or a fusion baseline),
evaluates every baseline under the same model for comparison, and returns a Plan whose payload holds what a
training job loads: the fusion groups (layer ranges in backward order, bytes, threads, NCCL channels), the
predicted stage and backward times, and the artifacts (DDP `bucket_cap_mb_list`, NCCL_NTHREADS, an NCCL tuner
config CSV). Status: LIBRA's DP is exact on its chunk grid, and Theorem 1 bounds the plan within
(1 + (K-1)/Z) of the best plan over the thread set when the fitted model satisfies the theorem's assumptions:
then the plan is "feasible" with best_bound = backward / (1 + (K-1)/Z); otherwise (or for baselines) it is
"heuristic", with the violated assumptions named.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from mlopt import __version__
from mlopt.formats.plan import Plan, PlanStatus, Provenance, input_hashes
from mlopt.planners.options import PlannerOptions
from mlopt.planners.result import heuristic_plan
from mlopt.planners.threads import artifacts, baselines
from mlopt.planners.threads.dp import co_optimise, threads_for_fusion
from mlopt.planners.threads.model import ContentionParams, Group, Layer, ThreadsProblem, assumption_violations, evaluate

ALGORITHMS = ("libra", "libra-m", "ddp", "horovod", "mg-wfbp", "single")
DEFAULT_THREAD_SET = (128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class ThreadsOptions:
    """One field per option of `mlopt plan threads`, same names (declared in mlopt/planners/threads/kind.py
    COMMAND_OPTIONS, from which the CLI builds its flags)."""

    nodes: int  # --nodes: N, data-parallel workers all-reducing every gradient
    algorithm: str = "libra"  # --algorithm: libra | libra-m | ddp | horovod | mg-wfbp | single
    thread_set: tuple[int, ...] = DEFAULT_THREAD_SET  # --threads: R, the communication thread counts to choose from
    max_groups: int = 10  # --max-groups: K, most fusion groups LIBRA may form
    chunks: int = 150  # --chunks: Z, computation chunks of the DP's grid (bound 1 + (K-1)/Z)
    alpha_us: float = 5.0  # --alpha-us: per-step latency of the all-reduce (ring: a = 2(N-1) alpha)
    allreduce: str = "ring"  # --allreduce: ring | tree | halving_doubling (cost model of eq. 3-4)
    default_threads: int = 512  # --default-threads: threads of the baselines that do not choose (NCCL_NTHREADS)
    # --gpus-per-node: ranks on each of the N nodes; only the NCCL tuner lines use it (nNodes = N, nRanks =
    # N x this); unset, the lines hold for any communicator. The cost model keeps N workers (the paper's nodes).
    gpus_per_node: int | None = None


def contention_params(parameters: Mapping[str, float]) -> ContentionParams:
    """contention.py's parameter names (q_gamma* for the exposed model q) -> the model's (delta*)."""
    return ContentionParams(alpha1=parameters["alpha1"], alpha2=parameters["alpha2"],
                            gamma1=parameters["gamma1"], gamma2=parameters["gamma2"], gamma3=parameters["gamma3"],
                            gamma4=parameters.get("gamma4", 0.6), delta1=parameters["q_gamma1"],
                            delta2=parameters["q_gamma2"], delta3=parameters["q_gamma3"],
                            delta4=parameters.get("q_gamma4"))


def make_problem(layers: Sequence[tuple[str, float, int]], options: ThreadsOptions,
                 parameters: Mapping[str, float]) -> ThreadsProblem:
    return ThreadsProblem(tuple(Layer(n, c, b) for n, c, b in layers), options.nodes, options.alpha_us,
                          tuple(options.thread_set), contention_params(parameters), options.allreduce)


def groups_for(problem: ThreadsProblem, options: ThreadsOptions, algorithm: str) -> tuple[list[Group], float | None]:
    """(groups, Theorem-1 factor or None) of one algorithm."""
    threads = options.default_threads
    if algorithm == "libra":
        result = co_optimise(problem, options.max_groups, options.chunks)
        return list(result.groups), result.bound_factor
    if algorithm == "libra-m":
        return list(baselines.libra_m(problem, options.chunks, fusion_threads=threads)), None
    table = {"ddp": baselines.ddp_buckets, "horovod": baselines.horovod, "mg-wfbp": baselines.mg_wfbp,
             "single": baselines.single_bucket}
    return list(table[algorithm](problem, threads)), None


def group_rows(problem: ThreadsProblem, groups: Sequence[Group], stages: Sequence[dict], channels: Sequence[int]):
    rows = []
    for group, stage, channel in zip(groups, stages, channels):
        layers = problem.layers[group.first:group.last + 1]
        rows.append({"first": group.first, "last": group.last, "layers": [l.name for l in layers],
                     "bytes": sum(l.grad_bytes for l in layers), "threads": group.threads, "channels": channel,
                     "stage": dict(stage)})
    return rows


def compare_baselines(problem: ThreadsProblem, options: ThreadsOptions) -> dict[str, float]:
    """Predicted backward time of every algorithm under the same model (the plan's comparison table)."""
    out = {}
    for name in ALGORITHMS:
        groups, _ = groups_for(problem, options, name)
        out[name] = evaluate(problem, groups).backward_us
    return out


def plan_threads(problem: ThreadsProblem, options: ThreadsOptions, planner_options: PlannerOptions,
                 inputs: dict[str, Any], contention: dict[str, Any], tuner_file: str,
                 communicators: Sequence[tuple[int, int]] | None = None) -> tuple[Plan, str]:
    """(the thread plan of `options.algorithm`, its NCCL tuner CSV text); `contention` says where the model's
    parameters came from; `tuner_file` is the CSV's path relative to the plan file (the job resolves it:
    artifacts.job_env); `communicators` are the (nNodes, nRanks) the tuner lines name (default: from
    options.nodes and options.gpus_per_node, artifacts.job_communicators)."""
    if communicators is None:
        communicators = artifacts.job_communicators(options.nodes, options.gpus_per_node)
    started = time.perf_counter()
    groups, factor = groups_for(problem, options, options.algorithm)
    evaluation = evaluate(problem, groups)
    sizes = [sum(l.grad_bytes for l in problem.layers[g.first:g.last + 1]) for g in groups]
    communicating = [(s, g.threads) for s, g in zip(sizes, groups) if s > 0]
    made = artifacts.thread_plan_artifacts([s for s, _ in communicating], [t for _, t in communicating],
                                           tuner_config_file=tuner_file, communicators=communicators)
    channel_of = iter(made["channels"])
    channels = [next(channel_of) if s > 0 else 0 for s in sizes]
    violations = list(assumption_violations(problem))
    payload = {
        "algorithm": options.algorithm,
        "options": {**asdict(options), "thread_set": list(options.thread_set)},
        "contention": contention,
        "layers": [{"name": l.name, "compute_us": l.compute_us, "grad_bytes": l.grad_bytes} for l in problem.layers],
        "groups": group_rows(problem, groups, evaluation.stages, channels),
        "predicted": {"backward_us": evaluation.backward_us,
                      "compute_us": sum(l.compute_us for l in problem.layers)},
        "baselines": compare_baselines(problem, options),
        "guarantee": {"theorem": "1", "factor": factor, "assumption_violations": violations},
        "artifacts": {"ddp_bucket_cap_mb_list": made["bucket_cap_mb_list"],
                      "ddp_bucket_bytes_list": made["bucket_bytes_list"],
                      "nccl_nthreads": made["nccl_nthreads"], "env": made["env"], "nccl_tuner_config": tuner_file,
                      "nccl_communicators": [{"nNodes": n, "nRanks": r} for n, r in communicators],
                      "channel_conflicts": made["channel_conflicts"]},
    }
    wall = time.perf_counter() - started
    notes = tuple(f"Theorem 1's assumption fails: {v}" for v in violations)
    if factor is None or violations:
        return heuristic_plan("threads", evaluation.backward_us, payload, inputs, planner_options, wall,
                              notes), made["nccl_tuner_csv"]
    # LIBRA's own DP is the solver; its bound is Theorem 1's.
    bound = evaluation.backward_us / factor
    provenance = Provenance(input_hashes(inputs), "libra-dp", __version__, planner_options.to_dict())
    plan = Plan("threads", PlanStatus.FEASIBLE, evaluation.backward_us, bound,
                (evaluation.backward_us - bound) / evaluation.backward_us, wall, payload, provenance, notes)
    return plan, made["nccl_tuner_csv"]
