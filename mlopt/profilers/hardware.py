"""`mlopt profile hardware`: measure links the way TACCL's profiler does and write an mlopt topology.

Two drivers share one pipeline (measure -> fit per link -> group into classes -> topology + fit report):

* CPU (no GPU): the ranks this machine runs for the runtime's CPU backend. `threads` (the default, what
  `mlopt run-collective` and `LocalComm` use): tiny MSCCL-EF programs run through the runtime itself, rank i
  sending n chunks to rank j in n steps ("seq") or in one step of cnt=n ("one"), timed by the library's own
  `wall_us`. `processes`: one process per rank, chunks copied through the receiver's shared-memory
  segment one message at a time (a semaphore posts that a message is there, another that it was copied
  out). `tcp`: one process per rank, chunks sent over loopback TCP, the receiver acknowledging the last
  byte. `runtime`: one process per rank joined by the runtime's multi-process communicator (its shared-memory
  transport, what the `mlopt` torch.distributed backend runs on), the same programs as `threads`, timed by
  the receiver's `wall_us` right after a synchronising run. Each transport is its own link class.
* GPU (torch sees 2 or more CUDA GPUs): peer copies (`Tensor.copy_` between devices, timed by CUDA events)
  for every ordered GPU pair with the same (n, s) experiments; `nvidia-smi topo -m` names the classes
  (nvlink, nvswitch, pcie) and places the NICs; PCIe-switch sharing comes from contention (TACCL 5.3):
  two GPUs copying to host memory at the same time vs alone; a pair slowed by more than
  `SHARING_THRESHOLD` (1.5x: independent paths give ~1x, one shared upstream link ~2x) shares a switch.
  The copy timing is injectable (`CopyTimer`), so this path is tested with a simulated machine.

Every experiment is repeated; the fit uses the medians and the report keeps median, quartiles and extremes
of every measurement next to its fitted time and residual (`Profile.report()`, in the topology's `source`).
"""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import os
import platform
import re
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from mlopt.errors import InputError, MloptError
from mlopt.formats.sizes import parse_size_range
from mlopt.formats.topology import (IB_ALPHA_US, IB_BETA_US_PER_MB, Link, Nic, Node, Switch, Topology,
                                    validate_topology)
from mlopt.native import binding as native
from mlopt.native.enforcer import motif_program_xml
from mlopt.profilers import linkfit, nvsmi
from mlopt.profilers.linkfit import LinkClass, Measurements, Sample
from mlopt.sim.plots import _save

KiB, MiB = 1 << 10, 1 << 20
CPU_TRANSPORTS = ("threads", "processes", "tcp", "runtime")
TRANSPORTS = ("auto", *CPU_TRANSPORTS, "cuda")
HOST = -1  # the host-memory end of a copy in CopyTimer
SHARING_THRESHOLD = 1.5  # concurrent/alone time above which two GPUs share a PCIe switch
PROFILER = "mlopt profile hardware"
WARMUP_RUNS = 5  # runs of a fresh communicator before any is timed

Progress = Callable[[int, int, str], None]  # (done, total, what)
# Microseconds for every (src, dst) copy in `copies` (device indices, HOST for host memory) to move `chunks`
# messages of `chunk_bytes` one after another; several copies run concurrently, the time is the slowest.
CopyTimer = Callable[[Sequence[tuple[int, int]], int, int], float]


class ProfileError(MloptError):
    """The measurements could not be made or fitted (exit code 1)."""

    exit_code = 1


@dataclass(frozen=True)
class ProfileOptions:
    transport: str = "auto"  # auto: cuda with 2+ GPUs, else threads
    ranks: int | None = None  # CPU: ranks to profile (default 4); GPU: first N GPUs (default all)
    sizes: tuple[int, ...] | None = None  # chunk sizes s (default per driver)
    chunks: tuple[int, ...] | None = None  # n (default per driver)
    repeats: int | None = None  # per experiment (default per driver)
    quick: bool = False
    beta_tol: float = linkfit.DEFAULT_BETA_TOL
    alpha_tol: float = linkfit.DEFAULT_ALPHA_TOL
    alpha_abs_us: float = linkfit.DEFAULT_ALPHA_ABS_US
    sharing_threshold: float = SHARING_THRESHOLD
    sharing_bytes: int | None = None  # GPU: bytes per host copy in the sharing test (default 16 MiB)
    seed: int = 0


CPU_DEFAULTS = dict(ranks=4, sizes=(16 * KiB, 64 * KiB, 256 * KiB), chunks=(1, 2, 4, 8), repeats=5)
CPU_QUICK = dict(ranks=2, sizes=(64 * KiB, 256 * KiB), chunks=(1, 4), repeats=3)
GPU_DEFAULTS = dict(sizes=(64 * KiB, 1 * MiB, 16 * MiB), chunks=(1, 2, 4, 8), repeats=10, sharing_bytes=64 * MiB)
GPU_QUICK = dict(sizes=(64 * KiB, 4 * MiB), chunks=(1, 4), repeats=3, sharing_bytes=16 * MiB)


def resolved(options: ProfileOptions, gpu: bool) -> ProfileOptions:
    """Options with the driver's defaults (and --quick's) filled in where the user gave none."""
    base = (GPU_QUICK if options.quick else GPU_DEFAULTS) if gpu else (CPU_QUICK if options.quick else CPU_DEFAULTS)
    out = options
    for key, value in base.items():
        if getattr(options, key) is None:
            out = replace(out, **{key: value})
    return out


# ---------------------------------------------------------------------------------------------------------
# the result


@dataclass
class Profile:
    """Measurements, per-link fits, classes and the topology they make."""

    topology: Topology
    transport: str
    options: ProfileOptions
    measurements: Measurements
    fits: dict[tuple[int, int], linkfit.Fit]
    classes: list[LinkClass]
    sharing: dict[str, Any] = field(default_factory=dict)
    layout: dict[str, Any] | None = None
    elapsed_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"name": self.topology.name, "transport": self.transport, "ranks": self.topology.num_ranks,
                "links": len(self.topology.links), "classes": linkfit.summary_rows(self.classes),
                "pcie_switches": [list(s.ranks) for s in self.topology.switches if s.kind == "pcie"],
                "warnings": self.warnings()}

    def warnings(self) -> list[str]:
        out = []
        for c in self.classes:
            out += [f"class {c.name}: {w}" for w in c.fit.warnings]
        bad = [f"{a}->{b}" for (a, b), f in self.fits.items() if not f.ok]
        if bad:
            out.append(f"{len(bad)} link fits were flagged (see source.fit.links): {', '.join(bad[:6])}")
        return out


def _source(transport: str, options: ProfileOptions, measurements: Measurements, fits, classes,
            extra: dict[str, Any]) -> dict[str, Any]:
    """What the topology's `source` carries: how it was measured and the whole fit report."""
    return {
        "profiler": PROFILER,
        "transport": transport,
        "method": "TACCL link profiling: n chunks of s bytes one after another (seq) vs one chunk of n*s (one); "
                  "alpha, beta by non-negative least squares over the medians",
        "model": classes[0].fit.model if classes else "taccl",
        "host": {"machine": platform.machine(), "system": platform.system(), "cpus": os.cpu_count()},
        "options": {"sizes": list(options.sizes or ()), "chunks": list(options.chunks), "repeats": options.repeats,
                    "quick": options.quick, "beta_tol": options.beta_tol, "alpha_tol": options.alpha_tol,
                    "alpha_abs_us": options.alpha_abs_us},
        "fit": {
            "classes": [c.to_dict() for c in classes],
            "links": {f"{a}->{b}": f.to_dict() for (a, b), f in sorted(fits.items())},
        },
        **extra,
    }


def _topology(name: str, ranks: list[int], classes: list[LinkClass], transport: str, options: ProfileOptions,
              measurements: Measurements, fits, lanes: dict[tuple[int, int], int] | None = None,
              switches: Sequence[Switch] = (), link_switch: dict[tuple[int, int], str] | None = None,
              nics: Sequence[Nic] = (), extra: dict[str, Any] | None = None) -> Topology:
    bad = [c for c in classes if not (c.fit.beta_us_per_MB > 0 and math.isfinite(c.fit.beta_us_per_MB))]
    if bad:
        raise ProfileError(f"could not fit a positive beta for class {bad[0].name} "
                           f"({'; '.join(bad[0].fit.warnings) or 'no usable measurements'})")
    links = []
    for c in classes:
        for a, b in c.links:
            links.append(Link(a, b, max(0.0, c.fit.alpha_us), c.fit.beta_us_per_MB, c.name,
                              (lanes or {}).get((a, b), 1), (link_switch or {}).get((a, b))))
    links.sort(key=lambda l: (l.src, l.dst))
    topo = Topology(name, (Node("node0", tuple(ranks)),), tuple(links), tuple(switches), tuple(nics),
                    _source(transport, options, measurements, fits, classes, extra or {}))
    validate_topology(topo, name)
    return topo


# ---------------------------------------------------------------------------------------------------------
# CPU: threads through the runtime


def transfer_program(nranks: int, src: int, dst: int, chunks: int, seq: bool, receive: str = "r") -> str:
    """MSCCL-EF XML: rank src sends `chunks` chunks to rank dst, in `chunks` steps (seq) or one step of
    cnt=chunks; the other ranks idle. A broadcast-shaped program (i_chunks = o_chunks = nchunksperloop).
    receive="rrc": the receiver adds what arrives to its own input chunks instead of copying it (the reduce
    probe: its extra time over "r" is the rank's reduction cost)."""
    pieces = [(k, 1) for k in range(chunks)] if seq else [(0, chunks)]

    def steps(kind: str) -> str:
        return "".join(f'<step s="{k}" type="{kind}" srcbuf="i" srcoff="{off}" dstbuf="o" dstoff="{off}" '
                       f'cnt="{cnt}" depid="-1" deps="-1" hasdep="0"/>' for k, (off, cnt) in enumerate(pieces))

    gpus = []
    for g in range(nranks):
        tbs = ""
        if g == src:
            tbs = f'<tb id="0" send="{dst}" recv="-1" chan="0">{steps("s")}</tb>'
        elif g == dst:
            tbs = f'<tb id="0" send="-1" recv="{src}" chan="0">{steps(receive)}</tb>'
        gpus.append(f'<gpu id="{g}" i_chunks="{chunks}" o_chunks="{chunks}" s_chunks="0">{tbs}</gpu>')
    name = f"profile {src}->{dst} {chunks}x{'seq' if seq else 'one'}" + (f" {receive}" if receive != "r" else "")
    return (f'<algo name="{name}" proto="Simple" nchannels="1" nchunksperloop="{chunks}" ngpus="{nranks}" '
            f'coll="broadcast" inplace="0" outofplace="1" minBytes="0" maxBytes="1099511627776">'
            + "".join(gpus) + "</algo>")


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(n) if a != b]


class _Runner:
    """Times one experiment (pair, kind, n, s) once; subclasses per transport."""

    def __init__(self, nranks: int, max_bytes: int):
        self.nranks, self.max_bytes = nranks, max_bytes

    def time_us(self, src: int, dst: int, kind: str, chunks: int, chunk_bytes: int) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _ThreadsRunner(_Runner):
    def __init__(self, nranks: int, max_bytes: int):
        super().__init__(nranks, max_bytes)
        self._np, self._native = np, native
        self.comm = native.LocalComm(nranks)
        self._plans: dict[tuple, Any] = {}
        self._buffers: dict[int, tuple[list, list]] = {}
        self._checked: set[tuple] = set()
        self._warm = False

    def _plan(self, src, dst, chunks, kind):
        key = (src, dst, chunks, kind)
        if key not in self._plans:
            xml = transfer_program(self.nranks, src, dst, chunks, kind == "seq", _receive_step(kind))
            self._plans[key] = self._native.Plan.from_bytes(xml, f"profile-{src}-{dst}-{chunks}-{kind}.xml")
        return self._plans[key]

    def _bufs(self, nbytes: int):
        """Views of one input and one output array per rank, allocated (and touched) once at the largest
        size, so that no run pays for fresh pages."""
        np = self._np
        if not self._buffers:
            count = self.max_bytes // 4
            self._buffers = {0: ([np.full(count, float(r + 1), dtype=np.float32) for r in range(self.nranks)],
                                 [np.ones(count, dtype=np.float32) for _ in range(self.nranks)])}
        inputs, outputs = self._buffers[0]
        count = nbytes // 4
        return [x[:count] for x in inputs], [x[:count] for x in outputs]

    def time_us(self, src, dst, kind, chunks, chunk_bytes):
        plan = self._plan(src, dst, chunks, kind)
        inputs, outputs = self._bufs(chunks * chunk_bytes)
        if not self._warm:  # a fresh communicator's first runs are slow (threads start, pages fault)
            for _ in range(WARMUP_RUNS):
                self.comm.run(plan, inputs, outputs)
            self._warm = True
        key = (src, dst, kind, chunks, chunk_bytes)
        if key not in self._checked:  # warm-up run, checked
            outputs[dst][...] = 0
            self.comm.run(plan, inputs, outputs)
            if not (outputs[dst] == _delivered(kind, src, dst)).all():
                raise ProfileError(f"runtime transfer {src}->{dst} ({kind}, {chunks} x {chunk_bytes} B) "
                                   f"delivered wrong data")
            self._checked.add(key)
        return float(self.comm.run(plan, inputs, outputs).stats.wall_us)

    def close(self):
        for p in self._plans.values():
            p.close()
        self.comm.close()


# ---- processes over shared memory, and loopback TCP: one worker process per rank

def _worker_main(rank: int, conn, transport: str, max_bytes: int, ready=None,
                 consumed=None) -> None:  # pragma: no cover - runs in the child processes
    data = np.frombuffer(np.random.default_rng(rank).integers(0, 255, max_bytes, dtype=np.uint8).tobytes(),
                         dtype=np.uint8)
    sink = np.empty(max_bytes, dtype=np.uint8)
    conn.send(_start_tcp_server(max_bytes) if transport == "tcp" else 0)
    peers: dict[int, socket.socket] = {}
    segments = _Segments(max_bytes)
    while True:
        msg = conn.recv()
        op = msg[0]
        if op == "stop":
            break
        if op == "send_tcp":
            conn.send(_worker_send_tcp(msg, data, peers))
        elif op == "send_shm":
            conn.send(_worker_send_shm(msg, data, segments, ready, consumed))
        elif op == "recv_shm":
            _worker_recv_shm(msg, rank, conn, sink, segments, ready, consumed)
    for sock in peers.values():
        sock.close()
    segments.close()


def _start_tcp_server(max_bytes: int) -> int:  # pragma: no cover - runs in the child processes
    """A loopback server (threads) that reads length-prefixed messages and acks each with one byte; its port."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve(client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(max_bytes))
        while True:
            head = _recv_exact(client, 8)
            if head is None:
                return
            (total,) = struct.unpack("<Q", head)
            got = 0
            while got < total:
                k = client.recv_into(buf[got:total])
                if not k:
                    return
                got += k
            client.sendall(b"a")

    def accept_loop() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return server.getsockname()[1]


class _Segments:  # pragma: no cover - runs in the child processes
    """The shared-memory segments a worker has attached, by name, each with a byte view of max_bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.by_name: dict[str, Any] = {}

    def region(self, name: str):
        if name not in self.by_name:
            shm = shared_memory.SharedMemory(name=name)
            self.by_name[name] = (shm, np.ndarray((self.max_bytes,), dtype=np.uint8,
                                                  buffer=shm.buf[:self.max_bytes]))
        return self.by_name[name][1]

    def close(self) -> None:
        self.by_name.clear()  # views into the segments go first, then the mappings
        gc.collect()


def _worker_send_tcp(msg, data, peers: dict[int, socket.socket]) -> float:  # pragma: no cover - in the children
    """Send chunks (one at a time, or as one message) to a peer's server; microseconds until its ack."""
    _, peer, port, kind, chunks, s = msg
    sock = peers.get(peer)
    if sock is None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peers[peer] = sock
    view = memoryview(data)
    t0 = time.perf_counter()
    sock.sendall(struct.pack("<Q", chunks * s))
    if kind == "seq":
        for k in range(chunks):
            sock.sendall(view[k * s:(k + 1) * s])
    else:
        sock.sendall(view[:chunks * s])
    _recv_exact(sock, 1)
    return (time.perf_counter() - t0) * 1e6


def _worker_send_shm(msg, data, segments: _Segments, ready, consumed) -> float:  # pragma: no cover - in the children
    """One slot: copy a message in, post `ready`, wait for `consumed`, per piece; microseconds taken."""
    _, dst, name, kind, chunks, s = msg
    region = segments.region(name)
    pieces = [(k * s, s) for k in range(chunks)] if kind == "seq" else [(0, chunks * s)]
    t0 = time.perf_counter()
    for off, size in pieces:
        region[:size] = data[off:off + size]
        ready[dst].release()
        consumed[dst].acquire()
    return (time.perf_counter() - t0) * 1e6


def _worker_recv_shm(msg, rank: int, conn, sink, segments: _Segments, ready,
                     consumed) -> None:  # pragma: no cover - runs in the child processes
    """The receiving side of _worker_send_shm: copy each piece out of the slot and post `consumed`."""
    _, name, kind, chunks, s = msg
    region = segments.region(name)
    pieces = [(k * s, s) for k in range(chunks)] if kind == "seq" else [(0, chunks * s)]
    conn.send("ready")
    for off, size in pieces:
        ready[rank].acquire()
        sink[off:off + size] = region[:size]
        consumed[rank].release()
    conn.send("done")


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        part = sock.recv(n - len(out))
        if not part:
            return None
        out += part
    return out


class _ProcessRunner(_Runner):
    """`processes` (shared memory) or `tcp` (loopback): one worker process per rank."""

    def __init__(self, nranks: int, max_bytes: int, transport: str):
        super().__init__(nranks, max_bytes)
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self.transport = transport
        self.conns, self.procs, self.ports = [], [], []
        self.segments: dict[int, Any] = {}
        # Per receiving rank: a semaphore posted when a message is in its segment, one when it was copied out.
        ready = [ctx.Semaphore(0) for _ in range(nranks)] if transport == "processes" else None
        consumed = [ctx.Semaphore(0) for _ in range(nranks)] if transport == "processes" else None
        try:
            if transport == "processes":
                for r in range(nranks):  # one segment per receiving rank: one transfer at a time
                    self.segments[r] = shared_memory.SharedMemory(create=True, size=max_bytes)
            for r in range(nranks):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker_main, args=(r, child, transport, max_bytes, ready, consumed),
                                daemon=True)
                p.start()
                self.conns.append(parent)
                self.procs.append(p)
            for c in self.conns:
                if not c.poll(30):
                    raise ProfileError(f"a {transport} worker process did not start")
                self.ports.append(c.recv())
        except BaseException:
            self.close()
            raise

    def _result(self, conn, what: str):
        if not conn.poll(60):
            raise ProfileError(f"{self.transport} worker timed out ({what})")
        return conn.recv()

    def time_us(self, src, dst, kind, chunks, chunk_bytes):
        if self.transport == "tcp":
            self.conns[src].send(("send_tcp", dst, self.ports[dst], kind, chunks, chunk_bytes))
            return float(self._result(self.conns[src], "send"))
        name = self.segments[dst].name
        self.conns[dst].send(("recv_shm", name, kind, chunks, chunk_bytes))
        self._result(self.conns[dst], "receiver ready")
        self.conns[src].send(("send_shm", dst, name, kind, chunks, chunk_bytes))
        elapsed = float(self._result(self.conns[src], "send"))
        self._result(self.conns[dst], "receive")
        return elapsed

    def close(self):
        _stop_workers(self.conns, self.procs, join_s=5)
        for shm in self.segments.values():
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        self.segments = {}


# ---- processes joined by the runtime's multi-process communicator


def _runtime_worker_main(rank: int, nranks: int, address: str, conn,
                         max_bytes: int) -> None:  # pragma: no cover - runs in the child processes
    source = np.full(max_bytes // 4, float(rank + 1), dtype=np.float32)
    sink = np.ones(max_bytes // 4, dtype=np.float32)
    sync_in, sync_out = np.zeros(nranks, dtype=np.float32), np.zeros(nranks, dtype=np.float32)
    plans: dict[tuple, Any] = {}
    with native.ProcessComm(rank, nranks, address=address, transport="shm", init_timeout_ms=60000) as comm, \
            native.Plan.from_bytes(motif_program_xml("allreduce", nranks), "profile-sync.xml") as sync:
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, src, dst, kind, chunks, chunk_bytes, check = msg
            key = (src, dst, chunks, kind)
            if key not in plans:
                plans[key] = native.Plan.from_bytes(
                    transfer_program(nranks, src, dst, chunks, kind == "seq", _receive_step(kind)),
                    f"profile-{src}-{dst}-{chunks}-{kind}.xml")
            count = chunks * chunk_bytes // 4
            if check:
                sink[:count] = 0
            comm.run(sync, sync_in, sync_out)  # every rank leaves it within microseconds of the others
            started = time.perf_counter()  # the whole call, as a job's collective pays it (not only the C run)
            comm.run(plans[key], source[:count], sink[:count])
            wall_us = (time.perf_counter() - started) * 1e6
            ok = not check or rank != dst or bool((sink[:count] == _delivered(kind, src, dst)).all())
            conn.send((wall_us, ok))
        for plan in plans.values():
            plan.close()


class _RuntimeRunner(_Runner):
    """`runtime`: one process per rank over the runtime's multi-process communicator; the time of one
    experiment is the receiver's ProcessComm.run call of the transfer program (what a job's collective call
    costs, the Python binding included), run right after a synchronising allreduce."""

    def __init__(self, nranks: int, max_bytes: int):
        super().__init__(nranks, max_bytes)
        ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited threads or library state
        with socket.socket() as probe:  # a free port for the runtime's own rendezvous
            probe.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{probe.getsockname()[1]}"
        self.conns, self.procs = [], []
        self._checked: set[tuple] = set()
        try:
            for r in range(nranks):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_runtime_worker_main, args=(r, nranks, address, child, max_bytes),
                                daemon=True)
                p.start()
                self.conns.append(parent)
                self.procs.append(p)
            for c in self.conns:
                if not c.poll(90) or c.recv() != "ready":
                    raise ProfileError("a runtime worker process did not start")
        except BaseException:
            self.close()
            raise

    def time_us(self, src, dst, kind, chunks, chunk_bytes):
        key = (src, dst, kind, chunks, chunk_bytes)
        check = key not in self._checked
        for c in self.conns:
            c.send(("run", src, dst, kind, chunks, chunk_bytes, check))
        results = []
        for c in self.conns:
            if not c.poll(60):
                raise ProfileError(f"runtime worker timed out (transfer {src}->{dst})")
            results.append(c.recv())
        if not all(ok for _, ok in results):
            raise ProfileError(f"runtime transfer {src}->{dst} ({kind}, {chunks} x {chunk_bytes} B) delivered "
                               f"wrong data")
        self._checked.add(key)
        return float(results[dst][0])

    def close(self):
        _stop_workers(self.conns, self.procs, join_s=10)


def _stop_workers(conns, procs, join_s: float) -> None:
    """Asks every worker to stop, waits join_s for each, and terminates those still running."""
    for c in conns:
        try:
            c.send(("stop",))
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(join_s)
        if p.is_alive():
            p.terminate()
            p.join(5)


RUNTIME_TRANSPORTS = ("threads", "runtime")  # transports whose experiments are runs of mlopt's runtime
REDUCE_KIND = "reduce"  # the reduce probe's experiment kind (runtime transports): "one" received with rrc
REDUCE_PROBE_BYTES = 4 << 20  # the reduce probe's message, at least (float32 sums of 1M elements: tens of us)


def _receive_step(kind: str) -> str:
    return "rrc" if kind == REDUCE_KIND else "r"


def _delivered(kind: str, src: int, dst: int) -> float:
    """What the receiver's output holds after a transfer (every rank's input is rank + 1)."""
    return (src + 1) + (dst + 1) if kind == REDUCE_KIND else src + 1


def _runner(transport: str, nranks: int, max_bytes: int) -> _Runner:
    if transport == "threads":
        return _ThreadsRunner(nranks, max_bytes)
    if transport == "runtime":
        return _RuntimeRunner(nranks, max_bytes)
    return _ProcessRunner(nranks, max_bytes, transport)


def measure_cpu(transport: str, nranks: int, sizes: Sequence[int], chunks: Sequence[int], repeats: int,
                progress: Progress | None = None) -> Measurements:
    """TACCL's experiments for every ordered pair of `nranks` ranks over a CPU transport, and on the runtime
    transports the reduce probe (`m.reduce_probe`, see `_reduce_probe`).

    Repeats are interleaved (every experiment once, then again ...) so that drift of a shared machine
    spreads over all experiments instead of biasing some.
    """
    exps = linkfit.experiments(chunks, sizes)
    pairs = _pairs(nranks)
    total = len(pairs) * len(exps) * repeats
    probe = transport in RUNTIME_TRANSPORTS
    probe_bytes = max(REDUCE_PROBE_BYTES, max(sizes))  # large enough that the reduction shows above the noise
    max_bytes = max(max(n * s for _, n, s in exps), probe_bytes if probe else 0)
    times: dict[tuple, list[float]] = {}
    done = 0
    runner = _runner(transport, nranks, max_bytes)
    try:
        for r in range(repeats):
            for kind, n, s in exps:  # one buffer size at a time for the runtime's buffers
                for a, b in pairs:
                    times.setdefault((a, b, kind, n, s), []).append(runner.time_us(a, b, kind, n, s))
                    done += 1
                    if progress:
                        progress(done, total, f"{transport} {a}->{b} {kind} {n}x{s}B (repeat {r + 1}/{repeats})")
        probed = _reduce_probe(runner, probe_bytes, repeats) if probe else None
    finally:
        runner.close()
    m = Measurements(reduce_probe=probed)
    for (a, b, kind, n, s), ts in times.items():
        m.add((a, b), Sample(kind, n, s, tuple(ts)))
    return m


def _reduce_probe(runner: _Runner, nbytes: int, repeats: int) -> dict[str, Any]:
    """Rank 1's time to receive `nbytes` from rank 0 in one message, plainly ("one") and adding it to its own
    input (rrc), interleaved over `repeats` (at least 5); the difference of the medians is what reducing those
    bytes costs a rank, so reduce_GBps = nbytes / that (None when it is not positive: free within the noise).
    CPU ranks reduce in the receiving thread, after the data arrived, unlike MSCCL's streaming reduction."""
    plain, reducing = [], []
    for _ in range(max(5, repeats)):
        plain.append(runner.time_us(0, 1, "one", 1, nbytes))
        reducing.append(runner.time_us(0, 1, REDUCE_KIND, 1, nbytes))
    receive_us, reduce_us = _median(plain), _median(reducing)
    extra_us = reduce_us - receive_us
    rate = nbytes / extra_us / 1e3 if extra_us > 0 else None
    return {"bytes": nbytes, "receive_us": receive_us, "receive_and_reduce_us": reduce_us,
            "reduce_GBps": rate, "repeats": max(5, repeats)}


def profile_cpu(options: ProfileOptions, progress: Progress | None = None) -> Profile:
    options = resolved(options, gpu=False)
    transport = "threads" if options.transport == "auto" else options.transport
    if transport not in CPU_TRANSPORTS:
        raise InputError("--transport", "$", f"{transport!r} is not a CPU transport ({', '.join(CPU_TRANSPORTS)})")
    start = time.perf_counter()
    m = measure_cpu(transport, options.ranks, options.sizes, options.chunks, options.repeats, progress)
    overhead = True  # one run has a fixed cost (thread wake-up, handshake) that is not per message
    hints = {p: transport for p in m.samples}
    name = f"{platform.node() or 'localhost'}-{transport}-{options.ranks}"
    extra = {"ranks_are": {"threads": "threads of one process (the runtime's CPU backend, LocalComm)",
                           "processes": "processes exchanging chunks through shared memory",
                           "tcp": "processes exchanging chunks over loopback TCP",
                           "runtime": "processes joined by the runtime's multi-process communicator "
                                      "(shared memory)"}[transport],
             "timer": {"threads": "mlopt_run_stats.wall_us",
                       "runtime": "the receiver's ProcessComm.run call (time.perf_counter) after a synchronising "
                                  "run"}.get(
                           transport, "time.perf_counter in the sender")}
    fits = m.fits(overhead=overhead)
    classes = linkfit.group_links(fits, hints, options.beta_tol, options.alpha_tol, options.alpha_abs_us,
                                  overhead=overhead)
    # Every rank's traffic goes through the same memory system and the same few cores: the links share a
    # generic switch whose port (per rank and direction) runs at the fastest class's bandwidth, so that a rank
    # sending to several peers at once is not modelled as having one private link per peer.
    ranks = list(range(options.ranks))
    sw = None
    if classes and classes[0].fit.beta_us_per_MB > 0 and math.isfinite(classes[0].fit.beta_us_per_MB):
        sw = Switch(f"node0/{transport}", "generic", tuple(ranks), 0.0, classes[0].fit.beta_us_per_MB)
    extra["switch"] = ("links share node0/" + transport + ": each rank's port runs at the fastest class's beta "
                       "(concurrent transfers of one rank share it); measurements were taken one pair at a time")
    runs_the_runtime = transport in RUNTIME_TRANSPORTS  # the harness is the runtime a job's collectives run on:
    # its per-run cost is every collective call's (the other transports' overhead is their Python harness's own)
    if runs_the_runtime:
        extra["call_overhead"] = ("call_overhead_us is the median over the link classes of the fit's per-run "
                                  "overhead: the runtime's fixed cost of starting one program run")
        extra["reduce_probe"] = m.reduce_probe  # reduce_GBps: what reducing a received message adds
    topo = _topology(name, ranks, classes, transport, options, m, fits, None, [sw] if sw else [],
                     {p: sw.name for p in fits} if sw else None, (), extra)
    if runs_the_runtime and classes:
        topo = replace(topo, call_overhead_us=_median(max(0.0, c.fit.overhead_us) for c in classes),
                       reduce_GBps=(m.reduce_probe or {}).get("reduce_GBps"))
    return Profile(topo, transport, options, m, fits, classes, elapsed_s=time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------------------
# GPU: peer copies


def measure_gpu_links(gpus: Sequence[int], copy_timer: CopyTimer, sizes: Sequence[int], chunks: Sequence[int],
                      repeats: int, progress: Progress | None = None,
                      done_total: list[int] | None = None) -> Measurements:
    """TACCL's experiments for every ordered GPU pair with `copy_timer`; samples keyed by rank (index in gpus)."""
    exps = linkfit.experiments(chunks, sizes)
    m = Measurements()
    counter = done_total or [0, len(gpus) * (len(gpus) - 1) * len(exps) * repeats]
    for a, ga in enumerate(gpus):
        for b, gb in enumerate(gpus):
            if a == b:
                continue
            for kind, n, s in exps:
                ts = []
                for _ in range(repeats):
                    if kind == "seq":
                        ts.append(float(copy_timer([(ga, gb)], s, n)))
                    else:
                        ts.append(float(copy_timer([(ga, gb)], n * s, 1)))
                    counter[0] += 1
                    if progress:
                        progress(counter[0], counter[1], f"GPU{ga}->GPU{gb} {kind} {n}x{s}B")
                m.add((a, b), Sample(kind, n, s, tuple(ts)))
    return m


def _median(xs: Iterable[float]) -> float:
    return linkfit._quantile(list(xs), 0.5)


def measure_pcie_sharing(gpus: Sequence[int], copy_timer: CopyTimer, nbytes: int, repeats: int,
                         threshold: float = SHARING_THRESHOLD, progress: Progress | None = None,
                         done_total: list[int] | None = None) -> dict[str, Any]:
    """TACCL 5.3: GPUs whose simultaneous copies to host memory slow each other down share a PCIe switch.

    Returns per GPU the alone time and bandwidth, per pair the concurrent time and slowdown, and the groups
    (connected components of the pairs slowed by more than `threshold`), as ranks (indices into gpus).
    """
    counter = done_total or [0, (len(gpus) + len(gpus) * (len(gpus) - 1) // 2) * repeats]

    def tick(what: str):
        counter[0] += 1
        if progress:
            progress(counter[0], counter[1], what)

    alone = {}
    for a, g in enumerate(gpus):
        ts = []
        for _ in range(repeats):
            ts.append(float(copy_timer([(g, HOST)], nbytes, 1)))
            tick(f"GPU{g}->host alone")
        alone[a] = _median(ts)
    pairs = {}
    parent = {a: a for a in range(len(gpus))}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            ts = []
            for _ in range(repeats):
                ts.append(float(copy_timer([(gpus[a], HOST), (gpus[b], HOST)], nbytes, 1)))
                tick(f"GPU{gpus[a]}+GPU{gpus[b]}->host together")
            both = _median(ts)
            slowdown = both / max(alone[a], alone[b])
            shared = slowdown > threshold
            pairs[f"{a}-{b}"] = {"together_us": both, "slowdown": slowdown, "shared": shared}
            if shared:
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for a in range(len(gpus)):
        groups.setdefault(find(a), []).append(a)
    return {
        "method": "copies to host memory, alone vs two GPUs at once (TACCL 5.3); a pair slowed by more than "
                  f"{threshold}x shares a PCIe switch",
        "bytes": nbytes, "threshold": threshold,
        "alone": {str(a): {"time_us": t, "bandwidth_GBps": nbytes / t / 1e3} for a, t in alone.items()},
        "pairs": pairs,
        "groups": sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: g[0]),
    }


def profile_gpus(gpus: Sequence[int], copy_timer: CopyTimer, options: ProfileOptions, layout=None,
                 progress: Progress | None = None, name: str | None = None,
                 smi_index: dict[int, int] | None = None) -> Profile:
    """The GPU path: link experiments, PCIe sharing, classes named from the nvidia-smi layout, topology.

    `gpus`: device indices as `copy_timer` knows them; rank r is gpus[r]. `layout`: nvsmi.Layout or None;
    `smi_index` maps a device index to its GPU index in the layout (default: the same number).
    """
    options = resolved(options, gpu=True)
    if len(gpus) < 2:
        raise ProfileError("the GPU path needs at least 2 GPUs")
    start = time.perf_counter()
    exps = linkfit.experiments(options.chunks, options.sizes)
    n = len(gpus)
    total = n * (n - 1) * len(exps) * options.repeats + (n + n * (n - 1) // 2) * options.repeats
    counter = [0, total]
    m = measure_gpu_links(gpus, copy_timer, options.sizes, options.chunks, options.repeats, progress, counter)
    sharing = measure_pcie_sharing(gpus, copy_timer, options.sharing_bytes, options.repeats,
                                   options.sharing_threshold, progress, counter)
    smi = {g: (smi_index or {}).get(g, g) for g in gpus}
    if layout is not None and not all(smi[g] in layout.gpus for g in gpus):
        layout = None  # the layout does not describe these devices: classes are named by order
    hints, lanes = {}, {}
    if layout is not None:
        for a, b in m.samples:
            hints[(a, b)] = layout.link_hint(smi[gpus[a]], smi[gpus[b]])
            lanes[(a, b)] = max(1, layout.nvlinks(smi[gpus[a]], smi[gpus[b]]))
    fits = m.fits(overhead=False)
    classes = linkfit.group_links(fits, hints or None, options.beta_tol, options.alpha_tol, options.alpha_abs_us)
    ranks = list(range(n))
    switches: list[Switch] = []
    link_switch: dict[tuple[int, int], str] = {}
    nvswitch_classes = [c for c in classes if c.hint == "nvswitch"]
    if nvswitch_classes:
        fastest = nvswitch_classes[0].fit
        sw = Switch("node0/nvswitch", "nvswitch", tuple(ranks), max(0.0, fastest.alpha_us), fastest.beta_us_per_MB)
        switches.append(sw)
        for c in nvswitch_classes:
            for p in c.links:
                link_switch[p] = sw.name
    of = linkfit.class_of(classes)
    for k, group in enumerate(sharing["groups"]):
        port_beta = max(sharing["alone"][str(a)]["time_us"] for a in group) / (options.sharing_bytes / linkfit.MB)
        sw = Switch(f"node0/pcie{k}", "pcie", tuple(group), 0.0, port_beta)
        switches.append(sw)
        for a in group:
            for b in group:
                if a != b and (a, b) in of and of[(a, b)].hint in (None, "pcie") and (a, b) not in link_switch:
                    link_switch[(a, b)] = sw.name
    nics: list[Nic] = []
    if layout is not None:
        index = {smi[g]: r for r, g in enumerate(gpus)}
        for nic in layout.nics:
            near = [index[g] for g in layout.nic_gpus(nic) if g in index]
            if near:
                nics.append(Nic(f"node0/{layout.nic_device(nic)}", "node0", tuple(near), IB_ALPHA_US,
                                IB_BETA_US_PER_MB))
    extra = {
        "ranks_are": {str(r): f"cuda:{g}" for r, g in enumerate(gpus)},
        "timer": "CUDA events around Tensor.copy_ on the copy's stream",
        "pcie_sharing": sharing,
        "layout": layout.to_dict() if layout is not None else None,
        "nics_note": "NIC alpha/beta are nominal InfiniBand values (TACCL's), not measured" if nics else None,
    }
    extra = {k: v for k, v in extra.items() if v is not None}
    topo = _topology(name or f"{platform.node() or 'localhost'}-gpu-{n}", ranks, classes, "cuda", options, m, fits,
                     lanes, switches, link_switch, nics, extra)
    return Profile(topo, "cuda", options, m, fits, classes, sharing, extra.get("layout"),
                   time.perf_counter() - start)


def torch_copy_timer(devices: Sequence[int], max_bytes: int) -> CopyTimer:  # pragma: no cover - needs GPUs
    """A CopyTimer over torch: per copy a source and destination buffer (pinned host memory for HOST), the
    chunks issued on a stream of the source device (the destination's for host-to-device), timed with CUDA
    events on that stream; concurrent copies are issued back to back and the slowest one counts."""
    import torch  # lazy: torch is an optional dependency (the torch extra)

    dev_buf = {d: (torch.empty(max_bytes, dtype=torch.uint8, device=f"cuda:{d}"),
                   torch.empty(max_bytes, dtype=torch.uint8, device=f"cuda:{d}")) for d in devices}
    host_bufs: list = []
    streams = {d: torch.cuda.Stream(device=f"cuda:{d}") for d in devices}

    def host_buffer(k: int):
        while len(host_bufs) <= k:
            host_bufs.append(torch.empty(max_bytes, dtype=torch.uint8, pin_memory=True))
        return host_bufs[k]

    def timer(copies, chunk_bytes, chunks):
        total = chunk_bytes * chunks
        if total > max_bytes:
            raise ProfileError(f"copy of {total} bytes exceeds the profiling buffers ({max_bytes})")
        plan = []
        for k, (src, dst) in enumerate(copies):
            owner = src if src != HOST else dst
            s = dev_buf[src][0] if src != HOST else host_buffer(k)
            d = dev_buf[dst][1] if dst != HOST else host_buffer(k)
            plan.append((owner, s, d))
        for d in devices:
            torch.cuda.synchronize(d)
        events = []
        for owner, s, d in plan:
            stream = streams[owner]
            with torch.cuda.device(owner), torch.cuda.stream(stream):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                for c in range(chunks):
                    d[c * chunk_bytes:(c + 1) * chunk_bytes].copy_(s[c * chunk_bytes:(c + 1) * chunk_bytes],
                                                                     non_blocking=True)
                end.record(stream)
                events.append((start, end))
        for d in devices:
            torch.cuda.synchronize(d)
        return max(start.elapsed_time(end) * 1e3 for start, end in events)

    return timer


def cuda_gpus() -> list[int]:
    """CUDA devices torch can use here ([] without torch, a CUDA build or GPUs)."""
    try:
        import torch  # lazy: torch is an optional dependency (the torch extra)
    except ImportError:
        return []
    try:
        return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    except Exception:  # noqa: BLE001 - a broken driver means no GPUs for profiling
        return []


def profile_hardware(options: ProfileOptions, progress: Progress | None = None) -> Profile:
    """`mlopt profile hardware`: the GPU path with 2+ GPUs (or --transport cuda), else the CPU path."""
    if options.transport in CPU_TRANSPORTS:
        return profile_cpu(options, progress)
    gpus = cuda_gpus()
    if options.transport == "cuda" and len(gpus) < 2:
        raise InputError("--transport", "$", f"cuda needs 2 or more CUDA GPUs; torch sees {len(gpus)}")
    if len(gpus) < 2:
        return profile_cpu(options, progress)
    if options.ranks:  # pragma: no cover - needs GPUs
        if options.ranks > len(gpus):
            raise InputError("--ranks", "$", f"{options.ranks} GPUs asked, {len(gpus)} available")
        gpus = gpus[:options.ranks]
    layout = nvsmi.read_topo_matrix()  # pragma: no cover
    opts = resolved(options, gpu=True)  # pragma: no cover
    timer = torch_copy_timer(gpus, max(max(opts.sizes) * max(opts.chunks), opts.sharing_bytes))  # pragma: no cover
    return profile_gpus(gpus, timer, opts, layout, progress, smi_index=smi_indices(gpus))  # pragma: no cover


def _bus_key(text: str) -> tuple[int, int, int] | None:
    """(bus, device, function) of a PCI address such as 00000000:07:00.0 or 0000:07:00.0."""
    m = re.search(r"([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*$", text.strip())
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def smi_indices(gpus: Sequence[int]) -> dict[int, int] | None:  # pragma: no cover - needs GPUs
    """CUDA device -> nvidia-smi GPU index, matched by PCI bus id (CUDA may order and hide devices
    differently from nvidia-smi); None when it cannot be told (then the layout is used only if every
    device has the same number in both)."""
    try:
        import torch  # lazy: torch is an optional dependency (the torch extra)

        done = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (ImportError, OSError, subprocess.TimeoutExpired):
        return None
    by_bus = {}
    for line in done.stdout.splitlines():
        index, _, bus = line.partition(",")
        key = _bus_key(bus)
        if key and index.strip().isdigit():
            by_bus[key] = int(index)
    out = {}
    for g in gpus:
        props = torch.cuda.get_device_properties(g)
        bus, dev = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
        if bus is None or dev is None or (bus, dev, 0) not in by_bus:
            return None
        out[g] = by_bus[(bus, dev, 0)]
    return out


# ---------------------------------------------------------------------------------------------------------
# outputs


def default_plot_path(output: str | os.PathLike) -> Path:
    p = Path(output)
    stem = p.name[:-len(".json")] if p.name.endswith(".json") else p.stem
    return p.with_name(f"{stem}.fit.png")


def plot_fit(profile: Profile, path: str | os.PathLike) -> Path:
    """Measured medians (with their interquartile range) and fitted times per class, written atomically."""
    from matplotlib.figure import Figure  # lazy: matplotlib is slow to import and only plots need it

    classes = profile.classes
    cols = min(3, max(1, len(classes)))
    rows = math.ceil(len(classes) / cols) or 1
    fig = Figure(figsize=(4.6 * cols, 3.8 * rows), dpi=100)
    for k, c in enumerate(classes):
        ax = fig.add_subplot(rows, cols, k + 1)
        series: dict[tuple[str, int], list] = {}
        for s in c.fit.samples:
            series.setdefault((s.kind, s.chunks), []).append(s)
        for (kind, n), ss in sorted(series.items()):
            ss.sort(key=lambda s: s.chunk_bytes)
            xs = [s.nbytes for s in ss]
            meds = [s.median_us for s in ss]
            lo = [s.median_us - s.spread()["q1_us"] for s in ss]
            hi = [s.spread()["q3_us"] - s.median_us for s in ss]
            label = f"{n} chunk" if n == 1 else f"{n} {'seq' if kind == 'seq' else 'one'}"
            line = ax.errorbar(xs, meds, yerr=[lo, hi], fmt="o" if kind == "seq" else "s", ms=3.5, capsize=2,
                               label=label, alpha=0.8, ls="none")
            ax.plot(xs, [c.fit.fitted_us(s) for s in ss], "-", lw=1, color=line[0].get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes moved (n x s)")
        ax.set_ylabel("time (us)")
        r2 = f"{c.fit.r2:.3f}" if math.isfinite(c.fit.r2) else "n/a"
        ax.set_title(f"{c.name}: a={c.fit.alpha_us:.2f} us, {c.fit.bandwidth_GBps:.2f} GB/s, R2={r2}", fontsize=9)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        if k == 0:
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{profile.topology.name}: measured (median, IQR) vs fitted (lines)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        _save(fig, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def parse_int_list(text: str, option: str, minimum: int = 1) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(option, "$", f"{text!r} is not a list of whole numbers like 1,2,4,8") from None
    if not values or min(values) < minimum:
        raise InputError(option, "$", f"{text!r}: give one or more numbers >= {minimum}")
    return tuple(sorted(set(values)))


def parse_sizes(text: str, option: str = "--sizes") -> tuple[int, ...]:
    sizes = parse_size_range(text, option)
    if not sizes:
        raise InputError(option, "$", f"{text!r}: give one or more sizes like 64KiB,1MiB")
    bad = [s for s in sizes if s % 4]
    if bad:
        raise InputError(option, "$", f"{bad[0]} bytes is not a multiple of 4 (the runtime moves float32 elements)")
    return tuple(sorted(set(sizes)))
