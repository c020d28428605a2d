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

Channels per message size reach NCCL through a tuner plugin. The CSV is the format of NCCL's example tuner
(ext-tuner/example/plugin.c as of the v5 tuner API, NCCL 2.27-2.28 era; older examples were stubs):
NCCL_TUNER_CONFIG_FILE (default ./nccl_tuner.conf), one config per line,
`collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]`;
lines starting with '#' and empty lines are skipped; fields are split on ',' by strtok (so an empty field
vanishes and shifts the rest), trimmed of spaces and tabs; 8 to 10 fields; byte bounds are inclusive; -1 in
channels/nNodes/nRanks/numPipeOps/regBuff means "NCCL's default"/"any"; the first matching line wins; lines
are read with fgets into 256 bytes, so longer lines are split. The plugin maps unknown names silently to
allreduce/ring/simple; `parse_nccl_tuner_csv` rejects them instead. Caveat of that example plugin: it sets
the channel count to 1 before looking for a match, so a collective no line matches runs on one channel; the
rows below therefore cover every all-reduce size, and `fallback_channels` adds catch-all lines for the other
collectives.

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


def tuner_rows(
    groups_bytes: Sequence[int],
    channels: Sequence[int],
    *,
    collective: str = "allreduce",
    algorithm: str = "ring",
    protocol: str = "simple",
    n_nodes: int = -1,
    n_ranks: int = -1,
    match: str = "nearest",
    fallback_channels: int | None = None,
) -> list[TunerRow]:
    """One line per distinct group size, in increasing size (ranges described in the module docstring), then,
    with fallback_channels, a catch-all line per other collective."""
    sizes = _check_groups(groups_bytes)
    if len(channels) != len(sizes):
        raise ValueError(f"{len(sizes)} groups but {len(channels)} channel counts")
    if match not in ("nearest", "exact"):
        raise ValueError(f"match must be 'nearest' or 'exact', found {match!r}")
    best: dict[int, int] = {}
    for g, c in zip(sizes, channels):
        best[g] = max(best.get(g, c), int(c))
    distinct = sorted(best)
    rows = []
    for i, size in enumerate(distinct):
        if match == "exact":
            lo, hi = size, size
        else:
            lo = 0 if i == 0 else math.isqrt(distinct[i - 1] * size) + 1
            hi = SIZE_MAX if i == len(distinct) - 1 else math.isqrt(size * distinct[i + 1])
        rows.append(TunerRow(collective, lo, hi, algorithm, protocol, best[size], n_nodes, n_ranks))
    if fallback_channels is not None:
        for other in COLLECTIVES:
            if other != collective:
                rows.append(TunerRow(other, 0, SIZE_MAX, "ring", "simple", fallback_channels, n_nodes, n_ranks))
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
    "# NCCL tuner config (NCCL_TUNER_CONFIG_FILE) for NCCL's example tuner plugin (ext-tuner/example)\n"
    "# written by mlopt: communication thread plan (LIBRA), one line per fusion-group size\n"
    "# format: collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\n"
    "# bytes inclusive; -1 = any (nNodes, nRanks) or NCCL's default (channels); first matching line wins\n"
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
    """Config lines as the example plugin reads them, strictly: a line is skipped when it is empty or its first
    character is '#'; the rest must have 8, 9 or 10 comma-separated fields (spaces/tabs around a field trimmed,
    no empty fields, which strtok would silently drop), known names, decimal integers, min <= max, and fit the
    plugin's 256-byte line buffer. InputError(source, "line N", ...) otherwise. Missing optional fields read
    as -1 (any), as in the plugin."""
    configs = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line == "" or line.startswith("#"):
            continue
        where = f"line {number}"
        if len(line) + 2 > MAX_LINE_LENGTH:
            raise InputError(source, where, f"longer than the plugin's {MAX_LINE_LENGTH - 2}-character limit")
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


# --- environment -------------------------------------------------------------------------------------------


def nccl_env(nthreads_per_channel: int = DEFAULT_NCCL_NTHREADS, tuner_config_file: str | None = None,
             tuner_plugin: str | None = None) -> dict[str, str]:
    """Environment for the training job: NCCL_NTHREADS, and where given NCCL_TUNER_CONFIG_FILE and
    NCCL_TUNER_PLUGIN (the example plugin's library, e.g. /path/libnccl-tuner-example.so)."""
    env = {"NCCL_NTHREADS": str(_check_nthreads(nthreads_per_channel))}
    if tuner_config_file is not None:
        env["NCCL_TUNER_CONFIG_FILE"] = str(tuner_config_file)
    if tuner_plugin is not None:
        env["NCCL_TUNER_PLUGIN"] = str(tuner_plugin)
    return env


def thread_plan_artifacts(groups_bytes: Sequence[int], threads: Sequence[int], *,
                          nthreads_per_channel: int | None = None, max_channels: int = MAX_CHANNELS,
                          tuner_config_file: str = "nccl_tuner.conf", match: str = "nearest",
                          n_nodes: int = -1, n_ranks: int = -1) -> dict[str, Any]:
    """Everything at once for groups in backward order with their thread counts: bucket caps, channels per
    group, NCCL_NTHREADS (chosen when not given), the tuner CSV text, the environment, and size conflicts."""
    sizes = _check_groups(groups_bytes)
    if len(threads) != len(sizes):
        raise ValueError(f"{len(sizes)} groups but {len(threads)} thread counts")
    n = choose_nthreads(threads, max_channels) if nthreads_per_channel is None else nthreads_per_channel
    channels = [threads_to_channels(t, n, max_channels) for t in threads]
    rows = tuner_rows(sizes, channels, match=match, n_nodes=n_nodes, n_ranks=n_ranks)
    return {
        "bucket_cap_mb_list": ddp_bucket_cap_mb_list(sizes),
        "bucket_bytes_list": ddp_bucket_bytes_list(sizes),
        "channels": channels,
        "threads_effective": [c * n for c in channels],
        "nccl_nthreads": n,
        "nccl_tuner_csv": nccl_tuner_csv(rows),
        "env": nccl_env(n, tuner_config_file),
        "channel_conflicts": {str(k): v for k, v in channel_conflicts(sizes, channels).items()},
    }
