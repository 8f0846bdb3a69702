"""What the gate compares, read off one variant's result: per-repeat values of every metric.

The gate and the A/B gate take a metric's values here and nowhere else, so a new way to read a
figure (issue 18: the stall share of the slowest rank) is one edit in this module.

- ``throughput``, ``peak_pss_mb``: the variant's per-repeat ``Summary.values``.
- ``stall_share``: per repeat, the trainer's stall share (``stall_s / epoch_s``). HOOK: when a
  result carries per-rank figures (issue 18), this becomes the maximum over ranks of each
  repeat's share: a job waits for its slowest rank, so the worst rank is the one to gate.
- attribution parts (``fetch_stall_share``, ``preprocess_stall_share``, ``transfer_stall_share``,
  ``loader_overhead_share``): per repeat index r, the attribution recomputed from that repeat's
  full run and its ablation runs alone (``differential.attribute`` on repeat r's epochs: the
  same formula as the stored attribution, which uses medians over repeats), divided by repeat
  r's full epoch. Per-repeat values are what the rank tests need; a result run with one repeat
  per process (the A/B gate) gets exactly its stored attribution.
"""

from __future__ import annotations

import math

from .rule import ATTRIBUTION_METRICS, Metric
from ..results import VariantResult

_PART = {"fetch_stall_share": "fetch_stall_s", "preprocess_stall_share": "preprocess_stall_s",
         "transfer_stall_share": "transfer_stall_s", "loader_overhead_share": "overhead_s"}


def available(v: VariantResult, m: Metric) -> bool:
    """Whether this variant's result holds the metric at all (attribution parts need the
    differential runs; a result without them has no such row, rather than a "no data" row)."""
    if m.name in ATTRIBUTION_METRICS:
        return v.attribution is not None and bool(v.ablations)
    return True


def per_repeat(v: VariantResult, m: Metric) -> list[float]:
    """The metric's value in each repeat, in repeat order (NaN where a repeat lacks it)."""
    if m.name in ATTRIBUTION_METRICS:
        return _attribution_part(v, _PART[m.name])
    if m.name == "stall_share":
        return stall_share(v)
    return [float(x) for x in getattr(v, m.attr).values]


def stall_share(v: VariantResult) -> list[float]:
    """Per repeat, the share of the run the trainer stalled. Issue 18's hook: with ranks, the
    maximum over ranks per repeat replaces this (the job waits for its slowest rank)."""
    return [float(x) for x in v.stall_share.values]


def _attribution_part(v: VariantResult, part: str) -> list[float]:
    if v.attribution is None or not v.ablations:
        return []
    from ..analysis.differential import ablations_for, attribute

    method = v.attribution.method
    names = [a.name for a in ablations_for(method) if a.name != "full"]
    out = []
    for r, full in enumerate(v.repeats):
        runs = {"full": full.epoch_s}
        for name in names:
            reps = v.ablations.get(name, [])
            if r >= len(reps):
                break
            runs[name] = reps[r].epoch_s
        else:
            epoch = full.epoch_s
            value = attribute(runs, method)[part]
            out.append(value / epoch if epoch > 0 and math.isfinite(value) else math.nan)
            continue
        out.append(math.nan)
    return out
