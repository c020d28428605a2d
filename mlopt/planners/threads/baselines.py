"""Fusion baselines the LIBRA paper compares with; each returns groups in backward order for `evaluate`.

Every baseline takes the thread count its all-reduces run with (a library default, DEFAULT_THREADS for
NCCL), except LIBRA-M, which optimises threads per group with the fixed-fusion DP.

* single_bucket (SynEASGD, "SE"): one all-reduce of every gradient once the backward pass is done.
* ddp_buckets (PyTorch DDP): buckets filled in backward order; a bucket closes as soon as its size
  reaches its cap (the layer that crosses the cap stays in it, as reducer.cpp's
  compute_bucket_assignment_by_size does), the first bucket's cap being first_cap_bytes.
* horovod (Horovod tensor fusion): consecutive gradients fused while the fusion buffer stays within the
  threshold; a gradient that would overflow it starts the next buffer (one larger than the threshold goes
  alone). Horovod's cycle time is not modelled: every ready tensor is assumed to be in the same cycle.
* mg_wfbp (Shi et al., MG-WFBP): see `mg_wfbp`.
* libra_m (LIBRA-M): MG-WFBP's fusion, then threads per group by `threads_for_fusion`.

Layers without gradient bytes belong to no DDP or Horovod bucket, so they cannot delay one: trailing ones
(after the last layer with bytes) form a group of their own, which launches no all-reduce.
"""

from __future__ import annotations

import numpy as np

from mlopt.planners.threads.dp import threads_for_fusion
from mlopt.planners.threads.model import Group, ThreadsProblem, allreduce_cost, comm_durations

DEFAULT_THREADS = 512  # NCCL's default threads per all-reduce kernel (NCCL_NTHREADS)
DDP_CAP_BYTES = 25 * 2**20
DDP_FIRST_CAP_BYTES = 2**20
HOROVOD_THRESHOLD_BYTES = 128 * 2**20


def _check_threads(problem: ThreadsProblem, threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads <= 0:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    problem.params.compute_rate(threads)  # raises, naming r, when the model does not cover it
    problem.params.overlapped_rate(threads)
    problem.params.exposed_rate(threads)
    return int(threads)


def _groups(problem: ThreadsProblem, ranges: list[tuple[int, int]], threads: int) -> list[Group]:
    """Groups from ranges, the zero-byte tail of the last range split off into its own group."""
    first, last = ranges[-1]
    end = last
    while end > first and problem.layers[end].grad_bytes == 0:
        end -= 1
    if end < last and problem.layers[end].grad_bytes > 0:
        ranges = ranges[:-1] + [(first, end), (end + 1, last)]
    return [Group(a, b, threads) for a, b in ranges]


def single_bucket(problem: ThreadsProblem, threads: int) -> list[Group]:
    """SE: every gradient in one all-reduce after the whole backward pass (no overlap)."""
    return [Group(0, len(problem.layers) - 1, _check_threads(problem, threads))]


def ddp_buckets(problem: ThreadsProblem, threads: int, cap_bytes: int = DDP_CAP_BYTES,
                first_cap_bytes: int = DDP_FIRST_CAP_BYTES) -> list[Group]:
    """PyTorch DDP bucketing in backward order: close a bucket once its bytes reach its cap."""
    threads = _check_threads(problem, threads)
    if cap_bytes <= 0 or first_cap_bytes <= 0:
        raise ValueError(f"bucket caps must be positive, got cap_bytes={cap_bytes}, first_cap_bytes={first_cap_bytes}")
    ranges, first, size, cap = [], 0, 0, first_cap_bytes
    for k, layer in enumerate(problem.layers):
        size += layer.grad_bytes
        if size >= cap:
            ranges.append((first, k))
            first, size, cap = k + 1, 0, cap_bytes
    if first < len(problem.layers):
        ranges.append((first, len(problem.layers) - 1))
    return _groups(problem, ranges, threads)


def horovod(problem: ThreadsProblem, threads: int, threshold_bytes: int = HOROVOD_THRESHOLD_BYTES) -> list[Group]:
    """Horovod tensor fusion: fuse consecutive gradients while the buffer stays within threshold_bytes."""
    threads = _check_threads(problem, threads)
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be positive, got {threshold_bytes}")
    ranges, first, size = [], 0, 0
    for k, layer in enumerate(problem.layers):
        if size > 0 and size + layer.grad_bytes > threshold_bytes:
            ranges.append((first, k - 1))
            first, size = k, 0
        size += layer.grad_bytes
    ranges.append((first, len(problem.layers) - 1))
    return _groups(problem, ranges, threads)


def mg_wfbp(problem: ThreadsProblem, threads: int) -> list[Group]:
    """MG-WFBP's merge rule (Shi, Chu, Li; the authors' _generate_groups_mgwfbp), contention-free.

    MG-WFBP knows the alpha-beta model only: layer k's gradient is ready at ready_k = b_0 + ... + b_k
    (no contention) and an all-reduce of P bytes takes t(P) = a + q(P, threads) (0 when P = 0). Walking
    the layers in backward order with the open group ending at layer k, its all-reduce would start at
    start = max(end of the previous all-reduce, ready_k). Layer k+1 joins the group when its gradient is
    ready before that all-reduce would end (ready_{k+1} < start + t(P)) and either the all-reduce could
    not have started before it anyway (start > ready_{k+1}: merging is free and saves a startup) or the
    wait it adds is shorter than the startup it saves (ready_{k+1} - start < a). Otherwise the group is
    closed and layer k+1 opens the next. (The rule provably minimises the iteration time in the
    contention-free model with sequential all-reduces, per Shi et al.; it ignores contention.)
    """
    threads = _check_threads(problem, threads)
    layers = problem.layers
    startup = allreduce_cost(problem).startup_us

    def t_comm(size: int) -> float:
        return float(comm_durations(problem, size, threads)[1])  # a + q, 0 without bytes

    ranges, first, size, prev_end, ready = [], 0, 0, 0.0, 0.0
    for k, layer in enumerate(layers):
        ready += layer.compute_us
        size += layer.grad_bytes
        if k + 1 == len(layers):
            break
        start = max(prev_end, ready)
        next_ready = ready + layers[k + 1].compute_us
        if next_ready < start + t_comm(size) and (start > next_ready or next_ready - start < startup):
            continue  # merge layer k+1 into this group
        ranges.append((first, k))
        prev_end, first, size = start + t_comm(size), k + 1, 0
    ranges.append((first, len(layers) - 1))
    return [Group(a, b, threads) for a, b in ranges]


def libra_m(problem: ThreadsProblem, Z: int, fusion_threads: int = DEFAULT_THREADS) -> list[Group]:
    """LIBRA-M: MG-WFBP's fusion (computed with fusion_threads, as MG-N runs it) + the best threads per group."""
    fusion = [(g.first, g.last) for g in mg_wfbp(problem, fusion_threads)]
    return list(threads_for_fusion(problem, fusion, Z).groups)
