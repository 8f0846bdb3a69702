"""Measured per-worker stage rates: the what-if model's inputs.

Each producer processes a unit of work sequentially, so rows / (seconds in a stage) is the rate
of that stage *per producer worker*. CPU-time rates are kept beside wall-time rates because an
emulated storage wait takes wall time without using a core, and the what-if model must know
which of the two more workers would buy.
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

from ..results import ByteFigures, RepeatFigures, StageRates
from .stats import finite_median


def _rate(rows: float, seconds: float) -> float | None:
    return rows / seconds if seconds > 1e-9 and rows else None


def stage_rates(full: Sequence[RepeatFigures],
                compute_only: Sequence[RepeatFigures] | None = None) -> StageRates:
    """Medians over the full runs' repeats of each stage's rows per producer-second."""
    def med(fn: Callable[[RepeatFigures], float | None]) -> float | None:
        return finite_median((fn(f) for f in full), None)

    return StageRates(
        fetch_rows_s=med(lambda f: _rate(f.stage_rows.fetch, f.stage_s.fetch)),
        fetch_cpu_rows_s=med(lambda f: _rate(f.stage_rows.fetch,
                                             f.stage_s.fetch - f.stage_s.fetch_io_wait)),
        preprocess_rows_s=med(lambda f: _rate(f.stage_rows.preprocess, f.stage_s.preprocess)),
        preprocess_cpu_rows_s=med(lambda f: _rate(f.stage_rows.preprocess,
                                                  f.stage_s.preprocess_cpu)),
        transfer_producer_rows_s=med(lambda f: _rate(f.stage_rows.transfer,
                                                     f.stage_s.transfer_producer)),
        transfer_trainer_rows_s=med(lambda f: _rate(f.samples, f.stage_s.transfer_trainer)),
        storage_mb_s=med(lambda f: _rate(f.bytes.storage_bytes / 1e6, f.stage_s.fetch_io_wait)),
        compute_rows_s=med(lambda f: _rate(f.samples, f.compute_s)),
        rows_out_per_row_in=med(lambda f: f.stage_rows.transfer / f.stage_rows.fetch
                                if f.stage_rows.fetch else None),
        compute_only_rows_s=statistics.median([f.throughput_samples_s for f in compute_only])
        if compute_only else None,
    )


def byte_figures(full: Sequence[RepeatFigures]) -> ByteFigures:
    if not full:
        return ByteFigures()
    f = full[0]
    b = f.bytes
    return ByteFigures(storage_bytes=b.storage_bytes, raw_bytes=b.raw_bytes,
                       wire_bytes=b.wire_bytes, ipc_bytes=b.ipc_bytes,
                       crossed_process=b.ipc_bytes > 0,
                       compression_ratio=b.raw_bytes / b.wire_bytes if b.wire_bytes else None,
                       wire_bytes_per_sample=b.wire_bytes / f.samples if f.samples else None)
