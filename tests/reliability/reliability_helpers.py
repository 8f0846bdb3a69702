"""Helpers of the hostile-input tests (``tests/reliability``): run the real ``stallbench``
command in a subprocess, as users do, and look at what it leaves behind (files, processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psutil

# A scenario that runs in a few seconds (append sections or keys to vary it).
TINY = """
name = "tiny"
[dataset]
rows = 4096
row_group_rows = 512
files = 1
dense_features = 3
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[model]
kind = "emulated"
step_ms = 1
[loader]
batch_size = 512
[analysis]
differential = false
"""


def sb(args: list[str], env: dict[str, str], cwd: Path,
       timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def write(directory: Path, text: str, name: str = "s.toml") -> Path:
    p = directory / name
    p.write_text(text)
    return p


def one_error_line(r: subprocess.CompletedProcess, *parts: str) -> str:
    """Exit 2 and exactly one line on stderr, ``stallbench: error: ...``, containing parts."""
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    line = lines[0]
    assert line.startswith("stallbench: error: "), line
    for part in parts:
        assert part in line, (part, line)
    return line


def no_files(directory: Path) -> bool:
    return not directory.exists() or not any(directory.iterdir())


POLL_MIN_S, POLL_MAX_S = 0.002, 0.025      # ``Watched.wait_for``'s polling period


class Watched:
    """A ``stallbench`` process started in the background, with every process seen under it."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "stallbench", *args], cwd=cwd,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.ps = psutil.Process(self.proc.pid)
        self.seen: dict[int, str] = {}

    def children(self) -> list[Any]:
        try:
            kids = self.ps.children(recursive=True)
        except psutil.Error:
            return []
        for k in kids:
            try:
                self.seen[k.pid] = k.name()
            except psutil.Error:
                pass
        return kids

    def wait_for(self, cond: Callable[[list[Any]], bool], timeout: float = 180) -> bool:
        """Poll ``cond`` on the command's processes until it holds. Each poll scans every
        process of the machine (about 1 ms of CPU), so a 2 ms period kept half a core busy for
        the whole of a long start-up: the period backs off to 25 ms while nothing changes
        and drops back to 2 ms as soon as a process appears or goes (a fork in progress:
        the moments the tests aim at), so an event is seen within ~25 ms."""
        deadline = time.monotonic() + timeout
        period, before = POLL_MIN_S, None
        while time.monotonic() < deadline and self.proc.poll() is None:
            kids = self.children()
            if cond(kids):
                return True
            now = {k.pid for k in kids}
            period = POLL_MIN_S if now != before else min(2 * period, POLL_MAX_S)
            before = now
            time.sleep(period)
        return False

    def finish(self, timeout: float = 240) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def finish_or_explain(self, timeout: float, what: str) -> tuple[int, str, str]:
        """``finish``; a command still running after ``timeout`` fails the test with where it
        is stuck: each thread's kernel state, and (started with ``PYTHONFAULTHANDLER=1``) its
        Python stacks, which ``faulthandler`` writes on the SIGABRT sent here. A hang seen
        only in whole-suite runs then explains itself the first time it happens again."""
        try:
            return self.finish(timeout=timeout)
        except subprocess.TimeoutExpired:
            pid = self.proc.pid
            states = []
            for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
                try:
                    comm = (task / "comm").read_text().strip()
                    wchan = (task / "wchan").read_text().strip()
                    state = next(ln.split(":", 1)[1].strip() for ln in
                                 (task / "status").read_text().splitlines()
                                 if ln.startswith("State:"))
                    states.append(f"{task.name} {comm} {state} {wchan}")
                except (OSError, StopIteration):
                    pass
            os.kill(pid, signal.SIGABRT)
            try:
                _, err = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, err = self.proc.communicate()
            raise AssertionError(f"{what} still running {timeout:g} s on; threads: "
                                 f"{states}; stderr after SIGABRT:\n{err[-6000:]}") from None

    def interrupt(self, sig: int, timeout: float = 240, what: str = "the run") -> str:
        """Send ``sig`` to the command, which must still be running (one that ended first
        would test nothing), and check how it ends: exit 128 + N, a last line on stderr that
        says ``interrupted by SIG...``, no process of it left. Returns its stderr."""
        assert self.proc.poll() is None, f"{what} ended before the signal: nothing was tested"
        self.proc.send_signal(sig)
        rc, _, err = self.finish(timeout=timeout)
        assert rc == 128 + sig, (rc, err[-3000:])
        last = err.splitlines()[-1] if err.strip() else ""
        assert f"interrupted by {signal.Signals(sig).name}" in last, err[-2000:]
        assert self.leftovers() == []
        return err

    def leftovers(self, grace_s: float = 3.0) -> list[str]:
        """Processes seen under the command that are still alive (killed here, then named)."""
        deadline = time.monotonic() + grace_s
        alive = []
        while True:
            alive = []
            for pid, name in self.seen.items():
                try:
                    p = psutil.Process(pid)
                    if p.status() != psutil.STATUS_ZOMBIE:
                        alive.append((p, name))
                except psutil.Error:
                    pass
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for p, _ in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        return [f"{p.pid}:{name}" for p, name in alive]
