"""A variant's device figures and data-loss warning, from typed repeats (pure functions)."""

from __future__ import annotations

import math

from factories import repeat
from stallbench.analysis.device import device_figures, sequence_note
from stallbench.results import DeviceRepeat, SequenceCut


def _dev(au: float, gb_s: float | None, pool: int = 0, ring: int = 0, pageable: int = 0,
         kind: str = "gpu") -> DeviceRepeat:
    n = pool + ring + pageable
    return DeviceRepeat(device="cuda:0", compute_kind=kind, compute_clock="cuda_events",
                        compute_s=1.0, au=au, step_ms_median=9.0, h2d_batches=n,
                        h2d_bytes=n * 8_000_000, h2d_s=n * 8e6 / (gb_s * 1e9) if gb_s else None,
                        h2d_gb_s=gb_s, h2d_ms_median=0.4 if n else None, h2d_from_pool=pool,
                        h2d_from_ring=ring, h2d_from_pageable=pageable, device_prefetch=2)


def test_device_figures_summarise_the_repeats() -> None:
    d = device_figures([repeat(device=_dev(0.90, 20.0, pool=30, ring=10)),
                        repeat(device=_dev(0.94, 24.0, pool=40))])
    assert d is not None and d.device == "cuda:0" and d.compute_kind == "gpu"
    assert math.isclose(d.au.median, 0.92) and (d.au.min, d.au.max) == (0.90, 0.94)
    assert math.isclose(d.h2d_gb_s.median, 22.0) and d.h2d_bytes_per_batch == 8_000_000
    assert d.host_memory == "pinned pool, no host copy 88%, pinned ring (pin thread copy) 12%"
    assert d.device_prefetch == 2


def test_without_copies_only_au_is_summarised() -> None:
    d = device_figures([repeat(device=_dev(0.5, None, kind="emulated"))])
    assert d.au.median == 0.5 and d.h2d_gb_s is None and d.h2d_ms is None
    assert d.h2d_bytes_per_batch is None and d.host_memory == ""
    assert device_figures([repeat()]) is None        # older results: no device figures


def test_sequence_note_names_the_key_the_counts_and_the_fix() -> None:
    cut = SequenceCut(seq_len=20, sequences=4000, sequences_cut=1200, ids=58000, ids_cut=6000,
                      longest=29)
    note = sequence_note([repeat(sequence_cut=cut)], "single_buffer")
    assert note.startswith("WARNING: ids lost: 1,200 of 4,000 sequences")
    assert "dataset.sequence_max_len = 20" in note and "6,000 of 58,000 ids, 10.3%" in note
    assert "dataset.sequence_max_len >= 29" in note and '"jagged"' in note
    assert sequence_note([repeat(sequence_cut=SequenceCut(seq_len=20, sequences=10, ids=50,
                                                          longest=9))], "rows") is None
    assert sequence_note([repeat()], "jagged") is None
