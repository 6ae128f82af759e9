"""The package's import structure (docs/design.md, "Layers"), read from the source.

Every import counts: module level, inside functions and under ``TYPE_CHECKING``, since
each is a dependency a reader must follow and a lazy one only hides a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pulsar_py

PACKAGE = Path(pulsar_py.__file__).resolve().parent
# Subpackages above the library: the library never imports them. ``python -m pulsar_py``
# (__main__) is the command line's entry point, part of the tools.
UPPER = ("pulsar_py.tools", "pulsar_py.io", "pulsar_py.distributed", "pulsar_py.__main__")
NATIVE = "pulsar_py._native"  # the compiled module: a leaf


def _modules() -> Dict[str, Optional[Path]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    found[NATIVE] = None
    return found


def _imports(name: str, path: Path, modules: Dict[str, Optional[Path]]) -> Set[str]:
    """The package's modules that ``name`` imports (a name imported from a package counts
    as its submodule where one exists, else as the package)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: List[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                if node.level
                else (node.module or "")
            )
            targets += [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != name:
            found.add(target)
            found |= _parents_run_by(name, target, modules)
    return found


def _parents_run_by(name: str, target: str, modules: Dict[str, Optional[Path]]) -> Set[str]:
    """The subpackages whose __init__ importing ``target`` runs first (pulsar_py.cameras for
    pulsar_py.cameras.params), less the importer's own packages, which are already
    running, and the package root, which every import runs."""
    parts = target.split(".")
    parents = {".".join(parts[:k]) for k in range(2, len(parts))}
    own = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 2)}
    return {p for p in parents if p in modules and p not in own}


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) if path else set() for name, path in modules.items()}


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as a list of modules (first == last), or [] if there is none."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_graph_reads_the_known_dependencies():
    # The reader itself: a graph that missed imports would pass the checks below vacuously.
    graph = _graph()
    assert "pulsar_py.ops" in graph["pulsar_py.renderer"]
    assert "pulsar_py.render_settings" in graph["pulsar_py._checks"]  # under TYPE_CHECKING
    assert "pulsar_py.cameras.params" in graph["pulsar_py.cameras"]  # a package's __init__
    assert "pulsar_py.cameras" in graph["pulsar_py.renderer"]  # from .cameras.camera runs cameras/__init__
    assert NATIVE in graph["pulsar_py._snapshot"]  # from . import _native
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_of_the_package_imports_itself_through_others():
    cycle = _cycle(_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_library_never_imports_the_layers_above_it():
    graph = _graph()
    library = [name for name in graph if not name.startswith(UPPER)]
    wrong = {name: sorted(t for t in graph[name] if t.startswith(UPPER)) for name in library}
    # The package's lazy attributes (pulsar_py.tools, ...) are strings, not imports.
    assert not {name: targets for name, targets in wrong.items() if targets}


# The top-level modules below the cameras: records and checks of one value, which import
# nothing of the package themselves.
CAMERA_LEAVES = ("pulsar_py.camera_layouts", "pulsar_py._arguments")


def test_the_cameras_import_only_the_leaves_of_the_top_level():
    """cameras/ sits below the renderer's modules (_checks, ops, renderer, ...), which build
    on it: it imports its own modules and the leaves, never the renderer's rules."""
    graph = _graph()
    cameras = [name for name in graph if name.startswith("pulsar_py.cameras")]
    assert "pulsar_py.cameras.camera" in cameras  # the reader found the subpackage
    wrong = {
        name: sorted(t for t in graph[name] if not t.startswith("pulsar_py.cameras") and t not in CAMERA_LEAVES)
        for name in cameras
    }
    assert not {name: targets for name, targets in wrong.items() if targets}
    for leaf in CAMERA_LEAVES:
        assert not graph[leaf], f"{leaf} imports {sorted(graph[leaf])}"
