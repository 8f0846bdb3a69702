"""Class 11 of issue 13: a scenario file is code, and where its code is imported from.

The decision (docs/reliability.md, "Trust"): a scenario names modules to import (``"pkg.mod:fn"``
transforms, ``"pkg.mod:factory"`` models) in the trainer and in every loader or Ray worker,
so it is trusted like a script. Those modules are imported from ``sys.path`` plus the current
directory, placed *after* every installed package for both entry points (``python -m``
would put it first, the ``stallbench`` script not at all): a repository's own ``mytf.py``
imports, a stray ``signal.py`` or ``torch.py`` in the directory cannot replace a library.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_helpers import TINY, sb, write

ROOT = Path(__file__).resolve().parents[2]

SHADOWS = ["signal", "json", "torch", "pyarrow", "ctypes"]


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('shadowed {name} imported')\n")
    (tmp_path / "mytf.py").write_text("def double(table, **kw):\n"
                                      "    import pyarrow.compute as pc\n"
                                      "    return table.set_column(1, table.column_names[1],\n"
                                      "        pc.multiply(table.column(1), 2))\n")
    write(tmp_path, TINY + '[preprocess]\ntransforms = ["mytf:double"]\n')
    return tmp_path


def _script() -> str:
    exe = shutil.which("stallbench", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the stallbench console script is not installed next to this Python")
    return exe


@pytest.mark.parametrize("entry", ["python -m stallbench", "stallbench script"])
def test_current_directory_cannot_shadow_a_library(hostile_dir: Path, env: dict,
                                                   entry: str) -> None:
    cmd = [sys.executable, "-m", "stallbench"] if entry.startswith("python") else [_script()]
    r = subprocess.run([*cmd, "run", "s.toml", "--out", "out", "--no-progress"],
                       cwd=hostile_dir, env=env, capture_output=True, text=True, timeout=240)
    assert "shadowed" not in r.stderr + r.stdout, r.stderr[-2000:]
    assert r.returncode == 0, r.stderr[-3000:]
    # ... and the repository's own transform module in that directory was imported.
    assert len(list((hostile_dir / "out").glob("tiny-*.json"))) == 1


def test_version_in_a_hostile_directory(hostile_dir: Path, env: dict) -> None:
    r = sb(["--version"], env, hostile_dir, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("stallbench "), r.stderr


def test_the_guide_says_a_scenario_is_code() -> None:
    guide = (ROOT / "docs" / "reliability.md").read_text()
    section = guide[guide.index("## Trust"):] + "\n## "
    section = section[:section.index("\n## ", 3)].lower()
    for phrase in ("a scenario file is code", "like a script", "sys.path", "by its file path",
                   "working directory", "python -m stallbench", "loader", "ray worker"):
        assert phrase in section, phrase
