"""Data-parallel ranks: each rank's figures, the straggler, and what it costs the job.

Pure functions on measured figures (the per-rank stalls of each run and the per-step exposed
stalls), plus ``summarize``, which assembles a variant's ``RankSummary``.

*Straggler.* The candidate is the rank with the largest exposed stall (median over the full
runs). Its *excess* is its stall minus the median stall of the other ranks, per run, median
over runs. It is named only when the excess is larger than the *noise* measured for it: what
the same statistic gives when the ranks are exchangeable. Per run, the per-step exposed
stalls ``e(r, k)`` (wait + trainer-side transfer of rank r at step k) of the steps every rank
took are shuffled across the ranks, step by step (a permutation test, 1000 shuffles), and the
top rank's excess is recomputed; the noise is the 99th percentile of that (median over runs).
Because the null also picks the largest of N, the rule names a straggler among exchangeable
ranks in about 1% of runs (``STRAGGLER_ALPHA``), whatever N, step count or machine noise.

*Gain if the straggler kept pace (ESTIMATED).* In a synchronous step the job waits, at every
step, for its slowest rank. Had the candidate ``c`` stalled like the median of the other ranks
at each step, the job's exposed stall at step k would have been the max over the others:

    gain = sum_k [ max_r e(r, k) - max( max_{r != c} e(r, k), median_{r != c} e(r, k) ) ]

(median over runs; steps where ``c`` is the only rank stepping count 0). It assumes the rest
of a step (compute, all-reduce) stays the same, which the synchronous step makes likely.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any, Sequence

import numpy as np

from ..results import Attribution, ExactlyOnce, RankStats, RankSummary, Summary
from ..stages.sizes import ceil_div
from ..trainers.job import last_rank_per_step
from . import differential
from .stats import finite_median


def excess(stalls: Sequence[float], c: int) -> float:
    """Rank ``c``'s stall minus the median stall of the other ranks (one run)."""
    others = [s for r, s in enumerate(stalls) if r != c]
    return stalls[c] - statistics.median(others) if others else 0.0


def gain_if_median_pace(steps: Sequence[Sequence[float]], c: int) -> float:
    """ESTIMATED job stall saved had rank ``c`` kept the others' median pace (module doc)."""
    gain = 0.0
    for k in range(len(steps[c])):
        others = [s[k] for r, s in enumerate(steps) if r != c and k < len(s)]
        if not others:
            continue
        now = max(steps[c][k], max(others))
        paced = max(max(others), statistics.median(others))
        gain += now - paced
    return gain


STRAGGLER_ALPHA = 0.01     # false-alarm rate of naming a straggler among exchangeable ranks
N_PERMUTATIONS = 1000


def null_excess(steps: Sequence[Sequence[float]], alpha: float = STRAGGLER_ALPHA,
                seed: int = 0, n_perm: int = N_PERMUTATIONS) -> float:
    """The (1 - alpha) quantile of the top rank's excess when the ranks are exchangeable: the
    per-step exposed stalls of the steps every rank took are shuffled across the ranks, step
    by step, and the top rank's excess over the median of the others is recomputed. This is
    the noise a real straggler must beat; it already accounts for picking the largest of N."""
    k = min((len(s) for s in steps), default=0)
    world = len(steps)
    if k < 2 or world < 2:
        return 0.0
    x = np.asarray([s[:k] for s in steps], dtype=float).T          # steps x ranks
    rng = np.random.default_rng(seed)
    out = []
    chunk = max(1, min(n_perm, 8_000_000 // (k * world)))
    done = 0
    while done < n_perm:
        m = min(chunk, n_perm - done)
        order = rng.random((m, k, world)).argsort(axis=2)
        sums = np.take_along_axis(np.broadcast_to(x, (m, k, world)), order, axis=2).sum(axis=1)
        sums.sort(axis=1)
        out.append(sums[:, -1] - np.median(sums[:, :-1], axis=1))
        done += m
    return float(np.quantile(np.concatenate(out), 1 - alpha))


def straggler(stalls: Sequence[Sequence[float]], steps: Sequence[Sequence[Sequence[float]]],
              alpha: float = STRAGGLER_ALPHA) -> tuple[int, float, float, int | None]:
    """(candidate, excess, noise, named straggler or None) from per-run, per-rank stalls
    (``stalls[run][rank]``) and per-step exposed stalls (``steps[run][rank][step]``):
    named when the candidate's excess (median over runs) beats the noise (median over runs
    of ``null_excess``)."""
    world = len(stalls[0])
    per_rank = [finite_median([run[r] for run in stalls]) for r in range(world)]
    c = max(range(world), key=lambda r: per_rank[r])
    ex = finite_median([excess(run, c) for run in stalls])
    noise = finite_median([null_excess(s, alpha, seed=i) for i, s in enumerate(steps)])
    noise = noise if math.isfinite(noise) else 0.0
    return c, ex, noise, (c if ex > noise else None)


def exactly_once(runs: Sequence[Any], plan: Any) -> ExactlyOnce | None:
    """Who got which batches in one run (``RankRun``s): every batch of the job's work list
    once. An item no rank saw counts with its shard's batches and rows (exact unless a
    filtering transform would have dropped rows of it). None when a batch cap
    (``loader.max_batches``) stopped the ranks early."""
    if not math.isinf(plan.max_batches):
        return None
    seen: Counter[tuple[int, str]] = Counter()
    item_batches: dict[int, int] = {}
    item_rows: dict[int, int] = {}
    rows = 0
    for run in runs:
        for d in run.deliveries:
            new = [b for b in d.batch_ids if (d.item, b) not in seen]
            for b in d.batch_ids:
                seen[(d.item, b)] += 1
            item_batches[d.item] = max(item_batches.get(d.item, 0), d.item_batches)
            if d.item_rows:
                item_rows[d.item] = d.item_rows
            rows += d.rows if len(new) == len(d.batch_ids) else 0
    bs = plan.config.loader.batch_size
    expected = sum(item_batches.get(i, ceil_div(s.rows, bs)) for i, s in enumerate(plan.items))
    expected_rows = sum(item_rows.get(i, s.rows) for i, s in enumerate(plan.items))
    delivered = len(seen)
    return ExactlyOnce(expected_batches=expected, delivered_batches=delivered,
                       duplicate_batches=sum(n - 1 for n in seen.values()),
                       dropped_batches=expected - delivered, expected_rows=expected_rows,
                       delivered_rows=rows, dropped_rows=expected_rows - rows)


def rank_attribution(rank_runs: dict[str, list[list[Any]]], r: int, method: str,
                     confidence: float) -> Attribution | None:
    """Differential attribution of rank ``r``'s own time (epoch - all-reduce: the pace it
    would keep alone) over the ablation runs, which all ranks ran together."""
    needed = [a.name for a in differential.ablations_for(method)]
    if not all(rank_runs.get(n) for n in needed):
        return None
    epochs = {n: [run[r].figures.epoch_s - run[r].sync_s for run in rank_runs[n]] for n in needed}
    computes = {n: [run[r].figures.compute_s for run in rank_runs[n]] for n in needed}
    return differential.analyze(epochs, method, confidence, computes=computes)


def summarize(jr: Any, cfg: Any, plan: Any, epoch_s: float) -> RankSummary:
    """The variant's ``RankSummary`` from its runs on all ranks (``trainers.job.JobRuns``)."""
    full = jr.rank_runs["full"]
    world = cfg.trainers.ranks
    stalls = [[run[r].figures.stall_s for r in range(world)] for run in full]
    steps = [[run[r].step_stall_s for r in range(world)] for run in full]
    c, ex, noise, named = straggler(stalls, steps)
    gain = finite_median([gain_if_median_pace(s, c) for s in steps])
    job_steps = [max(run[r].figures.batches for r in range(world)) for run in full]
    last = [last_rank_per_step(run) for run in full]
    analyzed = len(jr.rank_runs) > 1
    stats = []
    for r in range(world):
        figs = [run[r].figures for run in full]
        stats.append(RankStats(
            rank=r, stall_s=finite_median([f.stall_s for f in figs]), wait_s=finite_median([f.wait_s for f in figs]),
            trainer_transfer_s=finite_median([f.trainer_transfer_s for f in figs]),
            compute_s=finite_median([f.compute_s for f in figs]),
            sync_s=finite_median([run[r].sync_s for run in full]),
            steady_throughput_samples_s=finite_median([f.steady_throughput_samples_s for f in figs]),
            time_to_first_batch_s=finite_median([f.time_to_first_batch_s for f in figs]),
            last_step_share=finite_median([lr.count(r) / n if n else 0.0 for lr, n in zip(last, job_steps)]),
            straggler_delay_s=finite_median([run[r].straggler_delay_s for run in full]),
            attribution=(rank_attribution(jr.rank_runs, r, cfg.analysis.method,
                                          cfg.analysis.confidence) if analyzed else None)))
    spread = finite_median([max(s) - min(s) for s in stalls])
    speedup = epoch_s / (epoch_s - gain) if epoch_s > gain > 0 else 1.0
    summary = RankSummary(
        world=world, launcher=jr.launcher, backend=jr.backend, sharding=jr.sharding,
        producers_per_rank=jr.producers_per_rank, launch_s=jr.launch_s, ranks=stats,
        max_stall_s=Summary.of([max(s) for s in stalls]),
        median_stall_s=Summary.of([statistics.median(s) for s in stalls]),
        spread_s=spread, noise_s=noise, straggler=named, candidate=c, straggler_excess_s=ex,
        gain_if_median_pace_s=gain, gain_speedup=speedup,
        last_rank_per_step=last[0] if last else [], timeline_rank=jr.timeline_rank,
        exactly_once=exactly_once(full[0], plan) if full else None)
    summary.verdict = verdict(summary)
    return summary


def verdict(s: RankSummary) -> str:
    if s.straggler is None:
        return (f"no straggler: the {s.world} ranks' exposed stalls spread {s.spread_s:.2f} s "
                f"(rank {s.candidate} highest, {s.straggler_excess_s:+.2f} s above the others' "
                f"median), within the noise measured ({s.noise_s:.2f} s)")
    r = s.ranks[s.straggler]
    bound = ""
    if r.attribution is not None and r.attribution.bound_by != "compute":
        bound = f"; its own time is {r.attribution.bound_by}-bound"
    return (f"rank {s.straggler} is the straggler: exposed stall {r.stall_s:.2f} s, "
            f"{s.straggler_excess_s:.2f} s above the other ranks' median (noise "
            f"{s.noise_s:.2f} s), last to receive its batch at {r.last_step_share:.0%} of the "
            f"steps{bound}; at the others' median pace the job would stall "
            f"{s.gain_if_median_pace_s:.2f} s less ({s.gain_speedup:.2f}x, ESTIMATED)")
