"""The part writer: each process's figures into the run directory, as the wire's records.

Rules it keeps, and why:

- **Files, not pipes**: each process writes its own part (JSON, atomically replaced) into the
  run directory the launcher named in the settings (a Ray cluster's worker on another
  machine: into the job's collector actor, ``sink``/``raysink``): the trainer at each epoch end (at most
  every ``FLUSH_S``) and at exit, loader workers at most every ``FLUSH_S`` and when their
  loop ends (multiprocessing children leave through ``os._exit``: no ``atexit``). Nothing is
  sent through the job's own queues, so its batches are exactly its own.
- **A flush costs what is new**: the finished epochs go to files of their own, once; the
  trainer's part (its streams, its stages, the open epoch) is small and rewritten.
- **Never raises**: a flush runs inside the job's ``__next__``, at epoch ends, before an
  ``exec`` and at exit; whatever fails is said once on stderr, and a write that failed leaves
  a ``lost-*`` marker so the launcher never publishes what is left as whole.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from . import sink, state, util, windows, wire

FLUSH_S = 1.0
FLUSH_BUDGET = 0.005        # at most this share of the job's time goes to writing parts (issue
                            # 60: --live is held to 1% of the step; the writes get half of it)

T0_PERF = state.perf()
T0_WALL = time.time()
_next_flush = 0.0           # a loader worker's next flush (``stages.stage_add`` asks)
periodic_at = 0.0           # the next mid-epoch flush (FLUSH_S, or more if writes are slow):
                            # the stream's clock compares each batch's time with it
_next_epoch_flush = 0.0     # the earliest epoch-end flush of the same stream again
_last_end_key = ""          # the stream whose epoch end was flushed last
_seq = 0                    # this image's epochs files so far


def write(name: str, payload: dict, wait: bool = True) -> bool:
    """One part, whole, into this process's sink (``sink``: the run directory, or a Ray
    cluster's collector); False (and ``state.LOST`` counted, a ``lost-*`` marker left: an
    empty record, which a full disk still takes) when it could not be written. ``wait``
    False: a collector's put is sent, not waited for (a flush inside the job's loop: the
    wait would be the loop's step); an exit's flush waits."""
    out = sink.current()
    if out is None:
        return True
    try:
        out.put(name, json.dumps(payload, default=plain), wait=wait)
        return True
    except Exception as exc:  # noqa: BLE001 - a lost part must never fail the user's job
        util.say(f"cannot write its figures to {out.where()} ({type(exc).__name__}: {exc})")
        state.LOST[0] += 1
        try:
            out.mark(_lost_marker())
        except Exception:  # noqa: BLE001
            pass                    # the launcher also finds a run directory it cannot write
        return False


def _lost_marker() -> str:
    return wire.lost_marker(socket.gethostname(), os.getpid(), state.IMAGE)


def _recovered() -> None:
    """Every figure written after earlier writes failed: nothing is lost any more."""
    if state.LOST[0]:
        state.LOST[0] = 0
        out = sink.current()
        if out is not None:
            out.remove(_lost_marker())


def plain(o: object) -> object:
    """What JSON cannot write (a numpy int in a loader's settings): its Python scalar
    (numpy's ``.item()``), else a name of its type; a part is never lost to a type, and no
    method of a user's class runs here."""
    t = type(o)
    if t.__module__ == "numpy":
        try:
            return o.item()
        except Exception:  # noqa: BLE001
            pass
    return f"<{t.__module__}.{t.__qualname__}>"


def _stages_copy() -> dict:
    """``STAGE_RECORDS`` copied under the lock (other threads add to it while a flush dumps)."""
    with state.LOCK:
        return {k: {n: list(r) for n, r in v.items()} for k, v in state.STAGE_RECORDS.items()}


def _launched() -> bool:
    """A rank of a launcher: torchrun and Ray Train set both RANK and WORLD_SIZE; a process
    in an initialised torch.distributed group is one too. Any other process that iterates a
    loader (a helper the job spawned) is not a rank."""
    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ) or util.dist() is not None


def torch_threads(torch) -> int | None:
    """torch's intra-op threads in this process as it runs now (``OMP_NUM_THREADS``, the
    job's ``torch.set_num_threads``, 1 in a DataLoader worker): the budget that explains a
    10x difference between two runs of one job (issue 42). Read, never set; None where torch
    is not (or not yet fully) imported: the agent never imports it."""
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001 - a half-imported or torn-down torch: not read
        return None


def header():
    """Who writes this part, as ``wire.Header``."""
    torch = sys.modules.get("torch")
    ray = sys.modules.get("ray")
    return wire.Header(host=socket.gethostname(), pid=os.getpid(), ppid=os.getppid(),
                       image=state.IMAGE, launched=_launched(), t0_wall=T0_WALL,
                       t0_perf=T0_PERF, **util.rank(),
                       torch=getattr(torch, "__version__", None),
                       ray=getattr(ray, "__version__", None),
                       torch_threads=torch_threads(torch), cpu_s=time.process_time(),
                       node=util.node())


def flush(force: bool = True, epoch_end: str = "") -> None:
    """The trainer's part (its streams and the stages it timed itself, small: rewritten each
    time) and, in a file of their own, the epochs finished since the last flush (at exit,
    every epoch left): a flush costs what is new, not the whole history. It runs inside the
    job's ``__next__``, at epoch ends, before an ``exec`` and at exit: whatever fails in it
    is said once on stderr, never raised."""
    try:
        _flush(force, epoch_end)
    except Exception as exc:  # noqa: BLE001 - the user's job must not fail for a lost flush
        util.say(f"a flush of its figures failed ({type(exc).__name__}: {exc}); "
                 "this process's figures may be incomplete")


def _flush(force: bool, epoch_end: str) -> None:
    """When: always when ``force``; at an epoch end unless the last flush was so recent that
    this one would take more than ``FLUSH_BUDGET`` of the time since; mid-epoch every
    ``FLUSH_S`` (or longer, by the same budget). A pending epoch end is written by the next
    periodic flush."""
    global _seq, periodic_at, _next_epoch_flush, _last_end_key
    now = state.perf()
    if not force:
        if epoch_end:
            if epoch_end == _last_end_key and now < _next_epoch_flush:
                return
        elif now < periodic_at:
            return
    if os.getpid() != state.PID:        # a forked child that kept the parent's streams
        return
    if not state.STREAMS and not state.STAGE_RECORDS:
        return
    with state.LOCK:
        streams = list(state.STREAMS)
    pending = {s.key: (s, *s.pending_epochs(T0_PERF, force)) for s in streams}
    new = {k: tuple(v[1]) for k, v in pending.items() if v[1]}
    host, pid, image = socket.gethostname(), os.getpid(), state.IMAGE
    ok = True
    if new:
        rec = wire.Epochs(host=host, pid=pid, image=image, seq=_seq, streams=new)
        ok = write(rec.file_name(host, pid, image, _seq), rec.to_json(), force)
        if ok:
            _seq += 1
    if ok:
        for s, _, n in pending.values():
            s.written = n
    # the epochs not in an epochs file yet (the open one), as of now: a process that ends
    # without atexit (killed, os._exit) keeps them up to its last flush. ``from``: how many
    # epochs the files hold, so the merge adds them only to exactly those
    open_ = {}
    for s in streams:
        eps = tuple(ep.record(T0_PERF) for ep in s.epochs[s.written:] if ep.t_req)
        if eps:
            open_[s.key] = (s.written, eps)
    part = wire.Trainer(header=header(), streams=tuple(s.record() for s in streams),
                        stages=_stages_copy(), exiting=force, open=open_)
    ok = write(part.file_name(host, pid, image), part.to_json(), force) and ok
    if force and state.SETTINGS.live is not None:     # the live thread writes meanwhile
        ok = write_live(streams, True) and ok
    if ok:
        _recovered()
    if state.REPLAY is not None:
        state.REPLAY.flush()
    done = state.perf()
    cost = done - now
    if epoch_end:
        _last_end_key = epoch_end
    _next_epoch_flush = done + cost / FLUSH_BUDGET
    periodic_at = done + max(FLUSH_S, cost / FLUSH_BUDGET)


_LIVE_LOCK = threading.Lock()      # the live thread and the exit's flush write one file


def write_live(streams: list, force: bool) -> bool:
    """``--live`` (issue 60): the streams' totals and open windows (``wire.Live``, small)
    and their closed windows (``wire.WindowsPart``) when one closed since the last write, or
    at exit: written by the live thread (``windows``) about once a second, and by the exit's
    flush; a window's figures are on disk within a second of its closing."""
    with _LIVE_LOCK:
        got = windows.records(streams, force, header, T0_WALL - T0_PERF)
        if got is None:
            return True
        (name, live), win, tallies = got
        ok = True
        if win is not None:
            for _, t in tallies:
                t.dirty = False
            ok = write(win[0], win[1].to_json(), force)
            if not ok:
                for _, t in tallies:
                    t.dirty = True
        return write(name, live.to_json(), force) and ok


def flush_soon() -> None:
    """The launcher asked for a flush (``beats``): the next batch writes the part."""
    global periodic_at
    periodic_at = 0.0


def worker_flush_due() -> bool:
    """Whether a loader worker's part is due (``stages.stage_add`` asks after each stage)."""
    return state.perf() >= _next_flush


def flush_worker() -> None:
    """A loader worker's part; runs in a fetch's ``finally``: never raises (see ``flush``)."""
    global _next_flush
    _next_flush = state.perf() + FLUSH_S
    try:
        part = wire.Worker(header=header(), loader=str(state.PROC.worker_loader),
                           stages=_stages_copy())
        if write(part.file_name(socket.gethostname(), os.getpid(), state.IMAGE),
                 part.to_json(), False):
            _recovered()
        if state.REPLAY is not None:
            state.REPLAY.flush()
    except Exception as exc:  # noqa: BLE001
        util.say(f"a flush of its figures failed ({type(exc).__name__}: {exc}); "
                 "this process's figures may be incomplete")


def new_image() -> None:
    """In a forked child (``install``): its epochs files count from 0 under its new image."""
    global _seq
    _seq = 0
