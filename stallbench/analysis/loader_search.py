"""Which loader setting ``stallbench tune -- CMD`` measures next, and when it stops (issue 41).

One decider for the search on the user's job: the driver (``profile/tune.py``) measures, this
module reads the measured trials and chooses. No grid and no fixed answer ("always 2
persistent workers" is wrong on a job whose knee is 1 worker, or one already at its ceiling):
each next trial is the change that the evidence of the best trial so far calls for, with the
figure that called for it (``Choice.why``):

- **workers**: a producer model refitted on every measured trial: one producer needs ``L``
  seconds per batch (``L`` = the loop's own fetch wait per batch at 0 workers; ``n`` x the
  batch period where ``n`` workers left the loop waiting ``SHORT`` of a batch or more). The
  knee ``ceil(L / step)`` is the worker count that stops the wait, bounded by the machine's
  cores (``whatif_models.producer_budget``: more per core where the stages mostly wait); its rate is
  PREDICTED (``min(ceiling, rows / (max(step, L / n) + hand-off))``, the hand-off being
  what the loop waits per batch where workers keep up) and stored as such;
- **persistent_workers**: a worker pool forked again at each epoch whose start-up (each
  epoch's first wait beyond its steady wait) is a measured share of the span;
- **torch.num_threads**: a step computed on the CPU that slowed with workers beside it while
  the trainer's threads plus the workers exceed the cores (the "thread storm");
- **prefetch_factor**: steady waits in bursts (the 90th percentile wait several times the
  mean) where the model says the workers keep up on average;
- **pin_memory**: only where the loop copies to a CUDA device;
- **ray.prefetch_batches**: a Ray Data iterator still waiting, doubled while it pays.

A direction whose last trial did not beat the best by ``BETTER`` is not pushed further. The
search stops at the ceiling (``AT_CEILING`` of the compute-only rate), when no untried change
is predicted to give ``BETTER`` or more, or at the budget (the driver's).

The knobs are the rows of ``knob_table``: each names the rule above that searches it
(``RULES``, run in that order), the step it takes, and how its advice is written
(``apply_text``); which of them reach the job's loader the driver reads from the loader's door
(``Context.keys``), so nothing here names a loader kind or spells a key. A new knob is its row,
and a rule here only where none of these fits it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..results import Recommendation, VariantResult
from ..scenario import format_value
from . import knob_table
from .whatif_models import producer_budget

AT_CEILING = 0.95        # the best within 5% of the compute-only steady rate: nothing to buy
BETTER = 0.03            # a change predicted (or measured) to give less than 3% is not one
WAITS = 0.05             # a steady wait share below 5%: the loop is not waiting for data
STARTUP = 0.03           # epoch start-ups beyond the steady wait: 3% of the span pays a trial
STEP_SLOWED = 1.15       # the step 15% slower than with fewer workers: interference
BURSTY = 3.0             # p90 wait / mean wait: waits in bursts
LOAD_MOVED = 0.25         # cores others took, apart by more between two trials compared:
                         # the machine moved (``measure.load.HEAVY_CORES``)
SHORT = 0.20             # workers that leave the loop waiting 20% of a steady batch are too
                         # few (below it: the hand-off of a batch from a worker, not its rate)


@dataclass(frozen=True)
class Trial:
    """What one measured trial showed (the driver reads it from the job's own clocks)."""

    settings: dict[str, Any]      # the dotted keys it set ({} for the job as written)
    rate: float                   # steady samples/s (``JobTrial.steady_samples_s``)
    wait_share: float             # the loop's wait over the same span
    step_s: float                 # median step per batch
    wait_s: float                 # mean wait per batch in steady state (first batches apart)
    wait_p90_s: float
    startup_share: float          # each epoch's first wait beyond the steady wait / the span
    rows: float                   # samples per batch
    workers: int                  # as the loader ran (recorded by the hooks)
    persistent: bool
    prefetch_factor: int | None
    pin_memory: bool
    cuda: bool                    # the loop's batches reach a CUDA device
    threads: int | None           # torch's intra-op threads read in the trainer
    epochs: int
    ok: bool = True               # False: the job failed under it (a finding, not a rate)
    producer_cpu_share: float = math.nan   # CPU / wall of the loader's stages (nan: unread)
    foreign_cores: float = math.nan        # cores other processes took meanwhile (measured)

    @property
    def steady_wait(self) -> float:
        """The wait's share of a steady batch (each epoch's first batch apart): the loop
        left waiting by its producers, start-ups aside."""
        whole = self.wait_s + self.step_s
        return self.wait_s / whole if whole > 0 and math.isfinite(whole) else 0.0


@dataclass(frozen=True)
class Context:
    """What the search may change and against what. Which knobs reach the job's loader is
    the driver's to say (its door's groups: ``knob_table.searched_for``), so ``keys`` holds
    only those; nothing here names a loader kind."""

    cores: float
    ceiling: float | None         # compute-only steady samples/s
    keys: frozenset[str]          # the dotted keys the search may change
    as_written: dict[str, Any] = field(default_factory=dict)   # the loader's recorded
                                  # settings as written (a knob's value where no trial set it)
    ranks: int = 1                # the job's ranks on this machine: each loader's workers
                                  # (and its trainer's threads) share the cores with theirs

    @property
    def rank_cores(self) -> float:
        """The cores one rank's loader and trainer have: the machine's over its ranks (8
        ranks of a torchrun on 32 cores: 4 each, so "8 workers" is 64 processes)."""
        return self.cores / max(1, self.ranks)

    @property
    def cores_text(self) -> str:
        """The cores as the advice says them: the machine's, and its share per rank."""
        return (f"{self.cores:g} cores" if self.ranks <= 1 else
                f"{self.cores:g} cores shared by its {self.ranks} ranks "
                f"({self.rank_cores:g} each)")


@dataclass
class Choice:
    settings: dict[str, Any]      # every dotted key the trial sets (the best's, changed)
    change: str
    why: str
    predicted: float | None = None       # PREDICTED steady samples/s, where a model gives one
    gain: float = 0.0                    # predicted / best - 1 (ordering only)


@dataclass
class Decision:
    choice: Choice | None
    stop_reason: str = ""         # "at_ceiling", "no_gain_predicted" when choice is None
    stop_text: str = ""
    model: dict[str, float] = field(default_factory=dict)   # the refitted producer model


def best(trials: list[Trial]) -> Trial:
    return max((t for t in trials if t.ok), key=lambda t: t.rate)


def producer_load(trials: list[Trial]) -> float | None:
    """``L``: one producer's seconds per batch, the median of every trial's estimate (refitted
    on each measured point): at 0 workers the loop fetches itself, its wait per batch is L;
    ``n`` workers that leave the loop waiting deliver a batch per ``L / n`` seconds."""
    est = []
    for t in trials:
        if not t.ok or not (t.rows > 0 and t.rate > 0):
            continue
        if t.workers == 0 and t.wait_s > 0:
            est.append(t.wait_s)
        elif t.workers > 0 and t.steady_wait >= SHORT:
            est.append(t.workers * (t.wait_s + t.step_s))
    return statistics.median(est) if est else None


def handoff(trials: list[Trial], L: float | None) -> float:
    """What the loop waits per batch where its workers keep up (``L / n`` under the step):
    the hand-off of a batch from a worker process (its unpickling), measured in the worker
    trials, which more workers do not remove; 0 before any was measured."""
    est = [t.wait_s for t in trials if t.ok and t.workers > 0 and L is not None
           and L / t.workers < t.step_s and math.isfinite(t.wait_s)]
    return statistics.median(est) if est else 0.0


def _step(trials: list[Trial]) -> float:
    """The loop's own step without the data path's interference: the fastest measured."""
    steps = [t.step_s for t in trials if t.ok and t.step_s > 0 and math.isfinite(t.step_s)]
    return min(steps) if steps else math.nan


def _worker_cap(cores: float, trials: list[Trial]) -> int:
    """The most workers a trial may ask for: the producers the cores carry, by the one cores
    rule (``whatif_models.producer_budget``: one per core where the loader's stages burn CPU,
    more where they mostly wait), the share measured as their CPU over their wall time."""
    shares = [t.producer_cpu_share for t in trials if t.ok and math.isfinite(t.producer_cpu_share)]
    return max(1, int(producer_budget(cores, statistics.median(shares) if shares else None)))


def _fmt(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _with(b: Trial, **changes: Any) -> dict[str, Any]:
    out = dict(b.settings)
    out.update(changes)
    return out


def _pushed_in_vain(trials: list[Trial], key: str, b: Trial) -> bool:
    """A trial that changed ``key`` away from the best's value and was not better by
    ``BETTER``: that direction is spent."""
    return any(t.settings.get(key) is not None and t.settings.get(key) != b.settings.get(key)
               and (not t.ok or t.rate < b.rate * (1 + BETTER)) and t is not b for t in trials)


def lost_above(trials: list[Trial], b: Trial) -> int | None:
    """The fewest workers above the best's that a trial measured no better than the best by
    ``BETTER`` (or the job failed under): more than that is a losing direction (issue 58: on
    2 cores tune climbed to 5-8 workers, every step slower than the job as written)."""
    lost = [t.workers for t in trials if t is not b and t.workers > b.workers
            and (not t.ok or t.rate < b.rate * (1 + BETTER))]
    return min(lost) if lost else None


def moved(t: Trial, b: Trial) -> bool:
    """The machine's load moved between trial ``t`` and the best ``b``: their measured
    foreign cores apart by more than ``LOAD_MOVED``."""
    return (math.isfinite(t.foreign_cores) and math.isfinite(b.foreign_cores)
            and abs(t.foreign_cores - b.foreign_cores) > LOAD_MOVED)


def repeat_moved(trials: list[Trial]) -> Choice | None:
    """A trial that lost to the job as written (the first trial) while the machine's load
    moved between them, measured once: measured again (issue 58: one ``num_workers=1`` trial
    at 0.75x under a load that moved ended a search, while by hand it was faster in 2 of 3
    pairs). A trial that beat the job as written and lost to a better trial is not: its
    direction paid, the better one is what the search goes on from."""
    b = trials[0] if trials and trials[0].ok else best(trials)
    for t in trials:
        same = [u for u in trials if u.settings == t.settings]
        if t is b or not t.ok or len(same) > 1 or not t.settings \
                or t.rate >= b.rate * (1 + BETTER) or not moved(t, b):
            continue
        return Choice(dict(t.settings), f"{_name(t.settings)} again",
                      f"it ran at {t.rate / b.rate:.2f}x the job as written while other "
                      f"processes took {t.foreign_cores:.2f} cores against {b.foreign_cores:.2f} "
                      f"(measured): the machine moved, so it is measured again", None, BETTER)
    return None


def moved_note(trials: list[Trial]) -> str:
    """The trials compared under a load that moved and not measured again, said."""
    b = best(trials)
    said = [f"{_name(t.settings)} (others took {t.foreign_cores:.2f} cores, "
            f"{b.foreign_cores:.2f} for the best)" for t in trials
            if t is not b and t.ok and moved(t, b)]
    return (f"; compared under a load that moved: {', '.join(said)}" if said else "")


def _name(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in settings.items()) or "the job as written"


def wait_bound(b: Trial) -> float:
    """The most removing the loop's whole measured wait could give: 1 / (1 - wait share)."""
    w = b.wait_share
    return 1.0 / (1.0 - w) if math.isfinite(w) and 0 <= w < 1 else 1.0


def _spent(trials: list[Trial], key: str, b: Trial) -> bool:
    """The best's value of ``key`` bought under ``BETTER`` over every other value measured:
    going further that way is not predicted to pay either."""
    others = [t.rate for t in trials if t.ok and t is not b
              and t.settings.get(key) != b.settings.get(key)]
    return bool(others) and b.rate < max(others) * (1 + BETTER)


@dataclass
class _Round:
    """One decision's evidence, shared by the rules (``RULES``): the trials, the best so
    far, the producer model refitted on them, and the candidates the rules add."""

    ctx: Context
    trials: list[Trial]
    seen: list[dict[str, Any]]
    b: Trial
    L: float | None
    step: float
    hand: float
    cands: list[Choice] = field(default_factory=list)

    @property
    def room(self) -> float:
        return (self.ctx.ceiling / self.b.rate - 1) if self.ctx.ceiling else math.inf

    def capped(self, pred: float) -> float:
        """A predicted rate never above the measured ceiling."""
        return min(pred, self.ctx.ceiling) if self.ctx.ceiling else pred

    def add(self, settings: dict[str, Any], change: str, why: str, predicted: float | None,
            gain: float) -> None:
        if settings in self.seen or any(c.settings == settings for c in self.cands):
            return
        if predicted is not None and self.ctx.ceiling:
            predicted = min(predicted, self.ctx.ceiling)
            gain = predicted / self.b.rate - 1
        if gain >= BETTER:
            self.cands.append(Choice(settings, change, why, predicted, gain))


def _workers_knee(r: _Round, k: knob_table.Knob) -> None:
    """The producer model's knee, bounded by the cores (module doc, *workers*)."""
    b, ctx, L, step, trials = r.b, r.ctx, r.L, r.step, r.trials
    if not (L and math.isfinite(step) and step > 0 and b.steady_wait >= WAITS):
        return
    cap = _worker_cap(ctx.rank_cores, trials)
    knee = max(1, math.ceil(L / step - 1e-9))
    n = min(knee, cap)
    if n == b.workers and n < cap and b.steady_wait >= SHORT \
            and not _pushed_in_vain(trials, k.key, b):
        n = b.workers + 1           # the model's knee measured and still too few
    lost = lost_above(trials, b)
    if lost is not None and n >= lost:
        # issue 58: a direction that did not pay is not pushed further: between the best
        # and the count that lost, halfway (the fewest workers last)
        n = (b.workers + lost) // 2
        if n <= b.workers:
            return
    if n != b.workers:
        pred = r.capped(b.rows / (max(step, L / n) + r.hand))
        beyond = (f"; the knee ({knee}) is beyond the {cap} workers the machine's "
                  f"{ctx.cores_text} allow" if knee > cap else "")
        r.add(_with(b, **{k.key: n}), f"{k.name}: {b.workers} -> {n}",
              f"the loop waited {b.wait_share:.0%} of its steady state; one producer "
              f"needs {L * 1e3:.1f} ms per batch (fitted on {len(trials)} trial(s)) "
              f"against a {step * 1e3:.1f} ms step: the knee is {knee} worker(s), "
              f"PREDICTED {pred:,.0f} samples/s{beyond}", pred, pred / b.rate - 1)


def _startup(r: _Round, k: knob_table.Knob) -> None:
    """Any trial whose workers were forked again each epoch, with a start-up that weighs."""
    for t in r.trials:
        if t.ok and t.workers > 0 and not t.persistent and t.epochs >= 2 \
                and t.startup_share >= STARTUP:
            pred = r.capped(t.rate / max(1e-9, 1 - t.startup_share))
            r.add(_with(t, **{k.key: True}),
                  f"{k.name}: false -> true (at num_workers={t.workers})",
                  f"at num_workers={t.workers} each epoch's start-up (its workers forked "
                  f"again) took {t.startup_share:.0%} of the span over {t.epochs} epochs; "
                  f"kept workers pay it once: PREDICTED {pred:,.0f} samples/s", pred,
                  pred / r.b.rate - 1)


def _thread_storm(r: _Round, k: knob_table.Knob) -> None:
    """A trial whose step computes on the CPU beside its workers, threads over the cores."""
    ctx, L, trials = r.ctx, r.L, r.trials
    for t in trials:
        if not (t.ok and not t.cuda and t.threads and t.threads + t.workers > ctx.rank_cores
                and k.key not in t.settings):
            continue
        n = max(1, int(ctx.rank_cores) - t.workers)
        if n >= t.threads:
            continue
        ref = min((u for u in trials if u.ok and u.workers < t.workers
                   and math.isfinite(u.step_s)), key=lambda u: u.workers, default=None)
        if ref is not None and t.step_s > STEP_SLOWED * ref.step_s:
            pred = r.capped(t.rows / max(ref.step_s, (L / t.workers) if L else 0.0,
                                         t.rows / t.rate - (t.step_s - ref.step_s)))
            r.add(_with(t, **{k.key: n}),
                  f"{k.key}: {t.threads} -> {n} (at num_workers={t.workers})",
                  f"the step took {t.step_s * 1e3:.1f} ms with {t.workers} worker(s) beside "
                  f"the trainer's {t.threads} torch threads on {ctx.cores_text}, "
                  f"{t.step_s / ref.step_s:.2f}x its {ref.step_s * 1e3:.1f} ms with "
                  f"{ref.workers}: threads oversubscribe the cores; PREDICTED "
                  f"{pred:,.0f} samples/s", pred, pred / r.b.rate - 1)
        elif ref is None and t.workers >= ctx.rank_cores:
            # no trial with fewer workers to compare the step with: the oversubscription
            # read in the job is the evidence; no figure is predicted
            r.add(_with(t, **{k.key: n}),
                  f"{k.key}: {t.threads} -> {n} (at num_workers={t.workers})",
                  f"the trainer's {t.threads} torch threads and {t.workers} worker(s) share "
                  f"{ctx.cores_text} (read in the job): threads oversubscribe the cores",
                  None, BETTER)


def _bursts(r: _Round, k: knob_table.Knob) -> None:
    """Steady waits in bursts while the workers keep up on average: a deeper queue."""
    b, L = r.b, r.L
    if not (b.workers > 0 and b.wait_share >= WAITS and b.wait_s > 0
            and b.wait_p90_s >= BURSTY * b.wait_s and L is not None and L / b.workers < r.step):
        return
    cur = b.prefetch_factor or k.search.start
    pf = min(k.search.most, 2 * cur)
    if pf != cur:
        gain = min(r.room, b.wait_share / max(1e-9, 1 - b.wait_share)) / 2
        r.add(_with(b, **{k.key: pf}), f"{k.name}: {cur} -> {pf}",
              f"the steady waits come in bursts (90th percentile {b.wait_p90_s * 1e3:.1f} "
              f"ms, {b.wait_p90_s / b.wait_s:.1f}x the mean) while {b.workers} worker(s) "
              "keep up on average: a deeper queue absorbs them", None, gain)


def _cuda_copy(r: _Round, k: knob_table.Knob) -> None:
    """Batches copied to a CUDA device from unpinned memory while the loop waits."""
    b = r.b
    if b.cuda and not b.pin_memory and b.wait_share >= WAITS:
        r.add(_with(b, **{k.key: True}), f"{k.name}: false -> true",
              f"the loop copies its batches to a CUDA device and waited {b.wait_share:.0%}: "
              "pinned batches copy without a staging copy", None,
              min(r.room, b.wait_share / 2))


def _waiting(r: _Round, k: knob_table.Knob) -> None:
    """The loop still waiting on its loader: the knob's value doubled (from the loader's own,
    as recorded, or ``Search.start``), while a doubling pays (``_spent``). The rule of a
    queue depth whose gain no figure of the trials predicts (Ray's ``prefetch_batches``)."""
    b = r.b
    if b.wait_share < WAITS:
        return
    cur = int(b.settings.get(k.key, r.ctx.as_written.get(k.recorded or "")) or k.search.start)
    nxt = min(k.search.most, max(2, 2 * cur))
    if nxt != cur and not _spent(r.trials, k.key, b):
        gain = min(r.room, b.wait_share / max(1e-9, 1 - b.wait_share))
        r.add(_with(b, **{k.key: nxt}), f"{k.name}: {cur} -> {nxt}",
              f"the loop waited {b.wait_share:.0%} of its steady state on "
              f"{k.advice.where} at {k.name}={cur}", None, gain)


# ``Search.rule`` -> the rule that reads the evidence for a knob and adds its trial; run in
# this order (a tie in predicted gain goes to the earlier rule)
RULES: dict[str, Callable[[_Round, knob_table.Knob], None]] = {
    "workers_knee": _workers_knee, "startup": _startup, "thread_storm": _thread_storm,
    "bursts": _bursts, "cuda_copy": _cuda_copy, "waiting": _waiting}


def decide(ctx: Context, trials: list[Trial], tried: list[dict[str, Any]]) -> Decision:
    """The next trial from the trials measured so far (the first is the job as written), or
    why the search stops. Each knob of ``ctx.keys`` is searched by its table row's rule."""
    b = best(trials)
    L = producer_load(trials)
    step = _step(trials)
    model = {"producer_s_per_batch": L or math.nan, "step_s": step,
             "handoff_s": handoff(trials, L)}
    again = repeat_moved(trials)
    if again is not None:
        return Decision(again, model=model)
    ctx = trusted_ceiling(ctx, b)
    if ctx.ceiling and b.rate >= AT_CEILING * ctx.ceiling:
        return Decision(None, "at_ceiling",
                        f"the best measured steady rate ({b.rate:,.0f} samples/s) is "
                        f"{b.rate / ctx.ceiling:.0%} of the compute-only ceiling "
                        f"({ctx.ceiling:,.0f}, measured by replay): no loader setting can buy "
                        f"more than {ctx.ceiling / b.rate - 1:.0%} (the loop waits "
                        f"{b.wait_share:.0%})", model)
    r = _Round(ctx, trials, [dict(s) for s in tried], b, L, step, handoff(trials, L))
    knobs = [k for k in knob_table.rows() if k.search is not None and k.key in ctx.keys]
    for rule, fn in RULES.items():
        for k in knobs:
            if k.search.rule == rule:
                fn(r, k)
    if not r.cands:
        why = (f"the loop waits {b.wait_share:.0%} of its steady state"
               if b.wait_share < WAITS else
               f"every change the evidence calls for was measured or is predicted to give "
               f"under {BETTER:.0%} (the loop still waits {b.wait_share:.0%})")
        return Decision(None, "no_gain_predicted",
                        f"no untried setting is predicted to give {BETTER:.0%} or more: {why}"
                        f"{moved_note(trials)}", model)
    r.cands.sort(key=lambda c: -c.gain)
    return Decision(r.cands[0], model=model)


CEILING_WAIT = 2 * WAITS   # a loop waiting this much is not at a ceiling 5% above it


def trusted_ceiling(ctx: Context, b: Trial) -> Context:
    """The context with its ceiling where the measured wait does not contradict it: a loop
    that waits ``CEILING_WAIT`` or more of its steady state can gain up to 1 / (1 - wait),
    so a replayed ceiling that leaves it under ``BETTER`` was slowed itself (issue 58:
    "at_ceiling: no loader setting can buy more than 1%" beside "(wait 12%)"); the wait's
    bound stands in for it."""
    if not ctx.ceiling or b.wait_share < CEILING_WAIT or b.rate < AT_CEILING * ctx.ceiling:
        return ctx
    return replace(ctx, ceiling=max(ctx.ceiling, b.rate * wait_bound(b)))


def not_confirmed(name: str, speedup: float, pairs: list[float],
                  lost: list[str] | None = None) -> str:
    """Why the best trial is not the answer ("" when it is): measured again beside the job as
    written, its gain is under ``BETTER`` (the noise the search ranks by), one of its
    pairs (the search's, each confirmation round's) ran slower than the job as written, or
    the job failed under it in a confirmation round (``lost``)."""
    if lost:
        return f"the best trial, {name}, was not confirmed: {'; '.join(lost)}"
    if speedup >= 1 + BETTER and len(pairs) >= 2 and min(pairs) > 1:
        return ""
    spread = (f", range {min(pairs):.2f}-{max(pairs):.2f}" if pairs else "")
    return (f"the best trial, {name}, was not confirmed: {speedup:.2f}x the job as written "
            f"over {len(pairs)} pair(s){spread} (under {BETTER:.0%}, or a pair slower)")


def recommendation(best, settings: dict[str, Any]) -> Recommendation:
    """The result's ``analysis.recommendation`` of a tune: its confirmed answer (``best``, a
    ``JobTuneBest``), so that report, gate and history read the one answer printed."""
    if not settings and not getattr(best, "answered", True):
        return Recommendation(variant=best.name, bound_by="", steady_attributed_stall_share=None,
                              action="keep", predicted_from="measured", conclusive=False,
                              text=f"recommendation: none: {best.stop_text}")
    if not settings:
        return Recommendation(variant=best.name, bound_by="", steady_attributed_stall_share=None,
                              action="keep", predicted_from="measured",
                              text=f"recommendation: keep the job as written ({best.stop_text})")
    where = apply_text(settings)
    basis = getattr(best, "basis", "")
    whole = getattr(best, "whole_job_speedup", None)
    text = (f"recommendation: {where}: {best.speedup:.2f}x the job as written in steady state "
            f"(measured, confirmed interleaved{'; ' + basis if basis else ''})"
            + (f"; the whole job {whole:.2f}x ({best.whole_job_basis})" if whole else
               (f"; the whole job: {best.whole_job_basis}"
                if getattr(best, "whole_job_basis", "") else "")))
    key = next(iter(settings))
    return Recommendation(variant=best.name, bound_by="", steady_attributed_stall_share=None,
                          measured_speedup=best.speedup, measured_variant=best.name,
                          action=f"set {where}", knob=key, value=settings[key],
                          predicted_from="measured", text=text)


def apply_text(settings: dict[str, Any]) -> str:
    """The settings as the user writes them in code (each knob's ``Advice``)."""
    if not settings:
        return "keep the job as written"
    return knob_table.advice_text(settings)


def bare(settings: dict[str, Any]) -> dict[str, Any]:
    """The result's ``settings``: loader keywords bare, other knobs prefixed."""
    return {knob_table.bare_name(k): v for k, v in settings.items()}


def dotted(settings: dict[str, Any], groups: frozenset[str] | tuple[str, ...]
           ) -> dict[str, Any]:
    """``bare``'s inverse: a trial's recorded settings back as ``--set`` keys, for a loader
    whose door honours ``groups``."""
    return {knob_table.dotted_key(k, groups): v for k, v in settings.items()}


def still_binds(ctx: Context, b: Trial) -> str:
    ctx = trusted_ceiling(ctx, b)
    if ctx.ceiling and b.rate >= AT_CEILING * ctx.ceiling:
        return "the step (compute): the loop runs at its compute-only ceiling"
    if b.wait_share >= WAITS:
        return f"the data path: the loop still waits {b.wait_share:.0%} of its steady state"
    if ctx.ceiling:
        return (f"the step as slowed beside the data path: {b.rate / ctx.ceiling:.0%} of the "
                "compute-only ceiling while the loop barely waits (interference)")
    return "the step (compute): the loop barely waits"


# ------------------------------------------------ profile's recommendation (issue 39's decider)
# ``stallbench profile --set`` measures the values the user listed; which of them to advise is
# decided here, beside the search ``tune`` runs, so that the two never decide apart.

def steady_rate(v: VariantResult) -> float:
    """The variant's median steady rate; NaN when its runs had no steady window (never the
    whole-run rate in its place: start-up would be compared as if it were steady)."""
    if v.phases is not None and math.isfinite(v.phases.steady_samples_s.median):
        return v.phases.steady_samples_s.median
    return math.nan


def steady_or_zero(v: VariantResult) -> float:
    r = steady_rate(v)
    return r if math.isfinite(r) else 0.0


def _reaches(key: str, v: VariantResult) -> bool:
    """Whether a ``--set`` key's group had a loader in this variant's job to apply to: a
    loader whose door honours the group (``dataloader`` a torch DataLoader, ``ray`` a Ray
    Data iterator; a watched iterable takes neither: its door says, and the result's
    ``set_keys`` carries it). Without a profile record (a unit's stand-in) it is taken as
    reached."""
    k = knob_table.by_key(key)
    if getattr(v, "profile", None) is None or (k is not None and k.process):
        return True             # the trainer's threads: the process, not a loader
    group = knob_table.group_of(key)    # each loader's door says which groups reach it
    return any(group in ld.set_keys for ld in v.profile.loaders)


def knobs_reached_nothing(variants: list[VariantResult]) -> list[str]:
    """The ``--set`` keys the variants differ by, when none of them reached a loader (a
    watched generator takes no DataLoader setting): the variants then ran the same job, and
    which measured faster is noise, never advice. Empty when any differing key reached one."""
    changed = {k for v in variants for k in v.knobs
               if len({format_value(w.knobs.get(k)) for w in variants}) > 1}
    unreached = sorted(k for k in changed if not any(_reaches(k, v) for v in variants))
    return unreached if changed and len(unreached) == len(changed) else []


def not_applied(v: VariantResult) -> dict[str, str]:
    """The variant's ``--set`` values that its loaders did not run with, and why (issue 38,
    class 11: ``persistent_workers=true`` on a job at ``num_workers=0`` is dropped by the hooks,
    since torch refuses it; advising it would break the job). Read from what the headline
    loader recorded it ran with (the figures compared are its: the knob's ``recorded``
    field, where its door honours the knob's group); a key no loader records counts as
    applied."""
    if getattr(v, "profile", None) is None:
        return {}
    out: dict[str, str] = {}
    threads = knob_table.THREADS
    want = v.knobs.get(threads.key)
    ran = getattr(getattr(v, "threads", None), "trainer_torch_threads", None)
    if want is not None and ran is not None and int(ran) != int(want):
        out[f"{threads.name}={want}"] = (f"the trainer ran with {ran} torch threads (the job "
                                         "sets its own after importing torch)")
    # the headline loader's (the figures compared are its); every loader's without one
    lds = [ld for ld in v.profile.loaders if getattr(ld, "headline", False)] or v.profile.loaders
    for key, value in v.knobs.items():
        k = knob_table.by_key(key)
        if k is None or k.recorded is None:
            continue
        arg = k.recorded
        for ld in lds:
            if k.group not in ld.set_keys or arg not in ld.settings:
                continue
            if format_value(ld.settings[arg]) != format_value(value):
                why = next((n for n in ld.notes if n.startswith(f"{arg} not applied")),
                           f"{ld.name} ran with {arg}={format_value(ld.settings[arg])}")
                out[f"{arg}={format_value(value)}"] = why
                break
    return out


def advisable(variants: list[VariantResult]) -> list[VariantResult]:
    """The variants advice may name: the first (the comparison's base) and every other whose
    ``--set`` values all ran."""
    return [v for i, v in enumerate(variants) if i == 0 or not not_applied(v)]


def recommend(variants: list[VariantResult]) -> Recommendation | None:
    """Measured: the best variant in steady state against the first one; none when a side
    of the comparison had no steady window (too short a run to compare steady rates)."""
    if len(variants) < 2:
        return None
    base = variants[0]
    unreached = knobs_reached_nothing(variants)
    if unreached:
        kinds = sorted({ld.kind for v in variants if v.profile for ld in v.profile.loaders})
        text = (f"recommendation: none: {', '.join(unreached)} reached no loader of "
                f"the job (its loaders: {', '.join(kinds) or 'none'}), so the variants ran the "
                f"same job and their differences are noise; measured {base.name} "
                f"{base.throughput_samples_s.median:,.0f} samples/s over the whole run")
        return Recommendation(variant=base.name, bound_by="", steady_attributed_stall_share=None,
                              action="keep", predicted_from="measured", text=text)
    short = [v.name for v in variants if not math.isfinite(steady_rate(v))]
    if short:
        whole = ", ".join(f"{v.name} {v.throughput_samples_s.median:,.0f}" for v in variants)
        text = (f"recommendation: none: {', '.join(short)} too short for a steady state "
                f"(profile more batches to compare steady rates); whole-run samples/s, "
                f"start-up included: {whole} (measured)")
        return Recommendation(variant=base.name, bound_by="", steady_attributed_stall_share=None,
                              action="keep", predicted_from="measured", text=text)
    best = max(advisable(variants), key=steady_rate)
    b, x = steady_rate(base), steady_rate(best)
    dropped = {k: why for v in variants[1:] for k, why in not_applied(v).items()}
    unrun = ("; not advised, never applied: " + "; ".join(f"{k} ({why})" for k, why in
                                                          dropped.items())) if dropped else ""
    if best is base or not (b > 0 and x > 0):
        text = (f"recommendation: keep {base.name}: no variant was faster in steady state "
                f"({b:,.0f} samples/s; measured){unrun}")
        return Recommendation(variant=base.name, bound_by="", steady_attributed_stall_share=None,
                              action="keep", predicted_from="measured", text=text)
    changes = ", ".join(f"{k.split('.', 1)[1]}={format_value(val)}"
                        for k, val in best.knobs.items() if base.knobs.get(k) != val)
    where = knob_table.where(list(best.knobs))
    key = next((k for k in best.knobs if base.knobs.get(k) != best.knobs[k]), None)
    # issue 39: a measured ratio is the knob's gain only where the wait can explain it
    from . import waits
    chk = waits.check_gain(base, best, x / b)
    iv = (f" [{chk.interval[0]:.2f}, {chk.interval[1]:.2f}] over {chk.repeats} repeats"
          if chk.interval else " (one repeat: no interval; --repeats 2 or more gives one)")
    if chk.why_not:
        text = (f"recommendation: none measured: {best.name} ran {x / b:.2f}x{iv} {base.name} "
                f"in steady state, but that is not the gain of {changes}: {chk.why_not}; "
                f"measure again on a quiet machine (--repeats 3){unrun}")
        return Recommendation(variant=base.name, bound_by="", steady_attributed_stall_share=None,
                              measured_speedup=x / b, measured_variant=best.name,
                              action="keep", knob=key, conclusive=False,
                              not_the_knobs_gain=chk.why_not,
                              predicted_from="measured", text=text)
    text = (f"recommendation: {best.name}: {x:,.0f} steady samples/s, {x / b:.2f}x{iv} "
            f"{base.name} ({b:,.0f}; measured, steady state; the baseline's wait allows "
            f"{chk.bound:.2f}x); set {changes} on your {where}{unrun}")
    return Recommendation(variant=best.name, bound_by="", steady_attributed_stall_share=None,
                          measured_speedup=x / b, measured_variant=best.name,
                          action=f"set {changes} on your {where}", knob=key,
                          value=best.knobs.get(key) if key else None,
                          predicted_speedup=None, predicted_from="measured",
                          text=text)


# ------------------------------------------------ the answer a result stores (issue 55)
# ``profile`` and ``tune`` each decide their result's answer here, once, and hand it to
# ``profile.session.assemble``, which stores it as given (it was decided twice: ``assemble``
# recommended from the variants, then ``tune`` overwrote it with its confirmed answer).

@dataclass(frozen=True)
class Answer:
    """What a profile result says its variants showed: the recommendation, the variant it
    names best (the headline's comparison; None: no comparison), and whether the variants
    differ by a knob that reached a loader (else a what-if fitted on them would fit one job
    run N times)."""

    recommendation: Recommendation | None
    best_variant: str | None
    whatif: bool


def profile_answer(variants: list[VariantResult]) -> Answer:
    """``stallbench profile``: the measured recommendation among the ``--set`` variants
    (``recommend``), and its best the fastest advisable variant in steady state."""
    unreached = knobs_reached_nothing(variants)     # once: the best variant and the what-if
    best = (max(advisable(variants), key=steady_or_zero)
            if len(variants) > 1 and not unreached else None)
    return Answer(recommend(variants), best.name if best else None, not unreached)


def tune_answer(best, settings: dict[str, Any], variants: list[VariantResult]) -> Answer:
    """``stallbench tune -- CMD``: its confirmed answer (``best``, a ``JobTuneBest``; a
    trial the confirmation rejected is never named), ``settings`` its dotted keys."""
    return Answer(recommendation(best, settings), best.name,
                  not knobs_reached_nothing(variants))
