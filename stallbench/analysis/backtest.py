"""Back-testing a scaling curve: every measured point predicted by a fit that never saw it.

A prediction checked only against the point it was fitted on says nothing. For each measured
configuration i of a curve (variants that differ only in producer count), the richest what-if
model the OTHER points allow (``whatif_models.fit_best``: contention from two or more counts,
else one-point) predicts the whole run and its steady figure (``whatif.predict_run``), and the
errors are (predicted - measured) / measured. Worst and mean absolute errors, whole run and
steady, summarise them. A point whose removal leaves no run with producers is not back-tested
(the what-if fits on runs with producers: a no-worker run alone cannot predict workers).

Prediction interval (jackknife, i.e. leave-one-out conformal; Barber et al., "Predictive
inference with the jackknife+", 2021): with the n leave-one-out log errors
r_i = ln(predicted_i / measured_i), the interval of a new prediction X is

    [X * exp(-w), X * exp(+w)],   w = the k-th smallest |r_i|,   k = ceil((n + 1) * level)

which covers a new measurement with probability >= k / (n + 1) when the errors are
exchangeable. With few points k exceeds n: then w is the largest |r_i| and the level it can
claim is n / (n + 1), stored as ``interval_level`` (so 3 points give a 75% interval, not 90%).
Coverage is then checked on the same points: point i's interval is rebuilt from the other
n - 1 residuals and the point counts as covered when its own error falls inside.
Oversubscribed points (more producer slots than the cores they share, issue 16) are
back-tested and kept, marked, but count in neither the errors nor the interval.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from ..results import BackTest, BackTestPoint, DatasetInfo, MachineInfo, VariantResult
from . import whatif_models
from .stats import finite_median

LEVEL = 0.9
METHOD = ("leave-one-out: each measured point predicted by the richest model the other points "
          "fit (contention from >= 2 producer counts, else one-point); interval: jackknife "
          "(leave-one-out conformal) on the log errors, w = the ceil((n+1) level)-th smallest "
          "|ln(predicted/measured)|, level capped at n/(n+1); coverage: each point against the "
          "interval rebuilt without it")


def half_width(abs_log_errors: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """(w, the level it supports) from absolute leave-one-out log errors; None if there are none."""
    errs = sorted(e for e in abs_log_errors if math.isfinite(e))
    n = len(errs)
    if n == 0:
        return None
    k = math.ceil((n + 1) * level - 1e-12)
    if k <= n:
        return errs[k - 1], level
    return errs[-1], n / (n + 1)


def coverage(log_errors: Sequence[float], level: float = LEVEL) -> list[bool | None]:
    """For each point: inside the interval built from the other points' errors (None: no
    other point to build one from)."""
    out: list[bool | None] = []
    for i, r in enumerate(log_errors):
        hw = half_width([abs(e) for j, e in enumerate(log_errors) if j != i], level)
        out.append(None if hw is None or not math.isfinite(r) else abs(r) <= hw[0] + 1e-12)
    return out


def _log_err(pred: float | None, meas: float | None) -> float:
    if pred is None or meas is None or not (pred > 0 and meas > 0):
        return math.nan
    return math.log(pred / meas)


def backtest(variants: Sequence[VariantResult], machine: MachineInfo,
             dataset: DatasetInfo | None = None, *, level: float = LEVEL) -> BackTest | None:
    """The back-test of one scaling curve; None with fewer than two measured points."""
    pts = whatif_models.measured(variants)
    if len(pts) < 2:
        return None
    # a curve over ranks alone is numbered by ranks, as the validation's points are
    rank_axis = (len({whatif_models.ranks(v) for v in pts}) >= 2
                 and len({whatif_models.producers(v) for v in pts}) < 2)
    rows: list[BackTestPoint] = []
    for v in pts:
        others = [o for o in pts if o is not v]
        if not whatif_models.producer_counts(others):
            continue     # the what-if fits on a run with producers: none left to fit on
        m = whatif_models.fit_best(others, machine, dataset)
        if m is None:
            continue
        n, r = whatif_models.producers(v), whatif_models.ranks(v)
        samples = finite_median([f.samples for f in v.repeats])
        run = whatif_models.predict_run(m, n, samples, ranks=r)
        got = v.throughput_samples_s.median
        steady = finite_median([f.steady_throughput_samples_s for f in v.repeats])
        rows.append(BackTestPoint(
            n=r if rank_axis else n, variant=v.name, model=m.kind, fitted_on=list(m.fit_variants),
            ranks=r, oversubscribed=whatif_models.oversubscribed(v, machine.cores),
            measured_samples_s=got, predicted_run_samples_s=run.whole_samples_s,
            error=run.whole_samples_s / got - 1.0 if got > 0 else None,
            measured_steady_samples_s=steady if math.isfinite(steady) else None,
            predicted_steady_samples_s=run.steady_samples_s,
            steady_error=run.steady_samples_s / steady - 1.0
            if math.isfinite(steady) and steady > 0 else None))
    # oversubscribed points (issue 16) are predicted and shown, but measure contention beyond
    # the core budget: their errors enter neither the summary nor the interval
    counted = [p for p in rows if not p.oversubscribed]
    if not counted:
        return None
    steady_r = [_log_err(p.predicted_steady_samples_s, p.measured_steady_samples_s) for p in counted]
    run_r = [_log_err(p.predicted_run_samples_s, p.measured_samples_s) for p in counted]
    inside = coverage(steady_r, level)
    for p, r, ok in zip(counted, steady_r, inside):
        hw = half_width([abs(e) for e, q in zip(steady_r, counted) if q is not p], level)
        if hw is not None and p.predicted_steady_samples_s:
            p.interval_low_samples_s = p.predicted_steady_samples_s * math.exp(-hw[0])
            p.interval_high_samples_s = p.predicted_steady_samples_s * math.exp(hw[0])
        p.covered = ok
    errs = [abs(p.error) for p in counted if p.error is not None]
    steady_errs = [abs(p.steady_error) for p in counted if p.steady_error is not None]
    hw_steady = half_width([abs(e) for e in steady_r], level)
    hw_run = half_width([abs(e) for e in run_r], level)
    checked = [ok for ok in inside if ok is not None]
    return BackTest(
        method=METHOD, points=rows,
        max_abs_error=max(errs) if errs else None,
        mean_abs_error=statistics.fmean(errs) if errs else None,
        max_abs_steady_error=max(steady_errs) if steady_errs else None,
        mean_abs_steady_error=statistics.fmean(steady_errs) if steady_errs else None,
        interval_level=hw_steady[1] if hw_steady else None,
        interval_log_half_width=hw_steady[0] if hw_steady else None,
        interval_run_log_half_width=hw_run[0] if hw_run else None,
        coverage=sum(checked) / len(checked) if checked else None,
        covered=sum(checked), checked=len(checked))
