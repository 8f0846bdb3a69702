"""What-if models behind one small interface, registered by name.

A what-if model turns measured variants of one scaling curve (variants that differ only in
their producer count) into a fitted ``WhatIfModel``; ``whatif.predict`` / ``predict_run`` then
predict any count from it, and every prediction carries the name of the model that made it
(``WhatIfModel.kind``). Two are registered:

- ``one-point`` (``whatif.fit``): the bottleneck model fitted on ONE configuration (the fewest
  producers >= 1), calibrated there. Needs one measured producer count.
- ``contention`` (``contention.py``): the same, plus per-sample costs that grow with busy
  cores, fitted on every measured producer count. Needs two.

``fit_best`` takes the richest model the points allow (contention, else one-point): a scenario
with one measured count still gets a prediction, and says which model made it.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

from ..registry import Registry
from ..results import DatasetInfo, MachineInfo, VariantResult, WhatIfModel
from . import whatif


class ScalingModel:
    """The interface: a name, the measured producer counts it needs, and ``fit``."""

    name: ClassVar[str]
    min_counts: ClassVar[int] = 1

    @classmethod
    def fit(cls, variants: Sequence[VariantResult], machine: MachineInfo,
            dataset: DatasetInfo | None = None) -> WhatIfModel | None:
        """A fitted model, or None when these points cannot fit it (too few counts)."""
        raise NotImplementedError


MODELS: Registry[type[ScalingModel]] = Registry("what-if model")
PREFERENCE = ("contention", "one-point")      # fit_best tries these in order


def measured(variants: Sequence[VariantResult]) -> list[VariantResult]:
    """Variants with at least one measured run, fewest producers first."""
    return sorted((v for v in variants if v.repeats and v.repeats[0].samples),
                  key=whatif.workers_of)


def producer_counts(variants: Sequence[VariantResult]) -> list[int]:
    return sorted({whatif.workers_of(v) for v in measured(variants) if whatif.workers_of(v) >= 1})


def reference(variants: Sequence[VariantResult]) -> VariantResult | None:
    """The fit point of the one-point model: the fewest producers >= 1 (else the first)."""
    pts = measured(variants)
    return next((v for v in pts if whatif.workers_of(v) >= 1), pts[0] if pts else None)


@MODELS.register("one-point")
class OnePoint(ScalingModel):
    name = "one-point"
    min_counts = 1

    @classmethod
    def fit(cls, variants: Sequence[VariantResult], machine: MachineInfo,
            dataset: DatasetInfo | None = None) -> WhatIfModel | None:
        ref = reference(variants)
        return whatif.fit(ref, machine, dataset) if ref is not None else None


def fit_best(variants: Sequence[VariantResult], machine: MachineInfo,
             dataset: DatasetInfo | None = None, *, model: str | None = None) -> WhatIfModel | None:
    """The first model of ``PREFERENCE`` (or the one named) that these points can fit."""
    names = [model] if model else list(PREFERENCE)
    for name in names:
        m = MODELS.get(name).fit(variants, machine, dataset)
        if m is not None:
            return m
    return None


from . import contention  # noqa: E402,F401  (registers "contention")
