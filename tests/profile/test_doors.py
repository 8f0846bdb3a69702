"""The loader kinds' one table (issue 40: "a new loader kind is one module"): every door module
declares what the launcher side reads, no two doors claim a kind, nothing outside
``stallbench/profile/agent/doors/`` names a kind or tests one against a literal (a new kind
would otherwise need edits in the files that spell the old ones), and a door reaches nothing
of the agent but the core's declared interface (issue 55: ``H``, ``agent/core.py``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import profile_helpers as helpers
from stallbench.profile.agent import doors

PKG = Path(doors.__file__).resolve().parents[3]      # stallbench/
DOORS = Path(doors.__file__).resolve().parent


def test_every_door_declares_itself_and_is_in_the_table() -> None:
    table = doors.table()
    names = doors.names()
    assert names and {d.module for d in table.values()} == set(names)
    for kind, door in table.items():
        assert kind in door.kinds
        assert set(door.set_keys) <= {"dataloader", "ray", "torch"}, door
        assert isinstance(door.served, str) and isinstance(door.stages, str)
        for _, fn in door.patches:                   # what the hooks will call by name
            assert fn.startswith("patch_"), (door.module, fn)
    assert doors.of("no.such.kind") is doors.UNKNOWN and not doors.UNKNOWN.reaches("dataloader")


def test_the_agent_loads_every_door_binds_it_and_routes_each_patch() -> None:
    a = helpers.load_agent("_agent_doors_test")
    loaded = {m.__name__.rsplit(".", 1)[1] for m in a.state.DOORS}
    assert loaded == set(doors.names())
    assert all(m.H is a.core.CORE for m in a.state.DOORS)     # bound, one interface
    declared = {target for d in doors.table().values() for target, _ in d.patches}
    assert set(a.install.TARGETS) == declared
    for kind in doors.table():
        assert kind in a.util.door_of(kind).KINDS


def _door_files() -> list[Path]:
    return [DOORS / f"{name}.py" for name in doors.names()]


def test_a_door_reaches_the_agent_only_through_the_core_interface() -> None:
    """Every ``H.<name>`` a door uses is a member of ``core.Core`` (so a change of the core
    that keeps the interface cannot break a door), and a door imports nothing of the agent
    but ``doors._base`` (whose ``bind`` gives it ``H``), at its top or inside a function."""
    from stallbench.profile.agent import core

    stdlib = set(sys.stdlib_module_names)
    bad = []
    for path in _door_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "H" and node.attr not in core.MEMBERS:
                bad.append(f"{path.name}:{node.lineno}: H.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.level:
                if (node.level, node.module) != (1, "_base"):
                    bad.append(f"{path.name}:{node.lineno}: from {'.' * node.level}"
                               f"{node.module or ''} import ...")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) \
                    else [node.module or ""]
                bad += [f"{path.name}:{node.lineno}: import {n}" for n in names
                        if n.split(".")[0] not in stdlib]
    assert not bad, "\n".join(bad)


def test_a_door_without_knobs_is_one_module() -> None:
    """The door contract's cost: a door module holds no binding code of its own (the loader
    binds it: ``_base.bind``) and checks no version itself (``WRITTEN_FOR``: ``_base``)."""
    for path in _door_files():
        text = path.read_text()
        assert "def bind(" not in text and "global H" not in text, path.name
        assert "version_check" not in text and "dist_version" not in text, path.name


def _kind_literals(tree: ast.AST, kinds: set[str]) -> list[tuple[int, str]]:
    """String constants equal to a kind, and ``x.kind.startswith(...)`` with a literal that
    begins a kind (``"ray."``: the family test the doors' ``PASS_PER_CALL`` and ``SET_KEYS``
    replaced)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in kinds:
            out.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "startswith" and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == "kind" and node.args and \
                isinstance(node.args[0], ast.Constant) and \
                any(k.startswith(str(node.args[0].value)) for k in kinds):
            out.append((node.lineno, f"x.kind.startswith({node.args[0].value!r})"))
    return out


def test_nothing_outside_the_doors_names_a_kind() -> None:
    kinds = set(doors.table())
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if DOORS in path.parents:
            continue
        for line, what in _kind_literals(ast.parse(path.read_text()), kinds):
            found.append(f"{path.relative_to(PKG.parent)}:{line}: {what}")
    assert not found, "\n".join(found)


def test_the_check_finds_a_kind_where_one_is_named() -> None:
    """The check above can fail: each form it looks for is found in a sample."""
    src = ('a = "torch.DataLoader"\n'
           'if lo.kind == "thread.queue": pass\n'
           'if s.kind.startswith("ray."): pass\n'
           'if s.kind == "process": pass\n')     # an executor's kind: not a loader's
    got = _kind_literals(ast.parse(src), set(doors.table()))
    assert sorted(n for n, _ in got) == [1, 2, 3], got
