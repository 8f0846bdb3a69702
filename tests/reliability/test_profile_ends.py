"""``stallbench profile -- CMD`` at the edges of the user's job (issue 38, classes 4 to 8): what
it says when no figures came back, ``--progress-timeout``, the job dying with stallbench, the
result and trace published together, and a closed or full stdout. Real user-style scripts
(``tests/profile/scripts/user_ends.py``) under the real command, in subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profile"))
import profile_helpers as helpers  # noqa: E402

from reliability_helpers import TINY, Watched, write  # noqa: E402

PY = sys.executable
ENDS = helpers.script("user_ends.py")


def last_error(cp: subprocess.CompletedProcess, *parts: str) -> str:
    """Exit 2, the last stderr line ``stallbench: error: ...`` holding ``parts``, no traceback."""
    assert cp.returncode == 2, (cp.returncode, cp.stderr[-3000:])
    assert "Traceback" not in cp.stderr, cp.stderr[-3000:]
    line = cp.stderr.strip().splitlines()[-1]
    assert line.startswith("stallbench: error: "), cp.stderr[-3000:]
    for part in parts:
        assert part in line, (part, line)
    return line


def scratch_left(out: Path) -> list[Path]:
    return sorted(out.glob(".stallbench-profile-*")) if out.exists() else []


def gone(pid: int, timeout: float = 30.0) -> bool:
    """The process ended (a zombie has ended: only its parent's wait is missing)."""
    try:
        p = psutil.Process(pid)
        p.wait(timeout=timeout)
        return True
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return p.status() == psutil.STATUS_ZOMBIE


# ------------------------------------------------------------- class 4: what happened


@pytest.mark.parametrize("cmd, line", [
    # the job changes directory with the default relative --out: still measured
    ([ENDS, "chdir"], None),
    ([ENDS, "exit0"], "no DataLoader or Ray Data iteration was seen in the job (variant "
                      "default), whose process {pid} ended without running its exit handlers"),
    ([ENDS, "loader_exit0"], "the job made a loader (list#0) but exited before its first batch"),
    ([ENDS, "exitmid"], None),
    ([ENDS, "empty"], "the job's loader (list#0) yielded no batch: it is empty"),
    ([ENDS, "rmout", "results"], "the job removed stallbench's run directory"),
    (["-I", ENDS, "chdir"], "the hooks never started in the job: the command's Python runs "
                            "with -I (isolated: PYTHONPATH and site ignored); stallbench.watch "
                            "cannot help either"),
], ids=["chdir", "exit0", "loader_exit0", "exitmid", "empty", "rmout", "python-I"])
def test_no_figures_says_what_happened(tmp_path: Path, cmd: list[str], line: str | None) -> None:
    out = tmp_path / "results"                  # the default --out, relative to the job's cwd
    cp = helpers.profile(["--", PY, *cmd], cwd=tmp_path, timeout=120)
    if cmd[-1] == "exitmid":
        # os._exit after 3 batches: the hooks wrote the epoch in progress (at its first batch,
        # then about once a second); what they could not write is counted and said
        assert cp.returncode == 0, cp.stderr[-3000:]
        r = helpers.load(out).variants[0]
        said = next(ln for ln in cp.stderr.splitlines() if "without running its exit" in ln)
        assert "in the middle of an epoch: the figures hold its batches up to its last write (" \
            f"{r.profile.loaders[0].batches} batch(es) measured" in said, said
        assert 1 <= r.profile.loaders[0].batches <= 3 and r.notes["cut short"] in said
        return
    if line is None:
        assert cp.returncode == 0, cp.stderr[-3000:]
        assert helpers.load(out).variants[0].profile.loaders[0].batches == 8
        return
    pids = re.findall(r"pid (\d+)\)", cp.stderr) or re.findall(r"process (\d+)", cp.stderr)
    last_error(cp, line.format(pid=pids[0] if pids else "?"), "no result written")
    assert helpers.result_files(out) == []
    assert scratch_left(out) == []


@pytest.mark.parametrize("argv, flags", [
    (["python", "-I", "t.py"], ["-I"]),
    (["python3.11", "-Es", "t.py"], ["-E"]),
    (["bash", "-c", "python -X dev -S t.py"], ["-S"]),
    (["python", "-c", "import sys", "-I"], []),
    (["python", "-s", "t.py"], []),
])
def test_python_flags_that_keep_the_hooks_out(argv: list[str], flags: list[str]) -> None:
    from stallbench.profile import session
    assert [f.split(" ")[0] for f in session.python_flags(argv)] == flags


# --------------------------------------------------------- class 5: --progress-timeout


@pytest.mark.parametrize("mode, said", [
    ("before", "none came since the job started"),
    ("after2", "the last was batch 2 of epoch 1 of list#0 (pid {pid})"),
    ("stop", "the last was batch 2 of epoch 1 of list#0 (pid {pid}); stopped the job's "
             "processes: {pid} python (stopped)"),
])
def test_progress_timeout_ends_a_job_without_batches(tmp_path: Path, mode: str,
                                                     said: str) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--progress-timeout", "2", "--", PY, ENDS, mode],
                         cwd=tmp_path, timeout=120)
    pid = int(re.findall(r"stopped the job's processes: (\d+)", cp.stderr)[0])
    last_error(cp, "profile: no batch for 2 s (--progress-timeout): " + said.format(pid=pid),
               "no result written")
    assert cp.returncode == 2            # not the job's signal code
    assert gone(pid)
    assert helpers.result_files(out) == [] and scratch_left(out) == []


# --------------------------------------------------- class 6: the job dies with stallbench


def _job_tree(pid: int) -> list[int]:
    """The job's processes under stallbench ``pid``: the ``sh -c`` wrapper and what runs under
    it. Found from the wrapper down, not as "every child but the guard": stallbench's own
    short-lived children (a probe, the guard between its fork and its exec, when its command
    line is still stallbench's) are no part of the job, and were once counted as one."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for k in kids:
        try:
            if k.cmdline()[:2] == ["sh", "-c"] and str(ENDS) in " ".join(k.cmdline()):
                return [k.pid] + [c.pid for c in k.children(recursive=True)]
        except psutil.Error:
            continue
    return []


@pytest.mark.parametrize("how", ["SIGHUP", "SIGKILL-group"])
def test_the_job_never_outlives_stallbench(tmp_path: Path, how: str) -> None:
    """The job's leader is a shell wrapper (``sh -c "python ...; true"``, no exec), so the
    training is its child: the leader's parent-death signal alone would leave it running."""
    out = tmp_path / "out"
    p = subprocess.Popen([PY, "-m", "stallbench", "profile", "--no-analyze", "--out", str(out),
                          "--", "sh", "-c", f"{PY} {ENDS} after2; true"], cwd=tmp_path,
                         env=helpers.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True,    # its own group, as a CI step's
                         # as a terminal's shell starts it: SIGHUP not ignored (a test run
                         # under nohup passes SIG_IGN down, which stallbench keeps, rightly)
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    job: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not job:
        beats = list(out.glob(".stallbench-profile-*/v1r0/beat-*"))   # the training runs
        if beats:
            job = _job_tree(p.pid)
        time.sleep(0.05)
    assert len(job) == 2 and p.poll() is None, job      # the wrapper and the training
    if how == "SIGHUP":
        p.send_signal(signal.SIGHUP)
    else:
        os.killpg(p.pid, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    if how == "SIGHUP":
        assert p.returncode == 129, err
        last = err.strip().splitlines()[-1]
        assert last == "stallbench: interrupted by SIGHUP; no result written", err[-3000:]
        assert scratch_left(out) == []
    else:
        assert p.returncode == -signal.SIGKILL
        assert len(scratch_left(out)) == 1        # a killed run leaves it: the next one removes it
    for pid in job:
        assert gone(pid), f"{pid} of the job kept running after stallbench ended ({how})"
    cp = helpers.profile(["--out", str(out), "--", PY, "-c", "pass"], cwd=tmp_path)
    assert cp.returncode == 2, cp.stderr
    assert scratch_left(out) == []


# ------------------------------------------------ class 7: result and trace together


def test_a_signal_while_publishing_leaves_both_files_or_neither(tmp_path: Path) -> None:
    """SIGTERM as soon as the job ended, while profile merges, writes the trace and publishes:
    either 143 and no file, or 0 with the result and the trace whole; never one of them."""
    out, trace = tmp_path / "out", tmp_path / "t.json"
    w = Watched(["profile", "--no-analyze", "--out", str(out), "--trace", str(trace), "--",
                 PY, ENDS, "many", "30000"], helpers.env(), tmp_path)
    assert w.wait_for(lambda kids: len(kids) > 0, timeout=120)
    assert w.wait_for(lambda kids: len(kids) == 0, timeout=120)   # the job ended
    assert w.proc.poll() is None, "profile ended before the signal: nothing was tested"
    w.proc.send_signal(signal.SIGTERM)
    rc, stdout, err = w.finish(timeout=120)
    files = helpers.result_files(out) + ([trace] if trace.exists() else [])
    if rc == 143:
        assert files == [], files
        assert err.strip().splitlines()[-1] == ("stallbench: interrupted by SIGTERM; "
                                                "no result written")
    else:
        assert rc == 0, err[-3000:]
        assert len(files) == 2, files
        assert len(json.loads(trace.read_text())["traceEvents"]) > 30000
        assert f"trace: {trace}" in stdout and f"result: {files[0]}" in stdout
    assert not list(tmp_path.rglob("*.tmp")) and scratch_left(out) == []


def test_a_trace_that_cannot_be_written_publishes_no_result(tmp_path: Path) -> None:
    out, where = tmp_path / "out", tmp_path / "traces"
    where.mkdir()
    cp = helpers.profile(["--out", str(out), "--trace", str(where / "t.json"), "--", PY, ENDS,
                          "trace_dir", str(where)], cwd=tmp_path)
    last_error(cp, f"--trace: {where / 't.json'}: is under {where}, which is not a directory; "
                   "no result written")
    assert helpers.result_files(out) == []


# --------------------------------------------------- class 8: closed or full stdout


def _closed_stdout(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """``stallbench ARGS | head`` with head gone: stdout is a pipe whose reader closed."""
    p = subprocess.Popen([PY, "-m", "stallbench", *args], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    return p.wait(timeout=240), err


@pytest.mark.parametrize("how", ["profile | head", "profile > /dev/full", "run | head"])
def test_a_closed_or_full_stdout_keeps_the_result(tmp_path: Path, how: str,
                                                  env: dict[str, str]) -> None:
    out = tmp_path / "out"
    if how.startswith("run"):
        args = ["run", str(write(tmp_path, TINY)), "--out", str(out), "--no-progress"]
    else:
        args = ["profile", "--no-analyze", "--out", str(out), "--", PY, ENDS, "chdir"]
    if how.endswith("/dev/full"):
        with open("/dev/full", "w") as full:
            cp = subprocess.run([PY, "-m", "stallbench", *args], cwd=tmp_path, env=env,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=240)
        rc, err = cp.returncode, cp.stderr
        why = "No space left on device"
    else:
        rc, err = _closed_stdout(args, tmp_path, env)
        why = "Broken pipe"
    files = helpers.result_files(out)
    assert len(files) == 1, err[-3000:]
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"stallbench: error: cannot write to stdout ({why}): the rest of the output was "
        f"dropped; published: {files[0]}")
    helpers.load(out)                                # whole, readable


def test_a_signal_after_everything_was_published_is_kept_not_raised() -> None:
    """``interrupts.committed``: the publication is the outcome; a later signal is recorded
    (the CLI says it came after) and never turns the exit into 130/143 over published files."""
    from stallbench import interrupts

    state = interrupts._state
    saved = (state.pending, state.deferred, state.committed)
    try:
        state.pending, state.deferred, state.committed = None, 0, False
        with interrupts.deferred():
            interrupts.committed()
            interrupts._handler(signal.SIGTERM, None)       # recorded, not raised
        interrupts.check()                                  # nor raised here
        assert interrupts.pending() == signal.SIGTERM and interrupts.was_committed()
    finally:
        state.pending, state.deferred, state.committed = saved
