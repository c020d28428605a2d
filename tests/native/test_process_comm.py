"""native.ProcessComm faults that need no second process: a rank that never joins, and ranks (threads of this
process, each with its own communicator handle) that run mismatched counts or dtypes. The multi-process cases
(a dying rank, every collective, both transports) are in tests/pytorch/test_backend.py and runtime/tests."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from mlopt.native import binding as native
from mlopt.native.enforcer import motif_program_xml


def _usable() -> str | None:
    try:
        return native.multi_process_problem()
    except native.RuntimeLibraryNotFound as exc:
        return str(exc)


pytestmark = pytest.mark.skipif(_usable() is not None, reason=f"no multi-process runtime: {_usable()}")


def _address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _shm_names() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("mlopt-")} if os.path.isdir("/dev/shm") else set()


def _on_threads(n: int, body) -> list:
    """body(rank) on n threads; their results (or exceptions) by rank, bounded in time."""
    results: list = [None] * n

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except Exception as exc:  # noqa: BLE001 - the exception is the result
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a rank did not return within 60 s"
    return results


def test_a_rank_that_never_joins_times_out_at_init_naming_it():
    before = _shm_names()
    started = time.monotonic()
    with pytest.raises(native.RuntimeLibraryError) as caught:
        native.ProcessComm(0, 2, address=_address(), init_timeout_ms=1000)
    assert time.monotonic() - started < 10
    assert caught.value.status_name == "MLOPT_ERR_IO"
    assert "1" in caught.value.message and "did not join" in caught.value.message
    assert _shm_names() <= before


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("mismatch", ["count", "dtype"])
def test_mismatched_buffers_are_refused_naming_both_sides(transport, mismatch):
    before = _shm_names()
    address = _address()
    xml = motif_program_xml("allreduce", 2)

    def rank_body(rank: int):
        count = 1024 if (mismatch != "count" or rank == 0) else 2048
        dtype = np.float32 if (mismatch != "dtype" or rank == 0) else np.int32
        with native.ProcessComm(rank, 2, address=address, transport=transport) as comm, \
                native.Plan.from_bytes(xml, "ring.xml") as plan:
            comm.run(plan, np.ones(count, dtype=dtype), watchdog_ms=3000)

    results = _on_threads(2, rank_body)
    errors = [r for r in results if isinstance(r, native.RuntimeLibraryError)]
    assert errors, f"neither rank refused the mismatch: {results}"
    mismatch_errors = [e for e in errors if e.status_name == "MLOPT_ERR_MISMATCH"]
    assert mismatch_errors, [e.message for e in errors]
    message = mismatch_errors[0].message
    assert ("count=1024" in message and "count=2048" in message) if mismatch == "count" else \
        ("float32" in message and "int32" in message)
    assert _shm_names() <= before


def test_matching_ranks_on_threads_compute_the_allreduce():
    address = _address()

    def rank_body(rank: int):
        with native.ProcessComm(rank, 2, address=address) as comm, \
                native.Plan.from_bytes(motif_program_xml("allreduce", 2), "ring.xml") as plan:
            out, _ = comm.run(plan, np.full(4096, rank + 1, dtype=np.float32))
            return out.copy()

    results = _on_threads(2, rank_body)
    for r in results:
        assert not isinstance(r, Exception), r
        assert (r == 3).all()
