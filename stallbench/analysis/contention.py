"""The "contention" what-if model: per-sample costs that grow as more cores are busy.

Measured on a 16-core machine (issue 17): each loader worker slowed as workers were added
(about 51k samples/s alone, 46k each at 8), and the one-point model, which keeps every
per-sample cost at its fit value, over-predicted 8 workers by 12%. This model keeps the
one-point model's structure and calibration (fitted at the fewest producers, N_ref) and adds
the contention term of the universal scalability law (Gunther): with b = min(N * s, cores)
busy producer cores (s: the share of its wall a producer is on a core, ``whatif.on_cpu_share``;
1 for producers that burn CPU, so b = min(N, cores) there),

    cost(b) = cost(1) * (1 + sigma * (b - 1))

for two costs, each fitted on every measured producer count N >= 1 by least squares of the
cost on (b - 1) (two counts: the line through both; b as ``whatif.busy_of`` counts it: every
rank's producers, a real node's own cores; oversubscribed points are not fitted on):

- the producers' CPU seconds per sample (``producer_cpu_s``, else the stage timers' CPU
  clocks): a CPU clock, so a worker waiting for a core is not mistaken for a slower one;
  sigma_p scales the producers' wall and CPU cost (storage waits excepted);
- the trainer's busy seconds per sample, (epoch - wait) / samples: sigma_t scales its time.

sigma is clamped to [0, 1]: noise never makes workers faster together than alone, and a cost
that doubles per extra core is not contention. A growth is kept only when it beats the
repeats' noise (a one-sided t-test of the slope over every repeat, 95%): on a 16-core machine,
fitted on 1 and 2 workers, a +2% step that was mostly noise extrapolated to -14% at 12 workers. The start-up before the first item is fitted
as a line in N the same way (forking more workers takes longer), clamped to grow or stay.
With every count at or above the core count, b is the same for all and sigma is 0.

Fitting uses measured per-sample costs, not throughputs, so a point the trainer bounds still
tells how the producers' costs grew there.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Sequence

from ..results import DatasetInfo, MachineInfo, RepeatFigures, VariantResult, WhatIfModel
from . import figures, whatif
from .stats import t_quantile
from .whatif_models import (MODELS, ScalingModel, fit_points, measured, producer_counts, ranks,
                            reference)

SIGMA_MAX = 1.0
CONFIDENCE = 0.95        # one-sided level at which a growth must beat the repeats' noise


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least squares y = a + c * x; None when the x do not vary."""
    pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    c = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - c * mx, c


@dataclass(frozen=True)
class Slope:
    """A fitted growth and whether the repeats' spread lets it stand."""

    intercept: float
    slope: float
    t_stat: float | None          # slope / its standard error; None: no spread measured
    kept: bool


def tested_slope(xs: Sequence[float], ys: Sequence[float], level: float = CONFIDENCE) -> Slope | None:
    """Least squares over every observation (each repeat one), and a one-sided t-test of the
    slope against the residual spread: growth is kept only when it is above the noise at
    ``level``. With no residual degrees of freedom (one repeat per count, two counts) the
    spread is unknown and the fitted slope is kept as it is (``t_stat`` None says so)."""
    pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
    fit = line_fit([x for x, _ in pts], [y for _, y in pts])
    if fit is None:
        return None
    a, c = fit
    dof = len(pts) - 2
    if dof < 1:
        return Slope(a, c, None, True)
    mx = statistics.fmean(x for x, _ in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    ssr = sum((y - a - c * x) ** 2 for x, y in pts)
    se = math.sqrt(ssr / dof / sxx)
    if se == 0:
        return Slope(a, c, math.inf if c > 0 else 0.0, c > 0)
    t = c / se
    return Slope(a, c, t, t > t_quantile(dof, level))


def sigma_of(busy: Sequence[float], cost: Sequence[float]) -> tuple[float, Slope | None]:
    """sigma of cost(b) = cost(1) * (1 + sigma (b - 1)): the tested slope over the intercept,
    clamped to [0, 1]; 0 when the growth is not above the noise."""
    s = tested_slope([b - 1.0 for b in busy], cost)
    if s is None or not s.kept or not s.intercept > 0:
        return 0.0, s
    return min(max(s.slope / s.intercept, 0.0), SIGMA_MAX), s


def _say(what: str, sigma: float, s: Slope | None) -> str:
    if s is None:
        return f"{what}: one busy-core count, no growth measurable"
    t = "" if s.t_stat is None else f", t = {s.t_stat:.1f}"
    if s.t_stat is None:
        return (f"{what} {figures.signed_percent(sigma, 2)} per busy core (one repeat per "
                "count: spread unknown)")
    if not s.kept:
        rel = s.slope / s.intercept if s.intercept else 0.0
        return f"{what} {figures.signed_percent(rel, 2)} per busy core, " \
               f"within the repeats' noise{t}: 0"
    return f"{what} {figures.signed_percent(sigma, 2)} per busy core{t}"


def producer_cpu_per_sample(f: RepeatFigures) -> float:
    stage = f.stage_s.fetch_cpu + f.stage_s.preprocess_cpu + f.stage_s.transfer_producer_cpu
    cpu = f.producer_cpu_s if f.producer_cpu_s else stage
    return cpu / f.samples if f.samples else math.nan


def trainer_busy_per_sample(f: RepeatFigures) -> float:
    return (f.epoch_s - f.wait_s) / f.samples if f.samples else math.nan


@MODELS.register("contention")
class Contention(ScalingModel):
    name = "contention"
    min_counts = 2
    predict_run = staticmethod(whatif.predict_run)   # the formulas are the one-point model's

    @classmethod
    def fit(cls, variants: Sequence[VariantResult], machine: MachineInfo,
            dataset: DatasetInfo | None = None) -> WhatIfModel | None:
        # not on oversubscribed points (issue 16), and along one rank count: a curve over
        # producers
        usable = fit_points(variants, machine)
        ref = reference(usable)
        if ref is None:
            return None
        usable = [v for v in usable if ranks(v) == ranks(ref)]
        if len(producer_counts(usable)) < cls.min_counts:
            return None
        base = whatif.fit(ref, machine, dataset)
        pts = [v for v in measured(usable) if whatif.workers_of(v) >= 1]
        obs = [(whatif.busy_of(base, whatif.workers_of(v)), f, v) for v in pts for f in v.repeats]
        busy = [b for b, _, _ in obs]
        sigma_p, sp = sigma_of(busy, [producer_cpu_per_sample(f) for _, f, _ in obs])
        sigma_t, st = sigma_of(busy, [trainer_busy_per_sample(f) for _, f, _ in obs])
        m = replace(base, kind=cls.name, fit_variants=[v.name for v in pts],
                    contention_producer=sigma_p, contention_trainer=sigma_t)
        # start-up growth: what each run's time to first batch leaves after its first item
        first_item = {}
        for v in pts:
            n = whatif.workers_of(v)
            first_item[v.name] = 0.0
            if m.item_rows:
                run = whatif.predict_run(m, n, m.item_rows)   # one item: made, then consumed
                first_item[v.name] = run.first_batch_s - whatif.start_s(m, n)
        ss = tested_slope([float(whatif.workers_of(v)) for _, _, v in obs],
                          [f.time_to_first_batch_s - first_item[v.name] for _, f, v in obs])
        per_worker = max(ss.slope, 0.0) if ss is not None and ss.kept else 0.0
        said = "; ".join([_say("producer CPU/sample", sigma_p, sp),
                          _say("trainer time/sample", sigma_t, st),
                          f"start-up {figures.signed(per_worker * 1e3)} ms per worker"
                          + ("" if ss is None or ss.kept or ss.t_stat is None
                             else f" ({figures.signed(ss.slope * 1e3)} ms within the noise)")])
        return replace(m, startup_per_worker_s=per_worker, contention_fit=said)
