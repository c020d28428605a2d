"""A tiny builder of synthetic mlopt traces (tensors and ops as the trace schema wants them) for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class TraceBuilder:
    """Collects tensors and ops; `write` puts them in an mlopt.trace file with one process group."""

    def __init__(self) -> None:
        self.tensors: list[dict[str, Any]] = []
        self.ops: list[dict[str, Any]] = []

    def tensor(self, nbytes: int, kind: str = "activation") -> int:
        self.tensors.append({"bytes": nbytes, "dtype": "float32", "id": len(self.tensors), "kind": kind,
                             "shape": [nbytes // 4]})
        return len(self.tensors) - 1

    def op(self, name: str, role: str, us: float, inputs: list[int], outputs: list[int],
           comm: dict[str, Any] | None = None) -> None:
        self.ops.append({"comm": comm, "deps": [], "forward_op": None, "id": len(self.ops), "name": name, "role": role,
                         "implementations": [{"compute_us": us, "name": "default", "workspace_bytes": 0}],
                         "inputs": inputs, "outputs": outputs})

    def write(self, path: Path, name: str, world: int, group: str = "0", schema_version: str = "1.0") -> Path:
        path.write_text(json.dumps({"format": "mlopt.trace", "name": name, "rank": 0, "schema_version": schema_version,
                                    "world_size": world, "process_groups": [{"name": group, "ranks": list(range(world))}],
                                    "ops": self.ops, "tensors": self.tensors, "source": {"importer": "synthetic"}}))
        return path
