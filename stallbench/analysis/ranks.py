"""Data-parallel ranks: each rank's figures, the straggler, and what it costs the job.

Pure functions on measured figures (the per-rank stalls of each run and the per-step times),
plus ``summarize``, which assembles a variant's ``RankSummary``.

*Straggler: what the others waited for it.* In a synchronous step every rank waits in the
all-reduce for the last rank to get there, so the cost of a slow rank is what the *other*
ranks spent waiting for it in the collective (their ``sync_s``, measured per rank and per
step). A rank's *own time* at step k, ``o(r, k)`` = its exposed stall + its model step, is
when it reached the all-reduce; the others' wait for rank c at step k is ``o(c, k) - o(r, k)``
(what ``sync`` measures, up to the all-reduce's own cost). The candidate is the rank with the
largest own time over the steps every rank took; its *excess* is its own time minus the median
of the other ranks' (median over the full runs): with two ranks, what the other rank waited
for it net of what it waited for the other. ``others_wait_s`` reports that wait as measured
by the all-reduce clocks.

*Noise (the false-alarm rate).* The excess must beat what the same statistic gives when the
ranks are exchangeable, under two shuffles of the per-step own times (1000 each), the top
rank's excess recomputed each time: (a) step by step, the ranks' values at each step
shuffled among them (powerful when every rank pays its costs on the same steps: a steady
per-item delay); (b) pooled, all steps of all ranks dealt back to the ranks at random
(powerful for *bursty* stalls, a few steps carrying a row group's whole cost: it compares
the straggler's bursts with the other ranks' smaller ones). Neither can go below p = 1/64 on six
bursts per rank (a permutation test on six informative steps), so (c) a burst test: on the
steps where the slowest rank's own time is 4x the median step (chosen by a rule symmetric
in the ranks), Student's t on the candidate's log own time minus the others' median (log:
one long start-up step must not drown the rest), one-sided at alpha/(2N) (half the budget,
shared by the N ranks that could be the candidate); Student's t is conservative for values
symmetric about 0 (Efron 1969), which the differences of exchangeable ranks are. A straggler
is named when its excess beats (a) or (b) at their 99.75th percentile (each 1000
shuffles: a quarter of the budget each) or (c); ``noise_s`` is the shuffles' threshold (median over runs) and the verdict says
which test named the rank (``straggler_evidence``).
Together they keep the false-alarm rate among exchangeable ranks near 1%
(``STRAGGLER_ALPHA``), smooth or bursty, which the simulation test measures; each also pays
for choosing the largest of N. Bursts that land on
the same steps of every rank only make the pooled null wider (conservative). The pooled
null assumes a rank's steps are exchangeable among themselves when nothing slows it (no
slow phase of one rank only); a rank slowed for part of a run by something outside the
job is then named, which is what happened to the job in that run. ``tests/analysis/test_ranks.py`` measures the
false-alarm rate by simulation (smooth, bursty aligned, bursty unaligned; <= 2.5% over 400
runs each) and the power on a two-rank bursty straggler: named in >= 80% of single runs when
its six bursts fall on the same steps as the other rank's (same row-group layout, the usual
case). The limit, stated: six bursts at steps unrelated to the other rank's carry too little
evidence for 1% in one run (p >= 1/64 by sign, ~1% by position); such a rank is not named
from one run, and never the wrong one.

Why not shuffle step by step (the rule before issue 25): with bursty stalls and two ranks that
is a sign-flip test on a few large values; six bursts on one rank give at best p = 1/64, so a
rank that made the other wait two thirds of the run was called noise. Pooling the steps also
compares the straggler's bursts with the other rank's (smaller) bursts, which is where the
evidence is.

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
from . import differential, figures
from . import straggler as straggler_evidence
from .stats import finite_median, t_quantile


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


def own_steps(stall_steps: Sequence[float], compute_steps: Sequence[float]) -> list[float]:
    """A rank's own time per step (exposed stall + model step: when it reached the
    all-reduce); the stall alone where the per-step compute was not recorded."""
    if len(compute_steps) < len(stall_steps):
        return list(stall_steps)
    return [e + c for e, c in zip(stall_steps, compute_steps)]


def _top_excess(sums: np.ndarray) -> np.ndarray:
    """Per row (one deal of the steps to the ranks): the top rank's sum minus the median of
    the others' sums."""
    sums = np.sort(sums, axis=-1)
    return sums[..., -1] - np.median(sums[..., :-1], axis=-1)


def null_excess(steps: Sequence[Sequence[float]], alpha: float = STRAGGLER_ALPHA,
                seed: int = 0, n_perm: int = N_PERMUTATIONS) -> float:
    """The noise a real straggler must beat by the shuffles: the smaller of the (1 - alpha/4)
    quantiles of the top rank's excess under two shuffles of the per-step own times of the
    steps every rank took (module doc); with the burst test at alpha/2 the three together
    keep the false-alarm rate at most alpha (Bonferroni). Both already account for picking the largest of N."""
    k = min((len(s) for s in steps), default=0)
    world = len(steps)
    if k < 2 or world < 2:
        return 0.0
    x = np.asarray([s[:k] for s in steps], dtype=float)             # ranks x steps
    q = 1 - alpha / 4
    return min(_quantile(_step_by_step, x, q, seed, n_perm),
               _quantile(_pooled, x, q, seed, n_perm))


def _step_by_step(x: np.ndarray, rng: np.random.Generator, m: int) -> np.ndarray:
    """m deals that shuffle the ranks at each step (the steps stay where they are)."""
    world, k = x.shape
    order = rng.random((m, k, world)).argsort(axis=2)
    return np.take_along_axis(np.broadcast_to(x.T, (m, k, world)), order, axis=2).sum(axis=1)


def _pooled(x: np.ndarray, rng: np.random.Generator, m: int) -> np.ndarray:
    """m deals of all the steps of all ranks, pooled, back to the ranks at random."""
    world, k = x.shape
    pool = x.reshape(-1)
    order = rng.random((m, pool.size)).argsort(axis=1)
    return pool[order].reshape(m, world, k).sum(axis=2)


def _quantile(deal: Any, x: np.ndarray, q: float, seed: int, n_perm: int) -> float:
    rng = np.random.default_rng(seed)
    out = []
    chunk = max(1, min(n_perm, 8_000_000 // x.size))
    done = 0
    while done < n_perm:
        m = min(chunk, n_perm - done)
        out.append(_top_excess(deal(x, rng, m)))
        done += m
    return float(np.quantile(np.concatenate(out), q))


BURST_FACTOR = 4.0          # a step is a burst when the slowest rank's own time is 4x the median


def burst_test(own: Sequence[Sequence[float]], c: int, alpha: float = STRAGGLER_ALPHA
               ) -> tuple[float, float, int] | None:
    """(t, critical t, burst steps) of one run, or None with fewer than 3 burst steps. Burst
    steps: where the slowest rank's own time is ``BURST_FACTOR`` x the median own time of
    all steps of all ranks, a choice symmetric in the ranks, so it favours none. There, the
    candidate's log own time minus the median of the others' (log: one huge start-up step
    must not drown the rest): under exchangeable ranks symmetric about 0, where Student's t
    is conservative (Efron 1969). One-sided at alpha / (2 x world): half the budget (the
    shuffles have the other half), shared by the ranks that could be the candidate."""
    k = min(len(s) for s in own)
    x = np.log(np.maximum(np.asarray([s[:k] for s in own], dtype=float), 1e-6))
    sel = x.max(axis=0) > math.log(BURST_FACTOR) + float(np.median(x))
    n = int(sel.sum())
    if n < 3:
        return None
    d = x[c, sel] - np.median(np.delete(x, c, axis=0)[:, sel], axis=0)
    sd = float(np.std(d, ddof=1))
    mean = float(d.mean())
    t = math.inf if sd == 0 and mean > 0 else (mean / sd * math.sqrt(n) if sd > 0 else 0.0)
    return t, t_quantile(n - 1, 1 - alpha / (2 * len(own))), n


def straggler(own: Sequence[Sequence[Sequence[float]]], alpha: float = STRAGGLER_ALPHA,
              n_perm: int = N_PERMUTATIONS) -> tuple[int, float, float, int | None]:
    """(candidate, excess, noise, named straggler or None) from the per-step own times of
    every full run (``own[run][rank][step]``, ``own_steps``): the candidate has the largest
    own time over the steps every rank took (median over runs); named when its excess
    (median over runs) beats the shuffles' noise (median over runs of ``null_excess``) or
    the burst test names it (median over runs of t minus its critical value > 0)."""
    c, ex, noise = _candidate(own, alpha, n_perm)
    return c, ex, noise, (c if ex > noise or burst_margin(own, c, alpha) > 0 else None)


def _candidate(own: Sequence[Sequence[Sequence[float]]], alpha: float, n_perm: int
               ) -> tuple[int, float, float]:
    world = len(own[0])
    sums = []
    for run in own:
        k = min(len(s) for s in run)
        sums.append([float(sum(s[:k])) for s in run])
    per_rank = [finite_median([run[r] for run in sums]) for r in range(world)]
    c = max(range(world), key=lambda r: per_rank[r])
    ex = finite_median([excess(run, c) for run in sums])
    noise = finite_median([null_excess(s, alpha, seed=i, n_perm=n_perm)
                           for i, s in enumerate(own)])
    return c, ex, (noise if math.isfinite(noise) else 0.0)


def burst_margin(own: Sequence[Sequence[Sequence[float]]], c: int,
                 alpha: float = STRAGGLER_ALPHA) -> float:
    """Median over runs of (t - critical t) of ``burst_test``; -inf where no run has 3
    burst steps."""
    tests = [burst_test(run, c, alpha) for run in own if min(len(s) for s in run) >= 2]
    margins = [t - crit for t, crit, _ in filter(None, tests)]
    return statistics.median(margins) if margins else -math.inf


def evidence(own: Sequence[Sequence[Sequence[float]]], c: int, ex: float, noise: float,
             alpha: float = STRAGGLER_ALPHA) -> str:
    """Which test named the straggler, in words (for the verdict)."""
    if ex > noise:
        return f"noise {noise:.2f} s"
    tests = [t for t in (burst_test(run, c, alpha) for run in own) if t is not None]
    if not tests:
        return f"noise {noise:.2f} s"
    t, crit, n = sorted(tests)[len(tests) // 2]
    return (f"its {n} burst steps: t = {min(t, 999):.1f} > {crit:.1f}, the 1% level; the "
            f"shuffles' noise {noise:.2f} s")


def others_wait(syncs: Sequence[float], c: int) -> float:
    """What the other ranks spent in the all-reduce beyond what rank ``c`` spent there (the
    median of theirs minus its own, one run): measured time the job waited for ``c``."""
    others = [s for r, s in enumerate(syncs) if r != c]
    return statistics.median(others) - syncs[c] if others else 0.0


def others_wait_in_step(steps: Sequence[Sequence[float]], c: int) -> float:
    """What the other ranks spent waiting for rank ``c`` in the collective, seen from a job
    whose step holds its own all-reduce (``profile``: the user's step cannot be split): the
    other ranks' step time beyond ``c``'s (the median of theirs minus its own) over the steps
    every rank took, one run. In a synchronous step a rank that arrives late is waited for by
    the others inside their step, so this is the first, measured evidence of a straggler
    (issue 39); the statistical test (``straggler``) is the rule for naming it."""
    if len(steps) < 2:
        return 0.0
    k = min(len(s) for s in steps)
    sums = [float(sum(s[:k])) for s in steps]
    return statistics.median(x for r, x in enumerate(sums) if r != c) - sums[c]


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


def summarize(jr: Any, cfg: Any, plan: Any, epoch_s: float, crowding: float = 1.0
              ) -> RankSummary:
    """The variant's ``RankSummary`` from its runs on all ranks (``trainers.job.JobRuns``);
    ``crowding``: the job's processes per core on the machine it ran on (``straggler``)."""
    full = jr.rank_runs["full"]
    world = cfg.trainers.ranks
    stalls = [[run[r].figures.stall_s for r in range(world)] for run in full]
    steps = [[run[r].step_stall_s for r in range(world)] for run in full]
    own = [[own_steps(run[r].step_stall_s, run[r].step_compute_s) for r in range(world)]
           for run in full]
    c, ex, noise, named = straggler(own)
    why = evidence(own, c, ex, noise) if named is not None else ""
    waited = finite_median([others_wait([run[r].sync_s for r in range(world)], c)
                            for run in full])
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
        others_wait_s=waited, straggler_evidence=why,
        gain_if_median_pace_s=gain, gain_speedup=speedup,
        last_rank_per_step=last[0] if last else [], timeline_rank=jr.timeline_rank,
        exactly_once=exactly_once(full[0], plan) if full else None)
    summary.verdict = verdict(summary)
    straggler_evidence.revise(summary, full, verdict, crowding)   # issue 58: all evidence
    return summary


def verdict(s: RankSummary) -> str:
    """The ranks' line. Not naming a rank never hides what was measured: where the other
    ranks waited for the candidate in the all-reduce, that measured wait is stated beside
    the noise (issue 39: a bursty straggler's 0.68 s was printed as noise alone)."""
    if s.straggler is None:
        waited = (f"; the other ranks waited {s.others_wait_s:.2f} s for it in the all-reduce "
                  f"(measured), not enough evidence to name it from these runs"
                  if s.others_wait_s >= 0.005 else "")
        return (f"no straggler: the {s.world} ranks' exposed stalls spread {s.spread_s:.2f} s "
                f"(rank {s.candidate} slowest to the all-reduce, "
                f"{figures.signed(s.straggler_excess_s, 2)} s "
                f"above the others' median), within the noise measured ({s.noise_s:.2f} s)"
                f"{waited}")
    r = s.ranks[s.straggler]
    bound = ""
    if r.attribution is not None and r.attribution.bound_by != "compute":
        bound = f"; its own time is {r.attribution.bound_by}-bound"
    return (f"rank {s.straggler} is the straggler: the other ranks waited "
            f"{s.others_wait_s:.2f} s for it in the all-reduce; exposed stall {r.stall_s:.2f} s, "
            f"reaching the all-reduce {s.straggler_excess_s:.2f} s later than the other ranks' "
            f"median ({s.straggler_evidence or f'noise {s.noise_s:.2f} s'}), last to receive its batch at {r.last_step_share:.0%} of the "
            f"steps{bound}; at the others' median pace the job would stall "
            f"{s.gain_if_median_pace_s:.2f} s less ({s.gain_speedup:.2f}x, ESTIMATED)")
