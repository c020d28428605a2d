"""Content-addressed plan cache: a cell whose inputs were planned before gets the cached files, unsolved.

Key: sha256 of the canonical JSON of
  - the cell's command `plan PLANNER ARGS -o NAME` (NAME: the output's file name, which plans record for
    their side files; the folder is not part of it, so a cache serves any -o DIR),
  - the sha256 of every argument that names a file (trace, topology file, sketches, op profile, contention
    samples, cost table; presets and generators such as `ndv2x2` or `ring:4` are in the command by name),
  - mlopt's version and a fingerprint of its installed sources (so that an edited checkout never serves
    plans made by other code under the same version number).

Layout: CACHE/ab/abcdef.../ with the cell's files and `entry.json` (their names and hashes), published by
renaming a finished temporary folder, so readers see whole entries or none. A hit is checked against
`entry.json` and copied into the sweep folder atomically, file by file, the plan envelope last.
Default folder: $MLOPT_CACHE, else ~/.cache/mlopt/plans; `mlopt sweep --cache DIR` overrides both.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlopt
from mlopt import __version__
from mlopt.formats.io import atomic_write_bytes, canonical_json, sha256_bytes, sha256_file
from mlopt.sweep.cells import Cell

ENTRY = "entry.json"


def default_cache_dir() -> Path:
    env = os.environ.get("MLOPT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mlopt" / "plans"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the installed mlopt package's Python sources and schemas (names and bytes)."""
    root = Path(mlopt.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def key_material(cell: Cell) -> dict[str, Any]:
    """What the key hashes (kept readable in entry.json)."""
    command = ["plan", cell.planner, *cell.args, "-o", cell.basename]
    inputs = {}
    for arg in cell.args:
        if not arg.startswith("--") and os.path.isfile(arg):
            inputs[arg] = sha256_file(arg)
    return {"command": command, "inputs": inputs, "mlopt_version": __version__, "mlopt_code": code_fingerprint()}


def cell_key(cell: Cell) -> str:
    return sha256_bytes(canonical_json(key_material(cell)).encode())


class PlanCache:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> dict[str, bytes] | None:
        """The cached files (name -> bytes) when a complete, intact entry exists; None otherwise."""
        folder = self._dir(key)
        try:
            import json

            entry = json.loads((folder / ENTRY).read_text())
            files = {}
            for name, digest in entry["files"].items():
                data = (folder / name).read_bytes()
                if sha256_bytes(data) != digest:
                    return None
                files[name] = data
            return files
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: str, cell: Cell, files: dict[str, bytes]) -> None:
        """Publish an entry (first writer wins; a failure to cache never fails the sweep)."""
        folder = self._dir(key)
        if (folder / ENTRY).exists():
            return
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=folder.parent))
        except OSError:
            return
        try:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            entry = {"key": key, **key_material(cell), "files": {n: sha256_bytes(d) for n, d in sorted(files.items())}}
            (tmp / ENTRY).write_text(canonical_json(entry))
            os.replace(tmp, folder)  # atomic publish; fails if another writer got there first
        except OSError:
            pass
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def install_files(out_dir: Path, cell: Cell, files: dict[str, bytes]) -> None:
    """Write a cell's files under out_dir atomically, side files first and the plan envelope last (so a
    complete plan envelope means the cell's files are all there)."""
    folder = out_dir / Path(cell.output).parent
    plan_name = Path(cell.plan_file).name
    for name in sorted(files, key=lambda n: (n == plan_name, n)):
        atomic_write_bytes(folder / name, files[name])


def remove_files(out_dir: Path, cell: Cell) -> None:
    """Drop a failed cell's files from an earlier run, plan envelope first, so the folder never shows a
    plan the summary says failed (and --resume does not take it for done)."""
    for rel in reversed(cell.files):
        try:
            (out_dir / rel).unlink()
        except FileNotFoundError:
            pass
