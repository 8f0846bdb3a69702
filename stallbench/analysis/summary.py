"""Scenario-level verdict: which variant is best, by how much, and what bounds the baseline."""

from __future__ import annotations

from typing import Any, Sequence

from ..results import VariantResult


def scenario_analysis(variants: Sequence[VariantResult]) -> dict[str, Any]:
    if not variants:
        return {}
    base = variants[0]
    best = max(variants, key=lambda v: v.throughput_samples_s.median)
    speedup = best.throughput_samples_s.median / base.throughput_samples_s.median \
        if base.throughput_samples_s.median else None
    out: dict[str, Any] = {
        "baseline_variant": base.name,
        "best_variant": best.name,
        "best_speedup": speedup,
    }
    parts = [f"best variant {best.name!r}: {best.throughput_samples_s.median:,.0f} samples/s"
             f" ({speedup:.2f}x the first variant {base.name!r})" if speedup else ""]
    if best.analysis.get("verdict"):
        parts.append(f"{best.name}: {best.analysis['verdict']}")
    out["verdict"] = "; ".join(p for p in parts if p)
    return out
