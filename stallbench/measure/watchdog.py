"""No wait without an end: ``[run] progress_timeout_s``.

While the trainer waits for a batch, a frozen or dead producer (a loader worker stopped with
``kill -STOP``, a Flight server that stops mid-stream, a Ray task that never returns) would
keep it waiting forever. The rule: if no batch arrives *and* no producer completes any work
for ``progress_timeout_s``, the run ends with one line naming the executor and what it waited
for, exit 2, no result; the command's clean-up then stops every process it started.

Progress is a clock (``tick``) that producers' completed work moves: every item an executor
yields (a row group produced, fetched or received: bulk materialisation ticks per item too),
every batch the trainer receives. Only the time the trainer spends *waiting* counts: a slow
model step is not a stall. The watchdog thread raises ``NoProgress`` in the waiting thread:
by a SIGALRM to the main thread (it interrupts blocking waits there), else asynchronously.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from ..errors import NoProgress

__all__ = ["NoProgress", "Watchdog", "tick", "ticks", "ticking", "excused", "publish", "state",
           "SharedSlots", "map_slots"]

# What a trainer rank is doing, as its launcher reads it (``publish``): the launcher ends a
# job that makes no progress only when a rank waits on data or on its own set-up, or is
# stopped; a rank in the all-reduce waits for the others, and a model step is not a wait.
IDLE, SETUP, WAITING, COLLECTIVE, BUSY = 0.0, 1.0, 2.0, 3.0, 4.0


class _Clock:
    last = time.monotonic()
    ticks = 0                  # how many: what another machine's process can report
    slots: Any = None          # a rank's shared array (see ``publish``), or None
    index = 0


def publish(slots: Any, rank: int) -> None:
    """In a trainer rank process: also write every ``tick`` and ``state`` into ``slots``
    (a shared array of doubles, two per rank: the CLOCK_MONOTONIC time of its last progress,
    one clock for every process of the machine, and its state), so the launcher can tell a
    rank that is stuck, or stopped, from one that works (``trainers.processes``)."""
    _Clock.slots, _Clock.index = slots, 2 * rank
    tick()


class SharedSlots:
    """Progress slots (``publish``) for processes that are not this one's children (Ray
    actors on this node): a small file of this node's memory (``/dev/shm``) that each maps
    (``map_slots``). ``slots`` reads like the launcher's shared array."""

    def __init__(self, count: int) -> None:
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix=f"stallbench-progress-{os.getpid()}-",
                                           dir=where)
        try:
            os.ftruncate(fd, 8 * count)
            self._mm: mmap.mmap | None = mmap.mmap(fd, 8 * count)
        finally:
            os.close(fd)
        self.slots: Any = memoryview(self._mm).cast("d")

    def close(self) -> None:
        if self.slots is not None:
            self.slots.release()
            self.slots = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        try:
            os.unlink(self.path)
        except OSError:
            pass


def map_slots(path: str, count: int) -> Any:
    """In another process on this node: ``SharedSlots(count)``'s slots, or None where the
    file is not there (another machine) or not of that size."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != 8 * count:
            return None
        return memoryview(mmap.mmap(fd, 8 * count)).cast("d")   # kept for the process's life
    finally:
        os.close(fd)


def state(code: float) -> float:
    """What this rank is doing now (``IDLE`` ... ``BUSY``; nothing outside a rank); returns
    what it was doing before."""
    if _Clock.slots is None:
        return IDLE
    before = _Clock.slots[_Clock.index + 1]
    _Clock.slots[_Clock.index + 1] = code
    return before


def tick() -> None:
    """A producer completed work (or a batch arrived): the wait is not stuck."""
    _Clock.last = now = time.monotonic()
    _Clock.ticks += 1
    if _Clock.slots is not None:
        _Clock.slots[_Clock.index] = now


def ticks() -> int:
    """This process's progress so far, as a count (clocks of two machines do not compare):
    the Ray Client pump actor reports it to the trainer (``executors.ray.driver``)."""
    return _Clock.ticks


@contextlib.contextmanager
def excused(period_s: float = 0.25) -> Iterator[None]:
    """While the body runs, the clock ticks on its own: a wait that is bounded elsewhere (the
    Ray Client pump actor's start, ``PUMP_START_S``) is not a stuck producer. A tick after
    each short poll inside such a wait is not enough: one poll through Ray Client took more
    than a 2 s ``progress_timeout_s`` on a loaded machine, and the run ended as "no producer
    completed any work" while the pump was still starting."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(period_s):
            tick()

    t = threading.Thread(target=beat, daemon=True, name="stallbench-excused-wait")
    tick()
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        tick()


def ticking(items: Iterator[Any]) -> Iterator[Any]:
    """``items`` (an executor's stream), ticking the clock at every item it yields. Closing
    this closes ``items`` at once: an executor's stream does its end-of-run work (workers
    shut down, its run figures) in its ``finally``, which must not wait for the collector."""
    try:
        for item in items:
            tick()
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


class Watchdog:
    """Ends a wait that makes no progress for ``timeout_s`` (see the module docstring)."""

    def __init__(self, timeout_s: float, message: Callable[[], str]) -> None:
        self.timeout_s = float(timeout_s)
        self.message = message
        self.waiting_since: float | None = None
        self.fired: str | None = None
        self.target = threading.current_thread()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._old_handler: Any = None
        self._main = self.target is threading.main_thread()

    def __enter__(self) -> "Watchdog":
        tick()
        if self._main:
            self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._thread = threading.Thread(target=self._watch, name="stallbench-watchdog",
                                         daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._main:
            signal.signal(signal.SIGALRM, self._old_handler or signal.SIG_DFL)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around the trainer's wait for its next batch."""
        self.waiting_since = time.monotonic()
        before = state(WAITING)
        try:
            yield
        except NoProgress as exc:   # raised asynchronously (no message), by the alarm, or
            # by the wait itself with its own line (a Flight call past its deadline): kept
            raise NoProgress(str(exc) or self.fired or "no progress") from None
        finally:
            self.waiting_since = None
            state(before)
        tick()
        if self.fired:           # fired just as the batch came: the run is ending anyway
            raise NoProgress(self.fired)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.fired and self.waiting_since is not None:
            raise NoProgress(self.fired)

    def _watch(self) -> None:
        if self.timeout_s == float("inf"):     # not watched: nothing to do
            return
        step = min(1.0, self.timeout_s / 10)
        while not self._done.wait(step):
            since = self.waiting_since
            if since is None or self.fired:
                continue
            idle = time.monotonic() - max(_Clock.last, since)
            if idle < self.timeout_s:
                continue
            self.fired = self.message()
            if self._main:
                signal.pthread_kill(self.target.ident, signal.SIGALRM)   # type: ignore[arg-type]
            else:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.target.ident), ctypes.py_object(NoProgress))
