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


def test_batch_size_over_a_row_group_is_said(tmp_path: Path) -> None:
    """A batch never spans a work item (a row group, the unit of one fetch): with
    ``batch_size = 256`` over 100-row row groups every batch has 100 rows, 6 batches for 600
    rows where the batch size asks for 3. The run said nothing and its verdict advised 'a
    larger batch'; the result now warns with both figures (measured batches by construction)."""
    from stallbench.report import tables
    from stallbench.run.runner import RunOptions, run_scenario

    text = """
name = "bigbatch"
[dataset]
rows = 600
row_group_rows = 100
files = 1
dense_features = 2
sparse_features = 1
sequence_features = 0
[model]
kind = "emulated"
[loader]
batch_size = 256
"""
    sc = scenario.parse(text, "bigbatch.toml")
    result = run_scenario(sc, RunOptions(cache_dir=tmp_path, progress=False, analyze=False))
    (v,) = result.variants
    assert v.repeats[0].batches == 6 and v.repeats[0].samples == 600
    (line,) = [x for x in tables.warnings(result) if "batch_size" in x]
    assert "loader.batch_size = 256" in line and "100 rows" in line, line
    assert "6 batches" in line, line
