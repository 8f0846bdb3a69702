"""``--live``'s records in the result (issue 60): the batches past the per-batch cap added to
a stream's figures, and its windows as the result's stall over time.

Why apart from ``merge``: the per-batch figures stay ``merge``'s; a ``--live`` run's stream
also has a ``wire.Rest`` (the batches its agent counted past ``keep_batches``, in no
per-batch record) and windows. Every total of the result (batches, samples, wait, step,
epoch, the steady phase) adds the rest, so a 3-day job's result is whole; what is read per
batch (the timeline, the straggler's per-step test, the trace, a tune's rates) covers the
kept batches, and the result says so (``REST_NOTE``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .agent import wire
from ..results import Phases, StallOverTime, StallSeries

RULE = ("per window of the grid (Unix time, width_s; doubled as often as a long job needed to "
        "keep at most max_windows per loader and rank): the batches that came back in it, "
        "their samples, the seconds the loop waited and stepped in it (a wait or step "
        "spanning windows split by time), passes' first waits (start-up) and the longest "
        "wait")


def rest_note(rest: wire.Rest, kept: int) -> str:
    """The note a stream past the per-batch cap gets (the result's totals include it)."""
    return (f"--live kept the first {kept} batches as per-batch records and counted the "
            f"other {rest.batches} in windows only: totals include them; the timeline, the "
            "trace and the straggler's per-step test cover the kept batches")


def attach(sr: Any, parts: wire.Parts, image_key: tuple[str, int, str], key: str) -> None:
    """A stream's ``--live`` records (its totals' rest, its closed and open windows) added
    to its ``merge.StreamRun`` (a stream of several process images: each image's)."""
    lives = parts.cache.get("live_by_image")
    if lives is None:
        lives = parts.cache["live_by_image"] = _by_image(parts)
    live, closed = lives.get((image_key, key), (None, None))
    if live is None and closed is None:
        return
    if live is not None:
        r = live.rest
        had = sr.rest or wire.Rest()
        sr.rest = wire.Rest(passes=had.passes + r.passes, batches=had.batches + r.batches,
                            rows=had.rows + r.rows, wait=had.wait + r.wait,
                            step=had.step + r.step)
    sr.windows = wire.live.join([w for w in (sr.windows, closed, live and live.open) if w])


def _by_image(parts: wire.Parts) -> dict:
    """(image key, stream key) -> (its ``LiveStream``, its closed ``Windows``)."""
    out: dict = {}
    for rec in parts.lives:
        h = rec.header
        for s in rec.streams:
            out[((h.host, h.pid, h.image), s.key)] = (s, None)
    for w in parts.windows:
        for k, ws in w.streams.items():
            live = out.get((w.image_key, k), (None, None))[0]
            out[(w.image_key, k)] = (live, ws)
    return out


def with_rest(ph: Phases, rest: wire.Rest, epoch_s: float, batches: int) -> Phases:
    """The phases of the kept batches with the rest added to the steady state (the rest
    comes after ``keep_batches``: past any start-up). ``epoch_s`` / ``batches``: the
    stream's whole, rest included."""
    if not rest.batches or not ph.has_steady:
        return ph
    steady_s = ph.steady_s + rest.wait + rest.step
    steady_batches = ph.steady_batches + rest.batches
    stall = ph.steady_stall_s + rest.wait
    steady_epoch = steady_s * batches / steady_batches if steady_batches else math.nan
    return replace(ph, steady_batches=steady_batches,
                   steady_samples=ph.steady_samples + rest.rows, steady_s=steady_s,
                   steady_stall_s=stall, steady_wait_s=ph.steady_wait_s + rest.wait,
                   steady_compute_s=ph.steady_compute_s + rest.step,
                   steady_stall_share=stall / steady_s if steady_s > 0 else math.nan,
                   steady_epoch_s=steady_epoch, startup_cost_s=epoch_s - steady_epoch)


def over_time(streams: list[Any], most: int) -> StallOverTime | None:
    """The result's stall over time from one run's streams (``merge.StreamRun``, each with
    its windows): one series per loader and rank, all on the coarsest grid among them, at
    most ``most`` windows each; None where no stream has windows (a plain profile)."""
    got = [s for s in streams if s.windows is not None and len(s.windows)]
    if not got:
        return None
    width = max(s.windows.width_s for s in got)
    width = max(wire.live.coarsen(wire.live.rebin(s.windows, width), most).width_s
                for s in got)
    out = []
    for s in sorted(got, key=lambda s: (s.rank, s.name)):
        w = wire.live.rebin(s.windows, width)
        out.append(StallSeries(
            loader=s.name, rank=s.rank, node=s.node,
            start_unix_s=[k * width for k in w.start], batches=list(w.batches),
            samples=list(w.rows), wait_s=list(w.wait), step_s=list(w.step),
            startup_wait_s=list(w.startup), max_wait_s=list(w.max_wait)))
    return StallOverTime(width_s=width, max_windows=most, series=out, rule=RULE)
