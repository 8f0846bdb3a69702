"""Attribution from what was measured: the waits of the ablation runs, and their steps (issue 39).

Why not differences of epochs: each ablation is a separate run of the user's job, and its
*model step* differs from the full run's (machine load; the data path itself slowing the
step: loader threads competing for cores, cache pollution). A difference of epochs charges
that step change to data: a job that waited 14% of its run was "attributed" 27.74 s of data
stall against 6.42 s waited, and parts came out negative. Every run measures its waits and its
steps apart, so the parts here come from the waits:

    fetch      = S(full)       - S(items served)
    preprocess = S(items)      - S(items+collate served)
    transfer   = S(collate)    - S(pin served)            (0 by construction where not ablated)
    overhead   = S(pin served)                            (what is still waited with every
                                                           stage served: the loader hand-off)

S is a run's measured stall (wait + the trainer's own data work), median over repeats, on
steady state (each run's steady stall scaled to all its batches, ``Phases``) when every run
has a steady window, else on whole runs. The parts telescope to S(full): ``attributed_stall_s``
(steady parts only) + ``startup_cost_s`` (S(full, whole) - S(full, steady)) equals the full
run's measured ``stall_s``; a part that comes out negative is stored as 0 and named in
``negative_parts``, and where that breaks the sum beyond the stall's interval the attribution
is not conclusive (``inconclusive_because = "closure"``).

The step is compared apart: each run's step per batch against the full run's. A change beyond
its noise (``STEP_NOISE_SHARE``, or the spread of the repeats when larger) is *interference*
(the data path slowing the model): the full run's steps minus the compute-only run's, scaled
to its batches, in ``interference_s``, never folded into a stall part. Where the machine was
busy (``measure.load.heavy``) during a run whose step moved, the step change cannot be told
from the machine's: the attribution is withheld (``inconclusive_because = "busy_machine"``).
On a quiet machine nothing is withheld for a step change.

``ideal_speedup`` never exceeds ``wait_bound``: removing every wait gives at most
1 / (1 - the larger of the whole-run and steady stall shares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..measure.load import heavy
from ..results import Attribution, Interval, PartIntervals, RepeatFigures, VariantResult
from . import differential, knob_table
from .figures import wait_bound, withheld
from .stats import COMPUTE_BOUND_SHARE, bootstrap_medians, finite_median, percentile_interval

STAGES = ("fetch", "preprocess", "transfer")
PARTS = (*STAGES, "overhead")
# A step per batch within 5% of the full run's is the same step: below it, sleeps waking late
# and timer jitter move a step on a quiet machine; the repeats' own spread widens it.
STEP_NOISE_SHARE = 0.05
# The full run's measured stall is matched within its interval, and never tighter than this
# share of it (one repeat has no interval) nor than 5 ms.
CLOSURE_FLOOR_SHARE = 0.02
CLOSURE_FLOOR_S = 0.005
# A stage that ran for real in a served run (collate_fn in the dataset-served run, pin_memory
# in both) is the same stage as the full run's within 10% of its seconds (or the repeats'
# spread when larger): its clocks span fewer, shorter calls than the step's, on threads and
# processes that compete with the loop's. Beyond it (and beyond the closure's floor in
# seconds), the served run did not measure what it stands for (issue 57: collate_fn ran
# 13-60% slower in the served runs of a busy machine and the verdict named the wrong stage).
STAGE_NOISE_SHARE = 0.10
# What still ran for real in each served run of the chain (by its place in ``names``), and
# the ``StageSeconds`` field that timed it.
_UNSERVED = {1: ("preprocess", "transfer"), 2: ("transfer",), 3: ()}


def rank_batches(f: RepeatFigures) -> int:
    """The batches of the rank whose figures ``job_figures`` takes as the job's stall,
    compute and phases (the worst-stalled rank); ``f.batches`` sums the ranks'."""
    if not f.ranks:
        return f.batches
    return max(f.ranks, key=lambda r: r.stall_s).batches


def _steady(f: RepeatFigures) -> bool:
    return f.phases is not None and f.phases.has_steady


def stall_of(f: RepeatFigures, steady: bool) -> float:
    """The run's measured stall: its steady window's, scaled to all its batches, or the whole
    run's."""
    if steady and f.phases is not None:
        return f.phases.steady_stall_s * rank_batches(f) / f.phases.steady_batches
    return f.stall_s


def stall_se(wait: Sequence[float], steady_from: int | None) -> float | None:
    """The standard error of a run's measured stall from its batches' spread: with n batches,
    m of them in the steady window (from ``steady_from``; all without one) and s the
    standard deviation of their waits, S = mean(wait) x n, so SE(S) = n x s / sqrt(m).
    Batches taken as independent draws: a periodic cost (each epoch's workers forked again,
    torch's non-persistent workers) counts as spread, which errs toward calling a small
    negative part noise. None with fewer than 3 batches to read it from."""
    ws = list(wait[steady_from:] if steady_from is not None else wait)
    if len(ws) < 3:
        return None
    mean = sum(ws) / len(ws)
    sd = math.sqrt(sum((x - mean) ** 2 for x in ws) / (len(ws) - 1))
    return len(wait) * sd / math.sqrt(len(ws))


# How many standard errors a part may come out below 0 (or a served run's stall above the
# full run's) by noise alone (``stall_se``): ~2, a 95% two-sided band for one difference.
NOISE_SE = 2.0


def _noise(fs_a: Sequence[RepeatFigures], fs_b: Sequence[RepeatFigures]) -> float:
    """NOISE_SE standard errors of the difference of two runs' stalls (medians over repeats
    of each run's own SE, shrunk by its repeats); 0 where a run's SE is unknown."""
    out = 0.0
    for fs in (fs_a, fs_b):
        ses = [f.stall_se_s for f in fs if getattr(f, "stall_se_s", None) is not None]
        if len(ses) < len(fs) or not ses:
            return 0.0
        out += (_med(ses) ** 2) / len(ses)
    return NOISE_SE * math.sqrt(out)


def step_of(f: RepeatFigures, steady: bool) -> float:
    """The run's model step per batch (its steady window's, or the whole run's)."""
    if steady and f.phases is not None:
        return f.phases.steady_compute_s / f.phases.steady_batches
    return f.compute_s / max(rank_batches(f), 1)


# Batch sizes that differ by more than this ratio (largest / smallest) are variable-length
# batches: the compute-only floor is then scaled to the full run's sizes (``size_scaled``).
SIZE_VARIES = 1.10


def size_scaled(times: Sequence[float], served: Sequence[int],
                full: Sequence[int]) -> float | None:
    """The mean per-batch time of the compute-only run's served batches, as it would be over
    the full run's batches (issue 57: variable-length batches, dynamic padding: the kept
    batches served again are a few of the job's lengths, and their step was taken for the
    job's; 53.8 s of "interference" on the transformers tutorial).

    ``times``: each served batch's time; ``served``: its size (``rows.elements``: the values
    it held); ``full``: every full-run batch's size. Where the full run's sizes do not vary
    (within ``SIZE_VARIES``), the plain mean. Else, where the served sizes spread enough to
    fit it, the least-squares line t = a + b z (a: what every batch pays, b: per value) over
    the served batches, evaluated at each full-run size and averaged; where they do not
    (one kept size), t proportional to z: mean(t) * mean(full) / mean(served). None without
    the sizes (a part written before they were recorded, a batch with nothing countable)."""
    if not times or len(served) != len(times) or not full or min(full) <= 0 \
            or min(served) <= 0:
        return None
    mean_t = sum(times) / len(times)
    if max(full) <= SIZE_VARIES * min(full):
        return mean_t
    mz = sum(served) / len(served)
    mean_full = sum(full) / len(full)
    var = sum((z - mz) ** 2 for z in served)
    if max(served) > SIZE_VARIES * min(served) and var > 0:
        b = sum((z - mz) * (t - mean_t) for z, t in zip(served, times)) / var
        if b >= 0:
            a = mean_t - b * mz
            return max(a + b * mean_full, 0.0)      # linear: the mean of a + b z_i
    return mean_t * mean_full / mz


def _med(xs: Sequence[float]) -> float:
    return float(finite_median(xs))


_draws = bootstrap_medians


def _parts(s: Mapping[str, object], names: Sequence[str]) -> dict[str, object]:
    full, items, batch, free = (s[n] for n in names)
    return {"fetch": full - items, "preprocess": items - batch,    # type: ignore[operator]
            "transfer": batch - free, "overhead": free}            # type: ignore[operator]


def attribute(full: Sequence[RepeatFigures], items: Sequence[RepeatFigures],
              batch: Sequence[RepeatFigures], free: Sequence[RepeatFigures],
              only_epoch_s: Sequence[float], only_compute_s: Sequence[float],
              only_step_s: Sequence[float], names: Sequence[str], confidence: float = 0.9, seed: int = 0,
              n_boot: int = 2000, part_names: Mapping[str, str] | None = None,
              producers: int = 1) -> Attribution:
    """The attribution of one variant from the measured waits and steps of its runs.

    ``full``, ``items``, ``batch``, ``free``: the runs of the chain (full, items served,
    items and collate served, pin served: ``free`` may be ``batch``'s runs where nothing is
    pinned); ``only_epoch_s`` / ``only_compute_s`` / ``only_step_s``: each compute-only run's
    epoch and steps over the full run's batches, and its step per batch; ``names``: the
    ablation names of the five, in that order; ``part_names``: what the refusals call each
    part (a user's job: its own stages, ``figures.part_name``; the scenario words where
    not given); ``producers``: the loader's worker processes at a time (a stage's moved
    seconds reach the loop's wait spread over them, ``stage_ratios``)."""
    runs = {names[0]: list(full), names[1]: list(items), names[2]: list(batch),
            names[3]: list(free)}
    steady = all(_steady(f) for fs in runs.values() for f in fs)
    basis = ("steady state" if steady else
             "whole run (a run without a steady window: parts from whole runs' waits)")
    stalls = {k: [stall_of(f, steady) for f in fs] for k, fs in runs.items()}
    med = {k: _med(v) for k, v in stalls.items()}
    raw = _parts(med, names[:4])
    resampled = _draws(stalls, n_boot, seed)
    if len(free) == len(batch) and all(x is y for x, y in zip(free, batch)):
        # nothing pinned: the "pin served" run is the collate-served run itself, transfer is
        # 0 by construction (not two resamplings of the same runs)
        resampled[names[3]] = resampled[names[2]]
    draws = _parts(resampled, names[:4])

    def iv(d: object) -> Interval:
        return Interval(*percentile_interval(d, confidence))

    def part_iv(d: object) -> Interval:
        # a part's interval is stored no lower than 0, as the part is (issue 39: no negative
        # part printed or stored as a figure; ``negative_parts`` says which came out below)
        i = iv(d)
        return Interval(max(i.low, 0.0), max(i.high, 0.0))

    negative = [p for p in PARTS if raw[p] < 0]       # type: ignore[operator]
    part = {p: max(float(raw[p]), 0.0) for p in PARTS}   # type: ignore[arg-type]
    attributed = sum(part.values())

    epochs = [f.epoch_s for f in full]
    epoch = _med(epochs)
    steady_epoch = _med([f.phases.steady_epoch_s for f in full]) if steady else None  # type: ignore[union-attr]
    whole_stall = _med([f.stall_s for f in full])
    # start-up's part of the wait; below 0 (a steady window waiting more per batch than the
    # start-up did) it is stored as 0 like any part, and the sum to the measured stall says so
    startup = max(whole_stall - med[names[0]], 0.0) if steady else 0.0
    total = steady_epoch if steady_epoch is not None else epoch
    whole_share = whole_stall / epoch if epoch > 0 else math.nan
    steady_share = med[names[0]] / total if steady and total > 0 else None
    bound = wait_bound(whole_share, steady_share)

    # the step of each run against the full run's
    steps = {k: [step_of(f, steady) for f in fs] for k, fs in runs.items()}
    steps[names[4]] = [float(x) for x in only_step_s]
    base_step = _med(steps[names[0]])
    spread = 0.0
    for v in steps.values():
        vs = [x for x in v if math.isfinite(x)]
        if len(vs) >= 2 and _med(vs) > 0:
            spread = max(spread, (max(vs) - min(vs)) / _med(vs))
    noise = max(STEP_NOISE_SHARE, spread)
    ratio = {k: _med(v) / base_step for k, v in steps.items() if k != names[0]
             and base_step > 0 and math.isfinite(_med(v))}
    moved = [k for k, r in ratio.items() if abs(r - 1.0) > noise]
    batches = _med([rank_batches(f) for f in full])
    only_step = _med(steps[names[4]])
    interference = None
    if names[4] in moved and only_step < base_step:
        interference = (base_step - only_step) * batches
    compute = _med(only_compute_s)

    stage_total = sum(part[s] for s in STAGES)
    if total > 0 and stage_total / total >= COMPUTE_BOUND_SHARE:
        bound_by = max(STAGES, key=lambda s: part[s])
        rest = total - part[bound_by]
        speedup = total / rest if rest > 0 else math.inf
        speedup = min(speedup, bound) if math.isfinite(bound) else speedup
    else:
        bound_by, speedup = "compute", 1.0
    n_rep = min(len(v) for v in stalls.values())
    parts_sum = compute + (interference or 0.0) + attributed + startup
    a = Attribution(
        method="chain, from the measured waits of each run",
        interval=f"bootstrap percentile {confidence:.0%} over repeats ({n_rep} per run)",
        compute_s=compute, fetch_stall_s=part["fetch"], preprocess_stall_s=part["preprocess"],
        transfer_stall_s=part["transfer"], overhead_s=part["overhead"], epoch_s=epoch,
        attributed_stall_s=attributed,
        attributed_stall_share=attributed / epoch if epoch > 0 else math.nan,
        overhead_share=part["overhead"] / total if total > 0 else math.nan,
        bound_by=bound_by, ideal_speedup=speedup,
        intervals=PartIntervals(compute_s=Interval(min(only_compute_s), max(only_compute_s)),
                                fetch_stall_s=part_iv(draws["fetch"]),
                                preprocess_stall_s=part_iv(draws["preprocess"]),
                                transfer_stall_s=part_iv(draws["transfer"]),
                                overhead_s=part_iv(draws["overhead"])),
        closure_error=(parts_sum - epoch) / epoch if epoch > 0 else math.nan,
        ablation_epoch_s={k: _med([f.epoch_s for f in fs]) for k, fs in runs.items()},
        negative_parts=negative, basis=basis, startup_cost_s=startup,
        startup_cost_share=startup / epoch if epoch > 0 else 0.0,
        startup_cost_interval=None,
        steady_epoch_s=steady_epoch,
        steady_attributed_stall_share=(attributed / total if steady and total > 0 else None),
        interference_s=interference, step_ratio=ratio, step_noise_share=noise,
        wait_bound_speedup=bound)
    a.ablation_epoch_s[names[4]] = _med(only_epoch_s)
    # the contract: steady parts + start-up = the run's measured stall, within its interval
    measured = iv(_draws({"s": [f.stall_s for f in full]}, n_boot, seed)["s"])
    lo, hi = measured.low, measured.high
    slack = max(CLOSURE_FLOOR_SHARE * whole_stall, CLOSURE_FLOOR_S)
    got = attributed + startup
    said = {**SCENARIO_WORDS, **(part_names or {})}
    moved_stages = stage_ratios(runs, names, slack, producers)
    a.stage_ratio = {k: r for k, (r, _, _) in moved_stages.items()}
    costlier = serving_costlier(med, names, slack, said,
                                {k: _noise(runs[names[0]], runs[k]) for k in names[1:4]})
    if costlier:
        a.conclusive, a.inconclusive_because = False, "serving"
        a.refused = costlier
    elif moved_stages:
        a.conclusive, a.inconclusive_because = False, "stage_moved"
        a.refused = stage_moved_text(moved_stages, names, said)
    elif not (lo - slack <= got - _within_noise(raw, runs, names) <= hi + slack):
        a.conclusive, a.inconclusive_because = False, "closure"
        a.refused = (f"parts {attributed:.2f} s + start-up {startup:.2f} s = {got:.2f} s against "
                     f"a measured stall of {whole_stall:.2f} s [{lo:.2f}, {hi:.2f}]: "
                     f"{', '.join(negative) or 'a part'} came out negative (stored 0)")
    elif moved and any(heavy(f.load) for fs in runs.values() for f in fs):
        a.conclusive, a.inconclusive_because = False, "busy_machine"
        a.refused = ("the step per batch moved beyond its noise ("
                     + ", ".join(f"{k} {r:.2f}x" for k, r in ratio.items() if k in moved)
                     + " of the full run's) while other processes took cores: the parts are "
                     "withheld, the step change cannot be told from the machine's load")
    elif bound_by != "compute":
        i = a.part_interval(bound_by)
        if i.width > 1e-9 and i.low <= 0:
            a.conclusive, a.inconclusive_because = False, "interval"
    a.verdict = differential.verdict(a)
    return a


SCENARIO_WORDS = {"fetch": "fetch", "preprocess": "preprocess", "transfer": "transfer",
                  "overhead": "loader overhead"}


def _served_words(i: int, said: Mapping[str, str]) -> str:
    """What the chain's ``i``-th run served, in the job's words."""
    return " and ".join(said[p] for p in STAGES[:i])


def stage_ratios(runs: Mapping[str, Sequence[RepeatFigures]], names: Sequence[str],
                 slack: float, producers: int = 1) -> dict[str, tuple[float, float, float]]:
    """Each stage that ran for real in a served run and moved there beyond its noise against
    the full run's: ``"<run>:<part>"`` -> (its seconds / the full run's, the full run's
    seconds, the served run's), medians over repeats. Moved: beyond ``STAGE_NOISE_SHARE``
    (or the repeats' spread, when larger) and by more than ``slack`` seconds of the loop's
    wait: a stage's seconds summed over ``producers`` worker processes that ran it side by
    side reach the wait at most spread over them (a 1 ms collate in 2 workers that moved
    80 ms over a run moved the loop's wait by 40 ms at most)."""
    out: dict[str, tuple[float, float, float]] = {}
    full = runs[names[0]]
    for i, parts in _UNSERVED.items():
        fs = runs[names[i]]
        if i == 3 and all(x is y for x, y in zip(fs, runs[names[2]])):
            continue            # the "pin served" run is the collate-served run itself
        for part in parts:
            base = [getattr(f.stage_s, part) for f in full]
            got = [getattr(f.stage_s, part) for f in fs]
            mb, mg = _med(base), _med(got)
            if not (mb > 0 and math.isfinite(mg)):
                continue
            noise = STAGE_NOISE_SHARE
            for xs in (base, got):
                if len(xs) >= 2 and _med(xs) > 0:
                    noise = max(noise, (max(xs) - min(xs)) / _med(xs))
            if abs(mg / mb - 1.0) > noise and abs(mg - mb) / max(producers, 1) > slack:
                out[f"{names[i]}:{part}"] = (mg / mb, mb, mg)
    return out


def stage_moved_text(moved: Mapping[str, tuple[float, float, float]], names: Sequence[str],
                     said: Mapping[str, str]) -> str:
    """The refusal for stages that moved in the served runs without being served: which
    stage, in which run, by how much."""
    items = []
    for key, (r, mb, mg) in moved.items():
        run, part = key.split(":", 1)
        items.append(f"{said[part]} took {r:.2f}x its full-run seconds ({mg:.2f} s against "
                     f"{mb:.2f} s) in the run with {_served_words(names.index(run), said)} "
                     f"served")
    return ("; ".join(items) + ", without being served: the machine (or the serving) moved "
            "it, so the parts are withheld (measure on a quieter machine, or add repeats)")


def _within_noise(raw: Mapping[str, object], runs: Mapping[str, Sequence[RepeatFigures]],
                  names: Sequence[str]) -> float:
    """What the clamping of negative parts added to the sum that their runs' noise explains
    (issue 57): a part that came out below 0 by less than ``NOISE_SE`` standard errors of its
    two runs' stalls is 0 within its noise, and its clamp breaks no closure (a collate_fn
    part of ~0 came out -40 ms beside the noise of non-persistent workers forked each epoch,
    and a plain job was "inconclusive" on a quiet machine). Beyond it, only the noise's
    share is forgiven."""
    pairs = {"fetch": (names[0], names[1]), "preprocess": (names[1], names[2]),
             "transfer": (names[2], names[3])}
    out = 0.0
    for part, (a, b) in pairs.items():
        x = float(raw[part])        # type: ignore[arg-type]
        if x < 0:
            out += min(-x, _noise(runs[a], runs[b]))
    return out


def serving_costlier(med: Mapping[str, float], names: Sequence[str], slack: float,
                     said: Mapping[str, str], noise: Mapping[str, float] | None = None) -> str:
    """Why a served run waited longer than the full run ("" where none did): what it serves
    cost more than the stages it replaces (serving through loader workers, or the machine),
    so the parts built on it would exceed the stall; they are withheld (issue 57: a hand-off
    of 4.06 s printed against a 2.74 s stall). Beyond ``slack`` and the two runs' ``noise``
    (``_noise``: by noise alone a served run waits longer half the time where its part is
    ~0)."""
    base = med[names[0]]
    for i in (1, 2, 3):
        if med[names[i]] > base + slack + (noise or {}).get(names[i], 0.0):
            return (f"the run with {_served_words(i, said)} served waited "
                    f"{med[names[i]]:.2f} s, more than the full run's {base:.2f} s: serving "
                    f"cost more than the stages it replaces, so the parts are withheld")
    return ""


# ------------------------------------------------------------ gains the wait can explain

@dataclass
class GainCheck:
    """Whether a MEASURED speedup of one variant over the baseline is the knob's gain: only
    when the model step did not get faster beyond its noise (or no further than the
    baseline's measured interference allows; a slower step understates the gain) and the gain is within what the baseline's wait
    allows (``wait_bound``, plus its interference where measured). ``why_not`` says what else
    changed ("" when the gain stands); ``interval`` is the bootstrap interval of the ratio of
    the steady rates' medians over repeats, None with one repeat each (said in ``repeats``)."""

    gain: float
    bound: float
    step_ratio: float
    step_noise_share: float
    why_not: str = ""
    interval: tuple[float, float] | None = None
    repeats: int = 1


def variant_step(v: VariantResult) -> list[float]:
    """Each full run's model step per batch (its steady window's where it has one)."""
    return [step_of(f, _steady(f)) for f in v.repeats]


def _ratio_interval(num: Sequence[float], den: Sequence[float], confidence: float = 0.9,
                    n_boot: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    a = [x for x in num if math.isfinite(x)]
    b = [x for x in den if math.isfinite(x) and x > 0]
    if len(a) < 2 or len(b) < 2:
        return None
    d = _draws({"a": a, "b": b}, n_boot, seed)
    return percentile_interval(d["a"] / d["b"], confidence)


def check_gain(base: VariantResult, other: VariantResult, gain: float) -> GainCheck:
    """The rule of issue 39 for a measured speedup ``gain`` of ``other`` over ``base``."""
    whole = base.stall_share.median
    steady = (base.phases.steady_stall_share.median if base.phases is not None else None)
    a = base.attribution
    inter_share, only_ratio = 0.0, None
    if a is not None and a.interference_s is not None:
        total = a.steady_epoch_s if a.steady_epoch_s else a.epoch_s
        inter_share = a.interference_s / total if total > 0 else 0.0
        only_ratio = a.step_ratio.get("compute_only")
    share = max(s for s in (whole, steady if steady is not None else math.nan, 0.0)
                if math.isfinite(s))
    bound = wait_bound(min(share + inter_share, 1.0))
    sb, so = variant_step(base), variant_step(other)
    mb, mo = _med(sb), _med(so)
    ratio = mo / mb if mb > 0 and math.isfinite(mo) else math.nan
    spread = 0.0
    for xs in (sb, so):
        xs = [x for x in xs if math.isfinite(x)]
        if len(xs) >= 2 and _med(xs) > 0:
            spread = max(spread, (max(xs) - min(xs)) / _med(xs))
    noise = max(STEP_NOISE_SHARE, spread)
    n = min(len(base.repeats), len(other.repeats))
    rate = lambda v: [f.steady_throughput_samples_s for f in v.repeats]   # noqa: E731
    out = GainCheck(gain=gain, bound=bound, step_ratio=ratio, step_noise_share=noise,
                    interval=_ratio_interval(rate(other), rate(base)), repeats=n)
    step_ok = math.isfinite(ratio) and (
        ratio >= 1.0 - noise
        # a step that got slower (loader workers competing with a CPU-trained model) makes
        # the ratio an understatement of the knob's gain, never an overstatement; the data
        # path's measured interference leaving the step (down to the compute-only run's
        # step) is the knob's doing too
        or (only_ratio is not None and only_ratio - noise <= ratio < 1.0))
    why = []
    if not step_ok and math.isfinite(ratio):
        why.append(f"the model step changed: {mo * 1e3:.2f} ms/batch against {mb * 1e3:.2f} "
                   f"ms ({ratio:.2f}x, noise {noise:.0%}), which no loader setting does (the "
                   f"machine's load, or the data path slowing the step"
                   + (f" beyond the {inter_share:.0%} interference measured)" if only_ratio
                      is not None else ", not measured here: run --analyze)"))
    if math.isfinite(bound) and gain > bound * (1.0 + noise):
        why.append(f"{gain:.2f}x is more than the baseline's wait allows ({bound:.2f}x: "
                   f"1 / (1 - its wait share"
                   + (" + interference" if inter_share else "") + "))")
    out.why_not = "; ".join(why)
    return out


# ------------------------------------------------------------------------- the headline

# Start-up is split out of the headline's wait when it is more than this share of it: a Ray
# Data loop that waited 15.8 s of 15.97 s before its first batch headlined as "data stall
# 0.02 s" (its steady state) when the split was not said.
STARTUP_HEADLINE_SHARE = 0.10


def wait_headline(v: VariantResult) -> str:
    """The variant's measured wait in one line (median over its full runs): split into
    before the first batch / start-up and steady state when start-up holds more than a tenth
    of it; "" without figures."""
    stall, epoch = v.stall_s.median, v.epoch_s.median
    if not (math.isfinite(stall) and math.isfinite(epoch) and epoch > 0):
        return ""
    head = f"waited {stall:.2f} s of the {epoch:.2f} s run ({stall / epoch:.0%}; measured)"
    p = v.phases
    if p is None or not math.isfinite(p.startup_stall_s.median) or stall <= 0:
        return head
    start = min(max(p.startup_stall_s.median, 0.0), stall)
    if start <= STARTUP_HEADLINE_SHARE * stall:
        return head
    first = v.time_to_first_batch_s.median
    steady = stall - start
    ahead = (f"{first:.2f} s before the first batch, " if math.isfinite(first)
             and 0 < first <= start else "")
    reforks = _reforked_epochs(v)
    tail = ("a longer run pays the start-up once" if not reforks else
            f"the steady figure holds {reforks} later epoch(s)' start-up too: the loader's "
            f"workers are not persistent (persistent_workers=False), so every epoch forks "
            f"them again and pays it again")
    return (f"{head}: {start:.2f} s in start-up ({ahead}until every producer delivered its "
            f"first item), {steady:.2f} s in steady state: {tail}")


def _reforked_epochs(v: VariantResult) -> int:
    """Epochs after the first whose loader workers the headline DataLoader forked again (it
    has workers, they are not persistent): each pays the start-up, inside the steady window
    of ``Phases`` (which splits off the run's first start-up only). 0 where none did."""
    prof = getattr(v, "profile", None)
    lo = next((x for x in prof.loaders if x.headline), None) if prof is not None else None
    # a loader the ``persistent_workers`` knob reaches (its door honours the knob's group:
    # a DataLoader of torch's kind, whose setting decides whether each epoch forks its
    # workers again)
    kept, workers = knob_table.PERSISTENT_WORKERS, knob_table.WORKERS
    if lo is None or kept.group not in (getattr(lo, "set_keys", None) or ()):
        return 0
    st = lo.settings or {}
    if not int(st.get(workers.recorded) or 0) or st.get(kept.recorded):
        return 0
    return max(int(lo.epochs) - 1, 0)


# ``ProfileStage.where`` of the stages a loader library timed itself as parts of the loop's
# wait (the Ray Data door's ``ray <stage>``, from Ray's own iterator stats)
LIBRARY_SPLIT = {"ray": "Ray Data's own split of the wait (its iterator stats: the part of "
                        "each blocked next() each stage was active)"}


def library_split_line(v: VariantResult) -> str:
    """The headline loader's wait as its own library split it, with the part it left
    unattributed ("" where the library split nothing). The library's figures, said as its:
    Ray counts only the yielded batch's own spans, so its parts may sum to less than the
    wait; the rest is said, never spread over the parts."""
    lo = (next((x for x in v.profile.loaders if x.headline), None)
          if v.profile is not None else None)
    if lo is None:
        return ""
    for where, what in LIBRARY_SPLIT.items():
        parts = sorted((s for s in lo.stages if s.where == where and s.wall_s > 0),
                       key=lambda s: -s.wall_s)
        if not parts:
            continue
        total = sum(s.wall_s for s in parts)
        names = ", ".join(f"{s.name.split(' ', 1)[-1]} {s.wall_s:.3f} s" for s in parts)
        rest = max(lo.wait_s - total, 0.0)
        first = (f", {lo.time_to_first_batch_s:.2f} s of it before the first batch"
                 if math.isfinite(lo.time_to_first_batch_s) and
                 lo.time_to_first_batch_s > 0.1 * lo.wait_s else "")
        return (f"{lo.name}: {what}: {names}; {total:.3f} s of the {lo.wait_s:.3f} s waited, "
                f"{rest:.3f} s not attributed to a stage by it{first}")
    return ""


def interference_line(v: VariantResult) -> str:
    """The data path's measured cost on the model step, its own line ("" where not measured)."""
    a = v.attribution
    if a is None or a.interference_s is None or withheld(a):
        return ""       # withheld: the moved runs' step change is not a figure either
    r = a.step_ratio.get("compute_only")
    ratio = f" (served from memory its step took {r:.2f}x as long)" if r else ""
    return (f"the model step took {a.interference_s:.2f} s longer beside the data "
            f"path than with its batches served from memory{ratio}; measured, not a wait: no "
            f"loader setting that only removes waits recovers it")
