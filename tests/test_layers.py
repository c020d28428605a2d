"""Layers point down only (issue 25): formats -> solvers -> sim -> planners -> the application (command line,
validate, sweep, profilers) and the integrations (the native binding in mlopt/native, the
PyTorch integration in mlopt/pytorch). Every import between mlopt modules, at module top or inside a function,
is read from the source; one from a lower layer to a higher one fails this test unless it is listed in
KNOWN_UPWARD, the imports still to be moved (each entry must still occur, so the list only shrinks)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlopt"

# Top-level module or package of mlopt -> its layer; higher numbers may import lower ones.
LAYERS = {"__init__": 0, "errors": 0, "formats": 1, "solvers": 2, "sim": 3, "planners": 4}
APPLICATION = 5  # everything else: cli, validate, sweep, profilers, native, pytorch, trace_sources

# (importing module, imported module): upward imports still to be moved. Empty since the planner registry of
# issue 25 took how a simulated workload applies each plan kind out of mlopt.sim.evaluate.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1] if len(parts) > 1 else "__init__", APPLICATION)


def _imports(path: Path) -> set[str]:
    """Absolute mlopt modules imported anywhere in the file (relative imports are not used in mlopt)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "mlopt":  # `from mlopt import planners` imports a package, `__version__` does not
                found.update(f"mlopt.{a.name}" for a in node.names
                             if (PACKAGE / a.name).is_dir() or (PACKAGE / f"{a.name}.py").is_file())
    return {name for name in found if name == "mlopt" or name.startswith("mlopt.")}


def upward_imports() -> set[tuple[str, str]]:
    pairs = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _module_name(path)
        for imported in _imports(path):
            if _layer(imported) > _layer(importer):
                pairs.add((importer, imported))
    return pairs


def test_no_lower_layer_imports_a_higher_one():
    unexpected = sorted(upward_imports() - KNOWN_UPWARD)
    assert not unexpected, "imports from a lower layer to a higher one: " + "; ".join(
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})" for a, b in unexpected)


def test_every_known_upward_import_still_exists():
    gone = sorted(KNOWN_UPWARD - upward_imports())
    assert not gone, f"moved already, drop them from KNOWN_UPWARD: {gone}"


def test_the_layer_reader_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from mlopt import __version__, planners\n"
                      "def f():\n    from mlopt.planners.memory import catalog\n    import mlopt.sim.network\n")
    assert _imports(source) == {"mlopt", "mlopt.planners", "mlopt.planners.memory", "mlopt.sim.network"}
