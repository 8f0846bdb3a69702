"""Data flows one way: no module of stallbench imports, directly or not, a module that imports it.

The graph is read from the source (``ast``), not from ``sys.modules``, so imports inside
functions (lazy imports of heavy or optional libraries) count as much as module-level ones:
a cycle that only closes at run time is still a cycle. Nodes are modules; a package's
``__init__`` is a node of its own, and importing a submodule does not count as importing its
package's ``__init__`` (Python runs it first, but it is not a dependency the code declares).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "stallbench"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, ``pkg.__init__`` for packages."""
    out = {}
    for f in sorted((root / PACKAGE).rglob("*.py")):
        out[".".join(f.relative_to(root).with_suffix("").parts)] = f
    return out


def _node(name: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted import name lands in (``a.b`` -> ``a.b`` or ``a.b.__init__``)."""
    if name in mods:
        return name
    if f"{name}.__init__" in mods:
        return f"{name}.__init__"
    return None


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    pkg = mod.split(".")[:-1]        # the package a relative import starts from
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    out.add(_deepest(alias.name, mods))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                # ``from pkg import sub`` imports the submodule when there is one.
                sub = _node(f"{target}.{alias.name}", mods)
                out.add(sub if sub is not None else _deepest(target, mods))
    out.discard(mod)
    return out


def _deepest(name: str, mods: dict[str, Path]) -> str:
    parts = name.split(".")
    while parts:
        node = _node(".".join(parts), mods)
        if node is not None:
            return node
        parts.pop()
    raise AssertionError(f"import of {name!r}: no such module under {PACKAGE}/")


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component with a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:            # Tarjan; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [_path_in(c, g) for c in comps]


def _path_in(comp: set[str], g: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module, for a readable message."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component without a cycle")


def test_the_walker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Ground truth by construction: a package with a cycle through a lazy, relative
    ``from . import`` inside a function, and one through an absolute module-level import."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text("import stallbench.d\n")
    (pkg / "d.py").write_text("from stallbench.c import x\n")
    (pkg / "e.py").write_text("from .sub.b import f\nimport os\n")
    g = graph(tmp_path)
    assert g[f"{PACKAGE}.e"] == {f"{PACKAGE}.sub.b"}
    found = sorted(sorted(c) for c in cycles(g))
    assert found == [[f"{PACKAGE}.a", f"{PACKAGE}.a", f"{PACKAGE}.sub.b"],
                     [f"{PACKAGE}.c", f"{PACKAGE}.c", f"{PACKAGE}.d"]]


def test_stallbench_has_no_import_cycle() -> None:
    g = graph()
    assert len(g) > 30 and f"{PACKAGE}.executors.__init__" in g
    found = cycles(g)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("module", ["stallbench.scenario", "stallbench.executors.base"])
def test_lower_layers_do_not_import_implementations(module: str) -> None:
    """The scenario knows no implementation; the executor interface knows no executor."""
    g = graph()
    assert not {m for m in g[module] if m.startswith("stallbench.executors.")
                and m != "stallbench.executors.base"}, g[module]
