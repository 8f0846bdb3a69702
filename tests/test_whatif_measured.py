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
import time

import psutil
import pytest

from stallbench import scenario
from stallbench.runner import RunOptions, run_scenario

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


def _own_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _busy_cpu() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _measure(tmp_path) -> tuple[dict, float]:
    """The what-if validation and the cores other processes took meanwhile (foreign load)."""
    sc = scenario.parse(TEXT, "whatif-gt.toml")
    w0, b0, o0 = time.perf_counter(), _busy_cpu(), _own_cpu()
    w = run_scenario(sc, RunOptions(cache_dir=tmp_path, progress=False)).analysis.whatif
    wall = time.perf_counter() - w0
    foreign = max(0.0, (_busy_cpu() - b0) - (_own_cpu() - o0)) / wall
    return w, foreign


def test_prediction_from_one_worker_matches_two(tmp_path) -> None:
    # The model knows the core count, not what else runs: a busy shared machine steals the
    # second core from the 2-worker run. One re-measurement absorbs a burst of foreign load;
    # a model error shows in both attempts.
    for attempt in range(2):
        w, foreign = _measure(tmp_path)
        two = next(m for m in w.measured if m.n == 2)
        if abs(two.error) <= 0.15:
            break
    if abs(two.error) > 0.15 and foreign > 0.25:
        pytest.skip(f"other processes used {foreign:.2f} cores during the measurement; the model "
                    f"assumes the machine's cores are free (error was {two.error:+.0%})")
    assert w.fit_variant == "num_workers=1"
    assert abs(two.error) <= 0.15, w.measured
    assert two.bound_by == "preprocess"
    # the fit point itself is reproduced (the model is exact on its own inputs up to overlap)
    one = next(m for m in w.measured if m.n == 1)
    assert abs(one.error) <= 0.15
    # The knee follows from the measured rates, whatever the machine: one worker delivers
    # x1 samples/s (its measured steady rate), the trainer consumes at most xt (1 / its
    # measured seconds per sample: step + its own data work + loader hand-off), so the stall
    # goes at ceil(xt / x1) workers, unless the cores run out first (then no knee, and the
    # workers' heaviest stage, preprocess, bounds). 7-8 on this 2-core box, 6 on a 16-core one.
    knee, m = w.knee, w.model
    x1 = one.measured_steady_samples_s
    xt = 1.0 / (m.t_trainer + m.t_extra)
    cores_cap = m.cores * m.cores_scale / (m.p_cpu + m.t_cpu)
    expected = math.ceil(xt / x1 - 1e-9)
    if cores_cap * 1.05 < xt:
        assert knee.n is None and knee.bound_by == "preprocess", (knee, cores_cap, xt)
    elif cores_cap > xt * 1.05:
        assert knee.n is not None and abs(knee.n - expected) <= 1, (knee, expected, x1, xt)
    else:   # the core budget and the trainer are within 5%: either outcome is right
        assert knee.n is None or abs(knee.n - expected) <= 1, (knee, expected, x1, xt)


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
