"""Ranks as local processes, each with its own loader over a disjoint share of the row groups.

Rank ``r`` of N gets the job's work items ``r, r + N, ...`` (``base.rank_plan``) and runs the
variant's executor over them in its own process: a DataLoader with ``loader.num_workers``
workers of its own (forked from the rank, so they inherit its ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``), or its own batches with 0 workers. The ranks meet in a gloo (or nccl)
process group on loopback at a free port.

Rank processes are forked from stallbench's process (as the DataLoader forks its workers: no
re-import, the plan is inherited), or spawned where a GPU exists (CUDA does not survive a
fork; the plan is pickled to them). Each talks to the launcher over a pipe: ``run`` -> its
``RankRun``.
Stopping: a ``stop`` message, then SIGTERM, then SIGKILL, each rank by its PID, and then any
process still alive that a rank started (its loader workers), also by PID. While ranks live,
SIGTERM to stallbench becomes a KeyboardInterrupt, so it unwinds and stops them as on Ctrl-C;
a rank whose launcher disappears sees its pipe close and exits.
An executor whose producers serve the whole job (``Executor.ranks_share_producers``: the
Flight servers, started once by stallbench's process) gives each rank what it needs to attach
to them (``Executor.rank_options``), and may ask for spawned ranks (``rank_start_method``).
No wait without an end: each rank publishes its last progress and what it is doing in a
shared array (``measure.watchdog.publish``), which ``_check_progress`` reads while it waits.
A rank's own log lines stay off the user's terminal: its file descriptor 2, where torch's C++
core writes (``TCPStore.cpp ... TCP client failed to connect``, with ~50 C++ frames, when a
peer dies during the rendezvous; gloo's warnings), is a file of the job's log directory
(``stallbench-ranks-*/rank-N.log``) and Python's ``sys.stderr`` a duplicate of the terminal,
so the user's own prints and stallbench's lines still reach it (``_divert_stderr``). The
directory is removed when the job ends well or is interrupted; a failure's line names it
when a rank wrote anything there.
"""

from __future__ import annotations

import dataclasses
import io
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from .. import interrupts
from ..errors import NoProgress, ProcessDied, UserError, exit_status
from ..measure import watchdog
from ..pipeline import Ablation, Plan
from .base import (LAUNCHERS, RankContext, RankError, RankLauncher, RankRun, free_port, rank_plan,
                   stalled)

READY_TIMEOUT_S = 600.0
STOP_GRACE_S = 5.0


def _rank_main(ctx: RankContext, plan: Plan, conn: Connection, with_caches: bool,
               executor_cls: type, executor_kw: dict[str, Any] | None = None,
               scenario_file: str = "<scenario>", slots: Any = None,
               log_path: str | None = None) -> None:
    """A rank process: set up, then serve ``run`` requests until ``stop`` or the pipe closes.

    The launcher hands over the executor's class (pickled by reference), so this package
    imports nothing of ``executors`` (which imports it: the Ray launcher lives there), and
    the keyword arguments of the rank's executor (``Executor.rank_options``: e.g. the Flight
    servers the job's process started, which every rank attaches to)."""
    interrupts.sigterm_exits()
    if log_path is not None:
        _divert_stderr(log_path)
    os.environ.update(ctx.environ())      # before the loader forks its workers
    if slots is not None:                 # its progress and state, for the launcher
        watchdog.publish(slots, ctx.rank)
    watchdog.state(watchdog.SETUP)
    from .rank import RankWorker

    executor = None
    worker = None
    code = 0
    try:
        mine = rank_plan(plan, ctx.rank, ctx.world)
        executor = executor_cls(plan.config, scenario_file, **(executor_kw or {}))
        executor.start()
        shared = bool(getattr(executor_cls, "ranks_share_producers", False))
        worker = RankWorker(ctx, mine, lambda _arg: executor, mine if with_caches else None,
                            job_item=lambda i: ctx.rank + i * ctx.world, warm=not shared)
        info = worker.setup()
        # The executor's own preparation for this rank's shard (Flight: the servers build the
        # ablation caches of its row groups, one untimed pass per stream); a no-op for loaders.
        executor.prepare(mine, worker.caches)
        watchdog.state(watchdog.IDLE)
        conn.send(("ready", info))
        while True:
            try:
                msg = conn.recv()
            except EOFError:          # the launcher is gone
                break
            if msg[0] == "stop":
                break
            _, ablation, keep, hashes = msg
            watchdog.state(watchdog.BUSY)
            done = worker.run(ablation, None, keep_timeline=keep, hash_rows=hashes)
            watchdog.state(watchdog.IDLE)
            conn.send(("ok", done))
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:     # SIGTERM (``sigterm_exits``): 143
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which stops all
        code = 1
        kind = ("stall" if isinstance(exc, NoProgress) else
                "user" if isinstance(exc, UserError) else "bug")
        text = str(exc) if kind != "bug" else f"{type(exc).__name__}: {exc}"
        try:
            conn.send(("error", kind, text, traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        if worker is not None:
            worker.close()
        if executor is not None:
            executor.stop()
    # Ended here, without the interpreter's finalisation: in a spawned rank that would run
    # C++ destructors of runtimes still holding threads (gloo, gRPC), which abort with
    # "terminate called without an active exception" on the user's terminal.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _divert_stderr(path: str) -> None:
    """This rank's fd 2 (torch's and gloo's C++ log lines, written there directly) into
    ``path``; Python's ``sys.stderr`` (the user's prints, warnings, tracebacks) stays on the
    terminal through a duplicate of the old fd 2. Loader workers forked from the rank inherit
    both. Nothing changes where the file cannot be opened."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    terminal = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    old = sys.stderr
    sys.stderr = io.TextIOWrapper(os.fdopen(terminal, "wb", buffering=0),
                                  encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                                  errors="backslashreplace", line_buffering=True,
                                  write_through=True)
    _follow_stderr(old, sys.stderr)


def _follow_stderr(old: object, new: Any) -> None:
    """Logging handlers made before the rank started (a user module's
    ``logging.basicConfig()`` at import) hold the old ``sys.stderr`` object, whose fd 2 is
    now the log file: their records would vanish with it. They follow ``sys.stderr``."""
    logging = sys.modules.get("logging")
    if logging is None:
        return
    loggers = [logging.getLogger(), *(x for x in logging.Logger.manager.loggerDict.values()
                                      if isinstance(x, logging.Logger))]
    for lg in loggers:
        for h in list(lg.handlers):
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is old:
                h.setStream(new)


def start_method() -> str:
    """fork where no GPU exists (no re-import, the plan inherited); spawn where one does: a
    rank uses CUDA, and CUDA does not survive a fork once this process has touched the driver
    (even ``torch.cuda.is_available()`` can do that)."""
    import torch

    return "spawn" if torch.cuda.is_available() else "fork"


@LAUNCHERS.register("processes")
class ProcessLauncher(RankLauncher):
    name = "processes"
    start_method: str | None = None       # None: ``start_method()``; tests force "spawn"
    sharding = ("a DataLoader per rank over its own row groups (work items rank, rank + N, ...), "
                "with loader.num_workers workers per rank")
    producers_per_rank = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.info: list[dict[str, Any]] = []
        self._sigterm = interrupts.SigtermAsInterrupt()
        # Ranks of an executor whose producers serve the whole job (Flight servers) read
        # their own work items from that one pool, whose CPU only this side can measure.
        self.shared = bool(getattr(self.executor, "ranks_share_producers", False))
        if self.shared:
            self.producers_per_rank = False
            self.sharding = (f"each rank streams its own work items (rank, rank + N, ...) from "
                             f"the {self.executor.name} producers started once for the job")
        self._cpu_s: float | None = None
        self.slots: Any = None         # each rank's last progress and state (``watchdog``)
        self._busy = False             # a run was asked for and has not answered
        self.log_dir: str | None = None   # the ranks' fd 2 (``_divert_stderr``)
        self._keep_log = False            # a failure's line names it: not removed by stop

    def start(self) -> None:
        how = (self.start_method or getattr(self.executor, "rank_start_method", None)
               or start_method())
        ctx_mp = mp.get_context(how)
        self.slots = ctx_mp.RawArray("d", 2 * self.world)
        port = free_port()
        tr = self.plan.config.trainers
        self._sigterm.take()
        try:
            self.log_dir = tempfile.mkdtemp(prefix="stallbench-ranks-")
        except OSError:
            self.log_dir = None        # the ranks' C++ lines then reach the terminal
        try:
            for r in range(self.world):
                ctx = RankContext(r, self.world, r, "127.0.0.1", port, tr.straggler_rank,
                                  tr.straggler_delay_ms / 1000.0)
                parent, child = ctx_mp.Pipe()
                p = ctx_mp.Process(target=_rank_main,
                                   args=(ctx, self.plan, child, self.ablations,
                                         type(self.executor), self.executor.rank_options(),
                                         self.executor.scenario_file, self.slots,
                                         self._log_path(r)),
                                   name=f"stallbench-rank-{r}")
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
            replies = self._gather(READY_TIMEOUT_S, expect="ready")
            self.info = [r for r in replies]
            self.backend = self.info[0].get("backend", "gloo") if self.info else "gloo"
        except BaseException:
            self.stop()
            raise

    def run(self, ablation: Ablation, *, keep_timeline: bool = False,
            row_hashes: bool = False) -> list[RankRun]:
        shared = dataclasses.replace(self.plan, ablation=ablation)
        c0 = self.executor.producer_cpu_s(shared) if self.shared else None
        self._cpu_s = None
        self._busy = True
        for c in self.conns:
            c.send(("run", ablation, keep_timeline, row_hashes))
        out = self._gather(None, expect="ok")
        self._busy = False
        c1 = self.executor.producer_cpu_s(shared) if c0 is not None else None
        self._cpu_s = c1 - c0 if c0 is not None and c1 is not None else None
        return out

    def producer_cpu_s(self) -> float | None:
        """The job's pool of producers (shared ones only), over the last run."""
        return self._cpu_s

    def _gather(self, timeout_s: float | None, expect: str) -> list[Any]:
        """One reply from every rank; a rank that reports an error or dies is an error (the
        caller stops the rest)."""
        out: list[Any] = [None] * len(self.conns)
        pending = set(range(len(self.conns)))
        since = time.monotonic()
        deadline = None if timeout_s is None else since + timeout_s
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                raise RankError(f"ranks {sorted(pending)} did not answer within {timeout_s:g} s")
            self._check_progress(pending, since)
            handles: list[Any] = [self.conns[r] for r in pending]
            handles += [self.procs[r].sentinel for r in pending]
            ready = wait(handles, timeout=1.0 if left is None else min(1.0, left))
            for r in sorted(pending):
                c = self.conns[r]
                if c in ready or c.poll():
                    try:
                        msg = c.recv()
                    except EOFError:
                        msg = None
                    if msg is None or msg[0] != expect:
                        raise self._failure(r, msg)
                    out[r] = msg[1]
                    pending.discard(r)
                elif self.procs[r].sentinel in ready and not c.poll():
                    raise self._failure(r, None)
        return out

    def _log_path(self, r: int) -> str | None:
        return None if self.log_dir is None else os.path.join(self.log_dir, f"rank-{r}.log")

    def _check_progress(self, pending: set[int], since: float) -> None:
        """The job's progress watchdog (``base.stalled``), for what a rank cannot watch
        itself: a rank stopped, stuck in its set-up, or waiting while none progresses."""
        line = stalled(self.executor.scenario_file, self.slots, pending,
                       lambda r: self.procs[r].pid, since,
                       self.plan.config.run.progress_timeout_s, self._source)
        if line is not None:
            raise self._with_log(NoProgress(line))

    def _source(self) -> str:
        if self.shared:
            what = getattr(self.executor, "waiting_for", None)
            if callable(what):
                return str(what())
        n = self.plan.config.loader.num_workers
        return f"its own loader ({n} worker(s))" if n else "its own batch production"

    def _failure(self, r: int, msg: Any) -> Exception:
        if msg is not None and msg[0] == "error":
            _, kind, text, tb = msg
            if kind == "stall":
                return self._with_log(NoProgress(text))
            if kind == "user":
                return self._with_log(UserError(f"trainer rank {r}: {text}"))
            return self._with_log(RankError(f"trainer rank {r} failed: {text}\n{tb}"))
        p = self.procs[r]
        p.join(timeout=1.0)
        interrupts.check()      # a rank ended by the same Ctrl-C / SIGTERM: 130 / 143
        return self._with_log(ProcessDied(f"trainer rank {r} (pid {p.pid}) "
                                          f"{exit_status(p.exitcode)} before it finished; "
                                          f"no result written"))

    def _with_log(self, exc: Exception) -> Exception:
        """The job's failure, after every rank is stopped (what the others log as they end,
        a peer's TCPStore retries cut short, is in their files by then), with the ranks'
        log directory named where a rank wrote anything there; kept for the user then."""
        self._keep_log = True
        self._busy = True        # a failed job: the others get SIGTERM now, no grace for "stop"
        self.stop()
        d = self._written_log()
        if d is not None:                      # only the files that say something
            for e in os.scandir(d):
                try:
                    if e.stat().st_size == 0:
                        os.remove(e.path)
                except OSError:
                    pass
        if d is None:
            self._keep_log = False
            self._remove_log()
            return exc
        note = f" (the ranks' own log lines: {d})"
        text = str(exc)
        if isinstance(exc, RankError) and "\n" in text:     # before its traceback
            head, _, tail = text.partition("\n")
            exc.args = (f"{head}{note}\n{tail}",)
        else:
            exc.args = (text + note,)
        return exc

    def _written_log(self) -> str | None:
        d = self.log_dir
        if d is None:
            return None
        try:
            return d if any(e.stat().st_size > 0 for e in os.scandir(d)) else None
        except OSError:
            return None

    # ------------------------------------------------------------------------------ stop
    def stop(self) -> None:
        import psutil

        procs, conns = self.procs, self.conns
        self.procs, self.conns = [], []
        started: dict[int, Any] = {}          # what the ranks started (loader workers)
        for p in procs:
            try:
                for c in psutil.Process(p.pid).children(recursive=True):
                    started[c.pid] = c
            except psutil.Error:
                pass
        # A rank or worker stopped by a signal (kill -STOP: the watchdog's case) is continued
        # first: SIGTERM waits while a process is stopped.
        for pid in [p.pid for p in procs] + list(started):
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        for c in conns:
            try:
                c.send(("stop",))
            except (OSError, ValueError):
                pass
        # Ranks mid-run (an error, a signal) do not read their pipe: no grace for "stop".
        deadline = time.monotonic() + (0.0 if self._busy else STOP_GRACE_S)
        self._busy = False
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for sig in ("terminate", "kill"):
            alive = [p for p in procs if p.is_alive()]
            for p in alive:
                getattr(p, sig)()
            for p in alive:
                p.join(timeout=STOP_GRACE_S)
        for c in conns:
            c.close()
        interrupts.terminate_then_kill([c for c in started.values() if interrupts.running(c)],
                                       STOP_GRACE_S)
        if not self._keep_log:
            self._remove_log()
        self._sigterm.give_back()

    def _remove_log(self) -> None:
        if self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None


