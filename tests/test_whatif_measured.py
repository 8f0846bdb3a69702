"""What-if validated against measurement (issue 6): fit on the 1-worker run, predict 2 workers.

Ground truth by construction: preprocess burns a known 40 us of CPU per row in each worker,
compute is an EMULATED 6 ms step per 1024 rows (about 6 us per row) that leaves the CPU free.
One worker is preprocess-bound at about 25k samples/s; two workers on two cores about double
it. The prediction from the 1-worker run must land within 15% of the measured 2-worker rate.
"""

from __future__ import annotations

import math
import resource
import subprocess
import sys

import pytest

from stallbench import scenario
from stallbench.run.runner import RunOptions, run_scenario

import loadcheck

pytestmark = pytest.mark.groundtruth

TEXT = """
name = "whatif-gt"
[dataset]
rows = 32768
row_group_rows = 2048
files = 1
dense_features = 4
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[preprocess]
cpu_cost_us_per_row = 40
[model]
kind = "emulated"
step_ms = 6
[loader]
batch_size = 1024
batch_format = "single_buffer"
prefetch_factor = 4
[run]
repeats = 2
[matrix]
"loader.num_workers" = [1, 2]
"""


def _check(tmp_path) -> list[str]:
    """One measurement of the validation; what disagrees with the model's claims."""
    sc = scenario.parse(TEXT, "whatif-gt.toml")
    result = run_scenario(sc, RunOptions(cache_dir=tmp_path, progress=False))
    w = result.analysis.whatif
    problems = []
    if w.fit_variant != "num_workers=1":
        problems.append(f"fitted on {w.fit_variant}")
    two = next(m for m in w.measured if m.n == 2)
    one = next(m for m in w.measured if m.n == 1)
    if abs(two.error) > 0.15:
        problems.append(f"2 workers: predicted {two.predicted_run_samples_s:,.0f} vs measured "
                        f"{two.measured_samples_s:,.0f} samples/s ({two.error:+.0%})")
    if two.bound_by != "preprocess":
        problems.append(f"2 workers bound by {two.bound_by}")
    # the fit point itself is reproduced (the model is exact on its own inputs up to overlap)
    if abs(one.error) > 0.15:
        problems.append(f"the fit point is off by {one.error:+.0%}")
    if not (w.knee.n in (None, 7, 8) or w.knee.bound_by == "preprocess"):
        problems.append(f"knee {w.knee}")
    if problems:   # what each run did, to tell a slow machine from a wrong model
        problems += [f"{v.name}: " + "; ".join(
            f"epoch {f.epoch_s:.3f} s, first batch {f.time_to_first_batch_s:.3f} s, steady "
            f"{f.steady_throughput_samples_s:,.0f}/s, trainer CPU {f.trainer_cpu_s:.2f} s, "
            f"producers' CPU {f.producer_cpu_s or 0:.2f} s" for f in v.repeats)
            for v in result.variants]
    return problems


def test_prediction_from_one_worker_matches_two(tmp_path) -> None:
    # The model knows the core count, not what else runs: a busy shared machine takes the
    # second core from the 2-worker run. Measured twice, each with the load it ran under;
    # skipped (with the figures) only when both were wrong while other processes took more
    # than max(0.25, cores - 2.25) cores: the 2-worker run needs both cores of this machine.
    loadcheck.attempts("whatif", lambda: _check(tmp_path), 2, need=2.25)


def test_whatif_cli_prints_predicted_table(tmp_path) -> None:
    sc = scenario.parse(TEXT.replace("repeats = 2", "repeats = 1"), "whatif-gt.toml")
    result = run_scenario(sc, RunOptions(cache_dir=tmp_path, progress=False, analyze=False))
    from stallbench import results
    path = results.save(result, tmp_path)
    r = subprocess.run([sys.executable, "-m", "stallbench", "whatif", str(path), "--workers", "0..4",
                        "--cpu-node-cost", "0.5", "--gpu-node-cost", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "PREDICTED samples/s" in r.stdout and "knee:" in r.stdout
    assert r.stdout.count("\n") >= 8
    bad = subprocess.run([sys.executable, "-m", "stallbench", "whatif", str(path), "--workers", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--workers" in bad.stderr
