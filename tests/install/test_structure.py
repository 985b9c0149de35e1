"""The package's structure, read from its source with :mod:`ast` (nothing is imported): no import
cycle among its modules, and each layer imports only the layers below it.

The layers, from the bottom: the foundation (errors, limits, durations, serializers, model), the
sans-I/O core (``pyqueue.core``), the drivers that perform the core's steps (``pyqueue.drivers``),
the sync and asyncio APIs (``pyqueue.sync``, ``pyqueue.aio``), and on top the facades and
programs (``pyqueue``, ``pyqueue.cron``, the command line, the installer, the test servers, Spark).
Imports inside functions and under ``TYPE_CHECKING`` count: a cycle hidden there is still one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pyqueue"
FOUNDATION = {"pyqueue.errors", "pyqueue.limits", "pyqueue.durations", "pyqueue.serializers", "pyqueue.model"}
#: The I/O a sans-I/O module may not import.
IO_MODULES = {"socket", "select", "signal", "asyncio", "selectors", "subprocess", "psycopg_pool"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """The package's modules that ``name`` imports, and the outside top-level modules it imports."""
    is_package = path.name == "__init__.py"
    inside: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (inside if alias.name in known else outside).add(
                    alias.name if alias.name in known else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("pyqueue"):
                outside.add(target.split(".")[0])
                continue
            for alias in node.names:  # ``from .core import routines`` imports a module
                sub = f"{target}.{alias.name}"
                inside.add(sub if sub in known else target)
    inside.discard(name)
    return inside, outside


@functools.cache
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The imports of every module, read once per test session (the tests only read them)."""
    found = modules()
    known = set(found)
    edges, external = {}, {}
    for name, path in found.items():
        edges[name], external[name] = imports(name, path, known)
    return edges, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(name: str) -> int:
    """0 foundation, 1 core, 2 drivers, 3 the sync and asyncio APIs, 4 facades and programs."""
    if name in FOUNDATION:
        return 0
    for prefix, level in (("pyqueue.core", 1), ("pyqueue.drivers", 2), ("pyqueue.sync", 3)):
        if name == prefix or name.startswith(prefix + "."):
            return level
    if name.startswith("pyqueue.aio."):
        return 3
    return 4


def test_the_checker_finds_a_cycle_and_relative_imports() -> None:
    """The checker itself: a planted two-module cycle is found, and relative imports resolve."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    edges, _ = graph()
    assert "pyqueue.core.statements" in edges["pyqueue.drivers.sync"]
    assert "pyqueue.sync.client" in edges["pyqueue"]


def test_no_import_cycle() -> None:
    edges, _ = graph()
    assert cycles(edges) == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_each_layer_imports_only_layers_below(name: str) -> None:
    edges, _ = graph()
    upward = {m for m in edges[name] if layer(m) > layer(name)}
    if layer(name) == 3:  # the sync and asyncio APIs do not import each other, but for the one ticker thread
        upward |= {m for m in edges[name] if layer(m) == 3 and m.split(".")[1] != name.split(".")[1]
                   and m != "pyqueue.sync.cron"}
    assert not upward, f"{name} imports {sorted(upward)} from a layer above (or a sibling API)"


@pytest.mark.parametrize("name", sorted(m for m in modules() if layer(m) <= 1))
def test_the_core_does_no_io(name: str) -> None:
    """The foundation and the core import no sockets, selectors, signals, event loop or pool."""
    _, external = graph()
    assert not external[name] & IO_MODULES, f"{name} imports {sorted(external[name] & IO_MODULES)}"
    assert "threading.Thread" not in modules()[name].read_text(), f"{name} starts threads"
