"""Run the user's command once, hooked, and collect what its processes wrote.

Why a process of its own (``start_new_session``): the job and everything it starts (loader
workers, torchrun's ranks) form one process group whose id is the job's PID, so a signal to
stallbench reaches all of it with one ``killpg`` and nothing is left behind; the job's output
goes straight to the terminal (inherited stdout/stderr: streamed, never buffered by us).

The job never outlives stallbench: its own session keeps a terminal's SIGHUP and a SIGKILL
of stallbench's process group (a CI runner cancelling a step) away from it, so

- its leader gets a parent-death signal (``PR_SET_PDEATHSIG``, SIGKILL, Linux): when
  stallbench dies, however, the leader dies with it;
- the rest of its group (a wrapper's child: ``sh -c "...; python t.py"``, torchrun's ranks,
  loader workers) is ended by a guard (``_Guard``): a tiny ``sh`` in a session of its own
  that reads a pipe only stallbench holds; when stallbench dies the pipe closes and the
  guard SIGKILLs the job's group; at a normal end stallbench writes ``done`` first.

SIGHUP to stallbench itself ends the command like SIGTERM (``interrupts``): the job's group
gets it, then SIGKILL.

A terminal's job control reaches the job too (``_job_control``): Ctrl-Z (SIGTSTP) reaches
only the terminal's foreground group, stallbench's, so stallbench stops the job's group
(SIGSTOP: a stop signal the kernel would discard for the job's orphaned group otherwise),
then stops itself; ``fg`` or ``bg`` continues stallbench, which continues the job. Unprofiled,
Ctrl-Z stops the job; profiled it does the same, and the batches in flight count the pause.

Every wait here has an end: the job's run is unbounded by default (a job may legitimately go
long without a batch), ``--progress-timeout S`` bounds it by progress: no batch reported by
the agent's beat files (``agent/beats.py``) for S seconds, counted from the job's start, ends the
job (``NoProgress``, exit 2); stopping a job waits at most ``STOP_GRACE_S`` + 2 s.

Injection (``agent/bootstrap/sitecustomize.py`` says how and why): ``PYTHONPATH`` gets the
bootstrap directory in front of the user's value (kept as given; an unset or empty one is not
turned into "the current directory"), and ``STALLBENCH_PROFILE`` carries the settings
(``wire.Settings``): the run directory, the overrides, ``max_batches``, the replay plan of an
ablation run. The agent is the folder the bootstrap sits in: it needs no path of its own.
Everything that comes back (parts, beats) is read as the wire's records, never by key.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import interrupts
from ..errors import UserError
from ..measure.load import LoadMeter
from ..measure.sampler import Sampler
from ..results import ForeignLoad, Resources
from .agent import wire
from .agent.wire import Parts

HERE = Path(__file__).resolve().parent
AGENT = HERE / "agent"              # what runs inside the job (``agent/__init__.py``)
BOOTSTRAP = AGENT / "bootstrap"
STOP_GRACE_S = 5.0
BEAT_POLL_S = 0.5       # how often the beat files are read while the job runs
_PR_SET_PDEATHSIG = 1


class NoProgress(UserError):
    """``--progress-timeout``: no batch for that long; the job was stopped (exit 2)."""


_progress_timeout_s: float | None = None
_progress_why = "--progress-timeout"


@contextlib.contextmanager
def progress_limit(seconds: float | None, why: str = "--progress-timeout") -> Iterator[None]:
    """A limit on the time without a batch for every run of the job inside (profile and
    ablation runs: ``--progress-timeout``; a tune's trials: its hang limit); ``why`` names
    the limit in the line a stopped job gets."""
    global _progress_timeout_s, _progress_why
    before = _progress_timeout_s, _progress_why
    _progress_timeout_s, _progress_why = seconds, why
    try:
        yield
    finally:
        _progress_timeout_s, _progress_why = before


_job_cwd: Path | None = None      # where the job runs (``job_cwd``); None: stallbench's own


@contextlib.contextmanager
def job_cwd(path: Path | None) -> Iterator[None]:
    """Every run inside runs the job in ``path`` (None: stallbench's working directory)."""
    global _job_cwd
    before, _job_cwd = _job_cwd, path
    try:
        yield
    finally:
        _job_cwd = before


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def _die_with_us(parent: int) -> Callable[[], None] | None:
    """The job leader's ``preexec_fn``: SIGKILL when stallbench dies (``PR_SET_PDEATHSIG``).
    libc is loaded here, before the fork (``dlopen`` in a forked child can deadlock). A parent
    that died between the fork and the ``prctl`` is caught by the ``getppid`` check."""
    libc = _LIBC
    if libc is None:
        return None

    def pre() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
    return pre


def exit_status(code: int) -> int:
    """The job's exit code as a shell says it: a job killed by signal N (``Popen`` gives -N)
    is 128+N (137 for SIGKILL). One rule for the profile runs and the ablation runs."""
    return 128 - code if code < 0 else code


@dataclass
class JobRun:
    """One run of the command: its exit code, wall time, and what its processes wrote."""

    exit_code: int
    wall_s: float
    parts: Parts = field(default_factory=Parts)     # its part files, parsed once
    peak_pss_mb: float = 0.0
    resources: Resources = field(default_factory=Resources)
    load: ForeignLoad | None = None
    beats: list[wire.Beat] = field(default_factory=list)    # one per process of the job
    run_dir: Path | None = None
    pid: int = 0                    # the job's leader
    stopped: str = ""               # why stallbench ended the job early (tune's trials)
    # a multi-node job's run on node rank 0: every node's report (``nodes.NodeReport``), the
    # nodes that brought no figures included; [] on one node
    nodes: list[Any] = field(default_factory=list)


def job_env(base: dict[str, str], run_dir: Path, overrides: dict[str, Any],
            max_batches: int | None, replay: wire.ReplayPlan | None = None,
            live: wire.LiveSettings | None = None) -> dict[str, str]:
    """The job's environment: the bootstrap first on its ``PYTHONPATH``, the settings sent
    in (``wire.Settings``; ``live``: ``--live``'s windows, issue 60) in ``wire.ENV``."""
    env = dict(base)
    user = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(BOOTSTRAP) + (os.pathsep + user if user else "")
    env[wire.ENV] = wire.Settings(run_dir=str(run_dir), overrides=overrides,
                                  max_batches=max_batches, replay=replay, live=live).to_env()
    return env


def _stop(proc: subprocess.Popen[bytes], signum: int) -> None:
    """The job's process group gets the signal stallbench got; after a grace, SIGKILL. A
    SIGCONT follows the first signal: a stopped job (SIGSTOP, Ctrl-Z) acts on it at once."""
    for sig, grace in ((signum, STOP_GRACE_S), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(proc.pid, sig)
            if sig != signal.SIGKILL:
                os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:                        # the leader is gone; its group may not be
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def read_parts(run_dir: Path) -> Parts:
    """The run's part files, typed (``wire.read``)."""
    return wire.read(run_dir)


class _Guard:
    """Ends the job's process group if stallbench dies first (see the module docstring). Its
    own session: a SIGKILL of stallbench's group or a terminal's SIGHUP does not reach it. A
    guard that cannot start leaves the leader's parent-death signal alone on duty."""

    SCRIPT = 'read line; [ "$line" = done ] || kill -KILL -"$1"'

    def __init__(self, pgid: int) -> None:
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                ["/bin/sh", "-c", self.SCRIPT, "stallbench-guard", str(pgid)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except OSError:
            self.proc = None

    def release(self) -> None:
        """The job's group is ended: the guard exits without killing (bounded wait)."""
        if self.proc is None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"done\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass


def read_beats(run_dir: Path) -> list[wire.Beat]:
    """The processes' beat files (``wire.Beat``, written by the agent's ``beats``)."""
    return wire.read_beats(run_dir)


def last_batch(beats: list[wire.Beat], ranks: dict[int, int] | None = None) -> str:
    """``batch 2 of epoch 1 of ParquetItems#0 (pid 42)``: the last batch a beat reported;
    ``(rank 1, pid 42)`` where ``ranks`` (pid -> rank of a launched process) knows it."""
    seen = [b for b in beats if b.batches and b.last is not None]
    if not seen:
        return ""
    b = max(seen, key=lambda x: x.batches)
    name, epoch, index = b.last      # type: ignore[misc]
    from ..outputs import one_line
    rank = f"rank {ranks[b.pid]}, " if ranks and b.pid in ranks else ""
    return f"batch {index} of epoch {epoch} of {one_line(name)} ({rank}pid {b.pid})"


class _Progress:
    """``--progress-timeout``: the time since the batch count the beats report last changed,
    counted from the job's start (a job that never makes a loader times out too)."""

    def __init__(self, run_dir: Path, timeout_s: float, why: str = "--progress-timeout"
                 ) -> None:
        self.run_dir, self.timeout_s, self.why = run_dir, timeout_s, why
        self.since = self.next_read = time.monotonic()
        self.total = 0
        self.beats: list[wire.Beat] = []

    def stalled(self) -> bool:
        now = time.monotonic()
        if now >= self.next_read:
            self.next_read = now + BEAT_POLL_S
            self.beats = read_beats(self.run_dir)
            total = sum(b.batches for b in self.beats)
            if total != self.total:
                self.total, self.since = total, now
        return now - self.since > self.timeout_s

    def line(self, procs: str) -> str:
        ranks = {p.header.pid: p.header.rank for p in read_parts(self.run_dir).trainers
                 if p.header.launched}      # torchrun's ranks: the rank is named too
        last = last_batch(self.beats, ranks)
        what = (f"the last was {last}" if last else
                "none came since the job started" + (
                    " (its loaders were made)" if any(b.loaders for b in self.beats)
                    else ""))
        return (f"profile: no batch for {self.timeout_s:g} s ({self.why}): {what}; "
                f"stopped the job's processes: {procs}; no result written")


def _processes(pid: int) -> str:
    """``1234 python, 1240 python``: the job's leader and its descendants (at most 12)."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return str(pid)
    names = []
    for p in procs[:12]:
        try:
            stopped = " (stopped)" if p.status() == psutil.STATUS_STOPPED else ""
            names.append(f"{p.pid} {p.name()}{stopped}")
        except psutil.Error:
            names.append(str(p.pid))
    more = f" and {len(procs) - 12} more" if len(procs) > 12 else ""
    return ", ".join(names) + more


STOP_POLL_S = 1.0       # how often ``run_once``'s ``stop`` rule is asked
FLUSH_WAIT_S = 3.0      # how long a job asked to flush (``wire.FLUSH_MARK``) is waited for


def _ask_flush(run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    """Before ``stop`` ends the job: the agent's flush marker, then up to ``FLUSH_WAIT_S``
    for a trainer part written after it (the next batch writes one: ``agent/beats.py``), so
    the batches since the last periodic flush are kept. A job that makes no batch meanwhile
    is ended with what it wrote."""
    mark = run_dir / wire.FLUSH_MARK
    try:
        mark.write_bytes(b"")
        asked = mark.stat().st_mtime
    except OSError:
        return
    # every process that ran batches (its beat says so) writes its part again: one rank's
    # alone would leave the others' last batches out
    pids = {b.pid for b in read_beats(run_dir) if b.batches}
    deadline = time.monotonic() + FLUSH_WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        fresh = set()
        try:
            for p in run_dir.glob(f"{wire.Trainer.PREFIX}-*.json"):
                if p.stat().st_mtime > asked:
                    fresh.add(wire.Trainer.pid_of(p.name))
        except OSError:
            pass
        if pids <= fresh or (not pids and fresh):
            return
        time.sleep(0.05)


@contextlib.contextmanager
def _job_control(pgid: int) -> Iterator[None]:
    """While the job runs: SIGTSTP (Ctrl-Z) stops its group and then stallbench; the
    SIGCONT that resumes stallbench (``fg``, ``bg``) resumes the group (module docstring).
    Only in the main thread (signal handlers live there); the previous handlers come back."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_stop(signum: int, frame: object) -> None:
        try:
            os.killpg(pgid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)      # stopped here until continued
        signal.signal(signal.SIGTSTP, on_stop)
        _resume()

    def _resume(*_: object) -> None:
        try:
            os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    before = (signal.signal(signal.SIGTSTP, on_stop), signal.signal(signal.SIGCONT, _resume))
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, before[0])
        signal.signal(signal.SIGCONT, before[1])


def _wait(proc: subprocess.Popen[bytes], run_dir: Path, stop: Callable[[Path], str] | None,
          progress: "_Progress | None") -> tuple[int, str]:
    """Until the job ends, is ended by ``stop`` (its answer returned), or makes no progress
    (``NoProgress``): (its exit code, why the tune stopped it or "")."""
    stopped, next_stop = "", time.monotonic() + STOP_POLL_S
    while True:
        try:
            return proc.wait(timeout=0.2), stopped
        except subprocess.TimeoutExpired:
            interrupts.check()
            if stop is not None and time.monotonic() >= next_stop:
                next_stop = time.monotonic() + STOP_POLL_S
                stopped = stop(run_dir)
                if stopped:
                    _ask_flush(run_dir, proc)
                    if proc.poll() is not None:     # it ended on its own meanwhile
                        return proc.returncode, ""
                    with interrupts.deferred():
                        _stop(proc, signal.SIGTERM)
                    return proc.wait(), stopped
            if progress is not None and progress.stalled():
                procs = _processes(proc.pid)
                with interrupts.deferred():
                    _stop(proc, signal.SIGTERM)
                raise NoProgress(progress.line(procs))


def run_once(argv: list[str], run_dir: Path, overrides: dict[str, Any],
             max_batches: int | None, replay: wire.ReplayPlan | None = None,
             stop: Callable[[Path], str] | None = None,
             live: wire.LiveSettings | None = None) -> JobRun:
    """``replay``: the ablation this run is (the agent's ``replay``; None: the job as it is).
    ``stop``: asked every ``STOP_POLL_S`` with the run directory; a non-empty answer ends
    the job (SIGTERM to its process group, then SIGKILL: ``_stop``) and is the run's
    ``stopped`` (``stallbench tune``'s trials end a long job once its rate is known: what its
    processes flushed, epoch ends and the open epoch, is what the run measured). ``live``:
    ``--live``'s windows and per-batch cap, sent in (issue 60).

    The run directory reaches the hooks as an absolute path, fixed now: a job that changes
    its working directory (Hydra before 1.2 does) still writes its parts there."""
    run_dir = Path(os.path.abspath(run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    env = job_env(dict(os.environ), run_dir, overrides, max_batches, replay, live)
    timeout = _progress_timeout_s
    meter = LoadMeter()
    with meter, Sampler(interval_s=0.2, on_tree=meter.observe) as sampler:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, env=env, start_new_session=True, cwd=_job_cwd,
                                    preexec_fn=_die_with_us(os.getpid()))
        except OSError as exc:
            from .record import word     # the word may be API_KEY=X: never quoted as given
            raise UserError(f"cannot start {word(argv[0])!r}: {exc.strerror or exc}") from None
        guard = _Guard(proc.pid)
        progress = _Progress(run_dir, timeout, _progress_why) if timeout else None
        try:
            with _job_control(proc.pid):
                rc, stopped = _wait(proc, run_dir, stop, progress)
        except NoProgress:
            guard.release()
            raise
        except BaseException as exc:
            signum = exc.signum if isinstance(exc, interrupts.Interrupted) else signal.SIGINT
            with interrupts.deferred():
                _stop(proc, signum)
                guard.release()
            raise
        wall = time.perf_counter() - t0
        try:                        # workers the job left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        guard.release()
    return JobRun(exit_code=rc, wall_s=wall, parts=read_parts(run_dir),
                  peak_pss_mb=sampler.peak_pss_mb, resources=sampler.resources(),
                  load=meter.load, beats=read_beats(run_dir), run_dir=run_dir, pid=proc.pid,
                  stopped=stopped)
