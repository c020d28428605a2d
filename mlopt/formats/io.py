"""Reading and writing documents: JSON or YAML in, canonical JSON out, atomic writes, content hashes.

Canonical JSON is what makes plans byte-identical across runs: sorted keys, two-space indent, floats
printed with 12 significant digits (so last-bit noise never reaches the file), no NaN or infinity.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from mlopt.errors import InputError

FLOAT_DIGITS = 12  # significant digits kept in canonical JSON

# Set by the CLI's SIGINT handler. Python swallows a KeyboardInterrupt raised inside a weakref callback or a
# __del__ ("Exception ignored in ..."), and the command would go on to write its outputs: every place that
# installs an output checks this first, so a Ctrl-C is never followed by a file appearing.
_interrupted = False


def note_interrupt() -> None:
    global _interrupted
    _interrupted = True


def clear_interrupt() -> None:
    global _interrupted
    _interrupted = False


def check_interrupt() -> None:
    """KeyboardInterrupt when Ctrl-C was pressed, even if its first KeyboardInterrupt was swallowed."""
    if _interrupted:
        raise KeyboardInterrupt


def check_regular_file(path: str | os.PathLike) -> None:
    """InputError unless `path` is a regular file (following links): a FIFO would block the read forever and
    a device (/dev/zero) never ends, so neither is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(str(path), "$", "no such file") from None
    except NotADirectoryError:
        raise InputError(str(path), "$", "no such file (a folder on its path is a file)") from None
    except (OSError, ValueError) as exc:  # ELOOP, ENAMETOOLONG, EACCES; ValueError: a NUL in the path
        raise InputError(str(path), "$", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(mode):
        raise InputError(str(path), "$", "is a directory, expected a file")
    if not stat.S_ISREG(mode):
        raise InputError(str(path), "$", "is not a regular file (a FIFO, device or socket); give a file")


def read_bytes(path: str | os.PathLike) -> bytes:
    """File contents, transparently gunzipped; unreadable paths are input errors."""
    path = Path(path)
    check_regular_file(path)
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
    except RecursionError:  # the C scanner recurses once per [ or {: refuse instead of crashing
        raise InputError(source, "$", "nested too deeply to read (thousands of levels of [ or {)") from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's int parsing limit)
        if source.endswith((".json", ".json.gz")):
            raise InputError(source, "$", f"malformed JSON: {exc}") from None
    return _parse_yaml(text, source)


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "parse error"
        raise InputError(source, "$", f"malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError(source, "$", "nested too deeply to read (thousands of levels)") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar PyYAML cannot construct, e.g. a bad date
        raise InputError(source, "$", f"malformed YAML: {exc}") from None


def _json_path(parent: str, key: Any) -> str:
    """JSONPath of a child the way jsonschema spells it: $.a.b[3], $['odd key']."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key)
    return f"{parent}.{text}" if text.isidentifier() else f"{parent}[{text!r}]"


def check_finite(doc: Any, source: str) -> None:
    """InputError naming the JSON path of the first NaN or infinite number in a parsed document.

    Python's json reads the non-standard tokens NaN and Infinity, and numbers beyond the float range (1e400)
    as infinity; a schema's `minimum` does not catch them (NaN compares false), so they would reach the
    planners' arithmetic and the MILP solver. Iterative, and each container is visited once, so neither deep
    nesting nor YAML aliases (one list referenced a billion times) make it slow.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(doc, "$")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(source, where, f"{value} is not a finite number (NaN, Infinity and numbers "
                                                f"beyond 1.8e308 are not allowed)")
            continue
        if not isinstance(value, (dict, list)) or id(value) in seen:
            continue
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((child, _json_path(where, key)) for key, child in reversed(list(items)))


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
    """Write data so that readers see either the old file or the whole new one, never a partial file.
    A path that cannot be written (a folder there, a read-only or missing place) is an InputError naming it."""
    path = Path(path)
    try:
        _atomic_write(path, data)
    except OSError as exc:
        raise output_error(path, exc) from None


def output_error(path: str | os.PathLike, exc: OSError) -> InputError:
    """The InputError for an output path the file system refused (exit 2 naming the path)."""
    if isinstance(exc, IsADirectoryError) or (Path(path).is_dir() and not Path(path).is_symlink()):
        return InputError(str(path), "$", "cannot write: is a directory, expected a file path")
    reason = exc.strerror or str(exc)
    culprit = str(exc.filename) if exc.filename else ""
    if Path(culprit).name.startswith(".") and Path(culprit).parent == Path(path).parent:
        culprit = ""  # one of mlopt's own temporary files beside the output: its name would only confuse
    return InputError(str(path), "$", f"cannot write: {reason}" + (f" ({culprit})" if culprit and
                                                                    culprit != str(path) else ""))


def _atomic_write(path: Path, data: bytes) -> None:
    if path.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _new_file_mode())  # mkstemp makes 0600; a plan is an ordinary file
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        check_interrupt()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing ancestors; returns the folders created (outermost first) so that a
    failed command can remove them again."""
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for made in reversed(missing):
        made.mkdir()
    return list(reversed(missing))


def _remove_created(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:  # not empty (someone else wrote there) or already gone: leave it
            pass


def probe_output_path(path: str | os.PathLike) -> None:
    """InputError naming `path` unless a file can be created there; leaves nothing behind. For outputs that a
    library writes late (an MPS dump inside a solve), so that an unwritable path fails before any work."""
    target = Path(path)
    if target.is_dir():
        raise InputError(str(target), "$", "cannot write: is a directory, expected a file path")
    created: list[Path] = []
    try:
        created = _make_parents(target.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".probe", dir=target.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise output_error(target, exc) from None
    finally:
        _remove_created(created)


@contextlib.contextmanager
def staged_files(paths: Sequence[str | os.PathLike]) -> Iterator[list[Path]]:
    """Temporary paths, one per target, for a command that writes several files: when the block succeeds each
    replaces its target, when it fails or is interrupted (Ctrl-C) none does and nothing is left behind. Each
    temporary path has its target's very name, in a hidden folder beside it (a plotting library picks the format
    from the suffix). A folder in a file's place, or a place where no file can be created, is an InputError
    naming the path before the block runs."""
    targets = [Path(p) for p in paths]
    created: list[Path] = []
    scratch: list[Path] = []
    try:
        for target in targets:
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "Is a directory", str(target))
            if len(os.fsencode(target.name)) > 255:  # found now, not when the block writes its temporary file
                raise OSError(errno.ENAMETOOLONG, "File name too long", str(target))
            created += _make_parents(target.parent)
            scratch.append(Path(tempfile.mkdtemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)))
    except OSError as exc:
        _discard(scratch, created)
        raise output_error(target, exc) from None
    temps = [folder / target.name for folder, target in zip(scratch, targets)]
    try:
        yield temps
        check_interrupt()
        for tmp, target in zip(temps, targets):
            if tmp.exists():  # a drawing function may decide not to write (nothing to draw)
                os.chmod(tmp, _new_file_mode())
                os.replace(tmp, target)
    except OSError as exc:  # the block's own write failed: name the target, not the temporary file
        _discard(scratch, created)
        named = {str(t): target for t, target in zip(temps, targets)}.get(str(exc.filename))
        if named is None:
            raise
        raise output_error(named, exc) from None
    except BaseException:
        _discard(scratch, created)
        raise
    _discard(scratch, [])


def _discard(scratch: list[Path], created: list[Path]) -> None:
    for folder in scratch:
        shutil.rmtree(folder, ignore_errors=True)
    _remove_created(created)


def write_files(contents: dict[str | os.PathLike, str | bytes]) -> None:
    """Write several files as one: all of them or none (a plan and its companion file)."""
    with staged_files(list(contents)) as temps:
        for tmp, data in zip(temps, contents.values()):
            tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def staged_folder(target: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling folder for a command that writes a folder of files: when the block succeeds its files
    are moved into `target` (created if missing; files already there that the command does not write are
    kept), when it fails or is interrupted the scratch folder is removed and `target` is as it was."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise InputError(str(target), "$", "is a file; expected a folder (or a new name) for the output")
    created: list[Path] = []
    try:
        created = _make_parents(target.parent)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        _remove_created(created)
        raise output_error(target, exc) from None
    try:
        yield scratch
        check_interrupt()
        _install_folder(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        _remove_created(created)
        raise
    shutil.rmtree(scratch, ignore_errors=True)


def _install_folder(scratch: Path, target: Path) -> None:
    if not target.exists():
        os.rename(scratch, target)  # the whole folder appears at once
        return
    files = sorted(p for p in scratch.rglob("*") if p.is_file())
    for f in files:  # checked before anything moves, so a conflict leaves the target as it was
        dest = target / f.relative_to(scratch)
        for place in [dest, *dest.parents]:
            if place == target:
                break
            if place.exists() and (place.is_dir() if place == dest else not place.is_dir()):
                raise InputError(str(place), "$", "cannot write: " + (
                    "is a directory, expected a file path" if place == dest else "is a file, expected a folder"))
    for f in files:
        dest = target / f.relative_to(scratch)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
        except OSError as exc:
            raise output_error(dest, exc) from None


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
