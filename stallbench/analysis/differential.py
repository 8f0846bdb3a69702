"""Differential stall attribution: DS-Analyzer's method generalised to four parts.

The same variant is run with stages replaced by their ideal (instant) form. Differences of
median epoch time attribute the wall time:

- ``chain`` (DS-Analyzer's order, 5 runs): full -> no fetch -> no fetch+preprocess -> all
  three free (loader still running) -> compute-only (no loader). fetch stall = T(full) -
  T(no_fetch), preprocess stall = T(no_fetch) - T(no_fetch_preprocess), transfer stall =
  T(no_fetch_preprocess) - T(no_fetch_preprocess_transfer), loader overhead =
  T(no_fetch_preprocess_transfer) - T(compute_only), compute = T(compute_only). The parts sum
  to T(full) by construction.
- ``shapley`` (all 8 subsets + compute-only): each stage's stall is its Shapley value over the
  ablation lattice, i.e. its marginal saving averaged over every removal order. Needed when
  stages overlap in parallel workers: then the chain's answer depends on the order of removal.

Steady state (``analyze_runs``): T above is each run's steady epoch (``Phases.steady_epoch_s``:
its time after every producer delivered its first work item, scaled to all its batches), so
the parts, the bound, the shares and the ideal speedup describe a long epoch rather than a
short run's start-up. Start-up is its own part: ``startup_cost_s`` = median T_epoch(full) -
median T_steady(full), so compute + stages + overhead + startup_cost_s = the median epoch. A
variant with a run that has no steady window (too short), or whose runs are not split at all
(a data-parallel job: ``trainers.job`` keeps each rank's runs, not a split of the job's), is
attributed on whole runs, and ``basis`` says why.

The loader overhead (hand-off of empty work; on whole runs also worker start-up) is reported
as ``overhead_s`` beside the three stage stalls; the bounding stage is chosen among fetch,
preprocess and transfer, because only those can be made cheaper by the knobs the verdict names.

Point values use the median epoch time of each run over repeats (robust to one disturbed
repeat); intervals are percentile bootstrap intervals of the same statistic, each run's repeats
resampled independently; with one repeat they collapse to the point estimate.

Noise floor: every ablation run executes the same model steps, so the spread of its measured
compute seconds across runs (``compute_noise_s``) is a direct, free measurement of how much an
epoch moves for reasons that are not the data pipeline (a CPU-trained model competing with
loader workers for cores, a noisy machine). Differences smaller than that are not findings: the
verdict then says "inconclusive" instead of naming a stage with confidence it does not have.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import combinations
from typing import Any, Mapping, Sequence

import numpy as np

from ..stages.ablation import ALL_ABLATIONS, COMPUTE_ONLY, Ablation
from ..results import Attribution, Interval, PartIntervals, RepeatFigures
from . import figures
from .stats import COMPUTE_BOUND_SHARE, bootstrap_medians, finite_median, percentile_interval

STAGES = ("fetch", "preprocess", "transfer")
CHAIN = [Ablation(), Ablation(fetch=True), Ablation(fetch=True, preprocess=True),
         Ablation(True, True, True), COMPUTE_ONLY]


def ablations_for(method: str) -> list[Ablation]:
    return list(CHAIN) if method == "chain" else [*ALL_ABLATIONS, COMPUTE_ONLY]


def _ab(fetch: bool, prep: bool, xfer: bool) -> str:
    return Ablation(fetch, prep, xfer).name


def attribute(medians: Mapping[str, Any], method: str) -> dict[str, Any]:
    """Stage stalls and compute from per-run epoch statistics keyed by ablation name (floats,
    or arrays of bootstrap draws: the attribution is linear in them)."""
    free, compute = medians[_ab(True, True, True)], medians[COMPUTE_ONLY.name]
    if method == "chain":
        f, fp = medians[CHAIN[1].name], medians[CHAIN[2].name]
        full = medians["full"]
        return {"fetch_stall_s": full - f, "preprocess_stall_s": f - fp,
                "transfer_stall_s": fp - free, "overhead_s": free - compute, "compute_s": compute}
    out = {"compute_s": compute, "overhead_s": free - compute}
    n = len(STAGES)
    for i, stage in enumerate(STAGES):
        others = [s for s in range(n) if s != i]
        total = 0.0
        for k in range(n):
            for subset in combinations(others, k):
                removed = [s in subset for s in range(n)]
                with_i = list(removed)
                with_i[i] = True
                weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                total += weight * (medians[_ab(*removed)] - medians[_ab(*with_i)])
        out[f"{stage}_stall_s"] = total
    return out


def analyze(epochs: Mapping[str, Sequence[float]], method: str = "chain",
            confidence: float = 0.9, seed: int = 0,
            computes: Mapping[str, Sequence[float]] | None = None,
            steady: Mapping[str, Sequence[float]] | None = None,
            steady_computes: Mapping[str, Sequence[float]] | None = None,
            basis: str | None = None) -> Attribution:
    """Attribution, intervals, bound stage and verdict from per-ablation epoch times;
    ``computes`` (each run's measured model-step seconds) gives the noise floor.

    ``steady`` (each run's steady epoch, ``Phases.steady_epoch_s``, aligned with ``epochs``)
    and ``steady_computes`` put the parts, the bound, the ideal speedup and the noise floor on
    steady state; start-up is then its own part, ``startup_cost_s`` = median(full epochs) -
    median(full steady epochs), so compute + stages + overhead + startup_cost_s = the median epoch
    exactly. Without them every figure is on whole runs (``basis`` says which)."""
    needed = [a.name for a in ablations_for(method)]
    missing = [n for n in needed if not epochs.get(n)]
    if missing:
        raise ValueError(f"missing ablation runs: {missing}")
    use = steady if steady is not None else epochs
    # Medians, not means: one disturbed repeat on a shared machine must not move the answer.
    medians = {k: float(np.median(v)) for k, v in use.items() if v}
    point = attribute(medians, method)
    full_median = float(np.median(epochs["full"]))
    groups = {k: use[k] for k in needed}
    draws = bootstrap_parts(groups, method, confidence, seed)
    total = medians["full"]          # the parts' total: the (steady) full run
    startup = full_median - total if steady is not None else 0.0
    stage_stall = sum(point[f"{s}_stall_s"] for s in STAGES)
    stall = stage_stall + point["overhead_s"]
    bound, speedup = _bound(point, total, stage_stall / total if total > 0 else math.nan)
    parts = point["compute_s"] + stall + startup
    a = Attribution(
        method=method,
        interval=f"bootstrap percentile {confidence:.0%} over repeats "
                 f"({min(len(v) for v in groups.values())} per run)",
        compute_s=point["compute_s"], fetch_stall_s=point["fetch_stall_s"],
        preprocess_stall_s=point["preprocess_stall_s"],
        transfer_stall_s=point["transfer_stall_s"], overhead_s=point["overhead_s"],
        epoch_s=full_median, attributed_stall_s=stall,
        attributed_stall_share=stall / full_median if full_median > 0 else math.nan,
        overhead_share=point["overhead_s"] / total if total > 0 else math.nan,
        bound_by=bound, ideal_speedup=speedup,
        intervals=PartIntervals(**{k: Interval(*draws[k]) for k in _PARTS}),
        # parts vs the median full epoch (the headline figure); exact for the chain and for
        # Shapley values by construction, kept as a check on the arithmetic and old results
        closure_error=(parts - full_median) / full_median if full_median > 0 else math.nan,
        ablation_epoch_s={k: medians[k] for k in needed},
        basis=basis or ("steady state" if steady is not None else "whole run"),
        startup_cost_s=startup,
        startup_cost_share=startup / full_median if full_median > 0 else 0.0,
        startup_cost_interval=(_startup_interval(epochs["full"], use["full"], confidence, seed)
                          if steady is not None else None),
        steady_epoch_s=total if steady is not None else None,
        steady_attributed_stall_share=(stall / total if total > 0 else math.nan)
        if steady is not None else None,
    )
    a = noise_floor(steady_computes if steady is not None else computes, needed, a)
    # A clearly negative part means removing a stage made the run slower: the ablations
    # interact (e.g. caches, memory) or the machine was disturbed. Said, not hidden.
    floor = max(a.compute_noise_s or 0.0, COMPUTE_BOUND_SHARE * total)
    # the whole interval must lie below: with repeats, a part whose interval spans zero is noise
    a.negative_parts = [s for s in (*STAGES, "overhead")
                        if a.part_s(s) < -floor and a.part_interval(s).high < -floor]
    a.verdict = verdict(a)
    return a


def analyze_runs(runs: Mapping[str, Sequence[RepeatFigures]], method: str = "chain",
                 confidence: float = 0.9) -> Attribution:
    """The attribution of one variant's measured runs (by ablation name): on steady state
    when every run has a steady window (``Phases``), else on whole runs, saying why."""
    needed = [a.name for a in ablations_for(method)]
    epochs = {k: [f.epoch_s for f in v] for k, v in runs.items()}
    computes = {k: [f.compute_s for f in v] for k, v in runs.items()}
    unsplit = [k for k in needed for f in runs.get(k, ()) if f.phases is None]
    short = [k for k in needed for f in runs.get(k, ())
             if f.phases is not None and not f.phases.has_steady]
    if unsplit:     # a data-parallel job's figures (``trainers.job``) are not split
        return bound_by_wait(analyze(epochs, method, confidence, computes=computes,
                       basis=f"whole run ({len(unsplit)} run(s) not split into start-up and "
                             "steady state: data-parallel jobs are attributed on whole runs)"),
            runs.get("full", ()))
    if short:
        return bound_by_wait(analyze(epochs, method, confidence, computes=computes,
                       basis=f"whole run (no steady window in {len(short)} run(s): too short "
                             "for a steady state; raise max_batches)"), runs.get("full", ()))
    ph = {k: [(f, f.phases) for f in v] for k, v in runs.items()}
    steady = {k: [p.steady_epoch_s for _, p in v if p] for k, v in ph.items()}
    # the model steps of the steady window, scaled like its time (the noise floor's input)
    scomp = {k: [p.steady_compute_s * f.batches / p.steady_batches for f, p in v if p]
             for k, v in ph.items()}
    return bound_by_wait(analyze(epochs, method, confidence, computes=computes, steady=steady,
                                 steady_computes=scomp), runs.get("full", ()))


def bound_by_wait(a: Attribution, full: Sequence[RepeatFigures]) -> Attribution:
    """``ideal_speedup`` capped by what the full runs' measured waits allow (issue 39):
    removing every wait gives at most 1 / (1 - the larger of the whole-run and steady stall
    shares); differences of epochs can exceed it where the ablation runs' steps differ."""
    whole = finite_median(f.stall_s / f.epoch_s for f in full if f.epoch_s > 0)
    steady = finite_median(f.phases.steady_stall_share for f in full
                           if f.phases is not None and f.phases.has_steady)
    bound = figures.wait_bound(whole, steady)
    if math.isfinite(bound):
        a.wait_bound_speedup = bound
        a.ideal_speedup = min(a.ideal_speedup, bound)
        a.verdict = verdict(a)
    return a


def _startup_interval(epochs: Sequence[float], steady: Sequence[float], confidence: float,
                      seed: int, n_boot: int = 2000) -> Interval:
    """Bootstrap of median(epoch) - median(steady epoch), repeats resampled as pairs."""
    e, s = np.asarray(epochs, dtype=float), np.asarray(steady, dtype=float)
    if len(e) != len(s) or len(e) < 2:
        x = float(np.median(e) - np.median(s))
        return Interval(x, x)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(e), size=(n_boot, len(e)))
    d = np.median(e[idx], axis=1) - np.median(s[idx], axis=1)
    q = [0.5 - confidence / 2, 0.5 + confidence / 2]
    return Interval(float(np.quantile(d, q[0])), float(np.quantile(d, q[1])))


_PARTS = ("compute_s", "fetch_stall_s", "preprocess_stall_s", "transfer_stall_s", "overhead_s")


def noise_floor(computes: Mapping[str, Sequence[float]] | None, needed: Sequence[str],
                a: Attribution) -> Attribution:
    """Spread of the same work's compute time across the ablation runs, and whether the
    verdict stands clear of it: a named stage must stall longer than the noise; a
    compute-bound verdict needs the noise below the compute-bound threshold, else a stall of
    that size could hide in it. With repeats, a named stage's interval must also exclude 0."""
    per_run = [float(np.median(computes[k])) for k in needed if computes and computes.get(k)]
    out = dataclasses.replace(a, compute_noise_s=None, compute_noise_share=None,
                              conclusive=True, inconclusive_because=None)
    epoch = a.steady_epoch_s if a.steady_epoch_s is not None else a.epoch_s
    if len(per_run) >= 2:
        noise = max(per_run) - min(per_run)
        out.compute_noise_s = noise
        out.compute_noise_share = noise / epoch if epoch > 0 else math.nan
        if a.bound_by == "compute":
            clear = noise < COMPUTE_BOUND_SHARE * epoch
        else:
            clear = a.part_s(a.bound_by) > noise
        if not clear:
            out.conclusive, out.inconclusive_because = False, "compute_noise"
    # a stage stalling longer than the run it is part of is not a measurement but a sign the
    # ablation runs disagree (a window too short, a disturbed run): refused, never clamped
    over = [st for st in STAGES if a.part_s(st) > epoch]
    if over:
        out.conclusive, out.inconclusive_because = False, "impossible"
        out.refused = (f"{over[0]} stall {a.part_s(over[0]):.2f} s is longer than the run it is "
                       f"part of ({epoch:.2f} s)")
        return out
    if out.conclusive and a.bound_by != "compute":
        # with repeats, the named stage's own interval must stay above zero
        iv = a.part_interval(a.bound_by)
        if iv.width > 1e-9 and iv.low <= 0:
            out.conclusive, out.inconclusive_because = False, "interval"
    return out


def bootstrap_parts(groups: Mapping[str, Sequence[float]], method: str, confidence: float,
                    seed: int, n_boot: int = 2000) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap of every part at once: the attribution is linear in the per-run
    statistic, so it is evaluated on whole arrays of resampled medians (fast, same as a loop)."""
    draws = attribute(bootstrap_medians(groups, n_boot, seed), method)
    return {k: percentile_interval(d, confidence) for k, d in draws.items()}


def _bound(point: Mapping[str, float], epoch: float, stage_share: float) -> tuple[str, float]:
    if not (stage_share >= COMPUTE_BOUND_SHARE):
        return "compute", 1.0
    stage = max(STAGES, key=lambda s: point[f"{s}_stall_s"])
    # Free of that stage, an epoch still takes at least its compute: when other parts came
    # out negative, epoch - stall alone could fall below that (or below zero).
    rest = max(epoch - point[f"{stage}_stall_s"], point["compute_s"])
    return stage, epoch / rest if rest > 0 else math.inf


def _job_negative_names(text: str, a: Attribution, stage_map: Mapping[str, str] | None) -> str:
    """A user's job's verdict names a part that came out negative as its table does
    ("collate_fn part came out below 0", not "preprocess part ...")."""
    for part in a.negative_parts:
        name = figures.part_name(part, True, stage_map)
        for old in (f"{part} part came out below 0", f"{part} came out negative"):
            text = text.replace(old, old.replace(part, name, 1))
        text = text.replace(f": {part}, ", f": {name}, ").replace(f", {part} came", f", {name} came")
    return text


def verdict(a: Attribution, action: str | None = None, gain: float | None = None,
            knob: str | None = None, on_job: bool = False,
            stage_map: Mapping[str, str] | None = None) -> str:
    """One line: the bound (on steady state when the basis is), its share, the next change
    to try (``action``, from ``analysis.advice``: it needs the executor and the what-if), the
    ablations' bound on its gain (``figures.ideal_bound``: the stage's ideal, or for more
    producers, ``knob``, the ideal of all data work), and start-up apart when it weighs in
    this run. ``on_job``: a user's job (``stallbench profile``), whose parts are named after
    its own stages (``figures.part_name`` by ``stage_map``: "dataset __getitem__", not
    "fetch")."""
    if on_job and a.bound_by in STAGES:
        name = figures.part_name(a.bound_by, True, stage_map)
        text = verdict(a, action, gain, knob)
        for old in (f"{a.bound_by}-bound", f"ideal {a.bound_by} would"):
            text = text.replace(old, old.replace(a.bound_by, name), 1)
        return _job_negative_names(text, a, stage_map)
    if on_job:
        return _job_negative_names(verdict(a, action, gain, knob), a, stage_map)
    steady = a.basis == "steady state"
    share = (a.steady_attributed_stall_share if steady and a.steady_attributed_stall_share
             is not None else a.attributed_stall_share)
    where = "of steady state" if steady else "of the epoch"
    overhead = a.overhead_share
    tail = (f" (loader hand-off alone: {figures.share(overhead)})"
            if overhead >= COMPUTE_BOUND_SHARE else "")
    for part in a.negative_parts:
        # never printed as a negative figure (issue 39): a stall cannot be below zero
        tail += (f"; {part} part came out below 0 (taken as 0): making it ideal slowed the "
                 f"run, so the ablations interact or the run was disturbed (add repeats)")
    if a.interference_s is not None:
        tail += (f"; interference {figures.seconds(a.interference_s)}: the model step took longer beside "
                 f"the data path than served from memory (measured, apart from the wait)")
    if steady and a.startup_cost_share >= COMPUTE_BOUND_SHARE:
        tail += (f"; start-up {figures.seconds(a.startup_cost_s)} "
                 f"({figures.share(a.startup_cost_share)} of this run) "
                 f"is apart: a long epoch pays it once")
    elif not steady and a.basis != "whole run":
        tail += f"; {a.basis}"
    if not a.conclusive and a.inconclusive_because == "impossible":
        return (f"refused: the {a.refused}, which no measurement allows; the ablation runs "
                f"disagree (a run too short for its figures, or a disturbed machine): measure "
                f"longer runs or add repeats{tail}")
    if not a.conclusive and a.inconclusive_because in figures.WITHHOLDS:
        # withheld: no part's figure in the line (the hand-off's share, a negative part,
        # the interference the moved runs measured); start-up is the full run's own
        lean = "compute-bound" if a.bound_by == "compute" else f"{a.bound_by}-bound"
        start = (f"; start-up {figures.seconds(a.startup_cost_s)} is apart" if steady and
                 a.startup_cost_share >= COMPUTE_BOUND_SHARE else "")
        return f"inconclusive (leaning {lean}; parts withheld): {a.refused}{start}"
    if not a.conclusive and a.inconclusive_because == "interval":
        iv = a.part_interval(a.bound_by)
        return (f"inconclusive (leaning {a.bound_by}-bound): its stall's interval "
                f"[{iv.low:.2f}, {iv.high:.2f}] s includes zero; add repeats{tail}")
    if not a.conclusive:
        noise = float(a.compute_noise_s or 0.0)
        lead = "compute-bound" if a.bound_by == "compute" else f"{a.bound_by}-bound"
        return (f"inconclusive (leaning {lead}): the same model steps took "
                f"{figures.seconds(noise)} ({figures.share(a.compute_noise_share or 0.0)} of the "
                f"epoch) more in one ablation run "
                f"than in another, as much as the stalls measured; the model competes with the "
                f"loader for CPU or the machine is noisy: add repeats, or emulate the step{tail}")
    head = f"{a.bound_by}-bound ({figures.share(share)} {where} is attributed stall)"
    if a.bound_by == "compute":
        # the bound is decided on the data stages alone (loader hand-off is said in the tail)
        total = a.steady_epoch_s if steady and a.steady_epoch_s else a.epoch_s
        stages = sum(a.part_s(s) for s in STAGES) / total if total > 0 else 0.0
        head = f"compute-bound (data stages {figures.share(stages)} {where})"
        return (f"{head}: {action or 'nothing to do on the data side: the data stages keep up'}"
                f"{tail}")
    # "1 worker predicted 1.58x; ideal fetch would give 1.53x" read as one worker beating
    # no fetch at all: beside more producers (which take every data stage off the trainer)
    # the bound is the ideal of all data work, never one stage's (issue 25)
    bound = figures.ideal_bound(a, knob)
    ideal = f"{bound.source} would give {bound.value:.2f}x"
    if gain is not None and math.isfinite(gain) and gain > bound.value:
        # only a MEASURED gain gets here (``advice`` withdraws a prediction above the bound)
        ideal += (" (measured beyond this variant's own ablations: the two variants' runs "
                  "differ by more than their repeats show; add repeats)")
    return f"{head}: {action}; {ideal}{tail}" if action else f"{head}: {ideal}{tail}"
