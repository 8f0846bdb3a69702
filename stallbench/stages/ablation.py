"""Ablations: which stages of the data path run in their ideal (instant) form.

A plain value that the pipeline runs and the analysis reads (``analysis.differential``,
``gate.metrics``), apart from ``pipeline`` so that reading results never imports what running
needs (torch, through the stages): ``stallbench gate`` on results with attribution parts paid
torch's import (about a second, several on a busy machine) for four booleans.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ablation:
    """Which stages run in their ideal (instant) form.

    ``compute_only`` goes further than making all three stages free: the executor is not used
    at all and the trainer iterates pre-materialised batches (DS-Analyzer's ingestion-free
    rate). The gap between all-stages-free *through the executor* and compute-only is the
    loader's own overhead (worker start-up, hand-off), which belongs to no stage and is
    reported apart.
    """

    fetch: bool = False
    preprocess: bool = False
    transfer: bool = False
    compute_only: bool = False

    @property
    def name(self) -> str:
        if self.compute_only:
            return "compute_only"
        gone = [s for s in ("fetch", "preprocess", "transfer") if getattr(self, s)]
        return "no_" + "_".join(gone) if gone else "full"


ALL_ABLATIONS = [Ablation(f, p, t) for f in (False, True) for p in (False, True) for t in (False, True)]
FULL = Ablation()
COMPUTE_ONLY = Ablation(True, True, True, compute_only=True)
