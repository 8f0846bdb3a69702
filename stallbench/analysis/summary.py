"""Scenario-level verdict: which variant is best, by how much, and what bounds the baseline."""

from __future__ import annotations

from typing import Sequence

from ..results import ScenarioAnalysis, VariantResult, WhatIfValidation
from . import waits


def whole_run_speedup(best: VariantResult, base: VariantResult) -> float | None:
    """``ScenarioAnalysis.best_speedup``: the best variant's median whole-run samples/s over
    the baseline's. One meaning wherever it is stored (``run``, ``profile``, ``tune``), so the
    report can print it as the whole run's beside the steady ratio of the phases."""
    b, x = base.throughput_samples_s.median, best.throughput_samples_s.median
    return x / b if b and b > 0 and x == x else None


def scenario_analysis(variants: Sequence[VariantResult],
                      whatif: WhatIfValidation | None = None) -> ScenarioAnalysis:
    if not variants:
        return ScenarioAnalysis(whatif=whatif)
    base = variants[0]
    best = max(variants, key=lambda v: v.throughput_samples_s.median)
    speedup = whole_run_speedup(best, base)
    parts = [f"best variant {best.name!r}: {best.throughput_samples_s.median:,.0f} samples/s"
             f" ({speedup:.2f}x the first variant {base.name!r})" if speedup else ""]
    # issue 39: the measured wait first, start-up apart when it weighs; interference its own
    for v in ([base] if best is base else [base, best]):
        for line in (waits.wait_headline(v), waits.interference_line(v)):
            if line:
                parts.append(f"{v.name}: {line}")
    if best.attribution is not None and best.attribution.verdict:
        parts.append(f"{best.name}: {best.attribution.verdict}")
    return ScenarioAnalysis(baseline_variant=base.name, best_variant=best.name,
                            best_speedup=speedup, verdict="; ".join(p for p in parts if p),
                            whatif=whatif)
