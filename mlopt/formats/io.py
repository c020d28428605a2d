"""Reading and writing documents: JSON or YAML in, canonical JSON out, atomic writes, content hashes.

Canonical JSON is what makes plans byte-identical across runs: sorted keys, two-space indent, floats
printed with 12 significant digits (so last-bit noise never reaches the file), no NaN or infinity.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from mlopt.errors import InputError

FLOAT_DIGITS = 12  # significant digits kept in canonical JSON


def read_bytes(path: str | os.PathLike) -> bytes:
    """File contents, transparently gunzipped; unreadable paths are input errors."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(str(path), "$", "no such file") from None
    except IsADirectoryError:
        raise InputError(str(path), "$", "is a directory, expected a file") from None
    except OSError as exc:
        raise InputError(str(path), "$", f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InputError(str(path), "$", f"corrupt gzip data: {exc}") from None
    return raw


def parse_document(text: bytes | str, source: str) -> Any:
    """Parse JSON, falling back to YAML (a superset) for files that are not JSON."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(source, "$", f"not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as json_exc:
        if source.endswith((".json", ".json.gz")):
            raise InputError(
                source, "$", f"malformed JSON at line {json_exc.lineno} column {json_exc.colno}: {json_exc.msg}"
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "parse error"
        raise InputError(source, "$", f"malformed YAML{where}: {problem}") from None


def read_document(path: str | os.PathLike) -> Any:
    """Load a JSON or YAML file (optionally gzipped) into plain Python values."""
    return parse_document(read_bytes(path), str(path))


def _canonical(value: Any, where: str) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} cannot be written to JSON")
        rounded = float(f"{value:.{FLOAT_DIGITS}g}")
        if rounded == 0.0:
            return 0.0
        if rounded.is_integer() and abs(rounded) < 2**53:
            return float(rounded)
        return rounded
    if isinstance(value, dict):
        return {str(k): _canonical(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item"):  # numpy scalars
        return _canonical(value.item(), where)
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-serialisable")


def canonical_json(value: Any) -> str:
    """Deterministic JSON text (sorted keys, rounded floats, trailing newline)."""
    return json.dumps(_canonical(value, "$"), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write data so that readers see either the old file or the whole new one, never a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _new_file_mode())  # mkstemp makes 0600; a plan is an ordinary file
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _new_file_mode() -> int:
    """0666 less the process umask, as open() would give (umask can only be read by setting it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Canonical JSON, written atomically."""
    atomic_write_text(path, canonical_json(value))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hash of a file's bytes as stored (gzip not undone), for plan provenance."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
