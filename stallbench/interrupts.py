"""SIGINT, SIGTERM and SIGHUP end a stallbench command the same way, from its first instruction
to its last.

The rule: a signal ends the command with exit code 128 + signal (130, 143; 129 for SIGHUP,
a closed terminal) and one line, no result, no temp data, no process left behind. SIGHUP is
taken only where it is not ignored (``nohup`` keeps its meaning). Once a command has
published what it makes (``committed``), a later signal no longer changes its exit: files and
exit code agree. ``stallbench.cli`` installs the handlers at entry
and, on the way out, stops every process started under it that is still alive.

Why more than a handler that raises ``KeyboardInterrupt``:

- *Lost exceptions.* Python raises the handler's exception at whatever bytecode the main
  thread runs, and some places swallow it: inside an ``os.register_at_fork`` callback
  (logging's, run at every DataLoader worker fork) or a ``__del__`` it is printed as
  "Exception ignored" and dropped, so a Ctrl-C sent as the first loader worker appeared
  ended in exit 0 with a result. So the handler also *records* the signal, and the places
  where work goes on call ``check()``, which raises again while one is recorded: every
  measured batch, every generated row group and ablation cache entry, every loader worker
  fork (``executors.local._CheckedForkProcess``), the moment before a result is published,
  and the CLI after the command returned.
- *SIGTERM's default action* kills the process without running a ``finally``: loader workers
  linger, a generator's temp dir stays in the cache. Here SIGTERM raises like SIGINT.
- *Foreign handlers.* ``ray.init`` replaces the SIGTERM handler with ``sys.exit(15)`` (and
  Ray's C++ core would install one that aborts with a stack dump, which
  ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` turns off). ``foreign_handlers()`` wraps such
  calls: their exit becomes ``Interrupted`` and our handlers are put back after them.
- *Orphans.* A process whose parent died (a Ray agent when its raylet is stopped, a loader
  worker forked just before the signal) is adopted by init and forgotten. The CLI makes
  stallbench a child subreaper (Linux), so such processes stay in its tree until
  ``stop_new_children`` ends them by PID.

A later signal while the command is already unwinding is recorded but raises nothing: the
clean-up it would interrupt is what stops the children (each of its waits is bounded).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from typing import Any, Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM; a KeyboardInterrupt, so libraries unwind as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        self.outcome = ""     # what the command leaves (set by a command that knows; the CLI
                              # says "no result written" / "nothing written" otherwise)
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    installed = False
    pending: int | None = None
    deferred = 0
    previous: dict[int, Any] = {}
    previous_hook: Any = None
    subreaper_was: int | None = None
    left_behind = False
    skip_atexit = False
    committed = False


_state = _State()


def _handler(signum: int, frame: Any) -> None:
    first = _state.pending is None
    if first:
        _state.pending = signum
    if first and not _state.deferred:
        raise Interrupted(signum)


def _reset_in_child() -> None:
    """A forked child (loader worker) must die of SIGTERM, not run the trainer's handler."""
    if _state.installed:
        for s, h in _state.previous.items():
            try:
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):
                pass
        _state.installed = False
        _state.pending = None


os.register_at_fork(after_in_child=_reset_in_child)


def _unraisable(info: Any) -> None:
    """Python prints an exception it cannot raise (in an at-fork callback, a ``__del__``) as
    "Exception ignored in ..." with a traceback. Ours, and the half-built objects' complaints
    that follow an interruption (a DataLoader iterator interrupted while forking), are not
    news: the command ends with its one line. Anything else is printed as before."""
    if isinstance(info.exc_value, KeyboardInterrupt) or _state.pending is not None:
        return
    (_state.previous_hook or sys.__unraisablehook__)(info)


def install() -> bool:
    """Route SIGINT and SIGTERM to ``Interrupted``; False where that is impossible (not the
    main thread). Clears any signal recorded before."""
    _state.pending = None
    _state.deferred = 0
    _state.left_behind = False
    _state.skip_atexit = False
    _state.committed = False
    if threading.current_thread() is not threading.main_thread():
        return False
    if not _state.installed:
        _state.previous = {s: signal.getsignal(s) for s in _SIGNALS}
        _state.previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable
    for s in _taken():
        signal.signal(s, _handler)
    _state.installed = True
    return True


def _taken() -> list[int]:
    """The signals we handle: SIGHUP only when it was not ignored on entry (``nohup``)."""
    return [s for s in _SIGNALS
            if s != signal.SIGHUP or _state.previous.get(s) is not signal.SIG_IGN]


def reinstall() -> None:
    """Put our handlers back after code that replaced them (no-op when not installed)."""
    if _state.installed and threading.current_thread() is threading.main_thread():
        for s in _taken():
            signal.signal(s, _handler)


def installed() -> bool:
    return _state.installed


def uninstall() -> None:
    if not _state.installed or threading.current_thread() is not threading.main_thread():
        return
    for s, h in _state.previous.items():
        try:
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        except (ValueError, OSError, TypeError):
            pass
    if sys.unraisablehook is _unraisable:
        sys.unraisablehook = _state.previous_hook or sys.__unraisablehook__
    _state.installed = False
    _state.pending = None
    _state.deferred = 0


def pending() -> int | None:
    """The signal received so far (None: none)."""
    return _state.pending


def received(signum: int) -> Interrupted:
    """What a handler of some other part (a rank launcher's, the A/B gate's, Ray's) raises for
    a signal: recorded like ours, so the command ends with 128 + that signal (143 for
    SIGTERM), never as a generic KeyboardInterrupt read as SIGINT."""
    if _state.pending is None:
        _state.pending = int(signum)
    return Interrupted(int(signum))


def check() -> None:
    """Raise ``Interrupted`` if a signal was received, even if its first exception was lost
    (not after ``committed``: the outcome is decided)."""
    if _state.pending is not None and not _state.committed:
        raise Interrupted(_state.pending)


def committed() -> None:
    """The command has published everything it makes (a result and its trace): from now on a
    signal is recorded, never raised, and the exit stays the command's own, so exit code and
    files agree. ``cli`` says in one line that a signal came after the publication."""
    if not _state.committed:
        _state.committed = True
        _state.deferred += 1


def was_committed() -> bool:
    return _state.committed


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A short section that must finish once started (publishing a result and recording that
    it exists): a signal inside it is raised at its end. ``check()`` still raises inside."""
    _state.deferred += 1
    try:
        yield
    finally:
        _state.deferred -= 1
    if not _state.deferred:
        check()


def exiting() -> None:
    """The command is done and cleaning up: from now on a signal is only recorded."""
    _state.deferred += 1


@contextlib.contextmanager
def foreign_handlers() -> Iterator[None]:
    """Around code that installs its own SIGTERM handler (``ray.init``: ``sys.exit(15)``): its
    exit on SIGTERM becomes ``Interrupted``, and our handlers are back when it returns."""
    try:
        yield
    except SystemExit as exc:
        if _state.installed and exc.code in (signal.SIGTERM, -signal.SIGTERM):
            _state.pending = _state.pending or signal.SIGTERM
            raise Interrupted(signal.SIGTERM) from None
        raise
    finally:
        reinstall()
    check()


def runtime_left(run_atexit: bool = True) -> None:
    """A native runtime of this process is in a state its C++ destructors cannot end, so the
    command must end through ``end_process`` (``cli.main`` does): a signal that interrupted
    its start (``ray.init``), or a Flight server whose shutdown is stuck on a stream
    (``run_atexit=False``: pyarrow's ``atexit`` finaliser would wait on it again)."""
    _state.left_behind = True
    _state.skip_atexit = _state.skip_atexit or not run_atexit


def runtime_left_behind() -> bool:
    """Whether ``runtime_left`` was called: ``cli.main`` then ends through ``end_process``."""
    return _state.left_behind


def end_process(code: int) -> None:
    """End the process with ``code`` after its Python clean-up (``atexit`` functions, the
    streams flushed) but without C's exit handlers. A SIGTERM or SIGINT inside ``ray.init``
    can land while Ray's C++ core worker is being made, before Python holds it: ``ray.shutdown``
    then cannot stop it, and C's exit handlers destroy it while its threads still run, a
    SIGSEGV (rc -11) after the command's right line (seen: ``kill -TERM`` when the driver's
    core-worker log appeared). Everything the command started is stopped by then.
    ``runtime_left(run_atexit=False)`` skips the ``atexit`` functions too."""
    import atexit

    if not _state.skip_atexit:
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001 - ending anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


# ----------------------------------------------------------------------- child processes

def _prctl(option: int, arg: int = 0) -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if option == _PR_GET_CHILD_SUBREAPER:
            value = ctypes.c_int(0)
            if libc.prctl(option, ctypes.byref(value), 0, 0, 0) != 0:
                return None
            return value.value
        return 0 if libc.prctl(option, arg, 0, 0, 0) == 0 else None
    except (OSError, AttributeError):
        return None


def adopt_orphans() -> None:
    """Make this process a child subreaper (Linux): descendants whose parent dies stay ours."""
    if _state.subreaper_was is None:
        was = _prctl(_PR_GET_CHILD_SUBREAPER)
        if was is not None and _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0:
            _state.subreaper_was = was


def stop_adopting() -> None:
    if _state.subreaper_was is not None:
        _prctl(_PR_SET_CHILD_SUBREAPER, _state.subreaper_was)
        _state.subreaper_was = None


def children() -> set[int]:
    """PIDs of every live descendant of this process."""
    import psutil

    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def stop_new_children(before: set[int], grace_s: float = 3.0) -> list[int]:
    """Stop every descendant that was not there at ``before`` (SIGTERM, then SIGKILL after
    ``grace_s``); returns the PIDs that were still alive. Only processes started under this
    one are touched, by PID."""
    import psutil

    try:
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    except psutil.Error:
        return []
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    if not alive:
        _wait_zombies(procs)
        return []
    terminate_then_kill(alive, grace_s)
    _wait_zombies(procs)
    return [p.pid for p in alive]


def running(p: Any) -> bool:
    """A ``psutil.Process`` that is still running (a zombie has exited: only its parent's wait
    is missing)."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def terminate_then_kill(procs: list[Any], grace_s: float) -> None:
    """SIGTERM each ``psutil.Process``, give them ``grace_s`` to exit, SIGKILL what is left
    and wait for it: the one way stallbench stops processes it started (by PID, never by
    name). A process already gone is skipped."""
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(procs, timeout=grace_s)
    for p in still:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=grace_s)


def _wait_zombies(procs: list[Any]) -> None:
    """Collect adopted children that already exited (a subreaper must wait for them)."""
    for p in procs:
        try:
            os.waitpid(p.pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


# --- SIGTERM outside the CLI's handlers ---------------------------------------------------------
# Library use (tests, a user's script) has no ``install()``: SIGTERM's default action would kill
# the process without running a ``finally`` (a rank, a Ray runtime or a git worktree left behind).
# These are the one place that says what SIGTERM does then.

def _term_as_interrupt(signum: int, frame: Any) -> None:
    # Recorded like ours: the command ends with 143 and says SIGTERM (a bare
    # KeyboardInterrupt was read as SIGINT: 130, issue 26).
    raise received(signal.SIGTERM)


class SigtermAsInterrupt:
    """While taken, SIGTERM raises ``KeyboardInterrupt`` (so every ``finally`` runs, as on
    Ctrl-C); ``give_back`` restores the handler that was there. A no-op outside the main thread,
    where handlers cannot be installed. Also a context manager, for a block."""

    def __init__(self) -> None:
        self._old: Any = None
        self._taken = False

    def take(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._old = signal.signal(signal.SIGTERM, _term_as_interrupt)
            self._taken = True
        except (ValueError, OSError):  # pragma: no cover - no signals here
            self._taken = False

    def give_back(self) -> None:
        if not self._taken or threading.current_thread() is not threading.main_thread():
            return
        try:
            signal.signal(signal.SIGTERM, self._old if self._old is not None else signal.SIG_DFL)
        except (ValueError, OSError, TypeError):  # pragma: no cover
            pass
        self._taken = False
        self._old = None

    def __enter__(self) -> "SigtermAsInterrupt":
        self.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self.give_back()


def sigterm_exits() -> None:
    """In a child process that serves its parent (a trainer rank): SIGTERM ends it with exit
    code 128 + 15 through its ``finally`` (its executor and loader workers stopped), not by
    the default action that skips them.

    The handler's ``SystemExit`` can land inside a ``__del__`` (seen with one core busy: a
    multiprocessing ``Connection`` closed by the garbage collector), where Python prints
    "Exception ignored ... SystemExit: 143" on the user's terminal and drops it; the rank
    then went on until the launcher's SIGKILL. Such an exit is said nothing of and the
    signal sent again to the main thread from a short-lived thread, so that the handler
    runs after the finaliser returned (and interrupts a blocking read, which a signal
    delivered to another thread would not)."""
    import _thread

    in_hook = [False]

    def again() -> None:
        try:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        except (OSError, ValueError):  # pragma: no cover - the process is ending
            pass

    def on_term(signum: int, frame: Any) -> None:
        if in_hook[0]:                 # inside the hook below: not now, once it returned
            _thread.start_new_thread(again, ())
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    previous = sys.unraisablehook

    def unraisable(info: Any) -> None:
        if isinstance(info.exc_value, SystemExit) and info.exc_value.code == 128 + signal.SIGTERM:
            in_hook[0] = True
            try:
                _thread.start_new_thread(again, ())
            finally:
                in_hook[0] = False
            return
        previous(info)

    sys.unraisablehook = unraisable
