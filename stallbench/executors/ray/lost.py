"""A Ray runtime lost under a run, and Ray's own output kept out of the user's terminal.

*What a run cannot go on without.* A runtime stallbench starts (local, or simulated nodes)
lives in processes of this machine that stallbench started: the GCS (``gcs_server``) and the
raylet of the trainer's node. Killed (``kill -9``, the OOM killer), Ray itself ended the
trainer's process with exit 1 (a lost raylet: at the next touch of the object store, whose
server the raylet is) or waited for the GCS to come back for
``gcs_rpc_server_reconnect_timeout_s`` (60 s) and then did the same, leaving its agents
running, with pages of its C++ log on the terminal. ``Vital`` knows those processes by PID
(from Ray's own node records) and waits on each in a thread (``waitid``, so it learns of the
death at once and before Ray does): the runtime then says in one line which one is gone and
how it ended, kills every process of the runtime by PID and ends the command with exit 2
(``RayRuntime._lost``); no result exists yet to be half-written. A worker node's raylet of a
simulated cluster is not vital: Ray re-runs its tasks on the other nodes and the run
completes; the loss is recorded (``nodes_lost``).

*A cluster reached by address* (``ray_address = "host:port"`` or ``"auto"``) runs in
processes that are not stallbench's, so its GCS cannot be waited on: ``Vital.gcs`` is its
address, and a thread connects to it every 0.5 s (a TCP connect, answered by the kernel of
the GCS's machine: nothing of Ray's is touched). A GCS that refuses connections for
``gcs_grace_s`` (10 s, or ``[run] progress_timeout_s`` when smaller; a GCS restarted by its
owner within that keeps the run) is lost: one line, exit 2. Only a refused connection counts
(``port_answer``): a connect that times out says nothing of the GCS (a slow or cut network),
and ``[run] progress_timeout_s`` bounds such a wait. Ray's driver would wait
``gcs_rpc_server_reconnect_timeout_s`` (60 s) and end with exit 1.

*Ray's own lines.* The trainer's core worker writes its C++ log lines (``E ...
core_worker.cc``, ``task_manager.cc``) to file descriptor 2, and Ray's error subscriber prints
what the GCS publishes (a raylet's last 20 log lines when it dies, ``[state-dump]`` blocks of a
lost node) to stdout. ``RayLog`` sends both to a file of the Ray session's log directory while
a runtime is open: fd 2 is pointed at that file and Python's ``sys.stderr`` at a duplicate of
the terminal, so stallbench's own lines (and tracebacks) still reach the user, and the one
line of a lost runtime names the file.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable


GCS_GRACE_S = 10.0      # a cluster by address: how long its GCS may refuse connections

ACCEPTS, REFUSED, UNKNOWN = "accepts", "refused", "unknown"


def port_answer(host: str, port: int, timeout_s: float) -> str:
    """What a TCP connect to ``host:port`` says of the Ray process that serves it, the one
    rule for every such check (a cluster's GCS, ``_poll_gcs``; a node's raylet,
    ``RayRuntime.raylet_gone``): ``REFUSED``, the machine answers that nothing listens there,
    so the process is gone; ``ACCEPTS``; ``UNKNOWN``, no answer (a timeout, an unreachable
    host or network, a name that does not resolve): a slow or cut network is not a loss, and
    a run that waits on it is ended by ``[run] progress_timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ACCEPTS
    except ConnectionRefusedError:
        return REFUSED
    except OSError:
        return UNKNOWN


def _end_of(info: Any) -> str:
    """How a child ended, from ``os.waitid``'s answer: ``killed by SIGKILL``."""
    if info is None:
        return "ended"
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        try:
            return f"killed by {signal.Signals(info.si_status).name}"
        except ValueError:
            return f"killed by signal {info.si_status}"
    return f"exited with status {info.si_status}"


def _wait_end(pid: int) -> Any:
    """Block until child ``pid`` ends, without reaping it (Ray's own ``Popen`` still will)."""
    while True:
        try:
            return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except InterruptedError:
            continue
        except (ChildProcessError, OSError):
            return None


@dataclass
class Vital:
    """The processes of a runtime stallbench started, by PID: ``vital`` ones end the run when
    they die (the GCS, the trainer node's raylet), ``nodes`` are worker nodes' raylets (a
    node lost: Ray re-runs its tasks elsewhere and the run goes on)."""

    vital: dict[int, str] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    lost: str | None = None
    nodes_lost: dict[int, str] = field(default_factory=dict)
    node_ids: dict[int, str] = field(default_factory=dict)    # raylet pid -> node id (hex)
    closing: bool = False
    gcs: tuple[str, int] | None = None      # a cluster by address: its GCS, polled
    gcs_grace_s: float = GCS_GRACE_S

    @classmethod
    def of(cls, head: Any, workers: list[Any] = ()) -> "Vital":
        """From Ray's node records (``ray._private.node.Node``): the head's GCS and raylet,
        the worker nodes' raylets."""
        out = cls()
        if head is not None:
            for info in head.all_processes.get("gcs_server") or []:
                pid = info.process.pid
                out.vital[pid] = f"its GCS (gcs_server, pid {pid})"
            for info in head.all_processes.get("raylet") or []:
                pid = info.process.pid
                out.vital[pid] = f"the raylet of the trainer's node {_short(head)} (pid {pid})"
        for node in workers:
            for info in node.all_processes.get("raylet") or []:
                pid = info.process.pid
                out.nodes[pid] = f"its raylet, pid {pid}"
                out.node_ids[pid] = str(node.node_id)
        return out

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """One thread per process, blocked in ``waitid`` until it ends: a vital loss calls
        ``on_lost`` at once (Ray's core worker ends this process with exit 1 about a second
        after its raylet dies, at the next touch of the object store, so polling is too
        late), a node's loss is recorded."""
        def wait(pid: int, what: str, vital: bool) -> None:
            info = _wait_end(pid)
            if self.closing:
                return
            text = f"{what}, {_end_of(info)}"
            if info is not None and info.si_code == os.CLD_KILLED and \
                    info.si_status in (signal.SIGINT, signal.SIGTERM):
                time.sleep(0.3)    # a signal to the whole process group: ours comes too
                if self.closing:
                    return
            if not vital:
                self.nodes_lost[pid] = text
                return
            if self.lost is None:
                self.lost = text
                on_lost(text)

        for pid, what, vital in [*((p, w, True) for p, w in self.vital.items()),
                                 *((p, w, False) for p, w in self.nodes.items())]:
            threading.Thread(target=wait, args=(pid, what, vital), daemon=True,
                             name=f"stallbench-ray-vital-{pid}").start()
        if self.gcs is not None:
            threading.Thread(target=self._poll_gcs, args=(on_lost,), daemon=True,
                             name="stallbench-ray-vital-gcs").start()

    def _poll_gcs(self, on_lost: Callable[[str], None], period_s: float = 0.5) -> None:
        """A cluster by address: its GCS accepts a TCP connection, or has refused them for how
        long (``port_answer``). A connect that gets no answer changes nothing: it is not a
        loss, and the wait it leaves is bounded by the progress watchdog."""
        assert self.gcs is not None
        host, port = self.gcs
        since: float | None = None
        while not self.closing:
            answer = port_answer(host, port, min(2.0, self.gcs_grace_s))
            if answer == ACCEPTS:
                since = None
            elif answer == REFUSED:
                now = time.monotonic()
                since = now if since is None else since
                if now - since >= self.gcs_grace_s:
                    if self.closing or self.lost is not None:
                        return
                    self.lost = (f"its GCS at {host}:{port} (no connection accepted for "
                                 f"{now - since:.1f} s: connection refused)")
                    on_lost(self.lost)
                    return
            time.sleep(period_s)


def _short(node: Any) -> str:
    try:
        return str(node.node_id)[:8]
    except Exception:  # noqa: BLE001 - a name for a message
        return "?"


class RayLog:
    """Ray's terminal output into a file while a runtime is open (see the module docstring)."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.last_path: str | None = None     # kept after close, for a late message
        self._saved_fd: int | None = None
        self._saved_stderr: Any = None
        self._patched: Any = None
        self._file: Any = None
        self._early: list[str] = []       # Ray's messages before the log file exists
        self._scratch = False             # the file is removed at close (Ray Client)
        self.keep = False                 # ... unless the run failed (``RayRuntime.failed``)

    def open(self, directory: str, scratch: bool = False) -> None:
        """Divert to ``stallbench-driver-PID.log`` in ``directory``. ``scratch``: a file of
        the temp directory (Ray Client: no Ray session directory on this machine), removed
        at ``close`` after a run that did not fail; kept when the run failed (``keep``: the
        error's line names it) or a lost runtime's line names it (that ends the process
        before ``close``): it is the only record of what the cluster side printed."""
        if self.path is not None:
            return
        self._scratch = scratch
        try:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"stallbench-driver-{os.getpid()}.log")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            return                       # Ray's lines then reach the terminal, as before
        self.path = self.last_path = path
        self._file = open(path, "a", encoding="utf-8", buffering=1)   # noqa: SIM115
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        self._saved_fd = os.dup(2)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            real = sys.stderr.fileno() == 2
        except Exception:  # noqa: BLE001 - a capture object (pytest): leave sys.stderr
            real = False
        if real:
            self._saved_stderr = sys.stderr
            sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(self._saved_fd), "wb", buffering=0),
                                          encoding=getattr(sys.stderr, "encoding", None)
                                          or "utf-8", errors="backslashreplace",
                                          line_buffering=True, write_through=True)
        self._divert_messages()
        if self._early:
            self._file.write("".join(self._early))
            self._early = []

    def divert(self) -> None:
        """Before ``ray.init``: what the GCS publishes to the driver from the moment Ray's
        error subscriber starts is kept (in memory until ``open`` names the session's log
        file). The file exists only once the runtime is up, and a raylet lost in between
        (while Ray Data is imported, say) had its last 20 log lines printed on stdout."""
        self._divert_messages()

    def terminal_fd(self) -> int:
        """Where stallbench's own lines go: the terminal's fd 2 as it was before ``open``."""
        return self._saved_fd if self._saved_fd is not None else 2

    def _divert_messages(self) -> None:
        """Ray's error subscriber (``worker.listen_error_messages``) prints what the GCS
        publishes to the driver through the module function ``print_to_stdstream``; through
        Ray Client, what the cluster's side prints (its own warnings at connect, workers'
        output, its log records) arrives on the client's log stream (``LogstreamClient``); and
        Ray's Python modules warn through ``warnings`` ("Ray Client connection timed out"
        when the head is gone). All three go to the log while it is diverted."""
        if self._patched is not None:
            return                       # diverted already (``divert``), to self._file now
        patched: list[tuple[Any, str, Any]] = []

        def write(text: str) -> None:
            try:
                if self._file is not None:
                    self._file.write(text)
                else:
                    self._early.append(text)
            except Exception:  # noqa: BLE001 - never a failure of the run
                pass

        def to_log(data: dict, ignore_prefix: bool = False) -> None:
            write("".join(f"({data.get('pid', 'ray')}) {line}\n"
                          for line in data.get("lines", ())))

        def client_stream(_self: Any, level: int, msg: str) -> None:
            write(f"(ray client) {msg}" if msg.endswith("\n") else f"(ray client) {msg}\n")

        original_warning = warnings.showwarning
        try:
            import ray
        except ImportError:
            return
        # Ray's warnings are those of the installed ray package's files, not of any path with
        # a directory named ``ray`` in it (a user's project under ~/ray keeps its warnings).
        ray_dir = os.path.join(os.path.realpath(os.path.dirname(ray.__file__)), "")

        def show_warning(message: Any, category: Any, filename: str, lineno: int,
                         file: Any = None, line: Any = None) -> None:
            if os.path.realpath(str(filename)).startswith(ray_dir):
                write(warnings.formatwarning(message, category, filename, lineno, line))
            else:
                original_warning(message, category, filename, lineno, file, line)

        try:
            from ray._private import worker as ray_worker
        except ImportError:
            return
        if getattr(ray_worker, "print_to_stdstream", None) is not None:
            patched.append((ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream))
            ray_worker.print_to_stdstream = to_log
        try:
            from ray.util.client.logsclient import LogstreamClient
        except ImportError:
            LogstreamClient = None  # noqa: N806 - Ray without its client
        for name in ("stdstream", "log"):     # the cluster side's prints and log records
            if LogstreamClient is not None and hasattr(LogstreamClient, name):
                patched.append((LogstreamClient, name, getattr(LogstreamClient, name)))
                setattr(LogstreamClient, name, client_stream)
        patched.append((warnings, "showwarning", original_warning))
        warnings.showwarning = show_warning
        self._patched = patched

    def _restore_messages(self) -> None:
        if self._patched is not None:
            for owner, name, original in reversed(self._patched):
                setattr(owner, name, original)
            self._patched = None

    def close(self) -> None:
        """Ray's lines back to the terminal (after ``ray.shutdown``: its last lines too)."""
        if self.path is None:
            self._restore_messages()     # diverted, but the runtime never came up
            self._early = []
            return
        self._restore_messages()
        if self._saved_stderr is not None:
            try:
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass
            ours, sys.stderr = sys.stderr, self._saved_stderr
            self._saved_stderr = None
            try:
                ours.close()
            except Exception:  # noqa: BLE001
                pass
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._scratch and not self.keep:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.last_path = None
        self.path = None
        self.keep = False
