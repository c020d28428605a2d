"""`nvidia-smi topo -m` parsed into a layout: how GPU pairs connect, where the NICs are, who shares PCIe.

The matrix has one row and one column per device (GPU0..GPUn, then NICs named NIC0.. with a "NIC Legend"
giving their device names, or named mlx5_0.. directly), then the CPU Affinity, NUMA Affinity and GPU NUMA ID
columns (older drivers print only CPU Affinity). Cells are nvidia-smi's legend:

    X     the device itself
    NV#   a bonded set of # NVLinks
    PIX   at most one PCIe bridge            (same PCIe switch)
    PXB   several PCIe bridges, no host bridge (same PCIe switch tree)
    PHB   a PCIe host bridge (the CPU)
    NODE  PCIe and the interconnect between host bridges of one NUMA node
    SYS   PCIe and the SMP interconnect between NUMA nodes (older drivers: SOC)

Cells are separated by tabs (older drivers, and pasted copies) or padded with spaces (newer drivers); both
are read. A matrix cut short (rows missing at the end, as in copies pasted into issues) still parses: a
missing row is filled from its column where the matrix is symmetric.

What the layout implies (`Layout`):
* `gpu_link(i, j)`: the connection kind and NVLink count of a GPU pair;
* `nvswitch`: every GPU pair is NVLink and some GPU has more NVLinks in all than one GPU can bond to peers
  directly (18, an H100's total): the GPUs hang off NVSwitches (DGX-2, DGX/HGX A100 and H100);
* `nic_gpus(nic)`: the GPUs on the NIC's PCIe switch (PIX or PXB), else those on its host bridge (PHB);
* `pcie_switch_groups()`: GPUs that share a PCIe switch, from GPU-GPU PIX/PXB cells and from GPUs that are
  PIX/PXB to the same NIC (DGX-1: GPU pairs 0-1, 2-3, 4-5, 6-7 behind one PLX switch each).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from mlopt.errors import InputError

KINDS = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
PCIE_SWITCH_KINDS = ("PIX", "PXB")  # no host bridge on the path: same PCIe switch (tree)
DIRECT_NVLINK_LIMIT = 18  # the most NVLinks one GPU (H100) has: more in all means NVSwitches
AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_GPU = re.compile(r"^GPU(\d+)$")
_NV = re.compile(r"^NV(\d+)$")


@dataclass(frozen=True)
class Connection:
    kind: str  # "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "X" or the cell text when unknown
    nvlinks: int = 0  # NV#: the bonded NVLink count

    @property
    def label(self) -> str:
        return f"NV{self.nvlinks}" if self.kind == "NV" else self.kind

    @property
    def is_nvlink(self) -> bool:
        return self.kind == "NV"


def parse_cell(text: str) -> Connection:
    t = text.strip().upper()
    m = _NV.match(t)
    if m:
        return Connection("NV", int(m.group(1)))
    if t == "SOC":  # drivers before NODE existed called the inter-socket path SOC
        return Connection("SYS")
    return Connection(t)


@dataclass
class Layout:
    """What `nvidia-smi topo -m` says about one machine."""

    gpus: list[int]  # GPU indices in matrix order
    devices: list[str]  # every matrix column: GPU0.., NIC0.. / mlx5_0..
    matrix: dict[tuple[str, str], Connection]  # (row device, column device)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0 (NIC Legend); identity if absent
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, str] = field(default_factory=dict)
    missing_rows: list[str] = field(default_factory=list)  # rows the text lacked (filled by symmetry)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def nics(self) -> list[str]:
        """NIC columns (as the matrix names them)."""
        return [d for d in self.devices if not _GPU.match(d)]

    def nic_device(self, nic: str) -> str:
        return self.nic_names.get(nic, nic)

    def connection(self, a: str, b: str) -> Connection:
        return self.matrix.get((a, b)) or self.matrix.get((b, a)) or Connection("UNKNOWN")

    def gpu_link(self, i: int, j: int) -> Connection:
        return self.connection(f"GPU{i}", f"GPU{j}")

    def nvlinks(self, i: int, j: int) -> int:
        c = self.gpu_link(i, j)
        return c.nvlinks if c.is_nvlink else 0

    @property
    def nvswitch(self) -> bool:
        pairs = [(i, j) for i in self.gpus for j in self.gpus if i != j]
        if not pairs or not all(self.gpu_link(i, j).is_nvlink for i, j in pairs):
            return False
        return any(sum(self.nvlinks(i, j) for j in self.gpus if j != i) > DIRECT_NVLINK_LIMIT for i in self.gpus)

    def link_hint(self, i: int, j: int) -> str:
        """The link class name this layout suggests for GPU pair (i, j): nvswitch, nvlink (nvlink-x1,
        nvlink-x2, ... where pairs bond different numbers of NVLinks, as in a DGX-1) or pcie."""
        c = self.gpu_link(i, j)
        if not c.is_nvlink:
            return "pcie"
        if self.nvswitch:
            return "nvswitch"
        counts = {self.nvlinks(a, b) for a in self.gpus for b in self.gpus if a != b} - {0}
        return "nvlink" if len(counts) == 1 else f"nvlink-x{c.nvlinks}"

    def nic_gpus(self, nic: str) -> list[int]:
        """GPUs closest to a NIC: on its PCIe switch (PIX, PXB), else on its host bridge (PHB)."""
        for kinds in (PCIE_SWITCH_KINDS, ("PHB",)):
            near = [g for g in self.gpus if self.connection(f"GPU{g}", nic).kind in kinds]
            if near:
                return near
        return []

    def nic_switch_gpus(self, nic: str) -> list[int]:
        """GPUs that share a PCIe switch (tree) with the NIC (PIX or PXB)."""
        return [g for g in self.gpus if self.connection(f"GPU{g}", nic).kind in PCIE_SWITCH_KINDS]

    def pcie_switch_groups(self) -> list[list[int]]:
        """GPUs sharing a PCIe switch, as groups of two or more (union of GPU-GPU PIX/PXB cells and GPUs
        PIX/PXB to a common NIC). A tree with two levels (PXB) is one group."""
        parent = {g: g for g in self.gpus}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def union(a: int, b: int) -> None:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)

        for i in self.gpus:
            for j in self.gpus:
                if i < j and self.gpu_link(i, j).kind in PCIE_SWITCH_KINDS:
                    union(i, j)
        for nic in self.nics:
            near = self.nic_switch_gpus(nic)
            for g in near[1:]:
                union(near[0], g)
        groups: dict[int, list[int]] = {}
        for g in self.gpus:
            groups.setdefault(find(g), []).append(g)
        return sorted((sorted(v) for v in groups.values() if len(v) > 1), key=lambda v: v[0])

    def to_dict(self) -> dict[str, Any]:
        pairs = {f"{i}-{j}": self.gpu_link(i, j).label for i in self.gpus for j in self.gpus if i < j}
        return {
            "gpus": self.num_gpus, "nvswitch": self.nvswitch, "gpu_pairs": pairs,
            "nics": {self.nic_device(n): {"column": n, "gpus": self.nic_gpus(n),
                                          "pcie_switch_gpus": self.nic_switch_gpus(n)} for n in self.nics},
            "pcie_switch_groups": self.pcie_switch_groups(),
            "cpu_affinity": {str(g): a for g, a in self.cpu_affinity.items()},
            "missing_rows": list(self.missing_rows),
        }


def _header_columns(line: str) -> list[tuple[str, int]]:
    """Column names of the header with their start offsets: whitespace-separated tokens, with the
    affinity columns' two- and three-word names joined back."""
    tokens = [(m.group(0), m.start()) for m in re.finditer(r"\S+", line)]
    out: list[tuple[str, int]] = []
    k = 0
    while k < len(tokens):
        for name in AFFINITY_COLUMNS:
            words = name.split()
            if [t for t, _ in tokens[k:k + len(words)]] == words:
                out.append((name, tokens[k][1]))
                k += len(words)
                break
        else:
            out.append(tokens[k])
            k += 1
    return out


def _is_header(line: str) -> bool:
    """The header's first column is GPU0 and is not followed by a cell (a row GPU0 is followed by X)."""
    tokens = line.split()
    if not tokens or tokens[0] != "GPU0":
        return False
    return len(tokens) == 1 or parse_cell(tokens[1]).kind not in KINDS


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # CSI sequences (SGR underline, reset)


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m") -> Layout:
    """Parse `nvidia-smi topo -m` output; InputError naming the line when it is not such a matrix."""
    # nvidia-smi underlines the header with terminal escapes even when its output is piped (seen on an H100,
    # driver 580): drop them before reading columns.
    lines = _ANSI_ESCAPE.sub("", text).replace("\r\n", "\n").split("\n")
    header_at = next((i for i, l in enumerate(lines) if _is_header(l)), None)
    if header_at is None:
        raise InputError(source, "line 1", "no matrix header with GPU0 (is this `nvidia-smi topo -m` output?)")
    header = lines[header_at]
    columns = _header_columns(header)
    names = [c for c, _ in columns]
    n_dev = next((k for k, c in enumerate(names) if c in AFFINITY_COLUMNS), len(names))
    devices = names[:n_dev]
    affinity_cols = columns[n_dev:]
    if not devices or not _GPU.match(devices[0]):
        raise InputError(source, f"line {header_at + 1}", "the header does not start with GPU0")
    matrix: dict[tuple[str, str], Connection] = {}
    cpu_aff: dict[int, str] = {}
    numa_aff: dict[int, str] = {}
    seen_rows: list[str] = []
    device_set = set(devices)
    i = header_at + 1
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            if seen_rows:
                break
            continue
        first = stripped.split()[0]
        if first not in device_set:
            break
        tabbed = "\t" in line
        fields = line.split("\t") if tabbed else None
        if tabbed:
            cells = [f.strip() for f in fields[1:]]
            matrix_cells = cells[:n_dev]
            rest = [c for c in cells[n_dev:] if c]
        else:
            tokens = stripped.split()[1:]
            matrix_cells = tokens[:n_dev]
            rest = _affinity_by_position(line, affinity_cols, len(first), n_dev)
        if len(matrix_cells) < n_dev:
            raise InputError(source, f"line {i + 1}", f"row {first} has {len(matrix_cells)} cells for "
                             f"{n_dev} devices")
        for dev, cell in zip(devices, matrix_cells):
            conn = parse_cell(cell)
            if conn.kind not in KINDS:
                raise InputError(source, f"line {i + 1}", f"row {first}, column {dev}: unknown cell {cell!r} "
                                 f"(expected X, NV#, PIX, PXB, PHB, NODE or SYS)")
            matrix[(first, dev)] = conn
        gm = _GPU.match(first)
        if gm:
            g = int(gm.group(1))
            # Tabs: empty fields are dropped and the rest taken in order (nvidia-smi pads NUMA Affinity with
            # an extra tab); spaces: each field sits under its header column.
            values = dict(zip([c for c, _ in affinity_cols], rest))
            if values.get("CPU Affinity"):
                cpu_aff[g] = values["CPU Affinity"]
            if values.get("NUMA Affinity"):
                numa_aff[g] = values["NUMA Affinity"]
        seen_rows.append(first)
        i += 1
    nic_names: dict[str, str] = {}
    for line in lines[i:]:
        m = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if m:
            nic_names[m.group(1)] = m.group(2)
    gpus = [int(_GPU.match(d).group(1)) for d in devices if _GPU.match(d)]
    missing = [d for d in devices if d not in seen_rows]
    if not any(_GPU.match(r) for r in seen_rows):
        raise InputError(source, f"line {header_at + 2}", "the matrix has no GPU rows")
    for a in devices:  # fill missing rows by symmetry
        for b in devices:
            if (a, b) not in matrix and (b, a) in matrix:
                matrix[(a, b)] = matrix[(b, a)]
    for g in gpus:
        if matrix.get((f"GPU{g}", f"GPU{g}"), Connection("X")).kind != "X":
            raise InputError(source, "matrix", f"GPU{g}'s own cell is not X")
    return Layout(gpus, devices, matrix, nic_names, cpu_aff, numa_aff, missing)


def _affinity_by_position(line: str, affinity_cols: list[tuple[str, int]], name_len: int, n_dev: int) -> list[str]:
    """The affinity fields of a space-padded row, each placed under the header column it starts nearest to
    ('' for an empty field), so an empty CPU Affinity does not shift NUMA Affinity into its place."""
    tokens = [(m.group(0), m.start()) for m in re.finditer(r"\S+", line)]
    rest = tokens[1 + n_dev:]
    if not affinity_cols:
        return [t for t, _ in rest]
    out = [""] * len(affinity_cols)
    starts = [s for _, s in affinity_cols]
    for text, at in rest:
        k = min(range(len(starts)), key=lambda j: abs(starts[j] - at))
        out[k] = (out[k] + "," + text) if out[k] else text
    return out


def read_topo_matrix(command: tuple[str, ...] = ("nvidia-smi", "topo", "-m"), timeout_s: float = 30.0) -> Layout | None:
    """Run nvidia-smi and parse it; None when nvidia-smi is missing or fails (no GPUs, no driver)."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or "GPU0" not in done.stdout:
        return None
    return parse_topo_matrix(done.stdout)
