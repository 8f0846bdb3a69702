"""Runner pieces that measure outside the timed runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallbench import scenario
from stallbench.pipeline import Plan, dataset_for
from stallbench.run.runner import SOLO_ITEMS, solo_probe

TEXT = """
name = "solo"
[dataset]
rows = 2000
row_group_rows = 400
files = 1
dense_features = 3
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[preprocess]
cpu_cost_us_per_row = 300
[model]
kind = "emulated"
[loader]
batch_size = 100
num_workers = 2
"""


def test_solo_probe_measures_the_trainer_process_rate(tmp_path: Path) -> None:
    """Ground truth: 300 us of CPU per row burnt in preprocess, so each 400-row item costs at
    least 0.12 s and each row at least 300 us; decode and encode add a little on top."""
    cfg = scenario.parse(TEXT, "solo.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path, "solo.toml"), scenario_file="solo.toml")
    got = solo_probe(plan)
    assert SOLO_ITEMS <= len(plan.items)
    assert got.data_s_per_sample >= 300e-6 * 0.95
    assert got.item_s == pytest.approx(got.data_s_per_sample * 400)
    assert got.data_s_per_sample < 300e-6 * 10    # units: seconds per row
