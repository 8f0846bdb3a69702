"""Measured per-worker stage rates: the what-if model's inputs.

Each producer processes a unit of work sequentially, so rows / (seconds in a stage) is the rate
of that stage *per producer worker*. CPU-time rates are kept beside wall-time rates because an
emulated storage wait takes wall time without using a core, and the what-if model must know
which of the two more workers would buy.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ..results import RepeatFigures


def _rate(rows: float, seconds: float) -> float | None:
    return rows / seconds if seconds > 1e-9 and rows else None


def stage_rates(full: Sequence[RepeatFigures],
                compute_only: Sequence[RepeatFigures] | None = None) -> dict[str, float | None]:
    def med(fn) -> float | None:
        vals = [v for v in (fn(f) for f in full) if v is not None]
        return statistics.median(vals) if vals else None

    out = {
        "fetch_rows_s": med(lambda f: _rate(f.stage_rows.get("fetch", 0), f.stage_s.get("fetch", 0))),
        "fetch_cpu_rows_s": med(lambda f: _rate(f.stage_rows.get("fetch", 0),
                                                f.stage_s.get("fetch", 0) - f.stage_s.get("fetch_io_wait", 0))),
        "preprocess_rows_s": med(lambda f: _rate(f.stage_rows.get("preprocess", 0),
                                                 f.stage_s.get("preprocess", 0))),
        "preprocess_cpu_rows_s": med(lambda f: _rate(f.stage_rows.get("preprocess", 0),
                                                     f.stage_s.get("preprocess_cpu", 0))),
        "transfer_producer_rows_s": med(lambda f: _rate(f.stage_rows.get("transfer", 0),
                                                        f.stage_s.get("transfer_producer", 0))),
        "transfer_trainer_rows_s": med(lambda f: _rate(f.samples, f.stage_s.get("transfer_trainer", 0))),
        "storage_mb_s": med(lambda f: _rate(f.bytes.get("storage_bytes", 0) / 1e6,
                                            f.stage_s.get("fetch_io_wait", 0))),
        "compute_rows_s": med(lambda f: _rate(f.samples, f.compute_s)),
        "workers": med(lambda f: f.workers),
        "rows_out_per_row_in": med(lambda f: f.stage_rows.get("transfer", 0) / f.stage_rows["fetch"]
                                   if f.stage_rows.get("fetch") else None),
    }
    if compute_only:
        out["compute_only_rows_s"] = statistics.median(
            [f.throughput_samples_s for f in compute_only])
    return out


def byte_figures(full: Sequence[RepeatFigures]) -> dict[str, float | None]:
    f = full[0] if full else None
    if not f:
        return {}
    raw, wire = f.bytes.get("raw_bytes", 0), f.bytes.get("wire_bytes", 0)
    # ipc_bytes: what crossed a process boundary (absent in old results: unknown, None).
    ipc = f.bytes.get("ipc_bytes")
    return {"storage_bytes": f.bytes.get("storage_bytes", 0), "raw_bytes": raw, "wire_bytes": wire,
            "ipc_bytes": ipc, "crossed_process": None if ipc is None else ipc > 0,
            "compression_ratio": raw / wire if wire else None,
            "wire_bytes_per_sample": wire / f.samples if f.samples else None}
