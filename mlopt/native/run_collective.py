"""`mlopt run-collective`: run an MSCCL-EF algorithm on the CPU runtime, check it and measure it.

Every rank gets seeded random data, the library runs the program on an in-process communicator (ranks are
threads), and every rank's output is compared with the collective computed directly in numpy from the
inputs, following the collective's definition and the executor's chunk layout (mlopt/sim/symbolic.py,
"Chunks per rank"; mlopt/sim/collectives.py): bitwise for pure data movement (allgather, alltoall,
broadcast), exactly for max/min and for int32, and within the rounding a reduction order can cause for
float sums and products. One warm-up run, then --iterations timed runs; every run is checked.

Bandwidths follow nccl-tests: algorithm bandwidth = bytes of the larger buffer per rank (what --size gives)
/ time, bus bandwidth = algorithm bandwidth x the collective's factor (allreduce 2(n-1)/n; allgather,
reducescatter, alltoall (n-1)/n; broadcast, reduce 1). Time is the library's own measurement of the run
(mlopt_run_stats.wall_us), so the Python around it does not count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlopt.errors import InputError, MloptError
from mlopt.formats.sizes import format_size
from mlopt.native import binding as native
from mlopt.sim.network import busbw_factor as factor

DTYPES = tuple(native.DTYPES)
OPS = tuple(native.OPS)
COPYING = frozenset({"allgather", "alltoall", "broadcast"})  # pure data movement: outputs are input bits
MAX_MISMATCHES_LISTED = 8


@dataclass(frozen=True)
class RunCollectiveOptions:
    """One field per CLI option of `mlopt run-collective` (mlopt/cli.py), same names."""

    size_bytes: int  # --size: the larger buffer per rank (nccl-tests: output for allgather, input for reducescatter)
    ranks: int | None = None  # --ranks: must equal the program's ngpus (default: ngpus)
    dtype: str = "float32"  # --dtype: float32 | float16 | bfloat16 | int32
    op: str = "sum"  # --op: sum | prod | max | min (reductions only)
    in_place: bool = False  # --in-place: one buffer per rank (the program must declare inplace="1")
    iterations: int = 5  # --iterations: timed runs after one warm-up run
    seed: int = 0  # --seed: random input data
    chunk_bytes: int = 0  # --chunk-bytes: the executor's slice of a chunk per loop iteration (0: whole chunk)
    fifo_slots: int = 0  # --fifo-slots: messages in flight per connection (0: unbounded)
    threads: int = 0  # --threads: worker threads of the CPU backend (0: one per hardware thread)
    watchdog_ms: int = 10000  # --watchdog-ms: no progress for this long is reported as a deadlock


class CollectiveMismatch(MloptError):
    """Some rank's output differs from the reference: the program computes something else. Exit code 1."""

    exit_code = 1


@dataclass(frozen=True)
class Mismatch:
    rank: int
    index: int  # first bad element of that rank's output
    got: str
    expected: str
    bad_elements: int
    run: int  # 0: warm-up, 1..iterations: timed runs

    def describe(self) -> str:
        return (f"rank {self.rank} output[{self.index}] is {self.got}, expected {self.expected} "
                f"({self.bad_elements} bad element(s) on that rank, run {self.run})")


@dataclass
class RunReport:
    file: str
    collective: str
    ranks: int
    dtype: str
    op: str
    in_place: bool
    size_bytes: int
    input_bytes: int  # per rank
    output_bytes: int
    count: int  # input elements per rank
    root: int | None  # broadcast and reduce
    iterations: int
    time_us: float  # mean over the timed runs
    algbw_GBps: float
    busbw_GBps: float
    steps_executed: int  # per run
    per_step_us: float  # time_us / steps_executed
    loop_iterations: int
    messages: int
    bytes_moved: int
    times_us: list[float] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def summary(self) -> str:
        verdict = ("outputs match the reference on every rank" if self.ok
                   else f"MISMATCH on {len({m.rank for m in self.mismatches})} rank(s)")
        op = f" {self.op}" if self.collective not in COPYING else ""
        root = f" root {self.root}" if self.root is not None else ""
        layout = "in place" if self.in_place else "out of place"
        return (f"{self.collective}{op} of {_size(self.size_bytes)} {self.dtype} on {self.ranks} ranks{root} "
                f"({layout}): {self.time_us:.1f} us, algbw {self.algbw_GBps:.3f} GB/s, busbw "
                f"{self.busbw_GBps:.3f} GB/s, {self.per_step_us:.3f} us per step ({self.steps_executed} steps, "
                f"{self.loop_iterations} loop iteration(s)); {verdict}")


def _size(n: int) -> str:
    return format_size(n)


# ------------------------------------------------------------------------------------------------ sizes


def element_counts(size_bytes: int, dtype: str, i_chunks: int, o_chunks: int) -> tuple[int, int]:
    """(input, output) elements per rank when the larger buffer has `size_bytes`; InputError when it does not
    split into the program's chunks of whole elements."""
    elem = native.DTYPE_BYTES[dtype]
    larger_chunks = max(i_chunks, o_chunks)
    step = elem * larger_chunks
    if size_bytes % step:
        raise InputError("--size", "$", f"{size_bytes} bytes of {dtype} do not split into the program's "
                         f"{larger_chunks} chunks of whole elements; use a multiple of {step} bytes")
    chunk_elems = size_bytes // step
    return chunk_elems * i_chunks, chunk_elems * o_chunks


def busbw_factor(collective: str, nranks: int) -> float:
    return factor(collective, nranks)


# ------------------------------------------------------------------------------------------------ data


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) of float values, rounded to nearest even (finite values only)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def as_float64(data: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a buffer of `dtype` (bfloat16 as uint16 bits) as float64 (int32 as int64)."""
    if dtype == "bfloat16":
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "int32":
        return data.astype(np.int64)
    return data.astype(np.float64)


def random_inputs(nranks: int, count: int, dtype: str, op: str, seed: int) -> list[np.ndarray]:
    """Rank inputs (bfloat16 as uint16 bits) chosen so that no reduction over nranks overflows or underflows:
    products of values near 1 (floats) or of magnitude <= 2^(30/n) (int32); sums far from the limits."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(nranks):
        if dtype == "int32":
            if op == "prod":
                magnitude = max(1, int(2 ** (30 / nranks)))
                values = rng.integers(1, magnitude + 1, count) * rng.choice(np.array([-1, 1]), count)
            elif op == "sum":
                values = rng.integers(-(2**24), 2**24, count)
            else:
                values = rng.integers(-(2**31), 2**31, count)
            out.append(values.astype(np.int32))
            continue
        if op == "prod":
            values = rng.uniform(0.9, 1.1, count) * rng.choice(np.array([-1.0, 1.0]), count)
        else:
            values = rng.uniform(-1.0, 1.0, count)
        out.append(_bf16_bits(values) if dtype == "bfloat16" else values.astype(dtype))
    return out


# ------------------------------------------------------------------------------------------------ reference


def _eps(dtype: str) -> float:
    return {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]


def _smallest_normal(dtype: str) -> float:
    return {"float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}[dtype]


@dataclass(frozen=True)
class Expected:
    """What one rank's output must hold: `values` (float64/int64, or raw input bits for copies) and how much
    each element may be off (None: exactly / bitwise)."""

    values: np.ndarray
    tolerance: np.ndarray | None
    bitwise: bool


def reduce_inputs(inputs: list[np.ndarray], dtype: str, op: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Elementwise reduction of every rank's input, in float64 (int64 for int32) so that it is exact for the
    data random_inputs makes, and the tolerance of a float sum/product computed in any order in `dtype`:
    every partial result is rounded once (n - 1 roundings of at most eps times the sum of magnitudes, resp.
    the product), plus the final rounding; None when the result must be exact (int32, max, min)."""
    combine: Callable[[np.ndarray, np.ndarray], np.ndarray] = {
        "sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    total = as_float64(inputs[0], dtype)
    magnitude = np.abs(total) if op == "sum" else None
    for data in inputs[1:]:
        values = as_float64(data, dtype)
        total = combine(total, values)
        if magnitude is not None:
            magnitude += np.abs(values)
    if dtype == "int32" or op in ("max", "min"):
        return total, None
    n = len(inputs)
    scale = magnitude if op == "sum" else np.abs(total)
    return total, (n + 1) * _eps(dtype) * scale + n * _smallest_normal(dtype)


def expected_outputs(coll: str, inputs: list[np.ndarray], dtype: str, op: str, out_count: int,
                     root: int) -> Callable[[int], Expected | None]:
    """rank -> what its output must hold (None: anything, e.g. non-root ranks of reduce), following
    mlopt/sim/collectives.py with chunks of equal size: allgather concatenates the inputs; alltoall's output
    block s of rank r is block r of rank s's input; reducescatter gives rank r block r of the reduction."""
    n = len(inputs)
    if coll == "allgather":
        gathered = np.concatenate(inputs)
        return lambda rank: Expected(gathered, None, True)
    if coll == "alltoall":
        if inputs[0].size % n:
            raise InputError("<program>", "algo@nchunksperloop", f"an alltoall over {n} ranks needs input chunks "
                             f"in a multiple of {n}")
        block = inputs[0].size // n
        return lambda rank: Expected(
            np.concatenate([inputs[s][rank * block:(rank + 1) * block] for s in range(n)]), None, True)
    if coll == "broadcast":
        return lambda rank: Expected(inputs[root], None, True)
    total, tolerance = reduce_inputs(inputs, dtype, op)
    if coll == "allreduce":
        return lambda rank: Expected(total, tolerance, False)
    if coll == "reduce":
        return lambda rank: Expected(total, tolerance, False) if rank == root else None
    if coll == "reducescatter":
        def window(rank: int) -> Expected:
            part = slice(rank * out_count, (rank + 1) * out_count)
            return Expected(total[part], None if tolerance is None else tolerance[part], False)
        return window
    raise InputError("<program>", "algo@coll", f"unknown collective {coll!r}")


def _show(data: np.ndarray, index: int, dtype: str, bitwise: bool) -> str:
    value = as_float64(data[index:index + 1], dtype)[0] if data.dtype != np.float64 else data[index]
    if dtype == "int32":
        return str(int(value))
    shown = f"{float(value)!r}"
    if bitwise and dtype in ("float16", "bfloat16", "float32"):
        shown += f" (0x{int(data[index:index + 1].view(np.uint16 if dtype != 'float32' else np.uint32)[0]):x})"
    return shown


def compare(output: np.ndarray, expected: Expected, dtype: str) -> tuple[int, int] | None:
    """(first bad index, bad element count) of one rank's output, None when it matches."""
    if expected.bitwise:
        bits = np.uint16 if native.DTYPE_BYTES[dtype] == 2 else np.uint32
        bad = output.view(bits) != expected.values.view(bits)
    else:
        got = as_float64(output, dtype)
        bad = got != expected.values if expected.tolerance is None else ~(
            np.abs(got - expected.values) <= expected.tolerance)
    positions = np.flatnonzero(bad)
    return (int(positions[0]), int(positions.size)) if positions.size else None


def check_outputs(outputs: list[np.ndarray], expected: Callable[[int], Expected | None], dtype: str,
                  run: int) -> list[Mismatch]:
    found = []
    for rank, output in enumerate(outputs):
        want = expected(rank)
        if want is None:
            continue
        result = compare(output, want, dtype)
        if result is not None:
            index, bad = result
            found.append(Mismatch(rank, index, _show(output, index, dtype, want.bitwise),
                                  _show(want.values, index, dtype, want.bitwise), bad, run))
    return found


# ------------------------------------------------------------------------------------------------ running


def collective_root(info: dict) -> int | None:
    """The root of a broadcast/reduce program (mlopt_program_info.root, as mlopt/sim/symbolic.py defines
    it); None for the other collectives."""
    return info["root"] if info["root"] >= 0 else None


def load_runnable_plan(path: str) -> native.Plan:
    """The plan at `path`, which must be an MSCCL-EF XML; InputError (exit 2) otherwise."""
    if not Path(path).is_file():
        raise InputError(path, "$", "no such file")
    plan = native.Plan.load(path)  # RuntimeLibraryError with the library's one-line message: exit 2
    if plan.kind != "msccl-xml":
        raise InputError(path, "$", f"a JSON plan ({plan.planner or plan.format}); run-collective runs MSCCL-EF "
                         f"XML algorithms (a collective plan's sidecar names its XML in payload.xml)")
    return plan


def check_request(path: str, info: dict[str, Any], options: RunCollectiveOptions) -> int:
    """The number of ranks to run; InputError for requests the program cannot serve."""
    ranks = info["ngpus"] if options.ranks is None else options.ranks
    if ranks != info["ngpus"]:
        raise InputError("--ranks", "$", f"{path} is an algorithm for {info['ngpus']} ranks, not {ranks}")
    if options.dtype not in DTYPES:
        raise InputError("--dtype", "$", f"{options.dtype!r} is not one of {', '.join(DTYPES)}")
    if options.op not in OPS:
        raise InputError("--op", "$", f"{options.op!r} is not one of {', '.join(OPS)}")
    if options.in_place and not info["inplace"]:
        raise InputError("--in-place", "$", f"{path} does not declare inplace=\"1\"; run it out of place")
    if not options.in_place and not info["outofplace"]:
        raise InputError(path, "algo@outofplace", "the program only runs in place; add --in-place")
    if options.iterations < 1:
        raise InputError("--iterations", "$", "must be at least 1")
    return ranks


# Reused output buffers are filled with this byte before each run (0xA5A5A5A5 is no value a test input makes).
POISON_BYTE = 0xA5


def run_collective(path: str, options: RunCollectiveOptions) -> RunReport:
    """Runs the algorithm at `path` once to warm up and `options.iterations` times timed, checking every
    run's outputs. Mismatches are listed in the report (the CLI turns them into exit code 1); bad input
    raises InputError / RuntimeLibraryError (exit code 2)."""
    plan = load_runnable_plan(path)
    info = plan.program_info
    ranks = check_request(path, info, options)
    count, out_count = element_counts(options.size_bytes, options.dtype, info["i_chunks"], info["o_chunks"])
    root = collective_root(info)
    inputs = random_inputs(ranks, count, options.dtype, options.op, options.seed)
    expected = expected_outputs(info["coll"], inputs, options.dtype, options.op, out_count,
                                0 if root is None else root)
    run_options = {"dtype": options.dtype, "op": options.op, "in_place": options.in_place,
                   "chunk_bytes": options.chunk_bytes, "fifo_slots": options.fifo_slots,
                   "watchdog_ms": options.watchdog_ms, "threads": options.threads}
    mismatches: list[Mismatch] = []
    times_us, stats = [], None
    outputs = None
    with native.LocalComm(ranks) as comm:
        for run in range(options.iterations + 1):
            # Out of place, the warm-up's outputs are reused (as gloo reuses its tensors): a fresh array per
            # run would put its page faults inside the timed run.
            reuse = None if options.in_place else outputs
            for buffer in reuse or ():
                buffer.view(np.uint8).fill(POISON_BYTE)  # a run that skips an output must not pass on old data
            outputs, stats = comm.run(plan, inputs, outputs=reuse, **run_options)
            mismatches += check_outputs(outputs, expected, options.dtype, run)
            if run > 0:
                times_us.append(stats.wall_us)
            if mismatches:
                break  # the first wrong run says it all; timing a wrong program means nothing
    time_us = float(np.mean(times_us)) if times_us else stats.wall_us
    elem = native.DTYPE_BYTES[options.dtype]
    algbw = max(count, out_count) * elem / time_us / 1e3 if time_us > 0 else 0.0  # 0: too fast to measure
    return RunReport(
        file=str(path), collective=info["coll"], ranks=ranks, dtype=options.dtype, op=options.op,
        in_place=options.in_place, size_bytes=options.size_bytes, input_bytes=count * elem,
        output_bytes=out_count * elem, count=count, root=root, iterations=len(times_us), time_us=time_us,
        algbw_GBps=algbw, busbw_GBps=algbw * busbw_factor(info["coll"], ranks),
        steps_executed=stats.steps_executed,
        per_step_us=time_us / stats.steps_executed if stats.steps_executed else 0.0,
        loop_iterations=stats.loop_iterations,
        messages=stats.messages, bytes_moved=stats.bytes_moved, times_us=times_us,
        mismatches=mismatches[:MAX_MISMATCHES_LISTED])


def raise_for_mismatch(report: RunReport) -> None:
    """CollectiveMismatch (exit 1) naming the first bad rank and element, when there is one."""
    if report.ok:
        return
    first = report.mismatches[0]
    ranks = sorted({m.rank for m in report.mismatches})
    raise CollectiveMismatch(f"{report.file}: the {report.collective} result is wrong: {first.describe()}; "
                             f"wrong rank(s): {', '.join(map(str, ranks))}")
