"""What-if accuracy against measurement (issue 17).

Measures one scaling curve (a calibrated preprocess cost per row, an EMULATED accelerator step,
DataLoader workers as the matrix), saves the result, then predicts every measured worker count
from fits on at most two of them and prints the errors (whole run and steady state), the
leave-one-out back-test and the machine's conditions (cores, load, CPU other processes took).

    python3 benchmarks/whatif_accuracy.py                       # measure, then evaluate
    python3 benchmarks/whatif_accuracy.py --from results/x.json # evaluate a saved result again

Goals (issue 17): fitted on at most 2 worker counts, predictions up to 12 workers within 10%
(whole run) and 5% (steady state) on a 16-core machine; within 10% for 0-2 workers on a 2-core
machine. Default worker counts follow the cores: 0..2 on a small machine, 0..12 on >= 14 cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from stallbench import results, scenario  # noqa: E402

TEXT = """
name = "whatif-accuracy"
description = "What-if accuracy benchmark: calibrated preprocess, emulated step, worker sweep."
[dataset]
rows = {rows}
row_group_rows = {row_group_rows}
files = 4
dense_features = 13
sparse_features = 8
sequence_features = 2
sequence_max_len = 20
seed = 3
[preprocess]
transforms = ["log_dense", {{name = "hash_ids", buckets = 100000}}]
cpu_cost_us_per_row = {cpu_us}
[model]
kind = "emulated"
step_ms = {step_ms}
[loader]
batch_size = {batch}
batch_format = "single_buffer"
prefetch_factor = 2
[analysis]
differential = false
[run]
repeats = {repeats}
[matrix]
"loader.num_workers" = [{workers}]
"""


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _own_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _busy_cpu() -> tuple[float, float]:
    t = psutil.cpu_times()
    busy = sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0)
    return busy, getattr(t, "steal", 0.0)


def measure(args: argparse.Namespace) -> tuple[Path, str]:
    from stallbench.runner import RunOptions, run_scenario

    text = TEXT.format(rows=args.rows, row_group_rows=args.row_group_rows, cpu_us=args.cpu_us,
                       step_ms=args.step_ms, batch=args.batch, repeats=args.repeats,
                       workers=", ".join(str(w) for w in args.workers))
    sc = scenario.parse(text, "benchmarks/whatif_accuracy.py")
    load0 = os.getloadavg()
    w0, (b0, s0), o0 = time.perf_counter(), _busy_cpu(), _own_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        r = run_scenario(sc, RunOptions(cache_dir=cache, progress=False),
                         say=lambda s: print(s, flush=True))
    wall = time.perf_counter() - w0
    b1, s1 = _busy_cpu()
    foreign = max(0.0, (b1 - b0) - (_own_cpu() - o0)) / wall
    steal = (s1 - s0) / wall
    load1 = os.getloadavg()
    path = results.save(r, Path(args.out))
    cond = (f"measured on {_cores()} cores ({r.machine.cpu_model}), {wall:.0f} s; load average "
            f"{load0[0]:.1f} at start, {load1[0]:.1f} at end; other processes used {foreign:.2f} "
            f"cores on average, hypervisor steal {steal:.2f} cores")
    return path, cond


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", default=None, help="evaluate a saved result, measure nothing")
    ap.add_argument("--workers", default=None, help="worker counts, e.g. 0,1,2,4,8,12")
    ap.add_argument("--fit", default=None, help="the (at most 2) worker counts to fit on")
    ap.add_argument("--rows", type=int, default=786_432)
    ap.add_argument("--row-group-rows", type=int, default=16_384)
    ap.add_argument("--cpu-us", type=float, default=15.0)
    ap.add_argument("--step-ms", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/benchmarks")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    cores = _cores()
    if args.workers:
        args.workers = [int(x) for x in args.workers.split(",")]
    else:
        args.workers = [0, 1, 2, 4, 8, 12] if cores >= 14 else [0, 1, 2]
    if args.src:
        path, cond = Path(args.src), "(saved result: conditions as recorded when it was measured)"
    else:
        path, cond = measure(args)
    print(f"result: {path}")
    print(cond)
    return 0


if __name__ == "__main__":
    sys.exit(main())
