"""A ratchet on long functions (issue 55): the count of functions in ``stallbench/`` over 50
and over 80 lines may fall, never rise.

Why a ratchet and not a limit: a few long functions are older than the rule (a measured run's
loop, the what-if's validation); forbidding them at once would force splits without a reason.
Functions over 80 lines went 9 -> 13 in one round of issues (``profile/tune.py`` ``_tune``
reached 194 lines) before anyone looked. The counts below are what the code holds now; a
change that lowers one lowers the number here in the same commit, and a new long function
must be split into named steps instead (its docstrings say why each step is one). Nested
functions count on their own, and within their parent's lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stallbench"

LONG, VERY_LONG = 50, 80
MAX_OVER_50 = 46        # issue 55: 55 before it
MAX_OVER_80 = 9         # issue 55: 13 before it (_tune 194, ablate.analyze 161, _profile 116, patch_torch 127)


def lengths(root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(lines, "path:name") of every function and method, ``end_lineno - lineno + 1``."""
    out = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1,
                            f"{f.relative_to(root.parent)}:{node.name}"))
    return sorted(out, reverse=True)


def test_the_count_sees_what_it_counts(tmp_path: Path) -> None:
    pkg = tmp_path / "stallbench"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    nested = body.replace("    ", "        ")
    (pkg / "a.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n\n\n"
                              f"class C:\n    def method(self):\n{nested}\n")
    got = lengths(pkg)
    assert got == [(60, "stallbench/a.py:method"), (60, "stallbench/a.py:long"),
                   (2, "stallbench/a.py:short")]


def _shown(found: list[tuple[int, str]]) -> str:
    return "\n".join(f"{n:4d}  {where}" for n, where in found)


def test_no_more_long_functions_than_before() -> None:
    over_50 = [(n, where) for n, where in lengths() if n > LONG]
    over_80 = [(n, where) for n, where in over_50 if n > VERY_LONG]
    assert len(over_80) <= MAX_OVER_80, (
        f"{len(over_80)} functions over {VERY_LONG} lines (at most {MAX_OVER_80}): split the new "
        "one into named steps:\n" + _shown(over_80))
    assert len(over_50) <= MAX_OVER_50, (
        f"{len(over_50)} functions over {LONG} lines (at most {MAX_OVER_50}): split the new "
        "one into named steps:\n" + _shown(over_50))
