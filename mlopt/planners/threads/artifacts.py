"""What a training job loads from a thread plan: DDP bucket caps, an NCCL tuner config CSV, NCCL env vars.

Fusion groups are given in backward order (group 0 holds the last layers' gradients, ready first) as byte
sizes, with the communication thread count LIBRA chose for each.

PyTorch DDP (`bucket_cap_mb_list`, torch >= 2.13 here). DDP turns each MiB cap into bytes with
`int(cap_mb * 1024 * 1024)` and `_compute_bucket_assignment_by_size` closes a bucket as soon as the bytes it
has collected reach the current cap (`size >= cap`), then moves to the next cap (the last one repeats). Any
cap in (group bytes - bytes of the group's last tensor, group bytes] therefore closes bucket i exactly at the
end of group i; we use the group's bytes exactly: cap_i = bytes_i / 2**20, exact in binary floating point, so
`int(cap_i * 2**20) == bytes_i`. Rounding *up* would be wrong: the bucket would swallow the next group's
first tensor. Rounded to 12 significant digits (mlopt's canonical JSON) the cap still converts to bytes_i
or bytes_i - 1 for groups up to 256 GiB, both inside the window when the group's last tensor has >= 2 bytes;
a plan can also carry the integer `ddp_bucket_bytes_list` and divide by 2**20 at load time. DDP applies these
caps to gradients in ready order when it rebuilds its buckets after the first iteration (verified with
torch 2.13 + gloo: `rebuilt_bucket_sizes` equal the groups); the first iteration's provisional buckets
walk the parameters in definition order with the same caps and so differ unless the groups are symmetric.

NCCL. NCCL runs one CUDA block per channel with NCCL_NTHREADS threads (64, 128, 256 or 512; default 512; it
sets the Simple protocol's block size, LL128 has its own; current sources define NCCL_MIN_NTHREADS = 128, so
64 may not be honoured there: prefer >= 128), so r communication threads become ceil(r / NCCL_NTHREADS)
channels, clamped to [1, max_channels]. MAXCHANNELS
is 32 in NCCL 2.x releases up to the 2.1x series and 64 in current ones (src/include/device.h); 32 is the
default bound here. NCCL_NTHREADS is one value for the whole process: `choose_nthreads` picks the largest
that represents every group's thread count exactly.

Channels per message size reach NCCL through a tuner plugin: NCCL's example tuner (plugins/tuner/example/plugin.c,
formerly ext-tuner/example/plugin.c; tuner API v5, NCCL 2.27-2.29), built as libnccl-tuner-example.so and
loaded with NCCL_TUNER_PLUGIN. Its rules, which `parse_nccl_tuner_csv`/`match_config` follow and
tests/data/nccl_tuner/driver.c re-implements in C:
- the file is NCCL_TUNER_CONFIG_FILE, else ./nccl_tuner.conf, opened with fopen (a relative path is relative
  to the job's working directory; a missing file is not an error: nothing is tuned);
- lines are read with fgets into 256 bytes (longer lines are split); a line whose first character is '#' or
  '\n' is skipped; fields are split on ',' by strtok (an empty field vanishes and shifts the rest), trimmed
  of spaces and tabs, at most 10 read; 8 to 10 fields make a config, fewer drop the line silently:
  `collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]`;
  bytes by strtoull, the rest by atoi; unknown names read silently as allreduce/ring/simple;
- the plugin is initialised once per communicator with its nRanks and nNodes; a call (collective, nBytes,
  numPipeOps, regBuff) takes the first line, in file order, whose collective equals, min <= nBytes <= max
  (inclusive), and whose nNodes, nRanks, numPipeOps and regBuff equal the call's or are -1; a line whose
  algorithm/protocol NCCL marks as unavailable for the call is passed over (ring/simple, which mlopt
  writes, is available to every collective);
- the channel count starts at 1: a call no line matches runs on ONE channel, and so does a matching line
  with channels -1 (the plugin's "keep the default" keeps its own 1, not NCCL's); nBytes is NCCL's larger
  of send and receive bytes (an all-gather's output, a reduce-scatter's input);
- NCCL uses the tuner's count as the collective's channel bound, which cannot exceed the communicator's
  channels; those come from NCCL's topology search, at least NCCL_MIN_NCHANNELS (default 1).
`parse_nccl_tuner_csv` rejects what the plugin would misread (unknown names, empty fields, more than 10 or
fewer than 8 fields, non-integers) instead of guessing.

So mlopt writes, per communicator the job will use (`job_communicators`: nNodes = nodes and nRanks =
nodes x GPUs per node, or -1/-1 when the GPUs per node are not known: the plan then holds for any
communicator), a line per fusion-group size for every collective NCCL tunes (DDP broadcasts its states
and all-reduces its buckets; other wrappers all-gather, reduce-scatter or reduce), and the environment
sets NCCL_MIN_NCHANNELS to the most planned channels when that is more than NCCL's minimum of 1. The env
recorded in a plan names the CSV relative to the plan file, so committed plans do not depend on the
machine; `job_env` makes it absolute when a job loads the plan.

Size ranges: NCCL gives the tuner only the collective, the byte count, numPipeOps and regBuff, so a line can
only select by size. Distinct group sizes are sorted and the size axis is split at geometric midpoints
between neighbours (match="nearest", default: every size maps to the closest group size; the first range
starts at 0, the last ends at 2**64-1), or each size gets [size, size] (match="exact"). Ranges never overlap.
Groups of the same size cannot be told apart by NCCL: their line carries the largest channel count among
them (communication is never slower than planned; compute is slowed a little more than planned), and
`channel_conflicts` lists such sizes so the caller can warn.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from mlopt.errors import InputError

MIB = 1 << 20
NCCL_NTHREADS_CHOICES = (64, 128, 256, 512)
DEFAULT_NCCL_NTHREADS = 512
MAX_CHANNELS = 32  # NCCL 2.x MAXCHANNELS (64 in current releases: pass max_channels=64 there)
SIZE_MAX = (1 << 64) - 1  # what strtoull reads into a 64-bit size_t
MAX_LINE_LENGTH = 256  # the example plugin's fgets buffer, newline and NUL included

COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
CSV_FIELDS = ("collective", "min_bytes", "max_bytes", "algorithm", "protocol", "channels", "nNodes", "nRanks")
OPTIONAL_FIELDS = ("numPipeOps", "regBuff")


class TunerRow(NamedTuple):
    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nNodes: int = -1
    nRanks: int = -1


# --- PyTorch DDP -------------------------------------------------------------------------------------------


def _check_groups(groups_bytes: Sequence[int]) -> list[int]:
    out = []
    for i, g in enumerate(groups_bytes):
        if isinstance(g, bool) or not isinstance(g, int) or g <= 0:
            raise ValueError(f"group {i}: bytes must be a positive integer, found {g!r} (drop empty groups)")
        if g >= 1 << 53:
            raise ValueError(f"group {i}: {g} bytes is beyond exact float conversion")
        out.append(int(g))
    if not out:
        raise ValueError("no groups")
    return out


def ddp_bucket_bytes_list(groups_bytes: Sequence[int]) -> list[int]:
    """The byte caps DDP derives from `ddp_bucket_cap_mb_list`: the group sizes, in backward order."""
    return _check_groups(groups_bytes)


def ddp_bucket_cap_mb_list(groups_bytes: Sequence[int]) -> list[float]:
    """`bucket_cap_mb_list` for DistributedDataParallel: cap_i = bytes_i / 2**20 MiB, exactly (see the
    module docstring for why exactly and not rounded up)."""
    return [g / MIB for g in _check_groups(groups_bytes)]


def bucket_bytes_from_cap_mb(caps_mb: Iterable[float]) -> list[int]:
    """DDP's own conversion (torch.nn.parallel.distributed: int(cap_mb * 1024 * 1024))."""
    return [int(c * MIB) for c in caps_mb]


# --- NCCL channels -----------------------------------------------------------------------------------------


def _check_nthreads(nthreads_per_channel: int) -> int:
    if nthreads_per_channel not in NCCL_NTHREADS_CHOICES:
        raise ValueError(f"NCCL_NTHREADS must be one of {NCCL_NTHREADS_CHOICES}, found {nthreads_per_channel!r}")
    return int(nthreads_per_channel)


def threads_to_channels(threads: int, nthreads_per_channel: int = DEFAULT_NCCL_NTHREADS,
                        max_channels: int = MAX_CHANNELS) -> int:
    """ceil(threads / NCCL_NTHREADS), clamped to [1, max_channels]."""
    n = _check_nthreads(nthreads_per_channel)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be a non-negative integer, found {threads!r}")
    if max_channels < 1:
        raise ValueError("max_channels must be >= 1")
    return max(1, min(max_channels, -(-threads // n)))


def choose_nthreads(threads: Sequence[int], max_channels: int = MAX_CHANNELS) -> int:
    """The largest NCCL_NTHREADS dividing every thread count with at most max_channels channels each (so every
    group gets exactly its threads); else the one whose channels come closest (least total excess threads,
    then the larger value)."""
    if not threads:
        return DEFAULT_NCCL_NTHREADS

    def excess(n: int) -> int:
        return sum(threads_to_channels(t, n, max_channels) * n - t for t in threads)

    exact = [n for n in NCCL_NTHREADS_CHOICES
             if all(t % n == 0 and 1 <= t // n <= max_channels for t in threads)]
    if exact:
        return max(exact)
    return min(NCCL_NTHREADS_CHOICES, key=lambda n: (abs(excess(n)), -n))


def channel_conflicts(groups_bytes: Sequence[int], channels: Sequence[int]) -> dict[int, list[int]]:
    """Group sizes shared by groups with different channel counts: size -> sorted distinct counts."""
    seen: dict[int, set[int]] = {}
    for g, c in zip(groups_bytes, channels, strict=True):
        seen.setdefault(int(g), set()).add(int(c))
    return {g: sorted(cs) for g, cs in sorted(seen.items()) if len(cs) > 1}


ANY_COMMUNICATOR = (-1, -1)  # (nNodes, nRanks) of a line that holds for every communicator


def job_communicators(nodes: int | None, gpus_per_node: int | None) -> list[tuple[int, int]]:
    """(nNodes, nRanks) the tuner lines name: [(nodes, nodes x GPUs per node)] when both are known, else
    [(-1, -1)] (any communicator: the plan then holds for whatever communicator the job makes)."""
    if nodes is None or gpus_per_node is None:
        return [ANY_COMMUNICATOR]
    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, found {value!r}")
    return [(nodes, nodes * gpus_per_node)]


def _check_communicators(communicators: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for n_nodes, n_ranks in communicators:
        for name, value in (("nNodes", n_nodes), ("nRanks", n_ranks)):
            if isinstance(value, bool) or not isinstance(value, int) or (value != -1 and value < 1):
                raise ValueError(f"{name} must be >= 1 or -1, found {value!r}")
        if n_nodes != -1 and n_ranks != -1 and n_ranks < n_nodes:
            raise ValueError(f"a communicator of {n_ranks} ranks cannot span {n_nodes} nodes")
        out.append((n_nodes, n_ranks))
    if not out:
        raise ValueError("no communicators")
    return out


def size_ranges(distinct_sizes: Sequence[int], match: str) -> list[tuple[int, int]]:
    """Inclusive [lo, hi] per sorted distinct size (module docstring): exact, or split at geometric midpoints."""
    if match not in ("nearest", "exact"):
        raise ValueError(f"match must be 'nearest' or 'exact', found {match!r}")
    if match == "exact":
        return [(size, size) for size in distinct_sizes]
    last = len(distinct_sizes) - 1
    return [(0 if i == 0 else math.isqrt(distinct_sizes[i - 1] * size) + 1,
             SIZE_MAX if i == last else math.isqrt(size * distinct_sizes[i + 1]))
            for i, size in enumerate(distinct_sizes)]


def tuner_rows(
    groups_bytes: Sequence[int],
    channels: Sequence[int],
    *,
    collectives: Sequence[str] = COLLECTIVES,
    communicators: Sequence[tuple[int, int]] = (ANY_COMMUNICATOR,),
    algorithm: str = "ring",
    protocol: str = "simple",
    match: str = "nearest",
    fallback_channels: int | None = None,
) -> list[TunerRow]:
    """Per communicator (nNodes, nRanks), per collective, one line per distinct group size in increasing size
    (ranges in the module docstring); with fallback_channels, then a catch-all line per collective not in
    `collectives`. Lines of different communicators or collectives never compete for a call."""
    sizes = _check_groups(groups_bytes)
    if len(channels) != len(sizes):
        raise ValueError(f"{len(sizes)} groups but {len(channels)} channel counts")
    if not collectives or len(set(collectives)) != len(collectives):
        raise ValueError(f"collectives must be distinct and not empty, found {collectives!r}")
    best: dict[int, int] = {}
    for g, c in zip(sizes, channels):
        best[g] = max(best.get(g, c), int(c))
    distinct = sorted(best)
    ranges = size_ranges(distinct, match)
    rows = []
    for n_nodes, n_ranks in _check_communicators(communicators):
        for collective in collectives:
            rows += [TunerRow(collective, lo, hi, algorithm, protocol, best[size], n_nodes, n_ranks)
                     for size, (lo, hi) in zip(distinct, ranges)]
        if fallback_channels is not None:
            rows += [TunerRow(other, 0, SIZE_MAX, "ring", "simple", fallback_channels, n_nodes, n_ranks)
                     for other in COLLECTIVES if other not in collectives]
    for row in rows:
        _check_row(row)
    return rows


# --- the tuner CSV -----------------------------------------------------------------------------------------


def _check_row(row: Sequence[Any]) -> TunerRow:
    if len(row) != len(CSV_FIELDS):
        raise ValueError(f"a tuner row has {len(CSV_FIELDS)} fields, found {len(row)}: {row!r}")
    row = TunerRow(*row)
    if row.collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {row.collective!r}")
    if row.algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {row.algorithm!r}")
    if row.protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {row.protocol!r}")
    for name in ("min_bytes", "max_bytes", "channels", "nNodes", "nRanks"):
        value = getattr(row, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, found {value!r}")
    if not 0 <= row.min_bytes <= row.max_bytes <= SIZE_MAX:
        raise ValueError(f"byte range [{row.min_bytes}, {row.max_bytes}] is not within [0, 2**64-1] and ordered")
    if row.channels != -1 and row.channels < 1:
        raise ValueError(f"channels must be >= 1 or -1, found {row.channels}")
    for name in ("nNodes", "nRanks"):
        if getattr(row, name) != -1 and getattr(row, name) < 1:
            raise ValueError(f"{name} must be >= 1 or -1, found {getattr(row, name)}")
    return row


CSV_HEADER = (
    "# NCCL tuner config (NCCL_TUNER_CONFIG_FILE, an absolute path) for NCCL's example tuner plugin\n"
    "# (NVIDIA/nccl plugins/tuner/example, loaded with NCCL_TUNER_PLUGIN=/path/libnccl-tuner-example.so)\n"
    "# written by mlopt: communication thread plan (LIBRA), one line per fusion-group size and collective\n"
    "# format: collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\n"
    "# bytes inclusive; -1 nNodes/nRanks = any; first matching line wins; unmatched calls get 1 channel\n"
)


def nccl_tuner_csv(rows: Iterable[Sequence[Any]], comment: str | None = None) -> str:
    """The CSV text: a '#' header, optional extra comment lines, then one line per row."""
    lines = [CSV_HEADER.rstrip("\n")]
    if comment:
        lines += [f"# {line}".rstrip() for line in comment.splitlines()]
    for row in rows:
        row = _check_row(row)
        line = ",".join(str(v) for v in row)
        if len(line) + 2 > MAX_LINE_LENGTH:
            raise ValueError(f"line longer than the plugin's {MAX_LINE_LENGTH}-byte buffer: {line}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _int_field(token: str, source: str, where: str, lo: int, hi: int, minus_one: bool) -> int:
    text = token[1:] if token.startswith("-") else token
    if not text.isdigit() or not text.isascii():
        raise InputError(source, where, f"{token!r} is not an integer")
    value = int(token)
    if not (lo <= value <= hi or (minus_one and value == -1)):
        allowed = f"{lo}..{hi}" + (" or -1" if minus_one else "")
        raise InputError(source, where, f"{value} is out of range ({allowed})")
    return value


def _name_field(token: str, source: str, where: str, choices: Sequence[str]) -> str:
    if token not in choices:
        raise InputError(source, where, f"{token!r} is not one of: {', '.join(choices)}")
    return token


def parse_nccl_tuner_csv(text: str, source: str = "<nccl tuner config>") -> list[dict[str, Any]]:
    """Config lines as the example plugin reads them (module docstring), strictly: a line is skipped when it is
    empty or its first character is '#'; the rest must have 8, 9 or 10 comma-separated fields (spaces/tabs
    around a field trimmed, no empty fields, which strtok would silently drop), known names, decimal integers,
    min <= max, and fit the plugin's 256-byte line buffer. InputError(source, "line N", ...) for every line
    the plugin would drop or read differently from what it says (tests/data/nccl_tuner/corpus.json lists
    cases, checked against the C driver). Missing optional fields read as -1 (any), as in the plugin."""
    configs = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line == "" or line.startswith("#"):
            continue
        where = f"line {number}"
        if len(raw) > MAX_LINE_LENGTH - 1:  # fgets keeps 255 characters ('\r' included); the rest is a new line
            raise InputError(source, where, f"longer than the plugin's {MAX_LINE_LENGTH - 1}-character limit")
        tokens = [t.strip(" \t") for t in line.split(",")]
        if any(t == "" for t in tokens):
            raise InputError(source, where, "empty field (the plugin's strtok would shift the fields after it)")
        if not len(CSV_FIELDS) <= len(tokens) <= len(CSV_FIELDS) + len(OPTIONAL_FIELDS):
            raise InputError(source, where, f"expected 8 to 10 comma-separated fields, found {len(tokens)}")
        config: dict[str, Any] = {
            "collective": _name_field(tokens[0], source, f"{where} collective_type", COLLECTIVES),
            "min_bytes": _int_field(tokens[1], source, f"{where} min_bytes", 0, SIZE_MAX, False),
            "max_bytes": _int_field(tokens[2], source, f"{where} max_bytes", 0, SIZE_MAX, False),
            "algorithm": _name_field(tokens[3], source, f"{where} algorithm", ALGORITHMS),
            "protocol": _name_field(tokens[4], source, f"{where} protocol", PROTOCOLS),
            "channels": _int_field(tokens[5], source, f"{where} channels", 1, 2**31 - 1, True),
            "nNodes": _int_field(tokens[6], source, f"{where} nNodes", 1, 2**31 - 1, True),
            "nRanks": _int_field(tokens[7], source, f"{where} nRanks", 1, 2**31 - 1, True),
        }
        for i, name in enumerate(OPTIONAL_FIELDS, start=len(CSV_FIELDS)):
            hi = 1 if name == "regBuff" else 2**31 - 1
            lo = 0 if name == "regBuff" else 1
            config[name] = _int_field(tokens[i], source, f"{where} {name}", lo, hi, True) if i < len(tokens) else -1
        if config["min_bytes"] > config["max_bytes"]:
            raise InputError(source, f"{where} max_bytes",
                             f"{config['max_bytes']} is below min_bytes {config['min_bytes']}")
        configs.append(config)
    return configs


def match_config(configs: Sequence[Mapping[str, Any]], collective: str, nbytes: int, n_nodes: int,
                 n_ranks: int, num_pipe_ops: int = 1, reg_buff: int = 0) -> Mapping[str, Any] | None:
    """The config the example plugin applies to a call (first match in file order), or None."""
    for c in configs:
        if (c["collective"] == collective and c["min_bytes"] <= nbytes <= c["max_bytes"]
                and c["nNodes"] in (-1, n_nodes) and c["nRanks"] in (-1, n_ranks)
                and c.get("numPipeOps", -1) in (-1, num_pipe_ops) and c.get("regBuff", -1) in (-1, reg_buff)):
            return c
    return None


PLUGIN_DEFAULT_CHANNELS = 1  # what the example plugin answers when no line matches or the line says -1


def selected_channels(configs: Sequence[Mapping[str, Any]], collective: str, nbytes: int, n_nodes: int,
                      n_ranks: int, num_pipe_ops: int = 1, reg_buff: int = 0) -> int:
    """The channel count the example plugin hands NCCL for a call (before NCCL bounds it by the
    communicator's channels): the first matching line's, or 1 when none matches or it says -1."""
    config = match_config(configs, collective, nbytes, n_nodes, n_ranks, num_pipe_ops, reg_buff)
    if config is None or config["channels"] == -1:
        return PLUGIN_DEFAULT_CHANNELS
    return int(config["channels"])


# --- environment -------------------------------------------------------------------------------------------

NCCL_DEFAULT_MIN_CHANNELS = 1  # NCCL_MIN_NCHANNELS when unset: the least a communicator may end up with


def min_nchannels(channels: Sequence[int]) -> int | None:
    """NCCL_MIN_NCHANNELS for planned channel counts: the largest, when it is more than NCCL's default minimum
    (NCCL bounds a collective's channels by the communicator's, which the topology search may leave lower)."""
    most = max((int(c) for c in channels), default=NCCL_DEFAULT_MIN_CHANNELS)
    return most if most > NCCL_DEFAULT_MIN_CHANNELS else None


def nccl_env(nthreads_per_channel: int = DEFAULT_NCCL_NTHREADS, tuner_config_file: str | None = None,
             tuner_plugin: str | None = None, min_channels: int | None = None) -> dict[str, str]:
    """Environment for the training job: NCCL_NTHREADS, and where given NCCL_MIN_NCHANNELS,
    NCCL_TUNER_CONFIG_FILE and NCCL_TUNER_PLUGIN (the example plugin's library, e.g.
    /path/libnccl-tuner-example.so)."""
    env = {"NCCL_NTHREADS": str(_check_nthreads(nthreads_per_channel))}
    if min_channels is not None:
        if isinstance(min_channels, bool) or not isinstance(min_channels, int) or min_channels < 1:
            raise ValueError(f"NCCL_MIN_NCHANNELS must be an integer >= 1, found {min_channels!r}")
        env["NCCL_MIN_NCHANNELS"] = str(min_channels)
    if tuner_config_file is not None:
        env["NCCL_TUNER_CONFIG_FILE"] = str(tuner_config_file)
    if tuner_plugin is not None:
        env["NCCL_TUNER_PLUGIN"] = str(tuner_plugin)
    return env


PATH_VARIABLES = ("NCCL_TUNER_CONFIG_FILE", "NCCL_TUNER_PLUGIN")  # files NCCL opens from the job's cwd


def job_env(plan: Mapping[str, Any], plan_path: str | os.PathLike,
            tuner_plugin: str | os.PathLike | None = None) -> dict[str, str]:
    """The environment a job sets before creating its NCCL communicators, from a thread plan (its JSON dict)
    loaded from `plan_path`: the plan's env with relative file paths resolved against the plan file's folder
    (the plan records them relative so that it does not depend on the machine; NCCL would resolve them
    against the job's working directory and silently load nothing), plus NCCL_TUNER_PLUGIN when given
    (made absolute against the caller's working directory, like any command-line path)."""
    env = dict(plan["payload"]["artifacts"]["env"])
    folder = Path(plan_path).resolve().parent
    for name in PATH_VARIABLES:
        if name in env and not Path(env[name]).is_absolute():
            env[name] = str(folder / env[name])
    if tuner_plugin is not None:
        env["NCCL_TUNER_PLUGIN"] = str(Path(tuner_plugin).resolve())
    return env


def thread_plan_artifacts(groups_bytes: Sequence[int], threads: Sequence[int], *,
                          nthreads_per_channel: int | None = None, max_channels: int = MAX_CHANNELS,
                          tuner_config_file: str = "nccl_tuner.conf", match: str = "nearest",
                          communicators: Sequence[tuple[int, int]] = (ANY_COMMUNICATOR,)) -> dict[str, Any]:
    """Everything at once for groups in backward order with their thread counts: bucket caps, channels per
    group, NCCL_NTHREADS (chosen when not given), the tuner CSV text (every collective, per communicator),
    the environment (NCCL_MIN_NCHANNELS where needed), and size conflicts."""
    sizes = _check_groups(groups_bytes)
    if len(threads) != len(sizes):
        raise ValueError(f"{len(sizes)} groups but {len(threads)} thread counts")
    n = choose_nthreads(threads, max_channels) if nthreads_per_channel is None else nthreads_per_channel
    channels = [threads_to_channels(t, n, max_channels) for t in threads]
    rows = tuner_rows(sizes, channels, match=match, communicators=communicators)
    return {
        "bucket_cap_mb_list": ddp_bucket_cap_mb_list(sizes),
        "bucket_bytes_list": ddp_bucket_bytes_list(sizes),
        "channels": channels,
        "threads_effective": [c * n for c in channels],
        "nccl_nthreads": n,
        "nccl_tuner_csv": nccl_tuner_csv(rows),
        "env": nccl_env(n, tuner_config_file, min_channels=min_nchannels(channels)),
        "channel_conflicts": {str(k): v for k, v in channel_conflicts(sizes, channels).items()},
    }
