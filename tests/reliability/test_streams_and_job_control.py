"""Issue 59: standard streams closed or full, and a terminal's job control, through real
processes as a user starts them.

- A command started with stdin, stdout or stderr closed (``2>&-``, ``>&-``, ``<&-``) runs as
  it would with them open: the job runs, the result is written, the exit code is the
  documented one, and no traceback or "Exception ignored" line appears anywhere.
- ``report > /dev/full`` names the page it wrote (it was published); ``serve > /dev/full``
  says on stderr at once that its address line went nowhere, and serves on.
- Ctrl-Z in a real terminal (a pty running an interactive bash with job control) stops
  stallbench and the job together; ``fg`` resumes both and the profile ends with its
  result, as the same job unprofiled would.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

JOB = '''\
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return int(sys.argv[2])

    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.tensor([float(i)])


n = 0
for _ in DataLoader(Slow(), batch_size=2, num_workers=0):
    n += 1
    with open(sys.argv[1], "w") as f:
        f.write(str(n))
print("trained", n, flush=True)
'''


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("STALLBENCH_PROFILE", None)
    return env


def _sh(cmd: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``cmd`` through a POSIX shell, which can close a standard stream (``2>&-``)."""
    return subprocess.run(["/bin/sh", "-c", cmd], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("streams")
    (d / "job.py").write_text(JOB)
    return d


@pytest.mark.parametrize("closed", ["2>&-", ">&-", "<&-", ">&- 2>&-"])
def test_a_closed_stream_changes_neither_the_job_nor_the_result(job: Path, closed: str) -> None:
    out = job / f"out{abs(hash(closed))}"
    # stdout and stderr of the shell are captured; the closing applies to stallbench only
    cp = _sh(f"{PY} -m stallbench profile --no-analyze --out {out} -- {PY} job.py n 8 {closed}"
             f"; echo rc=$?", job)
    said = cp.stdout + cp.stderr
    assert "rc=0" in cp.stdout, said
    assert "Traceback" not in said and "Exception ignored" not in said, said
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, said
    assert (job / "n").read_text() == "4"                        # the job ran every batch
    if "2>&-" not in closed:
        assert "Traceback" not in cp.stderr


def test_other_verbs_with_a_closed_stderr_keep_their_exit_codes(job: Path) -> None:
    out = job / "out-hist"
    _sh(f"{PY} -m stallbench profile --no-analyze --out {out} -- {PY} job.py n 8", job)
    hist = _sh(f"{PY} -m stallbench history {out} 2>&-; echo rc=$?", job)
    assert "rc=0" in hist.stdout and "Traceback" not in hist.stdout + hist.stderr, hist
    missing = _sh(f"{PY} -m stallbench run /nonexistent.toml 2>&-; echo rc=$?", job)
    assert "rc=2" in missing.stdout, missing


def test_report_to_a_full_stdout_names_the_page_it_published(job: Path) -> None:
    out = job / "out-rep"
    _sh(f"{PY} -m stallbench profile --no-analyze --out {out} -- {PY} job.py n 8", job)
    page = job / "r.html"
    cp = _sh(f"{PY} -m stallbench report {out} -o {page} > /dev/full; echo rc=$?", job)
    assert page.is_file()
    assert "rc=2" in cp.stdout, cp
    assert cp.stderr.strip().splitlines()[-1] == (
        "stallbench: error: cannot write to stdout (No space left on device): the rest of the "
        f"output was dropped; published: {page}"), cp.stderr


def test_serve_to_a_full_stdout_says_so_at_once_and_serves_on(job: Path) -> None:
    (job / "s.toml").write_text('name = "s"\n[dataset]\nrows = 400\nrow_group_rows = 100\n'
                                'files = 1\n[model]\nkind = "emulated"\n')
    with open("/dev/full", "w") as full:
        p = subprocess.Popen([PY, "-m", "stallbench", "serve", "s.toml", "--port", "0"],
                             cwd=job, env=_env(), stdout=full, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        line = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "serving on grpc://" not in line:
            r, _, _ = select.select([p.stderr], [], [], 1.0)
            if r:
                line = p.stderr.readline()
                if not line and p.poll() is not None:
                    break
        assert line.startswith("stallbench serve: cannot write to stdout (No space left on "
                               "device); serving on grpc://"), line
        assert p.poll() is None                                   # it serves on
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "Traceback" not in err, err


# ------------------------------------------------------------------ job control in a pty
class Terminal:
    """An interactive bash with job control on a real pseudo-terminal; what it prints is read
    all the time (a full pty would block the writers)."""

    def __init__(self, cwd: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                          # the child: the shell
            os.chdir(cwd)
            env = _env()
            env.update(PS1="$ ", TERM="dumb")
            os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], env)
        self.text = ""
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.text += data.decode("utf-8", "replace")

    def type(self, s: str) -> None:
        os.write(self.fd, s.encode())

    def close(self) -> None:
        try:
            self.type("exit\n")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                done, _ = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.1)
            else:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        finally:
            self._stop.set()
            os.close(self.fd)


def _job_processes(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(marker in c for c in cmd) and any(c.endswith("job.py") for c in cmd) and \
                "stallbench" not in " ".join(cmd):
            out.append(p)
    return out


def _count(f: Path) -> int:
    try:
        return int(f.read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_ctrl_z_stops_the_job_with_stallbench_and_fg_resumes_both(job: Path) -> None:
    counter = job / "tty-count"
    out = job / "out-tty"
    term = Terminal(job)
    try:
        term.type(f"{PY} -m stallbench profile --no-analyze --out {out} -- {PY} job.py "
                  f"{counter} 400\n")
        deadline = time.monotonic() + 120
        while _count(counter) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _count(counter) >= 5, term.text[-2000:]
        term.type("\x1a")                                             # Ctrl-Z
        time.sleep(1.5)
        procs = _job_processes(str(counter))
        assert procs, term.text[-2000:]
        assert all(p.status() == psutil.STATUS_STOPPED for p in procs), \
            [(p.pid, p.status()) for p in procs]
        held = _count(counter)
        time.sleep(1.0)
        assert _count(counter) == held                                # no batch while stopped
        term.type("fg\n")
        deadline = time.monotonic() + 180
        while not list(out.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(out.glob("*.json")), term.text[-3000:]
        assert _count(counter) == 200                                 # every batch ran
        assert "Stopped" in term.text or "stopped" in term.text.lower(), term.text[-2000:]
        assert "Traceback" not in term.text, term.text[-3000:]
    finally:
        term.close()
