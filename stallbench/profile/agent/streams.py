"""A loader's clocks in the job: one ``Stream`` per loader (a DataLoader, a Ray Data iterator,
a watched iterable), one ``Epoch`` per pass, per batch its request time, wait, step and rows.

Rules it keeps, and why:

- **Per batch, not per item**: the loop's clock is the loader's ``__next__`` (wait = inside
  it, step = between its return and the next call): two clock reads per batch, so no
  sampling is needed to stay inside the 2% overhead target.
- **Per-batch records are a seam**: every batch of a stream goes through
  ``Stream.next_batch`` (``source`` = the loader's own ``__next__``), so a replay (issue 28)
  serves recorded batches by swapping the source, and the records (epoch, index, request
  time, wait, step, rows) say which batch to serve.
- **The job's exceptions are its own**: whatever fails in the clocks switches that loader's
  hooks off with one line (``Stream.switch_off``); the batch is always the loader's.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from . import beats, state, util, windows, wire, writer
from .rows import elements, rows as count_rows

UNREAD = object()       # ``Stream.length`` before the first pass read it
# never rebound (``state``'s docstring): read once, per batch they are this module's globals
perf = state.perf
ACTIVE = state.ACTIVE


class Epoch:
    """One pass over a stream (one ``iter()``): per-batch request time, wait and step."""

    __slots__ = ("t_iter", "t_req", "wait", "step", "rows", "size", "t_last", "t_end",
                 "capped", "cuda", "cpu0", "cpu1", "abandoned", "past_cap", "expected", "more")

    def __init__(self, t: float) -> None:
        self.t_iter = t
        self.expected: int | None = None    # len(loader) at iter(): the batches a pass yields
        self.abandoned = False      # closed because a later pass began
        self.past_cap = False       # capped inside a next(it) loop: served unmeasured after
        self.t_req: list = []
        self.wait: list = []
        self.step: list = []
        self.rows: list = []
        self.size: list = []
        self.t_last = t
        self.t_end: float | None = None
        self.capped = False
        self.more = 0               # --live: batches of this pass past the per-batch cap
        self.cuda: list | None = None   # [(start event, end event)] per batch on a GPU
        # the trainer process's CPU over this epoch (not its start-up: imports, data set-up),
        # as the what-if's t_cpu wants it
        self.cpu0 = time.process_time()
        self.cpu1: float | None = None

    def record(self, t0: float):
        """This pass as the part files carry it (``wire.Epoch``), times from ``t0``."""
        steps = list(self.step)
        if self.t_end is not None and self.t_req:
            steps.append(self.t_end - self.t_last)   # the last batch's step ends at the end call
        gpu_wait, gpu_step, gpu_error = _cuda_times(self.cuda) if self.cuda else ((), (), "")
        return wire.Epoch(
            t_iter=self.t_iter - t0, t_req=tuple(t - t0 for t in self.t_req),
            wait=tuple(self.wait), step=tuple(steps), rows=tuple(self.rows),
            size=tuple(self.size),
            ended=self.t_end is not None, capped=self.capped,
            t_end=(self.t_end if self.t_end is not None else self.t_last) - t0,
            cpu_s=(self.cpu1 if self.cpu1 is not None else time.process_time()) - self.cpu0,
            gpu_wait=tuple(gpu_wait), gpu_step=tuple(gpu_step), gpu_error=gpu_error)


def _cuda_times(events: list) -> tuple:
    """GPU-side wait and step per batch from CUDA events recorded on the current stream when
    the loop asked for a batch (``a``) and when it got it (``b``): wait_i = a_i -> b_i on the
    GPU's clock (the GPU idled that long only if it had finished the previous step's work),
    step_i = b_i -> a_{i+1} (what the GPU spent on the loop's kernels). (wait, step, error):
    a read that failed has no times and its error."""
    try:
        events[-1][1].synchronize()
        wait = [a.elapsed_time(b) / 1e3 for a, b in events]
        step = [events[i][1].elapsed_time(events[i + 1][0]) / 1e3 for i in range(len(events) - 1)]
        return wait, step, ""
    except Exception as exc:  # noqa: BLE001 - a failed GPU read must not fail the job
        return (), (), str(exc)[:200]


class Stream:
    """One loader (a DataLoader, a Ray Data iterator, a watched iterable) in this process.

    ``unmeasured``: why its figures are not kept (its hooks switched off after an exception
    inside hook code, or two passes or threads over it at once, whose waits and steps are
    not one loop's); the merge leaves such a stream out and the launcher says why."""

    def __init__(self, kind: str, label: str, settings: dict | None = None,
                 named: str = "") -> None:
        """``named``: what the job's framework calls the loader (``framework_name``): the
        stream's name as it stands (``val_dataloader``), ``#order`` added only where another
        stream of this process with that name is in a pass now (decided at the first pass:
        a Hugging Face ``Trainer`` makes a DataLoader it never iterates and the prepared copy
        it does, both in ``get_train_dataloader``); a framework's loader made anew for each
        pass (the Trainer's ``get_eval_dataloader`` at every evaluation) keeps the name, and
        the merge joins its passes into one row (issue 57: one eval loader was three rows,
        ``eval_dataloader``, ``#5``, ``#7``); else ``<label>#<order>``."""
        with state.LOCK:
            self.order = len(state.STREAMS)
            state.STREAMS.append(self)
        self.kind = kind
        self.label = label
        self.name = named or f"{label}#{self.order}"
        self.named = named
        self.key = f"{os.getpid()}-{state.IMAGE}:{self.order}"
        self.settings = wire.LoaderSettings(settings)
        self.notes: list = []
        self.epochs: list = []
        self.written = 0            # epochs already in an epochs-*.json file
        self.default_rows = self.settings.batch_rows
        # the door says a batch that is a list holds its samples (``rows.rows``' ``listed``)
        self.listed = bool(getattr(util.door_of(kind), "LISTS_ARE_SAMPLES", False))
        self.unmeasured = ""
        self.busy = 0               # the thread inside next_batch now (0: none)
        self.role = ""              # "producer": a thread that feeds the loop a queue
        self.fed_by = ""            # a queue's stream: the name of the stream feeding it
        self.length = UNREAD        # len(loader) read at its first pass (``passes.length``)
        self.passes = 0
        # --live: totals and windows (None: a plain profile)
        self.tally = windows.tally(writer.T0_WALL - writer.T0_PERF, writer.write_live)
        beats.loader_made(self.name)

    def switch_off(self, what: str) -> None:
        """Hooks off for this loader: it runs on exactly as without stallbench."""
        if not self.unmeasured:
            self.unmeasured = what
            util.unmeasured(self.name, what)

    def new_epoch(self, t: float) -> Epoch:
        """A new pass; a previous pass the loop left with ``break`` (never ended) is closed
        at its last batch first: left open, its CPU would run to process exit and overlap
        every later epoch's, and the run would read as one that exited mid-epoch."""
        if self.epochs:
            self.close_abandoned(self.epochs[-1])
        elif self.named:
            with state.LOCK:
                taken = any(s.name == self.named and s.epochs and s.epochs[-1].t_end is None
                            for s in state.STREAMS if s is not self)
            if taken:
                self.name = f"{self.named}#{self.order}"
        ep = Epoch(t)
        self.passes += 1
        tally = self.tally
        if tally is not None:
            tally.passes += 1
            if self.epochs and not self.epochs[-1].t_req and tally.kept >= tally.keep:
                # past --live's per-batch cap a pass has no per-batch record (its batches
                # are in the windows): only the latest one is kept, for its own clocks
                self.epochs[-1] = ep
                return ep
        self.epochs.append(ep)
        return ep

    def close_abandoned(self, ep: Epoch) -> None:
        """End an epoch the loop stopped asking from, at its last batch (its last step is
        not timed: nothing marks where it ended). Its CPU ends now: the trainer's CPU
        between the ``break`` and now is in it (no per-batch CPU clock read: overhead)."""
        if ep.t_end is None:
            ep.abandoned = True
            self.end_epoch(ep, ep.t_last)

    def next_batch(self, ep: Epoch, source, it):
        """One batch through the stream's clocks; ``source(it)`` makes it (the seam a replay
        swaps, see the module docstring). StopIteration ends the epoch and flushes the part.

        Whatever fails in the clocks switches this loader's hooks off (``switch_off``); the
        batch itself is always ``source(it)``'s, and its exceptions are the job's own."""
        if self.unmeasured or ep.past_cap:
            return source(it)
        measured = False            # decided inside the guard; the batch is made outside it,
        try:                        # so the job's own exceptions are never taken for ours
            t0 = perf()
            me = threading.get_ident()
            if self.busy or ep.abandoned:
                # another thread inside now, or a pass resumed after a later one began: two
                # loops over one loader (two threads), whose figures would be half of each
                self.switch_off("it was iterated from two threads or by two passes at once, "
                                "so its waits and steps are not one loop's")
            elif cap_reached(ep, state.SETTINGS.max_batches):
                if not ep.capped:
                    ep.capped = True
                    self.end_epoch(ep, t0)
                if _in_for_loop():
                    raise StopIteration
                # a next(it) loop: StopIteration would fail the job; the measured part is
                # kept and the rest of the pass is served unmeasured
                ep.past_cap = True
            else:
                cuda = _cuda_event() if ep.cuda is not None or _cuda_on() else None
                replay = state.REPLAY
                if replay is not None:
                    source = replay.source(self, ep, source, it)
                prev = getattr(ACTIVE, "stream", None)
                measured = True
        except StopIteration:
            raise
        except Exception:  # noqa: BLE001 - hook code failed: this loader runs unmeasured
            self.switch_off("its batches could not be timed")
        if not measured:
            return source(it)
        ACTIVE.stream = self
        self.busy = me
        try:
            batch = source(it)
        except StopIteration:
            self.busy = 0
            if not ep.t_req:        # a pass that yielded nothing: an empty loader
                beats.empty_pass()
            self.end_epoch(ep, t0)
            raise
        finally:
            self.busy = 0
            ACTIVE.stream = prev
        try:
            self._counted(ep, t0, perf(), batch, me, cuda)
        except Exception:  # noqa: BLE001
            self.switch_off("its batches could not be timed")
        return batch

    def _counted(self, ep: Epoch, t0: float, t1: float, batch, me: int, cuda) -> None:
        """A batch's figures, asked for at ``t0``, returned at ``t1``: into the pass's
        per-batch records (a pass's first batch waits from ``iter()``: worker start-up is in
        it) and, under ``--live``, the stream's windows; past ``--live``'s per-batch cap into
        the windows only (``windows.Tally``)."""
        first = not ep.t_req and not ep.more
        wait = t1 - (ep.t_iter if first else t0)
        step = 0.0 if first else t0 - ep.t_last
        rows = count_rows(batch, self.default_rows, self.listed)
        tally = self.tally
        if tally is None or tally.keeps():
            if not first:
                ep.step.append(step)
            ep.t_req.append(ep.t_iter if first else t0)
            ep.wait.append(wait)
            ep.rows.append(rows)
            ep.size.append(elements(batch))
            if cuda is not None:
                if ep.cuda is None:
                    ep.cuda = []
                ep.cuda.append((cuda, _cuda_event()))
        else:
            if ep.t_req and not ep.more:    # the pass's last kept batch's step: with it
                ep.step.append(step)
                tally.past_cap(wait, 0.0, rows, False)
            else:
                tally.past_cap(wait, step, rows, first)
            ep.more += 1
        ep.t_last = t1
        if tally is not None:
            tally.add(t1, wait, step, rows, first)
        if me != state.MAIN:   # a put of it into a queue.Queue: a feed (thread_queue);
            ACTIVE.produced = (self, id(batch), rows)    # main never feeds
        beats.count_batch(self.name, self.passes, len(ep.wait) + ep.more, t1)
        if t1 >= writer.periodic_at:
            writer.flush(force=False)

    def end_epoch(self, ep: Epoch, t: float) -> None:
        """An epoch ends: its part is written now (not only at exit: a Ray Train worker that
        Ray ends never runs ``atexit``), unless this same stream's last epoch end was written
        so recently that writing again would cost more than ``FLUSH_BUDGET`` of the time
        since (``next(iter(loader))`` every step ends an epoch per batch); then the next
        periodic flush or the exit writes it."""
        if ep.t_end is None:
            ep.t_end = t
            ep.cpu1 = time.process_time()
            tally = self.tally
            if tally is not None and (ep.t_req or ep.more):     # the pass's last step
                tally.add_step(t, t - ep.t_last)
                if ep.more:
                    tally.rest[4] += t - ep.t_last
            writer.flush(force=False, epoch_end=self.key)

    def record(self):
        """This stream as the part files carry it (``parts.Stream``)."""
        return wire.Stream(kind=self.kind, name=self.name, order=self.order, key=self.key,
                           settings=self.settings, notes=tuple(self.notes),
                            unmeasured=self.unmeasured, role=self.role, fed_by=self.fed_by)

    def pending_epochs(self, t0: float, all_: bool) -> tuple[list, int]:
        """The epochs not written yet: the finished ones (every one at exit), in order, and
        how far ``written`` moves once they are (``take``: only after the write succeeded, so
        a failed write is tried again at the next flush instead of losing them)."""
        out = []
        n = self.written
        while n < len(self.epochs):
            ep = self.epochs[n]
            if ep.t_end is None and not all_:
                break
            if ep.t_req:
                out.append(ep.record(t0))
            n += 1
        return out, n


def cap_reached(ep: Epoch, cap) -> bool:
    """``--max-batches`` reached in this pass."""
    return bool(cap) and len(ep.wait) + ep.more >= cap


def _in_for_loop() -> bool:
    """Whether StopIteration at ``--max-batches`` ends a loop rather than fails the job: the
    code asking for the batch is a ``for`` loop (its frame stands at ``FOR_ITER``; a
    comprehension, ``zip`` inside a ``for`` too), or a library's (a trainer framework's
    ``next(iterator)`` handles the end of an epoch: it meets one every epoch). A ``next(it)``
    in the user's own code gets no StopIteration: it would fail the job. Frames of the agent's
    files (a watched pass's generator, the torch ``__next__`` wrapper, any door's hooked
    method) are skipped. Not CPython, or no frame to read: taken as a loop (the behaviour
    before issue 38)."""
    try:
        import dis
        f = sys._getframe(2)
        ours = state.HERE + os.sep
        while f is not None and f.f_code.co_filename.startswith(ours):
            f = f.f_back
        if f is None:
            return True
        code = f.f_code.co_code
        i = f.f_lasti
        if not (0 <= i < len(code)) or dis.opname[code[i]].startswith("FOR_ITER"):
            return True
        return util.library_file(f.f_code.co_filename)
    except Exception:  # noqa: BLE001
        return True


def _cuda_on() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _cuda_event():
    """A CUDA event recorded now (only where ``_cuda_on``: the job imported torch)."""
    torch = sys.modules["torch"]
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def has_streams() -> bool:
    """Whether this process made a stream (a queue's ``get`` in a process without a loader
    has nothing that could feed it)."""
    return bool(state.STREAMS)


def forget_streams() -> None:
    """A loader worker (forked from the trainer): the trainer's streams and stage records are
    not this process's."""
    state.STREAMS.clear()
    state.STAGE_RECORDS.clear()
