"""Where cells run: a local process pool (default), or an existing Dask or Ray cluster.

Every executor runs the same function (`mlopt.sweep.cells.run_cell`) on the same plain-data task and
returns the same plain data (exit code, message, file bytes), so plans do not depend on the executor.

- local: `concurrent.futures.ProcessPoolExecutor` (spawned processes, --workers of them, default: CPUs).
- dask: `distributed.Client(ADDRESS)` (`tcp://scheduler:8786`); without --address, a LocalCluster of
  --workers single-threaded worker processes on 127.0.0.1, closed afterwards. Extra `mlopt[dask]`.
- ray: `ray.init(ADDRESS)` (`ray://head:10001`, or `auto`); without --address, a local Ray instance with
  --workers CPUs, shut down afterwards. Extra `mlopt[ray]`.

Cluster workers need mlopt installed (the same version: plans record it) and the input files at the paths
the spec names (a shared file system); they never need the output folder, the client writes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from mlopt.errors import InputError
from mlopt.sweep.cells import run_cell

EXECUTORS = ("local", "dask", "ray")
_EXTRA = {"dask": ("distributed", "dask"), "ray": ("ray", "ray")}  # executor -> (module, extra)

Outcome = tuple[int, "dict[str, Any] | BaseException"]


def check_available(kind: str, address: str | None) -> None:
    """Exit 2 before any work when the executor's extra is missing or the options do not fit it."""
    if kind not in EXECUTORS:
        raise InputError("--executor", kind, f"unknown executor; expected one of {', '.join(EXECUTORS)}")
    if kind == "local":
        if address:
            raise InputError("--address", address, "only the dask and ray executors connect to a cluster "
                                                   "(add --executor dask or --executor ray)")
        return
    module, extra = _EXTRA[kind]
    try:
        __import__(module)
    except ImportError as exc:
        raise InputError("--executor", kind, f"needs the '{extra}' extra: pip install 'mlopt[{extra}]' ({exc})") \
            from None


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def execute(kind: str, tasks: list[tuple[int, dict[str, Any]]], *, address: str | None = None,
            workers: int | None = None) -> Iterator[Outcome]:
    """Run tasks [(id, task)]; yield (id, result or the exception that lost it) as cells finish."""
    if not tasks:
        return
    workers = workers or default_workers()
    if kind == "local":
        yield from _local(tasks, workers)
    elif kind == "dask":
        yield from _dask(tasks, address, workers)
    elif kind == "ray":
        yield from _ray(tasks, address, workers)
    else:
        raise InputError("--executor", kind, f"unknown executor; expected one of {', '.join(EXECUTORS)}")


def _local(tasks, workers: int) -> Iterator[Outcome]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: workers do not inherit this process's threads (the progress bar's) or its solver state
    pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(run_cell, task): ident for ident, task in tasks}
        for future in as_completed(futures):
            try:
                yield futures[future], future.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died or failed to pickle: that cell's error
                yield futures[future], exc
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _dask(tasks, address: str | None, workers: int) -> Iterator[Outcome]:
    from distributed import Client, LocalCluster, as_completed

    cluster = None
    try:
        if address:
            client = Client(address, timeout="20s")
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, silence_logs=40)
            client = Client(cluster)
    except (OSError, TimeoutError, ValueError) as exc:
        if cluster is not None:
            cluster.close()
        raise InputError("--address", address or "(local cluster)", f"cannot connect to the Dask scheduler: {exc}") \
            from None
    futures: dict[Any, int] = {}
    try:
        futures = {client.submit(run_cell, task, pure=False): ident for ident, task in tasks}
        for future in as_completed(list(futures)):
            try:
                yield futures[future], future.result()
            except Exception as exc:  # noqa: BLE001
                yield futures[future], exc
    finally:
        for future in futures:
            future.cancel()
        client.close()
        if cluster is not None:
            cluster.close()


def _ray(tasks, address: str | None, workers: int) -> Iterator[Outcome]:
    import ray

    started = not ray.is_initialized()
    if started:
        try:
            if address:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, OSError, TimeoutError, ValueError, RuntimeError) as exc:
            raise InputError("--address", address or "(local Ray)", f"cannot start or reach Ray: {exc}") from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_cell)
        refs = {remote.remote(task): ident for ident, task in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield refs[ref], ray.get(ref)
                except Exception as exc:  # noqa: BLE001
                    yield refs[ref], exc
    finally:
        if started:
            ray.shutdown()
