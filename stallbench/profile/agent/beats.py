"""Beats: what the launcher reads while the job runs and when no figures came back
(``--progress-timeout``; "exited before its first batch", "an empty loader", "figures lost").

One small file per process, ``beat-<host>-<pid>`` (no ``.json``: it is not a part),
rewritten when the process starts, makes a loader, has an empty pass, at most every
``BEAT_S`` while batches come, and at exit. Counts only: the names are the streams' own.
A beat is also where the launcher's ``wire.FLUSH_MARK`` is seen (one stat per beat).
"""

from __future__ import annotations

import json
import os
import socket

from . import sink, state, util, wire, writer

BEAT_S = 0.5
_names: list = []         # the names of this process's first loaders (a few)
_batches = 0
_last = None            # (stream name, epoch, batch index) of the last batch
_empty = 0
_exited = False
_own_iter: list = []    # classes of its loaders that define their own __iter__ (a few)
_exec_lost = ""         # what this process's last exec dropped of the agent's start (install)
_next_beat = 0.0
_flush_asked = False
_told = False           # a beat with this process's loaders was waited for (a collector)


def loader_made(name: str) -> None:
    """A stream was made: its name for the launcher's lines (a few), said at once."""
    if len(_names) < 8:
        _names.append(name)
    beat(force=True)


def empty_pass() -> None:
    """A pass that yielded nothing (an empty loader), said at once."""
    global _empty
    _empty += 1
    beat(force=True)


def count_batch(name: str, epoch: int, index: int, t: float | None = None) -> None:
    """One more batch of this process (the last: batch ``index`` of epoch ``epoch`` of stream
    ``name``); with ``t`` (the stream's clock), the beat is rewritten when due: at the
    process's first batch and every ``BEAT_S``."""
    global _batches, _last
    _batches += 1
    _last = (name, epoch, index)
    if t is not None and (t >= _next_beat or _batches == 1):
        beat(force=True)


def beat(force: bool = False) -> None:
    """Rewrite this process's beat file; never raises (a lost beat is a lost hint). Also
    where a launcher's ``wire.FLUSH_MARK`` is seen (one stat per beat): the next batch then
    flushes its part, the open epoch with it, so a trial that ``stallbench tune`` ends keeps
    its batches up to now (``launcher.run_once``'s ``stop``)."""
    global _next_beat, _flush_asked, _told
    now = state.perf()
    if not force and now < _next_beat:
        return
    _next_beat = now + BEAT_S
    out = sink.current()
    if out is None:
        return
    try:
        if not _flush_asked and out.flush_asked():
            _flush_asked = True
            writer.flush_soon()
    except Exception:  # noqa: BLE001 - a hint
        pass
    try:
        pid = os.getpid()
        rec = wire.Beat(pid=pid, loaders=tuple(_names), batches=_batches, last=_last,
                        empty=_empty, exited=_exited, node=util.node(),
                        exec_lost=_exec_lost, own_iter=tuple(_own_iter))
        # the first beat with a loader and the exit's wait for a collector's reply (a process
        # killed right after is still named); the others are sent, not waited for (the
        # loop's step would hold the wait) and, as files, written in place (``sink.Files``)
        wait = _exited or (bool(_names) and not _told)
        out.put(wire.Beat.file_name(socket.gethostname(), pid), json.dumps(rec.to_json()),
                wait=wait, in_place=not wait)
        _told = _told or wait
    except Exception:  # noqa: BLE001 - never fail the job for a hint
        pass


def own_iter(cls_name: str) -> None:
    """A loader was made whose class defines its own ``__iter__`` (a door saw it): where no
    batch of it comes, the launcher says why (its batches never passed the hooked one)."""
    if len(_own_iter) < 8 and cls_name not in _own_iter:
        _own_iter.append(cls_name)
        beat(force=True)


def exec_lost(what: str) -> None:
    """The process is about to exec a new image whose environment drops ``what`` ("" when
    it keeps the agent's start): said in the beat, which the writer's flush then writes."""
    global _exec_lost
    _exec_lost = what
    beat(force=True)


def beat_exit() -> None:
    """At exit (after the final flush): the process ended through its exit handlers."""
    global _exited
    _exited = True
    beat(force=True)
