"""Straggler test on real runs (issue 25): false alarms among exchangeable ranks, and power
against a bursty straggler, each over repeated single runs.

Two ranks, 0 loader workers, 1,024-row batches, an EMULATED 4 ms step, 12 row groups of
4,096 rows. A user transform, loaded by path from the scenario's directory, burns 20 us of
CPU per row (once per row group: bursty, a row group's cost lands on one step):

* **exchangeable**: on every rank. The test must name no rank; its stated false-alarm rate
  is about 1% (simulation: ``tests/analysis/test_ranks.py``), so over N runs more than a
  few alarms mean the statistic is not calibrated on real runs.
* **straggler**: only where ``RANK`` is 1. Named in how many of N single runs (power).

Printed per run: the rank named (or none), the excess over the others' median, the noise it
was judged against, what the other rank spent waiting for it in the all-reduce; then the
counts. The tests (``tests/trainers/test_straggler_bursty.py``) allow three attempts per
case on a shared machine; this counts every run, none retried.

    python3 benchmarks/straggler_power.py [--runs 20] [--case exchangeable|straggler|both]
        [--workers 2 --row-groups 48]   # loader workers per rank need more data (see README)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stallbench import scenario  # noqa: E402
from stallbench.run.runner import RunOptions, default_cache_dir, run_scenario  # noqa: E402

# The same user transform and scenario as the ground-truth tests (one source).
sys.path.insert(0, str(ROOT / "tests" / "trainers"))
from test_straggler_bursty import TEXT, USER  # noqa: E402

CASES = {"exchangeable": ("cpu_on_every_rank", None), "straggler": ("cpu_on_rank_1", 1)}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_case(case: str, runs: int, where: Path, workers: int = 0,
             row_groups: int = 12) -> tuple[int, int]:
    fn, want = CASES[case]
    path = where / f"{case}.toml"
    text = TEXT.format(fn=fn, workers=workers)
    assert text.count("rows = 49152") == 1
    path.write_text(text.replace("rows = 49152", f"rows = {row_groups * 4096}"))
    sc = scenario.load(path)
    right = 0
    print(f"\n{case} ({fn}, {workers} loader workers per rank, {row_groups} row groups): "
          f"{runs} single runs; want {want if want is not None else 'none'} "
          f"named; load average {_load()} before")
    for i in range(runs):
        s = run_scenario(sc, RunOptions(cache_dir=default_cache_dir(), progress=False)
                         ).variants[0].ranks
        ok = s.straggler == want
        right += ok
        print(f"  run {i + 1:2}: named {s.straggler if s.straggler is not None else 'none':4} "
              f"excess {s.straggler_excess_s:6.3f} s  noise {s.noise_s:6.3f} s  others waited "
              f"{s.others_wait_s:6.3f} s  {'ok' if ok else 'WRONG'}", flush=True)
    print(f"  {case}: {right} of {runs} right; load average {_load()} after")
    return right, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--case", choices=(*CASES, "both"), default="both")
    ap.add_argument("--workers", type=int, default=0, help="loader workers per rank")
    ap.add_argument("--row-groups", type=int, default=12, help="4,096-row groups in the data")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; load average {_load()} at start")
    with tempfile.TemporaryDirectory(prefix="straggler-power-") as d:
        (Path(d) / "sb_bursty_user.py").write_text(USER)
        got = {c: run_case(c, args.runs, Path(d), args.workers, args.row_groups)
               for c in (CASES if args.case == "both" else [args.case])}
    print("\ncase          result")
    for c, (right, n) in got.items():
        what = (f"false alarms {n - right} of {n}" if CASES[c][1] is None
                else f"straggler named in {right} of {n} single runs")
        print(f"{c:13} {what}")


if __name__ == "__main__":
    main()
