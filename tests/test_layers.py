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


# ----------------------------------------------------------------------------------------------------
# No import circle, and imports at module top (issue 25 item 4)

# Files whose imports of mlopt modules inside functions do not yet say why they are lazy, while another change
# moves them to module top. This set may only shrink (each entry must still hold such an import); it emptied
# once mlopt/cli.py, mlopt/sweep/* and the planners' from_trace.py were done.
STILL_LAZY_WITHOUT_REASON: set[str] = set()
LAZY_MARK = "# lazy:"


def _is_module(name: str, package: Path) -> bool:
    path = package.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imported_modules(node: ast.Import | ast.ImportFrom, package: Path) -> set[str]:
    """The mlopt modules one import statement loads; `from mlopt.x import y` names mlopt.x.y when y is a
    submodule, else mlopt.x."""
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    elif node.level == 0 and node.module:
        names = {f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}", package) else node.module
                 for a in node.names}
    else:
        names = set()
    root = package.name
    return {name for name in names if name == root or name.startswith(root + ".")}


def _function_level_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a function body (they run when the function is called, not at import)."""
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(node) for node in ast.walk(fn) if node is not fn)
    return inside


def module_import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the same package that it imports when it is imported (class bodies included,
    function bodies not)."""
    graph = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inside = _function_level_nodes(tree)
        importer = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        importer = importer.removesuffix(".__init__")
        graph[importer] = {m for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                           and id(node) not in inside for m in _imported_modules(node, package)} - {importer}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle as [a, b, ..., a], or [] when there is none (iterative depth-first search)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph.get(start, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done and nxt in graph:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return []


def lazy_imports_without_reason(package: Path = PACKAGE) -> dict[str, list[str]]:
    """file -> `line: statement` of each import of a package module inside a function that has no `# lazy:`
    comment on its lines or on the line above."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source)
        inside = _function_level_nodes(tree)
        for node in ast.walk(tree):
            if (isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) in inside
                    and _imported_modules(node, package)):
                around = lines[max(node.lineno - 2, 0):node.end_lineno]
                if not any(LAZY_MARK in line for line in around):
                    rel = path.relative_to(package.parent).as_posix()
                    found.setdefault(rel, []).append(f"{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_no_import_circle_between_mlopt_modules():
    cycle = find_cycle(module_import_graph())
    assert not cycle, "module-level imports form a circle: " + " -> ".join(cycle)


def test_every_lazy_mlopt_import_says_why():
    missing = {f: lines for f, lines in lazy_imports_without_reason().items() if f not in STILL_LAZY_WITHOUT_REASON}
    assert not missing, "imports inside functions without a `# lazy: <why>` comment (move them to module top): " + \
        "; ".join(f"{f} line {line}" for f, lines in sorted(missing.items()) for line in lines)


def test_every_file_still_lazy_without_reason_still_is():
    fixed = sorted(STILL_LAZY_WITHOUT_REASON - set(lazy_imports_without_reason()))
    assert not fixed, f"their lazy imports are moved or explained, drop them from STILL_LAZY_WITHOUT_REASON: {fixed}"


def _write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_the_cycle_reader_follows_module_level_imports_and_submodules(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.sub import b\n",                 # a submodule: an edge to pkg.sub.b
        "sub/__init__.py": "",
        "sub/b.py": "import pkg.c\n",
        "c.py": "from pkg import a\nclass K:\n    from pkg import d\n",
        "d.py": "def f():\n    from pkg import a\n",    # inside a function: no edge
    })
    graph = module_import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.c"] == {"pkg.a", "pkg.d"} and graph["pkg.d"] == set()
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("def f():\n    from pkg import a\n")
    assert find_cycle(module_import_graph(package)) == []


def test_the_lazy_reader_wants_a_reason_on_the_line_or_above(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "m.py": "import json\n"
                "def f():\n"
                "    import os\n"                                   # not a package module: ignored
                "    from pkg import n  # lazy: a cycle\n"
                "    # lazy: optional dependency\n"
                "    from pkg.n import (\n        x,\n    )\n"
                "    from pkg import n as again\n",
        "n.py": "x = 1\n",
    })
    assert lazy_imports_without_reason(package) == {"pkg/m.py": ["9: from pkg import n as again"]}
