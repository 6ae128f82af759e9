"""The package's modules form layers: no import cycle, counting every import statement
(at module level, inside functions and under TYPE_CHECKING alike)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pulsar_py

PACKAGE = Path(pulsar_py.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: Set[str]) -> Set[str]:
    """The package modules a file imports, anywhere in it."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # ``from . import ops`` imports the submodule; ``from . import __version__`` a name
            # of the package itself.
            for alias in node.names:
                found.add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin)
    return {m for m in found if m in modules and m != name}


def _graph() -> Dict[str, Set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    # The native module (pulsar_py._native, its stub stands for it) imports nothing of the package.
    natives = {_module_name(p) for p in PACKAGE.rglob("*.pyi")}
    graph = {name: _imports(path, set(files) | natives) for name, path in files.items()}
    graph.update({name: set() for name in natives})
    return graph


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle of the graph (empty when there is none)."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
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


def test_the_graph_sees_the_operators_layer():
    graph = _graph()
    # The layer order around the operators: settings below the checks, the checks below
    # the operators, the operators below the renderer.
    assert "pulsar_py.settings" in graph["pulsar_py._checks"]
    assert "pulsar_py._checks" in graph["pulsar_py.ops"]
    assert "pulsar_py.ops" in graph["pulsar_py.renderer"]
    assert not graph["pulsar_py.settings"] - {"pulsar_py"}, graph["pulsar_py.settings"]


def test_no_import_cycle_in_the_library():
    graph = _graph()
    library = {name: deps for name, deps in graph.items()
               if name != "pulsar_py" and not name.startswith("pulsar_py.tools")}
    library = {name: {d for d in deps if d in library} for name, deps in library.items()}
    assert _cycle(library) == []


def test_the_library_does_not_import_the_package_root():
    """The root (pulsar_py/__init__.py) imports the library; a library module importing it
    back would close a cycle through it."""
    graph = _graph()
    offenders = sorted(name for name, deps in graph.items()
                       if "pulsar_py" in deps and not name.startswith("pulsar_py.tools") and name != "pulsar_py")
    assert offenders == []


def test_a_cycle_is_found_where_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
