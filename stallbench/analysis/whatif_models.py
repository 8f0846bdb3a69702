"""What-if models behind one small interface, registered by name.

A what-if model turns measured variants of one scaling curve (variants that differ only in
their producer count) into a fitted ``WhatIfModel``; ``whatif.predict`` / ``predict_run`` then
predict any count from it, and every prediction carries the name of the model that made it
(``WhatIfModel.kind``). Two are registered:

- ``one-point`` (registered in ``whatif``, beside its formulas): the bottleneck model fitted on
  ONE configuration (the fewest producers >= 1), calibrated there. Needs one measured count.
- ``contention`` (``contention.py``): the same, plus per-sample costs that grow with busy
  cores, fitted on every measured producer count. Needs two.

This module knows no model (they import it to register; ``stallbench.analysis`` imports them
all), so the back-test and the validation can use any model without an import cycle.

``fit_best`` takes the richest model the points allow (contention, else one-point): a scenario
with one measured count still gets a prediction, and says which model made it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, ClassVar, Sequence

from ..registry import Registry
from ..results import DatasetInfo, MachineInfo, VariantResult, WhatIfModel


class ScalingModel:
    """The interface: a name, the measured producer counts it needs, ``fit`` and
    ``predict_run`` (what a whole run at N producers would measure)."""

    name: ClassVar[str]
    min_counts: ClassVar[int] = 1

    @classmethod
    def fit(cls, variants: Sequence[VariantResult], machine: MachineInfo,
            dataset: DatasetInfo | None = None) -> WhatIfModel | None:
        """A fitted model, or None when these points cannot fit it (too few counts)."""
        raise NotImplementedError

    @classmethod
    def predict_run(cls, m: WhatIfModel, workers: int, samples: float, **kw: Any) -> Any:
        """A ``whatif.RunPrediction`` of a whole run of ``samples`` samples."""
        raise NotImplementedError


MODELS: Registry[type[ScalingModel]] = Registry("what-if model")
PREFERENCE = ("contention", "one-point")      # fit_best tries these in order


def producers(v: VariantResult) -> int:
    """Producers working in parallel outside the trainer, as the executor reported them."""
    return v.executor.producer_slots


def ranks(v: VariantResult) -> int:
    """Data-parallel trainer ranks of the variant (1: one trainer in stallbench's process)."""
    return v.ranks.world if v.ranks is not None else 1


def measured(variants: Sequence[VariantResult]) -> list[VariantResult]:
    """Variants with at least one measured run, fewest ranks, then fewest producers first."""
    return sorted((v for v in variants if v.repeats and v.repeats[0].samples),
                  key=lambda v: (ranks(v), producers(v)))


IO_BOUND = 0.5             # stages that spend under half their wall on CPU: they mostly wait
IO_PRODUCERS_PER_CORE = 4  # producers that mostly wait (storage, network) share a core, 4 each
MAX_PRODUCERS = 64


def producer_budget(cores: float, cpu_share: float | None) -> float:
    """How many producers the cores carry: the one cores rule (issue 39), behind the what-if's
    oversubscribed points and the tune's worker cap alike.

    Producers whose stages burn CPU: one per core; more measure contention beyond the core
    budget. Producers whose stages mostly wait (their CPU under ``IO_BOUND`` of their wall:
    storage latency, network): ``IO_PRODUCERS_PER_CORE`` per core, since a waiting producer
    holds no core, and a loader that reads from object storage needs more workers than cores
    to hide the latency (the model's cores term still bounds their CPU). ``cpu_share`` unknown:
    one per core, the rule before the share was read."""
    if cpu_share is not None and math.isfinite(cpu_share) and cpu_share < IO_BOUND:
        return min(float(MAX_PRODUCERS), cores * IO_PRODUCERS_PER_CORE)
    return cores


def stage_cpu_share(variants: Sequence[VariantResult]) -> float | None:
    """CPU over wall of the producers' stages (fetch, preprocess, producer-side transfer) at
    the fewest producers measured (>= 1), median over its repeats: there they contend least,
    so a stage's wall is its own work and waits, not time spent queued for a core. None
    where no point has producers or their stages were not timed."""
    pts = [v for v in measured(variants) if producers(v) >= 1]
    if not pts:
        return None
    v = min(pts, key=producers)
    shares = []
    for f in v.repeats:
        s = f.stage_s
        wall = s.fetch + s.preprocess + s.transfer_producer
        cpu = s.fetch_cpu + s.preprocess_cpu + s.transfer_producer_cpu
        if wall > 0 and math.isfinite(wall) and math.isfinite(cpu):
            shares.append(cpu / wall)
    return statistics.median(shares) if shares else None


def oversubscribed(v: VariantResult, cores: float, cpu_share: float | None = None) -> bool:
    """More producer slots than the cores they share carry (``producer_budget``; issue 16):
    such a point measures contention beyond the core budget; it is shown, but not fitted on
    or counted in errors. ``cpu_share``: ``stage_cpu_share`` of the curve it belongs to."""
    return bool(v.executor.producers_share_cores
                and producers(v) > producer_budget(cores, cpu_share))


def fit_points(variants: Sequence[VariantResult], machine: MachineInfo) -> list[VariantResult]:
    """The points a model may fit on: every measured one but the oversubscribed, unless that
    leaves no point with producers (then all of them, as before issue 16)."""
    pts = measured(variants)
    share = stage_cpu_share(pts)
    ok = [v for v in pts if not oversubscribed(v, machine.cores, share)]
    return ok if any(producers(v) >= 1 for v in ok) else pts


def producer_counts(variants: Sequence[VariantResult]) -> list[int]:
    return sorted({producers(v) for v in measured(variants) if producers(v) >= 1})


def reference(variants: Sequence[VariantResult]) -> VariantResult | None:
    """The fit point of the one-point model: the fewest ranks, then the fewest producers >= 1
    (else the first)."""
    pts = measured(variants)
    return next((v for v in pts if producers(v) >= 1), pts[0] if pts else None)


def predict_run(m: WhatIfModel, workers: int, samples: float, **kw: Any) -> Any:
    """The run prediction of the model that made ``m``."""
    return MODELS.get(m.kind).predict_run(m, workers, samples, **kw)


def fit_best(variants: Sequence[VariantResult], machine: MachineInfo,
             dataset: DatasetInfo | None = None, *, model: str | None = None) -> WhatIfModel | None:
    """The first model of ``PREFERENCE`` (or the one named) that these points can fit."""
    names = [model] if model else [n for n in PREFERENCE if n in MODELS]
    for name in names:
        m = MODELS.get(name).fit(variants, machine, dataset)
        if m is not None:
            return m
    return None
