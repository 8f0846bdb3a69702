"""Flight servers that stallbench starts on the trainer's machine, and stops.

Each is a fresh interpreter (``python -m stallbench.executors.flight.server``) listening on
loopback at a port the kernel picks, in its own session (a Ctrl-C in the terminal reaches the
trainer, which stops them, not the servers half-way through a stream). Its first stdout line
says its port; plans reach it through its stdin; it exits when that pipe closes, so a trainer
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
from .server import READY, REGISTERED, send_registration


class LocalServers:
    def __init__(self, n: int, budget: int | None, scenario_file: str = "<scenario>") -> None:
        self.n = n
        self.budget = budget
        self.file = scenario_file
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.registered: set[str] = set()
        self._logs: list[Any] = []
        self._dir: str | None = None

    @property
    def locations(self) -> list[str]:
        return [f"grpc://127.0.0.1:{p}" for p in self.ports]

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self, timeout_s: float = 180.0) -> None:
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
        deadline = time.monotonic() + timeout_s
        for i, p in enumerate(self.procs):
            word, value = self._line(i, deadline)
            if word != READY:
                self._fail(i, f"said {word!r} instead of its port")
            self.ports.append(int(value))

    def register(self, cfg: Any, dataset: Any, key: str, file: str,
                 timeout_s: float = 120.0) -> None:
        """Hand every server a plan's config, dataset and scenario file (once per config
        key)."""
        if key in self.registered:
            return
        deadline = time.monotonic() + timeout_s
        for i, p in enumerate(self.procs):
            try:
                send_registration(p.stdin, cfg, dataset, file)
            except OSError:
                self._fail(i, "closed its input")
        for i in range(len(self.procs)):
            word, value = self._line(i, deadline)
            if word != REGISTERED or value != key:
                self._fail(i, f"registered {value!r} instead of {key!r}")
        self.registered.add(key)

    def _line(self, i: int, deadline: float) -> tuple[str, str]:
        p = self.procs[i]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(i, "did not answer in time")
            ready, _, _ = select.select([p.stdout], [], [], min(left, 0.5))
            if ready:
                line = p.stdout.readline().decode(errors="replace").strip()
                if not line:
                    self._fail(i, "exited")
                word, _, value = line.partition(" ")
                return word, value
            if p.poll() is not None:
                self._fail(i, f"exited with code {p.returncode}")

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
        import psutil

        total = 0.0
        for p in self.procs:
            try:
                t = psutil.Process(p.pid).cpu_times()
            except psutil.Error:
                return None
            total += t.user + t.system
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
