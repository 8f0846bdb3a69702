"""Classes 5 and 7 of issue 26: exit codes as the README states them, in every verb, and the
report marker matched only where the report writes it.

The rules: a signal ends every verb with 128 + its number (130 SIGINT, 143 SIGTERM): a
handler of another part (the rank launcher's, the A/B gate's, Ray's) raises
``interrupts.received(signum)``, never a bare ``KeyboardInterrupt`` read as SIGINT; ``serve``
exits the same way after stopping its server. ``report -o FILE`` replaces FILE only when it
starts the way a stallbench report starts (``outputs.REPORT``): a user's notes that quote
the generator tag are never overwritten.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from reliability_helpers import TINY, Watched, one_error_line, sb, write

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "results" / "examples" / "schema-v2.json"
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
TAG = '<meta name="generator" content="stallbench 0.1.0">'


@pytest.mark.parametrize("text", [
    f"# notes\n{TAG}\n",
    f"{TAG}\n# my notes start with the tag\n",
    f"<!DOCTYPE html>\n<!-- {TAG} -->\n<p>mine</p>\n",
    "x" * 3000 + TAG,
])
def test_report_never_replaces_a_file_that_only_quotes_the_marker(tmp_path: Path, env: dict,
                                                                  text: str) -> None:
    notes = tmp_path / "NOTES.md"
    notes.write_text(text)
    r = sb(["report", str(EXAMPLE), "-o", "NOTES.md"], env, tmp_path, timeout=120)
    one_error_line(r, "NOTES.md", "not a stallbench HTML report")
    assert notes.read_text() == text


# The other side, a report replacing its own report (exit 0 twice, the file rewritten and
# still carrying the marker): test_output_paths.py::test_report_replaces_an_earlier_report,
# on the same example result (CI time: this file ran the same two reports again).


def _started(w: Watched, marker: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    line = ""
    while marker not in line and time.monotonic() < deadline and w.proc.poll() is None:
        line = w.proc.stdout.readline()
    assert marker in line, line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_ranks_keeps_its_exit_code(tmp_path: Path, env: dict, sig: int) -> None:
    # 4 batches of 1 s per rank: the signal (0.3 s after both ranks exist) lands mid-run on
    # any machine; a run that ended first would test nothing, so that fails here.
    write(tmp_path, TINY.replace("step_ms = 1", "step_ms = 1000") + "[trainers]\nranks = 2\n")
    w = Watched(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    _started(w, "variant")
    assert w.wait_for(lambda kids: len(kids) >= 2, timeout=120)
    time.sleep(0.3)
    w.interrupt(sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_exits_with_the_signals_code(tmp_path: Path, env: dict, sig: int) -> None:
    pytest.importorskip("pyarrow.flight")
    write(tmp_path, TINY)
    w = Watched(["serve", "s.toml", "--port", "0"], env, tmp_path)
    _started(w, "serving")
    w.proc.send_signal(sig)
    rc, out, err = w.finish(timeout=60)
    assert rc == EXIT[sig], (rc, out[-1000:], err[-2000:])
    assert f"interrupted by {signal.Signals(sig).name}; server stopped" in err, err[-2000:]


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_CONFIG_NOSYSTEM": "1"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_gate_calibrate_keeps_its_exit_code(tmp_path: Path, env: dict,
                                                            sig: int) -> None:
    """``gate --calibrate`` runs A/A pairs as ``stallbench run`` children: a signal while one
    runs ends it with 128 + N, writes no calibration and leaves no run or temp dir."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**env, **GIT_ENV, "TMPDIR": str(tmp)}
    write(repo, TINY)
    for args in (["init", "-q"], ["add", "s.toml"], ["commit", "-qm", "first"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    w = Watched(["gate", "--calibrate", "s.toml", "--repeats", "3"], env, repo)
    assert w.wait_for(lambda kids: any("run" in _cmdline(k) for k in kids), timeout=120), \
        (w.proc.poll(), "no side run started")
    time.sleep(0.3)
    w.interrupt(sig, timeout=120, what="the calibration")
    assert not list(repo.rglob("calibration/*.json"))
    assert list(tmp.iterdir()) == []


def _cmdline(p: Any) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_tunes_confirmation_says_what_it_kept(tmp_path: Path, env: dict,
                                                              sig: int) -> None:
    """The recommended scenario file is written (whole) before its confirmation run: a signal
    then says that file is kept and that no tune result was written, never "nothing written"."""
    write(tmp_path, TINY.replace("step_ms = 1", "step_ms = 100"))
    w = Watched(["tune", "s.toml", "--budget-minutes", "1", "--out", "out", "--no-progress"],
                env, tmp_path)
    _started(w, "confirm: stallbench run")
    w.proc.send_signal(sig)
    rc, _, err = w.finish(timeout=120)
    assert rc == EXIT[sig], (rc, err[-3000:])
    last = err.splitlines()[-1]
    assert f"interrupted by {signal.Signals(sig).name}" in last, err[-2000:]
    (toml,) = (tmp_path / "out" / "tune").glob("*-tuned-*.toml")
    assert f"kept the file(s) written before it: {toml.relative_to(tmp_path)}" in last, last
    assert "no tune result written" in last, last
    assert not list((tmp_path / "out" / "tune").glob("*.json"))
    assert w.leftovers() == []
