"""The loader kinds' one table (issue 40: "a new loader kind is one module"): every door module
declares what the launcher side reads, no two doors claim a kind, and nothing outside
``stallbench/profile/doors/`` names a kind or tests one against a literal (a new kind would
otherwise need edits in the files that spell the old ones)."""

from __future__ import annotations

import ast
from pathlib import Path

import profile_helpers as helpers
from stallbench.profile import doors

PKG = Path(doors.__file__).resolve().parents[2]      # stallbench/
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


def test_the_hooks_load_every_door_and_route_each_patch() -> None:
    h = helpers.load_hooks("_hooks_doors_test")
    loaded = {m.__name__.rsplit("_door_", 1)[1] for m in h.DOORS}
    assert loaded == set(doors.names())
    declared = {target for d in doors.table().values() for target, _ in d.patches}
    assert set(h.TARGETS) == declared
    for kind in doors.table():
        assert kind in h.door_of(kind).KINDS


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
