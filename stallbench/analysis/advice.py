"""Verdicts that say what to do: the next change to try and what it is predicted to give.

A bound stage alone leaves the user to guess the fix. From a variant's steady-state
attribution (which stage binds, how much of steady state is stall) and the what-if model fitted
on that same variant, one ``Recommendation``:

- **compute-bound**: nothing to do on the data side (a faster step or a larger batch is what
  helps); no prediction.
- **preprocess- or fetch-bound**: more producers where the executor scales
  (``ExecutorFacts.scaling_knobs``): for N = current+1 .. max(current+1, cores), the what-if
  predicts each steady rate; the advice is the fewest N within 5% of the best of them, its
  predicted gain = predict(N) / the current rate (``_base_rate``: the measured steady rate
  on the curve's model, the model's own on a fit on this variant alone). For fetch it also weighs caching the data (``cache = 1``) and twice the
  storage bandwidth where an emulated storage wait was measured, and takes the largest gain.
  When no option is predicted to give 5% (the cores bind), the advice is to make the stage
  cheaper or give it more CPUs, with the ideal stage's speedup as an upper bound.
- **transfer-bound**: the first knob that the configuration leaves on its slow setting, in
  this order: ``batch_format = "columnar"`` (from rows), ``collate = "producer"``,
  ``compression = "none"`` (zstd without a slow link), ``compression = "zstd"`` (a slow link
  without it), ``batch_format = "single_buffer"`` (with producers), ``prefetch_batches = 2``.
  The what-if has no model of batch formats, so the predicted gain is the attribution's ideal
  transfer speedup, labelled an upper bound.
- **inconclusive**: measure again (repeats; an emulated step on a CPU-only machine).

Beside any of these (``Recommendation.also``, issue 27): ``loader.persistent_workers = true``
where the variant's loader workers are forked for every run by an executor that could keep
them (``ExecutorFacts.workers_kept`` is False) and its MEASURED start-up is at least
``MATERIAL_STARTUP`` of its epoch (``_keep_workers``): each run pays every worker's fork,
start-up, first item's page faults and exit, which a job with kept workers pays once. Where a
sibling variant of the run measured it, its measured whole-run ratio is quoted, over its runs
whose workers its executor reports kept (``RepeatFigures.workers_reused``): its first run
forks them, so a sibling of one repeat has none.

Every gain printed is PREDICTED (``Recommendation.predicted_from`` says by what), except
(issue 25) where the suggested value was measured in the same run: then the measured steady
ratio is quoted, labelled measured, and nothing is predicted. A what-if prediction carries the
interval of the leave-one-out back-tests that vouch for it (``backtest.evidence``: the same
model's rows that extrapolated as far the same way; predicted x exp(+-w)), is made by the
model whose such rows missed least (``_best_model``), and is not printed ("not predicted",
with the reason) where they missed by more than ``MAX_BACKTEST_ERROR`` or none reaches that
far. The scenario's top recommendation (``top``) starts from its
best measured variant.

One figure per quantity (issue 25, ``figures``): the what-if used is the one the result
stores for the variant's scaling curve (``model_for``; the one ``stallbench whatif`` and the
report print, and whose back-test gives the interval), fitted on the variant alone only off
that curve; a what-if gain above the ablations' bound for that change
(``figures.ideal_bound``) contradicts a measurement and is withdrawn (``_within_ideal``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from ..measure.load import HEAVY_CORES
from ..results import BackTest, MachineInfo, Recommendation, Result, VariantResult
from ..stages.sizes import ceil_div
from . import backtest, figures, waits, whatif, whatif_models
from .stats import finite_median

WORTH = 1.05          # a change predicted to give less than this is not advised
# a what-if gain is not printed when its back-test missed by more (the one threshold, issue 39)
MAX_BACKTEST_ERROR = backtest.MAX_ERROR
NEAR_BEST = 0.95      # the fewest producers within 5% of the best predicted rate
MATERIAL_STARTUP = 0.05   # forked workers' start-up worth keeping them for: this share of the epoch


def _steady_share(v: VariantResult) -> float | None:
    """The steady-state attributed stall share, None where the attribution has no steady
    window: ``Recommendation.steady_attributed_stall_share`` holds one figure only (the whole
    run's share is ``Attribution.attributed_stall_share``, said "of the run")."""
    a = v.attribution
    if a is None or a.basis != "steady state":
        return None
    s = a.steady_attributed_stall_share
    return s if s is not None and math.isfinite(s) else None


def _cfg(v: VariantResult, section: str, key: str) -> Any:
    return (v.config.get(section) or {}).get(key)


def _producer_knob(v: VariantResult) -> tuple[str, str] | None:
    """(scenario key, words) that adds producers for this executor, or None."""
    knobs = v.executor.scaling_knobs
    if "loader.num_workers" in knobs:
        return "loader.num_workers", "add loader workers"
    if v.executor.nodes_simulated and "executor.simulated_nodes" in knobs:
        return "executor.simulated_nodes", "add producer nodes"
    if "executor.concurrency" in knobs:
        return "executor.concurrency", "add producer CPUs"
    return None


def _base_rate(v: VariantResult, m: whatif.Model, shared: bool) -> float:
    """The rate a predicted gain is relative to. On a model fitted on ``v`` alone, the
    model's own rate at ``v`` (calibrated there, so it cancels). On the curve's model
    (``shared``), ``v``'s MEASURED steady rate where it has one: ``v`` need not be the fit
    point, and a ratio of two predictions would carry two model errors where the back-test's
    interval covers one (the predicted rate's against a measured one)."""
    if shared and v.phases is not None:
        x = v.phases.steady_samples_s.median
        if math.isfinite(x) and x > 0:
            return x
    return whatif.predict(m, v.executor.producer_slots).throughput_samples_s


def _more_producers(v: VariantResult, m: whatif.Model, cores: float, base: float
                    ) -> tuple[str, str, int, float, int] | None:
    """(knob, words, value, predicted gain vs ``base``, producers) of the fewest producers
    near the best rate."""
    pk = _producer_knob(v)
    if pk is None:
        return None
    cur = v.executor.producer_slots
    if not (math.isfinite(base) and base > 0):
        return None
    top = max(cur + 1, int(math.ceil(cores)))
    preds = {n: whatif.predict(m, n).throughput_samples_s for n in range(cur + 1, top + 1)}
    best = max(preds.values())
    n = next(n for n, x in preds.items() if x >= NEAR_BEST * best)
    value = n
    if pk[0] == "executor.simulated_nodes":
        per = max(m.cpus_per_node, 1)
        value = ceil_div(n, per)
    return pk[0], pk[1], value, preds[n] / base, n


def _producers_text(knob: str, value: int) -> str:
    if knob == "loader.num_workers":
        return f"{value} worker{'s' if value != 1 else ''}"
    if knob == "executor.simulated_nodes":
        return f"{value} node{'s' if value != 1 else ''}"
    return f"{value} producer CPUs"


def _transfer_fix(v: VariantResult) -> tuple[str, str, Any]:
    fmt = _cfg(v, "loader", "batch_format")
    collate = _cfg(v, "loader", "collate")
    comp = _cfg(v, "loader", "compression")
    link = _cfg(v, "loader", "wire_bandwidth_mb_s")
    if fmt == "rows":
        return ("loader.batch_format", 'batch_format = "columnar" (no per-row Python objects)',
                "columnar")
    if collate == "trainer":
        return ("loader.collate", 'collate = "producer" (tensors made where the data is)',
                "producer")
    if comp == "zstd" and link is None:
        return ("loader.compression", 'compression = "none" (zstd costs CPU on both sides and '
                "buys nothing without a slow link)", "none")
    if comp != "zstd" and link is not None:
        return ("loader.compression", 'compression = "zstd" (fewer bytes over the slow link)',
                "zstd")
    # Both contiguous-buffer formats (``BatchFormat.contiguous_buffer``; named here because
    # analysis reads results, not the stages): jagged, the default, is one too.
    if fmt not in ("single_buffer", "jagged") and v.executor.has_producers:
        return ("loader.batch_format", 'batch_format = "single_buffer" (one shared buffer per '
                "batch, unpacked zero-copy)", "single_buffer")
    if not _cfg(v, "loader", "prefetch_batches"):
        return ("loader.prefetch_batches", "prefetch_batches = 2 (the trainer unpacks the next "
                "batch while the model computes)", 2)
    return ("", "fewer bytes per sample (narrower dtypes, fewer or shorter features)", None)


def _sibling(v: VariantResult, variants: Sequence[VariantResult], knob: str, value: Any
             ) -> VariantResult | None:
    """The variant of this run that differs from ``v`` only in ``knob``, set to ``value``."""
    section, key = knob.split(".", 1)
    for s in variants:
        if s is v or _cfg(s, section, key) != value:
            continue
        differ = {k for k in set(s.knobs) | set(v.knobs) if s.knobs.get(k) != v.knobs.get(k)}
        if all(k.split(".")[-1] == key for k in differ):
            return s
    return None


def _quote_measured(v: VariantResult, rec: Recommendation,
                    variants: Sequence[VariantResult]) -> bool:
    """Where this run measured the suggested ``rec.knob = rec.value`` (a sibling variant),
    quote that gain as measured and drop any prediction; True if it did."""
    if not (rec.knob and rec.value is not None and variants):
        return False
    s = _sibling(v, variants, rec.knob, rec.value)
    if s is None:
        return False
    # steady state where both have one, else whole runs (a run too short for a steady
    # state: ``measure.phases``), said in the text
    for steady, basis in ((True, "steady state"), (False, "whole run")):
        here, there = _rate(v, steady), _rate(s, steady)
        if math.isfinite(here) and here > 0 and math.isfinite(there):
            rec.measured_speedup, rec.measured_variant = there / here, s.name
            # issue 39: the knob's gain only where the wait explains it
            rec.not_the_knobs_gain = waits.check_gain(v, s, there / here).why_not
            rec.predicted_speedup = None
            rec.prediction_model = None
            rec.predicted_from = f"measured in this run ({basis})"
            return True
    return False


def _measured_or_bounded(v: VariantResult, rec: Recommendation,
                         variants: Sequence[VariantResult], bt: Any,
                         m: whatif.Model | None = None, n: int | None = None
                         ) -> backtest.Evidence | None:
    """Quote a value this run measured as measured; give a what-if gain the interval of the
    back-test that vouches for it (``_evidence``), or withdraw it where that back-test
    missed by more than 25% or reaches no count that far. Returns that evidence (None:
    nothing predicted by the what-if)."""
    if _quote_measured(v, rec, variants):
        return None
    if rec.predicted_from != "what-if model" or rec.predicted_speedup is None or bt is None:
        return None
    ev = _evidence(v, variants, bt, m, n)
    if ev is None:
        return None
    if not math.isfinite(ev.worst):     # nothing back-tested that far: no figure to vouch
        rec.not_predicted = (f"the {ev.model} what-if is not back-tested that far: "
                             f"{ev.scope}; measure that count")
        rec.predicted_speedup = None
        return ev
    if ev.worst > MAX_BACKTEST_ERROR:
        rec.not_predicted = (f"the {ev.model} what-if's leave-one-out back-test missed a "
                             f"measured count by {ev.worst:.0%}, above "
                             f"{MAX_BACKTEST_ERROR:.0%}, {ev.scope}")
        rec.predicted_speedup = None
        return ev
    w = ev.log_half_width
    if math.isfinite(w):
        rec.predicted_low = rec.predicted_speedup * math.exp(-w)
        rec.predicted_high = rec.predicted_speedup * math.exp(w)
    return ev


def _evidence(v: VariantResult, variants: Sequence[VariantResult], bt: Any,
              m: whatif.Model | None, n: int | None) -> backtest.Evidence | None:
    """The back-test rows that vouch for a prediction at ``n`` producers by ``m``: those of
    the same model at the same or a larger extrapolation beyond its fit (issue 25), where the
    result stores them; else the curve's worst and interval, as before (a back-test written
    before issue 25 has no extrapolations; a model fitted on ``v`` alone is not on it)."""
    if m is not None and n is not None and isinstance(bt, BackTest):
        named = {x.name: x for x in [*variants, v]}
        fitted = [whatif_models.producers(named[f]) for f in m.fit_variants if f in named]
        far, direction = backtest.extrapolation(n, fitted)
        ev = backtest.evidence(bt, m.kind, far, direction)
        if ev is not None:
            return ev
    worst = getattr(bt, "max_abs_steady_error", None)
    if worst is None:
        worst = getattr(bt, "max_abs_error", None)
    if worst is None:
        return None
    w = getattr(bt, "interval_log_half_width", None)
    if w is None:
        w = math.log1p(worst)
    return backtest.Evidence(model=m.kind if m is not None else "what-if", rows=[],
                             worst=worst, log_half_width=w,
                             scope="at the worst point of the curve")


def recommend(v: VariantResult, machine: MachineInfo,
              variants: Sequence[VariantResult] = (), backtest: Any = None,
              model: whatif.Model | None = None,
              alternatives: Sequence[whatif.Model] = ()) -> Recommendation | None:
    """The next change to try for ``v`` (None without an attribution); ``variants`` (the
    run's, to quote a suggested value it measured), ``backtest`` (the what-if's
    ``BackTest``, for the interval) and ``model``: the what-if the result stores for the
    scaling curve ``v`` is on (``model_for``), so that the verdict's figures are the ones
    ``stallbench whatif`` and the report print and the interval is that model's back-test;
    None: fitted on ``v`` alone. ``alternatives`` (``alternatives_for``): the other models
    the same curve fits; a gain is predicted by whichever of them has the best back-test
    where its prediction extrapolates (the stored model on a tie, or where none has one)."""
    a = v.attribution
    if a is None:
        return None
    rec = Recommendation(variant=v.name, bound_by=a.bound_by,
                         steady_attributed_stall_share=_steady_share(v),
                         action="")
    if not a.conclusive:
        rec.conclusive = False
        rec.action = "measure again: add repeats (--repeats)"
        if "model.step_ms" not in v.emulated:
            rec.action += (", or emulate the model step (model.kind = \"emulated\") where a "
                           "CPU-trained model competes with the loader")
        busy = [f.load.taken_cores for f in v.repeats if f.load is not None]
        if busy and max(busy) > HEAVY_CORES:
            rec.action += (f", on a quieter machine (other processes took up to "
                           f"{max(busy):.2f} cores during these runs)")
        # no knob and no gain: nothing measured to quote, nothing predicted to bound
    elif a.bound_by == "compute":
        rec.action = ("nothing to do on the data side: the data stages keep up (a faster step "
                      "or a larger batch is what speeds this up)")
    elif a.bound_by == "transfer":
        rec.knob, rec.action, rec.value = _transfer_fix(v)
        rec.knob = rec.knob or None
        rec.predicted_speedup = a.ideal_speedup
        rec.predicted_from = "attribution: ideal transfer (an upper bound)"
        _quote_measured(v, rec, variants)   # an upper bound is not a what-if: nothing to vouch
    else:
        rec = _best_model(v, machine, rec, variants, backtest, [model, *alternatives])
    _within_ideal(a, rec)
    keep = _keep_workers(v, variants)
    if keep:
        rec.also.append(keep)
    rec.text = f"{v.name}: {action_text(rec)}"
    return rec


def _startup(v: VariantResult) -> tuple[float, str]:
    """The variant's measured start-up inside its epoch and its name: the phases' start-up
    cost (the time beyond the steady rate before every producer delivered its first work item:
    what forked workers' start adds) where the runs had a steady window, else the time to
    first batch. Where the attribution put start-up apart (a steady basis) the verdict's tail
    prints its ``startup_cost_s``: that one figure, so one line never holds two start-ups
    (issue 42: "0.172 s" beside "0.21 s")."""
    a = v.attribution
    if v.phases is not None and a is not None and a.basis == "steady state" \
            and math.isfinite(a.startup_cost_s):
        return a.startup_cost_s, "start-up cost beyond the steady rate"
    if v.phases is not None:
        x = v.phases.startup_cost_s.median
        if math.isfinite(x):
            return x, "start-up cost beyond the steady rate"
    return v.time_to_first_batch_s.median, "time to first batch"


def _keep_workers(v: VariantResult, variants: Sequence[VariantResult]) -> str:
    """``loader.persistent_workers = true`` with the measured start-up that motivates it
    (module docstring), or "" where the workers are kept, cannot be, or start-up is not a
    material share of the epoch."""
    if v.executor.workers_kept is not False:
        return ""
    cost, name = _startup(v)
    epoch = v.epoch_s.median
    if not (math.isfinite(cost) and math.isfinite(epoch) and epoch > 0) \
            or cost / epoch < MATERIAL_STARTUP:
        return ""
    n = v.executor.producer_slots
    text = (f"loader.persistent_workers = true (its {n} loader worker{'s' if n != 1 else ''} "
            f"are forked every run: {name} {figures.seconds(cost)} of its "
            f"{figures.seconds(epoch)} epoch, {figures.share(cost / epoch)}, measured")
    s = _sibling(v, variants, "loader.persistent_workers", True)
    if s is None:
        return text + ")"
    # only its runs whose workers really were kept count (``RepeatFigures.workers_reused``,
    # as its executor reported): its first run forks them (the ablation runs between its full
    # runs reuse them: the local executor's kept workers serve every ablation of a variant)
    reused = [r.throughput_samples_s for r in s.repeats if r.workers_reused]
    kept = finite_median(reused)
    here = v.throughput_samples_s.median
    if math.isfinite(kept) and math.isfinite(here) and here > 0:
        return (text + f"); measured {kept / here:.2f}x ({s.name}, whole run, its "
                f"{len(reused)} run{'s' if len(reused) != 1 else ''} that reused the kept workers)")
    return (text + f"; {s.name} reused no kept workers (its first run forks them): keeping "
            f"not measured in this run)")


def _best_model(v: VariantResult, machine: MachineInfo, start: Recommendation,
                variants: Sequence[VariantResult], bt: Any,
                models: Sequence[whatif.Model | None]) -> Recommendation:
    """The data-stage advice by each candidate model; the first (the stored one) unless
    another's prediction is vouched for by a back-test with a smaller worst error."""
    best: tuple[Recommendation, float] | None = None
    for m in models:
        rec = dataclasses.replace(start)
        used, n = _data_stage(v, machine, rec, m)
        ev = _measured_or_bounded(v, rec, variants, bt, used, n)
        worst = ev.worst if ev is not None and rec.predicted_from == "what-if model" else None
        if worst is not None and not math.isfinite(worst):
            worst = math.inf            # not back-tested that far: any vouched model wins
        if best is None:
            best = (rec, worst if worst is not None else math.inf)
            if worst is None:       # measured, an upper bound, or nothing to vouch for it
                return rec
        elif worst is not None and worst < best[1]:
            best = (rec, worst)
    assert best is not None
    return best[0]


def alternatives_for(v: VariantResult, result: Result) -> list[whatif.Model]:
    """The other what-if models fitted on the scaling curve ``model_for`` gives ``v``'s model
    from (empty off that curve): candidates for the verdict's prediction."""
    wi = result.analysis.whatif
    stored = model_for(v, wi)
    if stored is None or wi is None:
        return []
    names = {c.variant for c in wi.measured}
    curve = [x for x in result.variants if x.name in names]
    out = []
    for kind in whatif_models.PREFERENCE:
        if kind == stored.kind or kind not in whatif_models.MODELS:
            continue
        m = whatif_models.fit_best(curve, result.machine, result.dataset, model=kind)
        if m is not None:
            out.append(m)
    return out


def model_for(v: VariantResult, wi: Any) -> whatif.Model | None:
    """The stored what-if (``WhatIfValidation``) when ``v`` is one of its measured points on a
    curve over producers at ``v``'s rank count, else None (``recommend`` fits ``v`` alone)."""
    if wi is None or wi.model is None or wi.axis.startswith("ranks"):
        return None
    if v.name not in {c.variant for c in wi.measured}:
        return None
    return wi.model if whatif.ranks_of(v) == wi.model.ranks else None


def _within_ideal(a: Any, rec: Recommendation) -> None:
    """A what-if gain above the ablations' bound (``figures.ideal_bound``) contradicts a
    measurement: the ablations measured what removing that data work gives at most, the
    what-if only models it. The prediction is withdrawn with both figures, never printed
    beside a bound it exceeds."""
    x = rec.predicted_speedup
    if rec.predicted_from != "what-if model" or x is None or not math.isfinite(x):
        return
    bound = figures.ideal_bound(a, rec.knob)
    if math.isfinite(bound.value) and x > bound.value:
        rec.not_predicted = (f"the what-if predicted {x:.2f}x, above the {bound.value:.2f}x "
                             f"{bound.source} gives in this variant's ablations")
        rec.predicted_speedup = rec.predicted_low = rec.predicted_high = None


def _data_stage(v: VariantResult, machine: MachineInfo, rec: Recommendation,
                model: whatif.Model | None = None) -> tuple[whatif.Model | None, int]:
    """Fill ``rec`` for a fetch- or preprocess-bound variant; (the what-if model used, the
    producer count its prediction is at: the back-test that vouches for it is chosen by how
    far that lies outside the model's fit)."""
    a = v.attribution
    assert a is not None
    stage = a.bound_by
    m = model if model is not None else (
        whatif.fit(v, machine) if v.repeats and v.repeats[0].samples else None)
    options: list[tuple[float, str, str | None, Any, int]] = []   # (gain, action, knob, value, n)
    cur = v.executor.producer_slots
    base = _base_rate(v, m, model is not None) if m is not None else math.nan
    if m is not None:
        more = _more_producers(v, m, machine.cores, base)
        if more is not None:
            knob, words, value, gain, n = more
            options.append((gain, f"{words}: {_producers_text(knob, value)}", knob, value, n))
        if stage == "fetch":
            if math.isfinite(base) and base > 0:
                cached = whatif.predict(m, cur, cache=1.0).throughput_samples_s / base
                where = ("cache the data locally (disk or memory)" if m.io_wait > 0 else
                         "keep the decoded tables in memory (fetch here is Parquet decode)")
                options.append((cached, where, None, None, cur))
                if m.io_wait > 0 and m.io_bytes > 0:
                    bw = m.io_bytes / m.io_wait / 1e6          # the measured MB/s per request
                    faster = whatif.predict(m, cur, bandwidth_mb_s=2 * bw).throughput_samples_s
                    options.append((faster / base, f"twice the storage bandwidth "
                                    f"({2 * bw:,.0f} MB/s per request)", "storage.bandwidth_mb_s",
                                    round(2 * bw, 1), cur))
    # prefer the cheaper change (listed first) unless another is clearly better
    options = [o for o in options if math.isfinite(o[0])]
    best = None
    for o in options:
        if best is None or o[0] > best[0] * 1.05:
            best = o
    if best is not None and best[0] >= WORTH:
        rec.predicted_speedup, rec.action, rec.knob, rec.value, n = best
        rec.predicted_from = "what-if model"
        rec.prediction_model = m.kind if m is not None else None
        return m, n
    rec.action = f"make {stage} cheaper or give it more CPUs, e.g. Ray nodes"
    if m is not None:
        # one story: the attribution names the stage, the what-if says why more producers
        # would not help; the verdict says both in one clause instead of two claims
        p = whatif.predict(m, max(v.executor.producer_slots, 1) + 1)
        whole = a.attributed_stall_share
        if rec.steady_attributed_stall_share is not None:
            share = f" stalls {figures.share(rec.steady_attributed_stall_share)} of steady state"
        elif whole is not None and math.isfinite(whole):
            share = f" stalls {figures.share(whole)} of the run"
        else:
            share = " binds"
        rec.action = (f"{stage}{share}, but more producers would not help ({p.why}): "
                      f"{rec.action}")
    rec.predicted_speedup = a.ideal_speedup
    rec.predicted_from = f"attribution: ideal {stage} (an upper bound)"
    return m, cur


def action_text(rec: Recommendation) -> str:
    """The action and its gain: MEASURED where this run measured the suggested value ("2
    workers measured 1.96x (num_workers=2, steady state)"), else PREDICTED with its
    back-test interval ("4 workers predicted 2.10x [1.80x, 2.40x]"), or "not predicted"
    with the reason; then each further change (``Recommendation.also``)."""
    text = _action_text(rec)
    return "; ".join([text, *(f"also {x}" for x in rec.also)])


def _action_text(rec: Recommendation) -> str:
    if rec.measured_speedup is not None and math.isfinite(rec.measured_speedup):
        basis = rec.predicted_from.partition("(")[2].rstrip(")") or "steady state"
        text = f"{rec.action} measured {rec.measured_speedup:.2f}x ({rec.measured_variant}, {basis})"
        if rec.not_the_knobs_gain:
            return (f"{text}, which is not that change's gain alone: "
                    f"{rec.not_the_knobs_gain}; measure again on a quiet machine")
        if rec.measured_speedup < WORTH:
            text += (f": no gain, so not that; make {rec.bound_by} cheaper or give it more "
                     f"CPUs")
        return text
    if rec.not_predicted:
        return f"{rec.action}: gain not predicted ({rec.not_predicted})"
    x = rec.predicted_speedup
    if x is None or not math.isfinite(x):
        return rec.action
    if rec.predicted_low is not None and rec.predicted_high is not None:
        return (f"{rec.action} predicted {x:.2f}x [{rec.predicted_low:.2f}x, "
                f"{rec.predicted_high:.2f}x]")
    if rec.predicted_from.startswith("attribution"):
        return f"{rec.action}: predicted at most {x:.2f}x ({rec.predicted_from})"
    return f"{rec.action} predicted {x:.2f}x"


def _rate(v: VariantResult, steady: bool) -> float:
    if steady and v.phases is not None:
        return v.phases.steady_samples_s.median
    return v.throughput_samples_s.median


def top(variants: Sequence[VariantResult]) -> Recommendation | None:
    """The scenario's one recommendation: start from the fastest measured variant in steady
    state (whole runs where a variant has no steady window), say by how much it beat the first
    (measured), and give its next change."""
    if not variants:
        return None
    steady = all(v.phases is not None and math.isfinite(v.phases.steady_samples_s.median)
                 for v in variants)
    ranked = [v for v in variants if math.isfinite(_rate(v, steady))]
    if not ranked:
        return None
    base = variants[0]
    best = max(ranked, key=lambda v: _rate(v, steady))
    rec = best.recommendation
    if rec is None:
        return None
    out = dataclasses.replace(rec)
    b = _rate(base, steady)
    gain = _rate(best, steady) / b if b and math.isfinite(b) else math.nan
    if best is not base and math.isfinite(gain) and gain >= WORTH:
        basis = " in steady state" if steady else ""
        out.text = (f"use {best.name} (measured {gain:.2f}x {base.name}{basis}); then "
                    f"{action_text(rec)}")
    else:
        out.text = f"{best.name}: {action_text(rec)}"
    return out
