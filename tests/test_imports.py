"""Data flows one way: no module of stallbench imports, directly or not, a module that imports it.

The graph is read from the source (``ast``), not from ``sys.modules``, so imports inside
functions (lazy imports of heavy or optional libraries) count as much as module-level ones:
a cycle that only closes at run time is still a cycle. Nodes are modules; a package's
``__init__`` is a node of its own, and importing a submodule does not count as importing its
package's ``__init__`` (Python runs it first, but it is not a dependency the code declares).
"""

from __future__ import annotations

import ast
import re
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


# --- The architecture as tests (issue 24) ------------------------------------------------------
#
# docs/architecture.md declares the order of the wings in a fenced ``layers`` block, top first;
# wings on one line are peers. A module may import only from its own wing or from wings on lower
# lines: an import that runs back up (or across to a peer) fails here, as does a cycle between
# wings, a cycle between files, a private name imported from another module, and a top-level
# module not on the allow-list. ``stallbench/__init__.py`` is the package's face: it may re-export
# (lazily) from any wing and any wing may read ``__version__`` from it, so it stands outside the
# order (file cycles through it still fail).

DOC = ROOT / "docs" / "architecture.md"
# The ground floor (rules every layer uses, the two Ray modules that import nothing of
# stallbench), the scenario, the plan, and the entry points. A new capability is a wing.
TOP_LEVEL_ALLOWED = {"cli", "errors", "registry", "interrupts", "outputs", "threads", "ray_probe",
                     "ray_setup", "scenario", "pipeline", "__init__", "__main__"}


def layers(doc: Path = DOC) -> list[list[str]]:
    """The ``layers`` block of the architecture page: one list of peer wings per line, top first."""
    text = doc.read_text(encoding="utf-8")
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].split() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def wing(mod: str) -> str | None:
    """``stallbench.gate.ab`` -> ``gate``; ``stallbench.cli`` -> ``cli``; the face -> None."""
    parts = mod.split(".")
    return None if parts[1:] == ["__init__"] else parts[1]


def wing_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        a = wing(m)
        if a is None:
            continue
        out.setdefault(a, set())
        for d in deps:
            b = wing(d)
            if b is not None and b != a:
                out[a].add(b)
                out.setdefault(b, set())
    return out


def back_up(g: dict[str, set[str]], order: list[list[str]]) -> list[str]:
    """File-level imports that run back up the order (or across to a peer wing)."""
    level = {w: i for i, line in enumerate(order) for w in line}
    bad = []
    for m, deps in sorted(g.items()):
        a = wing(m)
        for d in sorted(deps):
            b = wing(d)
            if a is None or b is None or a == b:
                continue
            if a not in level or b not in level:
                bad.append(f"{m} -> {d} (wing {a if a not in level else b!r} not in the order)")
            elif level[b] <= level[a]:
                bad.append(f"{m} -> {d}")
    return bad


def private_imports(root: Path = ROOT) -> list[str]:
    """A private name (``_x``) of one module used in another: ``from stallbench.x import _name``,
    or ``mod._name`` where ``mod`` is a stallbench module the file imported. Make it public, or
    move it to where it is used. Dunders (``__version__``) are public."""
    mods = modules(root)

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    bad = []
    for mod, path in mods.items():
        pkg = mod.split(".")[:-1]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        aliases: dict[str, str] = {}           # local name -> the stallbench module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == PACKAGE and alias.asname:
                        aliases[alias.asname] = alias.name
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                target = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                if private(alias.name):
                    bad.append(f"{path.relative_to(root)}:{node.lineno} imports {target}.{alias.name}")
                elif _node(f"{target}.{alias.name}", mods) is not None:
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and private(node.attr)):
                bad.append(f"{path.relative_to(root)}:{node.lineno} uses "
                           f"{aliases[node.value.id]}.{node.attr}")
    return bad


def top_level(root: Path = ROOT) -> list[str]:
    return sorted(p.stem for p in (root / PACKAGE).glob("*.py"))


def figures(root: Path = ROOT) -> dict[str, int]:
    """The issue's figures, measured: ``python tests/test_imports.py [ROOT]`` prints them."""
    g = graph(root)
    order = layers(root / "docs" / "architecture.md") if "```layers" in (
        root / "docs" / "architecture.md").read_text() else DEFAULT_ORDER
    return {"top-level modules (not __init__/__main__)":
            len([m for m in top_level(root) if m not in ("__init__", "__main__")]),
            "imports running back up the order": len(back_up(g, order)),
            "package-level cycles": len(cycles(wing_graph(g))),
            "file cycles": len(cycles(g)),
            "private names imported across modules": len(private_imports(root))}


# The order this test shipped with, to measure trees whose page predates the ``layers`` block.
DEFAULT_ORDER = [["__main__"], ["cli"], ["commands"], ["report"], ["gate", "run", "profile"],
                 ["analysis", "executors"], ["trainers"], ["measure"], ["pipeline"], ["stages"],
                 ["data"], ["scenario", "outputs", "threads"], ["results"],
                 ["registry", "interrupts", "errors", "ray_probe", "ray_setup"]]


def test_the_page_declares_every_wing_once() -> None:
    order = layers()
    flat = [w for line in order for w in line]
    assert len(flat) == len(set(flat)), f"a wing twice in the order: {flat}"
    present = {wing(m) for m in graph()} - {None}
    assert not present - set(flat), f"wings missing from docs/architecture.md: {present - set(flat)}"


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """Ground truth by construction: a low wing importing a high one, a wing cycle without a
    file cycle, a private name across modules, and a stray top-level module."""
    pkg = tmp_path / PACKAGE
    for d in ("low", "high"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from ..low.b import f\n")
    (pkg / "low" / "b.py").write_text("def f():\n    pass\n")
    (pkg / "low" / "c.py").write_text("from ..high import a\nfrom .b import _g\nfrom . import b\n"
                                      "b._h()\n")
    (pkg / "stray.py").write_text("")
    g = graph(tmp_path)
    order = [["high"], ["low"], ["stray"]]
    assert back_up(g, order) == [f"{PACKAGE}.low.c -> {PACKAGE}.high.a"]
    assert not cycles(g) and cycles(wing_graph(g)) == [["high", "low", "high"]]
    assert private_imports(tmp_path) == ["stallbench/low/c.py:2 imports stallbench.low.b._g",
                                         "stallbench/low/c.py:4 uses stallbench.low.b._h"]
    assert "stray" in set(top_level(tmp_path)) - TOP_LEVEL_ALLOWED


def test_no_import_runs_back_up_the_order_of_the_wings() -> None:
    bad = back_up(graph(), layers())
    assert not bad, "imports running back up docs/architecture.md's order:\n" + "\n".join(bad)


def test_no_cycle_between_wings() -> None:
    found = cycles(wing_graph(graph()))
    assert not found, "wing cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_private_name_crosses_a_module() -> None:
    bad = private_imports()
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_the_top_level_holds_only_the_ground_floor() -> None:
    stray = sorted(set(top_level()) - TOP_LEVEL_ALLOWED)
    assert not stray, (f"new top-level modules {stray}: a new capability is a wing (a package) "
                       "or joins one (docs/architecture.md, 'Where to put a new ...')")


# --- No verb imports another verb (issue 55) ---------------------------------------------------
# ``commands/`` holds one module per verb, parse and print only; what two verbs share lives in
# a wing (``profile/jobrun.py`` for ``profile`` and ``tune -- CMD``), so that a verb's module
# can change without another verb's. The shared flag parser is the one sibling a verb reads;
# a verb of two modules (``gate``: ``gate.py`` and ``gate_ab.py``) is one verb, as the page's
# table of verbs says.

COMMANDS = f"{PACKAGE}.commands."
SHARED_FLAGS = f"{PACKAGE}.commands.numbers"


def verb_modules(doc: Path = DOC) -> dict[str, str]:
    """``stallbench.commands.<module>`` -> its verb, from the table of verbs on the page."""
    out = {}
    for line in doc.read_text().splitlines():
        m = re.match(r"\| `([\w-]+)` \| (.*?) \|", line)
        if m:
            for mod in re.findall(r"`commands/(\w+)\.py`", m.group(2)):
                out[f"{COMMANDS}{mod}"] = m.group(1)
    return out


def verbs_importing_verbs(g: dict[str, set[str]], verb_of: dict[str, str]) -> list[str]:
    """Each import from one verb's module of another verb's (a module the table does not
    name is a verb of its own)."""
    bad = []
    for mod, deps in g.items():
        if not mod.startswith(COMMANDS) or mod.endswith(".__init__"):
            continue
        for d in deps:
            if (d.startswith(COMMANDS) and d != SHARED_FLAGS and not d.endswith(".__init__")
                    and verb_of.get(d, d) != verb_of.get(mod, mod)):
                bad.append(f"{mod} imports {d}")
    return sorted(bad)


def test_the_verb_check_sees_a_sibling() -> None:
    c = COMMANDS
    g = {f"{c}tune": {f"{c}profile", SHARED_FLAGS, f"{PACKAGE}.profile.jobrun"},
         f"{c}gate": {f"{c}gate_ab"}, f"{c}gate_ab": {SHARED_FLAGS},
         f"{c}profile": {SHARED_FLAGS}, f"{c}run": {f"{c}__init__"}}
    verb_of = {f"{c}gate": "gate", f"{c}gate_ab": "gate"}
    assert verbs_importing_verbs(g, verb_of) == [f"{c}tune imports {c}profile"]
    table = verb_modules()
    assert table[f"{c}gate_ab"] == table[f"{c}gate"] == "gate" and table[f"{c}tune"] == "tune"


def test_no_verb_imports_another_verb() -> None:
    bad = verbs_importing_verbs(graph(), verb_modules())
    assert not bad, ("a verb imports another verb's module (what they share goes into a wing; "
                     "only commands/numbers.py is shared):\n" + "\n".join(bad))


if __name__ == "__main__":
    import sys
    for k, v in figures(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT).items():
        print(f"{v:4d}  {k}")


def test_every_test_module_has_a_name_of_its_own() -> None:
    """pytest imports test files by basename here (no packages under tests/): two files of
    one name fail collection for the whole suite, every pass of it (a merge did that once)."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for f in tests.rglob("test_*.py"):
        if "__pycache__" not in f.parts:
            seen.setdefault(f.name, []).append(str(f.relative_to(tests)))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, f"test modules sharing a name: {twice}"
