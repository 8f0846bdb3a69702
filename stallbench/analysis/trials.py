"""When a trial of ``stallbench tune -- CMD`` has measured enough, and what its confirmation
measured (issue 55: decided here, from measured figures, not in the driver that runs them).

- **The stop rule** (``stop_by_count``, ``stop_by_rate``): a trial's job is ended once its
  steady rate is known: the per-epoch rates after its first epoch within ``KNOWN_WITHIN``
  (the half-width of the 90% t interval of their mean, at least two of them), or, for a job
  still in its one long epoch after a while, its steady window's rate known as well; or at
  ``--trial-batches``, or at the tune's deadline. The driver (``profile/tune.py``'s
  ``Enough``) reads the job's files and asks.
- **The confirmation** (``confirm``): the best trial measured again, interleaved with the job
  as written; its speedup is the median of the best's rates over the median of the job's,
  its range the pairs' (the search's and each round's), and it is the answer only where
  ``loader_search.not_confirmed`` finds nothing against it; else the answer is the job as
  written, at 1.00x.

Pure functions of rates and spans, so that the rules are tested without running a job.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from .loader_search import not_confirmed
from .stats import t_quantile

KNOWN_WITHIN = 0.05         # a trial's rate is known when its 90% interval is +-5%
WINDOW_CHUNKS = 4           # one long epoch: its steady window in this many chunks
WINDOW_BATCHES = 10         # of at least this many batches each

# (start, end, batches, rows, ended) of one epoch, as ``merge.StreamRun.spans`` holds it
Span = Sequence


def known(rates: list[float]) -> float | None:
    """The half-width of the 90% t interval of the rates' mean, as a share of it, when
    within ``KNOWN_WITHIN``; None otherwise."""
    if len(rates) < 2:
        return None
    m = statistics.fmean(rates)
    half = t_quantile(len(rates) - 1, 0.95) * statistics.stdev(rates) / math.sqrt(len(rates))
    return half / m if m > 0 and half <= KNOWN_WITHIN * m else None


def epoch_rates(spans: list[Span]) -> list[float]:
    """Samples/s of each ended epoch after the first, its start-up included."""
    return [rows / (t1 - t0) for (t0, t1, n, rows, ended) in spans[1:]
            if ended and n and t1 > t0]


def window_rates(wait: list[float], step: list[float], rows: list[int],
                 batches: int) -> list[float]:
    """One epoch still running: its batches after the first tenth in ``WINDOW_CHUNKS``
    chunks, each chunk's samples over its own wait + step (the steady window's rate)."""
    lo = max(1, batches // 10)
    n = (batches - lo) // WINDOW_CHUNKS
    if n < WINDOW_BATCHES:
        return []
    out = []
    for c in range(WINDOW_CHUNKS):
        i, j = lo + c * n, lo + (c + 1) * n
        t = sum(wait[i:j]) + sum(step[i:j])
        if t > 0:
            out.append(sum(rows[i:j]) / t)
    return out


def stop_by_count(batches: int, trial_batches: int | None, past_deadline: bool) -> str:
    """Why a trial ends before its rate is known ("" when it goes on): ``--trial-batches``
    batches of one process (a rank), or the tune's budget spent once a batch came."""
    if trial_batches and batches >= trial_batches:
        return f"--trial-batches {trial_batches} reached"
    if past_deadline and batches:
        return "the tune's budget ran out"
    return ""


def stop_by_rate(spans: list[Span], wait: list[float], step: list[float], rows: list[int],
                 batches: int, running_s: float, window_after_s: float) -> str:
    """Why a trial ends because its steady rate is known ("" when it is not yet): its
    per-epoch rates, or after ``window_after_s`` of a job still in its first epoch, the
    chunks of that epoch's steady window."""
    per_epoch = epoch_rates(spans)
    within = known(per_epoch)
    if within is not None:
        return (f"its steady rate was known within +-{within:.1%} after "
                f"{len(per_epoch) + 1} epochs")
    if len(spans) == 1 and running_s >= window_after_s:
        within = known(window_rates(wait, step, rows, batches))
        if within is not None:
            return (f"one epoch still running after {running_s:.0f} s: its steady "
                    f"window's rate was known within +-{within:.1%}")
    return ""


@dataclass(frozen=True)
class Confirmation:
    """The answer's figures as the confirmation measured them."""

    steady_samples_s: float       # median over the answer's runs
    speedup: float                # over the job as written (1.0 where the answer is it)
    low: float | None             # the pairs' range (two pairs or more)
    high: float | None
    rounds: int                   # confirmation rounds that measured both sides
    why_not: str = ""             # why the best trial is not the answer ("": it is)


def confirm(name: str, base_rates: list[float], best_rates: list[float], pairs: list[float],
            lost: list[str], searched: bool) -> Confirmation:
    """The confirmation's verdict on the best trial ``name``: ``base_rates`` / ``best_rates``
    the steady rates of the job as written and of the best (the search's first, then each
    round's), ``pairs`` best / job per pair, ``lost`` the rounds the job failed under the
    best. ``searched``: the best is a trial, not the job as written (nothing to confirm)."""
    rounds = len(pairs) - 1 if pairs else 0
    b_med, a_med = statistics.median(best_rates), statistics.median(base_rates)
    speed = b_med / a_med if a_med > 0 else math.nan
    why_not = not_confirmed(name, speed, pairs, lost) if searched else ""
    if why_not:
        b_med = statistics.median(base_rates)
        speed, pairs = 1.0, []
    return Confirmation(steady_samples_s=b_med, speedup=speed,
                        low=min(pairs) if len(pairs) >= 2 else None,
                        high=max(pairs) if len(pairs) >= 2 else None,
                        rounds=rounds, why_not=why_not)


def whole_job_s(spans: list[Span], stopped: bool, epochs: int | None) -> float | None:
    """The job's epochs end to end (its first epoch, start-up included): measured where the
    run ended by itself, else ESTIMATED as the first epoch plus ``epochs`` - 1 times the
    median of the later ended epochs (issue 58: "1.63x the job as written" on the basis of
    epochs 2 onward was 0.98x over the whole 3-epoch job). None where it cannot be said."""
    ended = [sp for sp in spans if sp[4] and sp[1] > sp[0]]
    if not spans:
        return None
    if not stopped:
        return spans[-1][1] - spans[0][0]
    later = [t1 - t0 for (t0, t1, _, _, _) in ended[1:]]
    if not ended or epochs is None or (epochs > 1 and not later):
        return None
    first = ended[0][1] - ended[0][0]
    return first + (epochs - 1) * (statistics.median(later) if later else 0.0)


def whole_job(base: tuple[list[Span], bool], best: tuple[list[Span], bool],
              epochs: int | None) -> tuple[float | None, str]:
    """(the best's whole-job speedup over the job as written, its basis in words): each a
    (spans, stopped by tune) of one run; ``epochs``: the job's, where a run of it ended."""
    a = whole_job_s(base[0], base[1], epochs)
    b = whole_job_s(best[0], best[1], epochs)
    if a is None or b is None or not b > 0:
        why = ("the job's epoch count is unknown (tune ended every run of it)"
               if epochs is None else "a run had no ended epoch to estimate it from")
        return None, f"not known: {why}"
    how = ("measured: both runs ran the whole job" if not (base[1] or best[1]) else
           f"ESTIMATED: {epochs} epoch(s), the first measured, the rest at the median of "
           f"the later ones")
    return a / b, how
