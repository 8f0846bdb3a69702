"""Flight servers that stallbench starts on the trainer's machine, and stops.

Each is a fresh interpreter (``python -m stallbench.executors.flight.server``) listening on
loopback at a port the kernel picks, in its own session (a Ctrl-C in the terminal reaches the
trainer, which stops them, not the servers half-way through a stream). Its first stdout line
says its port; an owner token (``auth``: the only token it takes, so no other user of this
machine can call it), then plans, reach it through its stdin; it exits when that pipe closes, so a trainer
that dies (even by SIGKILL) takes its servers with it. ``stop`` closes the pipes, waits, and
kills by PID whatever is still running. OMP/MKL variables of the thread budget are set in
each server's environment before any library starts its pool.
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ...errors import UserError
from ... import threads
from . import auth
from .server import READY, REGISTERED, send_registration, send_token


# A server still busy starting after this long is broken, however much CPU it uses (the
# rule for every start-up stallbench waits on: Ray's pump actor, the ranks).
START_LIMIT_S = 600.0


class LocalServers:
    def __init__(self, n: int, budget: int | None, scenario_file: str = "<scenario>",
                 progress_timeout_s: float = 300.0) -> None:
        self.n = n
        self.budget = budget
        self.file = scenario_file
        self.progress_timeout_s = float(progress_timeout_s)
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.registered: set[str] = set()
        self._logs: list[Any] = []
        self._dir: str | None = None
        self.token = auth.new_token()      # the trainer's, as these servers' owner

    @property
    def locations(self) -> list[str]:
        return [f"grpc://127.0.0.1:{p}" for p in self.ports]

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        """Start the servers and wait for each one's port. A wait with an end
        (``[run] progress_timeout_s``): a server that is starting uses CPU (importing Arrow,
        binding its port), so its CPU clock moving is progress; one that is stopped
        (``kill -STOP``) or blocked without using CPU for that long ends the run."""
        self._dir = tempfile.mkdtemp(prefix="stallbench-flight-")
        env = {**os.environ, **threads.env_for(self.budget), "PYTHONUNBUFFERED": "1"}
        atexit.register(self.stop)
        for i in range(self.n):
            log = open(Path(self._dir) / f"server-{i}.log", "wb")
            self._logs.append(log)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "stallbench.executors.flight.server",
                 "--host", "127.0.0.1", "--port", "0"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                start_new_session=True))
            try:
                send_token(self.procs[-1].stdin, self.token)
            except OSError:
                pass                     # it exited already: its start-up line says so
        for i, p in enumerate(self.procs):
            word, value = self._line(i, f"its start-up (its {READY} line)", START_LIMIT_S)
            if word != READY:
                self._fail(i, f"said {word!r} instead of its port")
            self.ports.append(int(value))

    def register(self, cfg: Any, dataset: Any, key: str, file: str) -> None:
        """Hand every server a plan's config, dataset and scenario file (once per config
        key). Opening the dataset and importing the user's modules is real work: the wait
        ends when a server makes no progress (its CPU clock) for ``progress_timeout_s``, or
        after ``START_LIMIT_S`` however busy it is (an import that spins forever)."""
        if key in self.registered:
            return
        for i, p in enumerate(self.procs):
            try:
                send_registration(p.stdin, cfg, dataset, file)
            except OSError:
                self._fail(i, "closed its input")
        for i in range(len(self.procs)):
            word, value = self._line(i, f"its registration of variant {key}", START_LIMIT_S)
            if word != REGISTERED or value != key:
                self._fail(i, f"registered {value!r} instead of {key!r}")
        self.registered.add(key)

    def _line(self, i: int, what: str, limit_s: float | None = None) -> tuple[str, str]:
        """Server ``i``'s next stdout line. Each time its CPU clock moves is progress (and
        ticks the progress watchdog's clock, so a registration under ``prepare_watched``
        that works is not a stall); ``progress_timeout_s`` without any ends the wait."""
        from ...measure.watchdog import tick

        p = self.procs[i]
        start = last = time.monotonic()
        cpu = _cpu_s(p.pid)
        while True:
            now = time.monotonic()
            if now - last >= self.progress_timeout_s:
                self._stalled(i, what)
            if limit_s is not None and now - start >= limit_s:
                self._fail(i, f"was still busy with {what} after {limit_s:g} s")
            wait = min(0.5, max(0.01, last + self.progress_timeout_s - now))
            ready, _, _ = select.select([p.stdout], [], [], wait)
            if ready:
                line = p.stdout.readline().decode(errors="replace").strip()
                if not line:
                    self._fail(i, "exited")
                word, _, value = line.partition(" ")
                return word, value
            if p.poll() is not None:
                self._fail(i, f"exited with code {p.returncode}")
            now_cpu = _cpu_s(p.pid)
            if now_cpu is not None and (cpu is None or now_cpu > cpu) and not _stopped(p.pid):
                cpu, last = now_cpu, time.monotonic()
                tick()

    def _stalled(self, i: int, what: str) -> None:
        """The one line of a server that made no progress: which, where, what stallbench
        waited for and the state it is in (the caller stops the servers by PID)."""
        from ...errors import NoProgress

        p = self.procs[i]
        where = (f"listening on {self.locations[i]}" if i < len(self.ports)
                 else "starting on 127.0.0.1, its port not chosen yet")
        state = ("stopped (SIGSTOP or a debugger)" if _stopped(p.pid)
                 else "alive but using no CPU")
        raise NoProgress(f"{self.file}: run.progress_timeout_s: local Flight server {i} "
                         f"(pid {p.pid}, {where}) made no progress for "
                         f"{self.progress_timeout_s:g} s while stallbench waited for {what}: "
                         f"it is {state}; stallbench ended it by PID; no result written")

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                self._fail(i, f"exited with code {p.returncode}")

    def _fail(self, i: int, what: str) -> None:
        """An error naming the server and the end of its log (the caller stops the servers,
        after cancelling the streams that still wait on them)."""
        tail = self.log_tail(i)
        raise UserError(f"{self.file}: executor: local Flight server {i} {what}"
                        + (f"; its log ends: {tail}" if tail else ""))

    def log_tail(self, i: int, chars: int = 400) -> str:
        if self._dir is None:
            return ""
        try:
            text = (Path(self._dir) / f"server-{i}.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines())[-chars:]

    def cpu_s(self) -> float | None:
        """User + system CPU seconds of the server processes so far (their whole clocks:
        every stream, Arrow's pools, gRPC's threads)."""
        total = 0.0
        for p in self.procs:
            t = _cpu_s(p.pid)
            if t is None:
                return None
            total += t
        return total

    def stop(self) -> None:
        """Close the servers' pipes (they shut down), then kill by PID what still runs."""
        for p in self.procs:
            try:
                if p.stdin and not p.stdin.closed:
                    p.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        for p in self.procs:
            if _stopped(p.pid):          # a stopped server never reads its closed pipe
                p.kill()
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        for log in self._logs:
            log.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self.procs, self.ports, self._logs, self._dir = [], [], [], None
        self.registered.clear()
        atexit.unregister(self.stop)


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (None when it cannot be read)."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def _stopped(pid: int) -> bool:
    """Process ``pid`` is stopped (``kill -STOP``, a debugger): it makes no progress."""
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False
