"""The agent as one unit (issue 55): everything that runs inside the user's processes lives in
``stallbench/profile/agent/``, imports only the standard library and its own modules (the
job's Python may have nothing else, and the agent must never import what the job did not),
keeps to the Python the job may run (3.7 syntax), and stays in modules short enough to
read whole; the launcher side imports two things of it only: the wire and the doors'
declarations (never the core, whose modules would run their set-up on the launcher's side).

The rules are read from the source (``ast``), imports inside functions included, as
``tests/test_imports.py`` reads the layers."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from test_imports import graph

AGENT = Path(__file__).resolve().parents[2] / "stallbench" / "profile" / "agent"
PKG = AGENT.parents[1]                  # stallbench/
MAX_LINES = 400
# what the launcher side may import of the agent: the wire, and the doors' declarations
LAUNCHER_MAY = ("stallbench.profile.agent.wire", "stallbench.profile.agent.doors.__init__")


def _files() -> list[Path]:
    return sorted(AGENT.rglob("*.py"))


def foreign_imports(path: Path, root: Path = AGENT) -> list[str]:
    """The imports of ``path`` (a file under ``root``) that are neither the standard library
    nor a module under ``root`` (a relative import that stays inside it)."""
    stdlib = set(sys.stdlib_module_names)
    here = path.parent
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = here
            for _ in range(node.level - 1):
                base = base.parent
            if base != root and root not in base.parents:
                bad.append(f"{path.name}:{node.lineno}: from {'.' * node.level}"
                           f"{node.module or ''} (outside the agent)")
            continue
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        bad += [f"{path.name}:{node.lineno}: import {n}" for n in names
                if n.split(".")[0] not in stdlib]
    return bad


def test_the_agent_imports_only_the_standard_library_and_itself() -> None:
    bad = [b for f in _files() for b in foreign_imports(f)]
    assert not bad, "\n".join(bad)


def test_the_import_check_can_fail(tmp_path: Path) -> None:
    """Ground truth by construction: a third-party import inside a function, stallbench by
    its absolute name, and a relative import that leaves the agent are each found."""
    root = tmp_path / "agent"
    (root / "doors").mkdir(parents=True)
    f = root / "doors" / "x.py"
    f.write_text("import os\nfrom . import _base\nfrom .. import state\n"
                 "def g():\n    import torch\n    from stallbench.profile import knobs\n"
                 "from ... import launcher\n")
    got = foreign_imports(f, root)
    assert sorted(b.split(":")[1] for b in got) == ["5", "6", "7"], got


def launcher_reaches(g: dict[str, set[str]]) -> list[str]:
    """Imports of agent modules from outside the agent, other than ``LAUNCHER_MAY``."""
    inside = "stallbench.profile.agent."
    return sorted(f"{m} -> {d}" for m, deps in g.items() if not m.startswith(inside)
                  for d in deps if d.startswith(inside)
                  and not any(d == ok or d.startswith(ok + ".") for ok in LAUNCHER_MAY))


def test_the_launcher_side_imports_only_the_wire_and_the_door_declarations() -> None:
    bad = launcher_reaches(graph())
    assert not bad, "\n".join(bad)


def test_the_launcher_check_can_fail() -> None:
    g = {"stallbench.profile.launcher": {"stallbench.profile.agent.wire",
                                         "stallbench.profile.agent.core"},
         "stallbench.profile.merge": {"stallbench.profile.agent.doors.__init__",
                                      "stallbench.profile.agent.doors.ray_data"},
         "stallbench.profile.agent.install": {"stallbench.profile.agent.core"}}
    assert launcher_reaches(g) == [
        "stallbench.profile.launcher -> stallbench.profile.agent.core",
        "stallbench.profile.merge -> stallbench.profile.agent.doors.ray_data"]


def test_no_module_of_the_agent_is_longer_than_a_few_hundred_lines() -> None:
    long = {str(f.relative_to(AGENT)): n for f in _files()
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"agent modules over {MAX_LINES} lines (split them by concern): {long}"


@pytest.mark.parametrize("path", [f for f in _files() if f.parent.name != "bootstrap"],
                         ids=lambda f: str(f.relative_to(AGENT)))
def test_the_agent_parses_as_python_3_7(path: Path) -> None:
    """A job's Python may be 3.7 (the bootstrap installs the agent from 3.7 on; it has its
    own test for 2.7): no syntax of a later Python (``:=``, ``/`` parameters, ``match``)."""
    ast.parse(path.read_text(), str(path), feature_version=(3, 7))
