"""Instrumentation overhead: the measured trainer loop vs a bare loop over the same batches.

Both loops consume the same plan (same data, same stages, same emulated step) in alternating
trials within one run, so machine drift hits both alike. Prints the median ratio; the target is
< 2% (issue 3). Run: .venv/bin/python benchmarks/overhead.py [--trials 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stallbench import scenario  # noqa: E402
from stallbench.executors import base as executors  # noqa: E402
from stallbench.measure.probe import measured_run  # noqa: E402
from stallbench.pipeline import FULL, Plan, dataset_for  # noqa: E402

TEXT = """
name = "overhead"
[dataset]
rows = 131072
row_group_rows = 8192
files = 1
dense_features = 13
sparse_features = 8
sequence_features = 2
[model]
kind = "emulated"
step_ms = 0.5
[loader]
batch_size = 512
batch_format = "columnar"
"""


def bare(plan: Plan, executor, compute) -> float:
    t0 = time.perf_counter()
    for out in executor.run(plan):
        for batch, rows, tx in plan.receive(out):
            compute.step(batch)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=7)
    args = ap.parse_args()
    sc = scenario.parse(TEXT, "overhead")
    cfg = sc.base
    with tempfile.TemporaryDirectory() as cache:
        plan = Plan(cfg, dataset_for(cfg, Path(cache), "overhead"), FULL)
        ex = executors.get("local")(cfg)
        compute = plan.build_compute()
        bare(plan, ex, compute)  # warm up
        ratios, b_all, i_all = [], [], []
        for _ in range(args.trials):
            b = bare(plan, ex, compute)
            fig, _, _ = measured_run(plan, ex, compute)
            ratios.append(fig.epoch_s / b)
            b_all.append(b)
            i_all.append(fig.epoch_s)
    batches = fig.batches
    r = statistics.median(ratios)
    print(f"{batches} batches per run, {args.trials} alternating trials")
    print(f"bare loop        median {statistics.median(b_all):.4f} s")
    print(f"instrumented     median {statistics.median(i_all):.4f} s (probe + resource sampler)")
    print(f"overhead ratio   median {r:.4f}  (min {min(ratios):.4f}, max {max(ratios):.4f})")
    print(f"per batch        {(statistics.median(i_all) - statistics.median(b_all)) / batches * 1e6:+.1f} us")
    print(f"target < 1.02: {'PASS' if r < 1.02 else 'FAIL'}")


if __name__ == "__main__":
    main()
