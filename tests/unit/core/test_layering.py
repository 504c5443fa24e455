"""Dependencies point one way (docs/architecture.md, "Layering"): no import cycles between raysim's modules, the runtime is
plugged in from outside, and only the runtime imports ray.

The graph holds every import of a raysim module, module-level or inside a function (a lazy import
still makes the module depend on the other). The method registry discovers the modules of
``raysim.algorithms`` by name (each registers itself), which is not an import statement and so no
edge; ``raysim/__init__.py`` installs the registry as the config parser's source of method sections.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "raysim"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)   # `from pkg import module`
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        found = {d for d in _imports(path, name) if d in files and d != name}
        # `from pkg import module` depends on the module; a submodule importing its own package's
        # __init__ (which re-exports it) is how packages work, not a cycle.
        deps = {d for d in found if not any(o != d and o.startswith(d + ".") for o in found)}
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def _external(name: str) -> set[str]:
    path = next(p for p in PACKAGE.rglob("*.py") if _module_name(p) == name)
    return {d.split(".")[0] for d in _imports(path, name)}


def _package(module: str) -> str:
    """raysim.runtime.driver -> raysim.runtime; top-level modules stay themselves."""
    return ".".join(module.split(".")[:2])


def _find_cycle(edges: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_no_import_cycles_between_modules():
    graph = _graph()
    _find_cycle(graph)


def test_no_import_cycles_between_packages():
    # e.g. runtime/ importing experiment.py while experiment.py imports runtime/ is a cycle here
    edges: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        edges.setdefault(_package(m), set()).update(
            _package(d) for d in deps if _package(d) != _package(m))
    for deps in list(edges.values()):
        for d in deps:
            edges.setdefault(d, set())
    _find_cycle(edges)


def test_the_runtime_plugs_in_from_outside():
    graph = _graph()
    users = {m for m, deps in graph.items() if any(d == "raysim.runtime" or d.startswith("raysim.runtime.") for d in deps)}
    outside = {m for m in users if not (m.startswith("raysim.runtime") or m.startswith("raysim.cli"))}
    assert not outside, f"only the CLI may choose a runtime; imported by {sorted(outside)}"


def test_only_the_runtime_imports_ray():
    importers = {_module_name(p) for p in PACKAGE.rglob("*.py") if "ray" in _external(_module_name(p))}
    assert importers and all(m.startswith("raysim.runtime") for m in importers), sorted(importers)


def test_the_graph_sees_lazy_imports():
    # the checks above would be vacuous if function-level imports were missed
    graph = _graph()
    assert "raysim.runtime.driver" in graph["raysim.runtime"]          # imported inside driver_host_for
    assert "raysim.experiment" in graph["raysim.cli.run"]
