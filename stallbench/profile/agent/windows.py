"""``--live`` in the job (issue 60): each stream's running totals and its stall over time, in
windows, bounded for a job of any length; only loaded when the settings ask for it.

Rules it keeps, and why:

- **Sums, not batches**: a window holds its batches' count, samples, wait, step, start-up
  wait and longest wait, so memory grows with the windows kept, never with the batches; past
  ``LiveSettings.max_windows`` adjacent pairs merge and the width doubles (``_coarsen``). The
  stream's per-batch records stop at ``keep_batches`` (``Tally.keeps``); the batches past
  it are counted here only (``rest``), so the result's totals stay whole.
- **Unix-time grid**: window ``k`` covers ``[k * width, (k + 1) * width)`` of Unix time
  (the process's perf clock plus its offset at start), so every rank's and every node's
  windows line up (the wire's ``Windows``). A wait or a step that spans windows is split by
  time over them: a ten-minute stall shows in the ten minutes it lasted, not in the window
  its batch came back in.
- **Cheap per batch**: one comparison with the open window's end, five additions; a window
  closes at most once per width (a few list appends), a coarsening once per ``max_windows``
  closes. Nothing is written from the loop: a daemon thread (``_Writer``, started with the
  first tally, once per process) writes the totals every ``WRITE_S`` when they changed and
  the closed windows when one closed (``dirty``), so the endpoint's figures follow the job
  within a second even when the loop pauses after a pass (validation, a checkpoint, the end
  of training) and the loop's own thread pays only the additions; the exit's flush writes
  both once more, final.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from typing import Any, Callable

from . import state, wire

_EMPTY = (0, 0, 0.0, 0.0, 0.0, 0.0)
WRITE_S = 1.0           # how often the live records are written while anything changed


class Tally:
    """One stream's figures under ``--live``: its open window (``cur``: batches, rows, wait,
    step, start-up wait, longest wait), its closed windows (``closed``: start index -> the
    same six), their sums (``done``), and its batches past the per-batch cap (``rest``)."""

    __slots__ = ("width", "most", "keep", "offset", "k", "start", "end", "cur", "closed",
                 "done", "rest", "kept", "passes", "first_wait", "last", "dirty")

    def __init__(self, live: "wire.LiveSettings", offset: float) -> None:
        self.width = float(live.window_s)
        self.most = int(live.max_windows)
        self.keep = int(live.keep_batches)
        self.offset = offset            # Unix time - perf clock, fixed at the process's start
        self.k = None                   # the open window's index (None: none open)
        self.start = self.end = -math.inf   # the open window, on the perf clock
        self.cur = list(_EMPTY)
        self.closed: dict = {}
        self.done = [0, 0, 0.0, 0.0, 0.0]
        self.rest = [0, 0, 0, 0.0, 0.0]     # passes, batches, rows, wait, step past the cap
        self.kept = 0                   # batches in per-batch records
        self.passes = 0
        self.first_wait = None
        self.last = 0.0                 # the last batch's time (perf clock)
        self.dirty = False              # a window closed since the windows were written

    def keeps(self) -> bool:
        """Whether this batch goes into the per-batch records too (the first ``keep``)."""
        if self.kept < self.keep:
            self.kept += 1
            return True
        return False

    def add(self, t: float, wait: float, step: float, rows: int, first: bool) -> None:
        """One batch returned at ``t`` (perf clock) after ``wait``; ``step``: the loop's time
        before asking for it (0 for a pass's first batch); ``first``: a pass's first batch
        (its wait is the pass's start-up)."""
        if t >= self.end or t - wait - step < self.start:
            wait, step = self._spread(t, wait, step, first)
        c = self.cur
        c[0] += 1
        c[1] += rows
        c[2] += wait
        c[3] += step
        if first:
            c[4] += wait
            if self.first_wait is None:
                self.first_wait = wait
        if wait > c[5]:
            c[5] = wait
        self.last = t

    def add_step(self, t: float, step: float) -> None:
        """A pass's last step (its end came after it), ending at ``t``."""
        if step > 0:
            if t >= self.end or t - step < self.start:
                _, step = self._spread(t, 0.0, step)
            self.cur[3] += step

    def past_cap(self, wait: float, step: float, rows: int, new_pass: bool) -> None:
        """A batch past the per-batch cap: counted in ``rest`` (its window has it too)."""
        r = self.rest
        r[0] += new_pass
        r[1] += 1
        r[2] += rows
        r[3] += wait
        r[4] += step

    def _spread(self, t: float, wait: float, step: float, first: bool = False) -> tuple:
        """Open the window of ``t``; the parts of the step and the wait (in that order, the
        wait ending at ``t``) that fell before it go to the windows they fell in (a pass's
        first wait: as start-up there too). Returns the wait and step left for the window
        of ``t``."""
        self._open(t)
        t0 = t - wait - step
        if t0 >= self.start:
            return wait, step
        if (self.k - math.floor((t0 + self.offset) / self.width)) > self.most:
            while (self.k - math.floor((t0 + self.offset) / self.width)) > self.most:
                self._coarsen()
        for lo, hi, cols in ((t0, t0 + step, (3,)), (t - wait, t, (2, 4) if first else (2,))):
            lo = max(lo, t0)
            while hi > lo and lo < self.start:
                k = math.floor((lo + self.offset) / self.width)
                edge = min((k + 1) * self.width - self.offset, hi, self.start)
                row = self._closed_row(k)
                for col in cols:
                    row[col] += edge - lo
                    self.done[col] += edge - lo
                lo = edge
        return max(min(wait, t - self.start), 0.0), max(min(step, t - wait - self.start), 0.0)

    def _closed_row(self, k: int) -> list:
        row = self.closed.get(k)
        if row is None:
            row = self.closed[k] = list(_EMPTY)
            self.dirty = True
        return row

    def _open(self, t: float) -> None:
        """Close the open window (its figures into ``closed``) and open the one of ``t``. A
        close that coarsened may have made the window of ``t`` the open one again."""
        while True:
            k = math.floor((t + self.offset) / self.width)
            if k == self.k:
                return
            width = self.width
            self._close()
            if self.width == width:
                break
        self.k = k
        self.start = k * self.width - self.offset
        self.end = self.start + self.width

    def _close(self) -> None:
        c = self.cur
        if self.k is not None and any(c[:5]):
            wire.live.add_into(self._closed_row(self.k), c)
            for i in range(5):
                self.done[i] += c[i]
            self.dirty = True
        self.cur = list(_EMPTY)
        while len(self.closed) > self.most:
            self._coarsen()

    def _coarsen(self) -> None:
        """Twice the width: adjacent closed windows merge; the open window joins the closed
        one it now shares a window with."""
        self.width *= 2
        merged: dict = {}
        for k, row in self.closed.items():
            wire.live.add_into(merged.setdefault(k // 2, list(_EMPTY)), row)
        self.closed = merged
        self.dirty = True
        if self.k is not None:
            self.k //= 2
            self.start = self.k * self.width - self.offset
            self.end = self.start + self.width
            row = self.closed.pop(self.k, None)
            if row is not None:
                for i in range(5):
                    self.done[i] -= row[i]
                wire.live.add_into(self.cur, row)

    def windows(self, rows: list) -> "wire.Windows":
        return wire.Windows.of_rows(self.width, rows)

    def record(self, st, now_unix_of) -> "wire.LiveStream":
        """The stream's running totals and its open window (``wire.LiveStream``)."""
        c, d = self.cur, self.done
        open_ = [(self.k, list(c))] if self.k is not None and any(c[:5]) else []
        r = self.rest
        return wire.LiveStream(
            key=st.key, name=st.name, kind=st.kind, role=st.role, passes=self.passes,
            batches=d[0] + c[0], rows=d[1] + c[1], wait_s=d[2] + c[2], step_s=d[3] + c[3],
            startup_wait_s=d[4] + c[4], first_wait_s=self.first_wait,
            last_batch_unix=now_unix_of(self.last) if self.last else 0.0,
            open=self.windows(open_), unmeasured=st.unmeasured,
            rest=wire.Rest(passes=r[0], batches=r[1], rows=r[2], wait=r[3], step=r[4]))


def tally(off: float, write: Callable[[list, bool], bool]):
    """A stream's ``Tally`` under ``--live`` (None in a plain profile: nothing of this runs);
    the process's writer thread starts with its first. ``off``: the writer's wall-minus-perf
    clock offset; ``write``: the writer's ``write_live`` (handed in: this module sits below
    the writer and never imports it)."""
    live = state.SETTINGS.live
    if live is None:
        return None
    _Writer.start(write)
    return Tally(live, off)


class _Writer:
    """The process's live writer thread (see the module docstring); one per process (a
    forked child starts its own with its first tally: threads do not survive a fork)."""

    pid = 0
    stop = threading.Event()

    @classmethod
    def start(cls, write: Callable[[list, bool], bool]) -> None:
        if cls.pid == os.getpid():
            return
        cls.pid = os.getpid()
        cls.stop = threading.Event()
        t = threading.Thread(target=cls._loop, args=(cls.stop, write), name="stallbench-live",
                             daemon=True)
        t.start()

    @staticmethod
    def _loop(stop: threading.Event, write: Callable[[list, bool], bool]) -> None:
        seen = None
        while not stop.wait(WRITE_S):
            if not state.own_process():
                return
            with state.LOCK:
                streams = list(state.STREAMS)
            now = tuple((t.done[0] + t.cur[0], t.done[3] + t.cur[3], t.passes, t.dirty)
                        for t in (s.tally for s in streams) if t is not None)
            if now != seen:
                write(streams, False)
                seen = now


def stop_writer() -> None:
    """At exit, before the final flush writes the records: the thread writes no more."""
    _Writer.stop.set()


def records(streams: list, force: bool, header: Callable[[], Any], off: float):
    """(the ``Live`` record and its file name, the ``WindowsPart`` and its name or None where
    no window closed since the last write and this is not the exit's flush), for the writer;
    None where no stream has a tally."""
    tallies = [(s, s.tally) for s in streams if getattr(s, "tally", None) is not None]
    if not tallies:
        return None
    host, pid, image = socket.gethostname(), os.getpid(), state.IMAGE
    live = wire.Live(header=header(),
                     streams=tuple(t.record(s, lambda p: p + off) for s, t in tallies),
                     exiting=force)
    win = None
    if force or any(t.dirty for _, t in tallies):
        # list() first: the loop's thread may close a window meanwhile (one C call: atomic)
        win = wire.WindowsPart(host=host, pid=pid, image=image, streams={
            s.key: t.windows(sorted(list(t.closed.items()))) for s, t in tallies})
    return ((live.file_name(host, pid, image), live),
            (win.file_name(host, pid, image), win) if win is not None else None, tallies)
