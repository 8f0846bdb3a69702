"""A variant's accelerator figures and data-loss warnings, from its full runs' measurements.

Pure functions of measured repeats: ``device_figures`` summarises each run's ``DeviceRepeat``
(AU, H2D copies by CUDA events) over repeats; ``sequence_note`` turns the ids a padded batch
format cut into the warning results and ``stallbench run`` print.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ..results import DeviceFigures, RepeatFigures, Summary

AU_PASS = 0.90      # MLPerf Storage passes a run at accelerator utilisation >= 90%
WARNING = "WARNING"


def device_figures(repeats: Sequence[RepeatFigures]) -> DeviceFigures | None:
    """AU, step and H2D figures over repeats (medians with spread); None without figures.

    ``h2d_gb_s`` = bytes / copy time per run, copy time from CUDA events; ``host_memory``
    says where the copied batches' host bytes were, counted over every run."""
    reps = [r.device for r in repeats if r.device is not None]
    if not reps:
        return None
    first = reps[0]
    copied = [d for d in reps if d.h2d_batches]
    steps = [d.step_ms_median for d in reps if d.step_ms_median is not None]
    sources = {"pinned pool, no host copy": sum(d.h2d_from_pool for d in reps),
               "pinned ring (pin thread copy)": sum(d.h2d_from_ring for d in reps),
               "pageable": sum(d.h2d_from_pageable for d in reps)}
    total = sum(sources.values())
    host_memory = ", ".join(f"{k} {v / total:.0%}" for k, v in sources.items() if v) if total else ""
    return DeviceFigures(
        device=first.device, compute_kind=first.compute_kind, compute_clock=first.compute_clock,
        au=Summary.of([d.au for d in reps]),
        step_ms=Summary.of(steps),
        h2d_gb_s=Summary.of([d.h2d_gb_s for d in copied if d.h2d_gb_s is not None])
        if copied else None,
        h2d_ms=Summary.of([d.h2d_ms_median for d in copied if d.h2d_ms_median is not None])
        if copied else None,
        h2d_bytes_per_batch=statistics.median(d.h2d_bytes / d.h2d_batches for d in copied)
        if copied else None,
        host_memory=host_memory, device_prefetch=first.device_prefetch,
        steady_au=Summary.of([d.steady_au for d in reps if d.steady_au is not None])
        if any(d.steady_au is not None for d in reps) else None)


def au_label(kind: str) -> str:
    """How AU's compute time was measured, in words (tables, report)."""
    return {"gpu": "GPU step time by CUDA events",
            "emulated": "EMULATED step (host clock)",
            "cpu": "model step on the CPU (host clock)"}.get(kind, kind)


def sequence_note(repeats: Sequence[RepeatFigures], batch_format: str) -> str | None:
    """The warning for sequences a padded format cut at ``dataset.sequence_max_len`` (None
    when nothing was cut). Counted in the first full run that counted anything."""
    cut = next((r.sequence_cut for r in repeats if r.sequence_cut is not None), None)
    if cut is None or not cut.sequences_cut:
        return None
    share = cut.ids_cut / cut.ids if cut.ids else 0.0
    return (f"{WARNING}: ids lost: {cut.sequences_cut:,} of {cut.sequences:,} sequences were "
            f"longer than dataset.sequence_max_len = {cut.seq_len} and lost their tails in the "
            f"padded batches of batch_format = \"{batch_format}\" ({cut.ids_cut:,} of {cut.ids:,} "
            f"ids, {share:.1%}; the longest had {cut.longest}). Set dataset.sequence_max_len >= "
            f"{cut.longest}, or loader.batch_format = \"jagged\", which keeps every id.")
