"""Issue 59, "lines that are not true": each of the four shapes gets the line that says what
happened, through the real command on a user-style script
(``tests/profile/scripts/user_true_lines.py``), and the job's own traceback shows none of the
agent's frames (at 0 workers, in the loop's traceback; at 2, in the worker's traceback torch
carries to the loop as text; in a thread of the job)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profile"))
import profile_helpers as helpers  # noqa: E402

PY = sys.executable
SCRIPT = helpers.script("user_true_lines.py")


def profile(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "stallbench", "profile", "--no-analyze", "--out",
                           str(tmp_path / "out"), "--", PY, str(SCRIPT), mode],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)


def last_line(cp: subprocess.CompletedProcess) -> str:
    assert cp.returncode == 2, (cp.returncode, cp.stderr[-3000:])
    assert "Traceback" not in cp.stderr, cp.stderr[-3000:]
    return cp.stderr.strip().splitlines()[-1]


def test_a_subclass_with_its_own_iter_is_named_not_an_early_exit(tmp_path: Path) -> None:
    cp = profile(tmp_path, "own_iter")
    assert "batches 16" in cp.stdout
    line = last_line(cp)
    assert "OwnIter" in line and "defines its own __iter__" in line, line
    assert "stallbench.watch" in line and "exited before its first batch" not in line, line


def test_a_reloaded_dataloader_module_is_measured_once(tmp_path: Path) -> None:
    """The reload found the module's spec with our loader already on it: wrapped twice,
    every batch went through the clocks twice ("iterated from two threads")."""
    cp = profile(tmp_path, "reload")
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "two threads" not in cp.stderr and "not measured" not in cp.stderr, cp.stderr
    assert "batches 32" in cp.stdout
    results = list((tmp_path / "out").glob("*.json"))
    assert len(results) == 1, results


def test_an_exec_that_drops_the_bootstrap_is_said(tmp_path: Path) -> None:
    cp = profile(tmp_path, "reexec")
    assert "batches 16" in cp.stdout
    line = last_line(cp)
    assert "replaced itself (os.exec*)" in line and "drops PYTHONPATH" in line, line
    assert "for another loader" not in line, line


@pytest.mark.parametrize("mode", ["raise0", "raise2", "raise_thread"])
def test_the_jobs_traceback_shows_no_frame_of_the_agent(tmp_path: Path, mode: str) -> None:
    cp = profile(tmp_path, mode)
    assert cp.returncode != 0
    tb = cp.stderr
    assert "ValueError: bad item 20" in tb and 'in __getitem__' in tb, tb[-3000:]
    assert "stallbench" not in tb.replace("stallbench: ", ""), tb[-3000:]
