"""What `stallbench profile`'s hooks cost a training loop (issue 23: at most 2% of the
unhooked loop's wall time, 1 ms step, 4096-row batches, 0 and 2 loader workers).

Each pair runs the same loop script twice in fresh processes, unhooked and hooked (the
bootstrap + hooks exactly as `stallbench profile` injects them, no sampler: the hooks alone),
in alternating order; the loop times itself (perf_counter around the whole epoch). The ratio
per pair is hooked / unhooked; the table prints both medians side by side and the median
ratio with its min..max over pairs. Run: .venv/bin/python benchmarks/profile_overhead.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stallbench.profile.launcher import job_env  # noqa: E402
from stallbench.report.tables import table  # noqa: E402

LOOP = r'''
import json, sys, time
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

class Rows(Dataset):
    def __init__(self, n): self.x = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8)
    def __len__(self): return len(self.x)
    def __getitem__(self, idx): return self.x[idx]     # a list of 4096 indices -> one batch

def spin(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end: pass

workers, batches = int(sys.argv[1]), int(sys.argv[2])
step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.001
torch.set_num_threads(1)
ds = Rows(4096 * batches)
dl = DataLoader(ds, batch_size=None, num_workers=workers,
                sampler=BatchSampler(SequentialSampler(ds), 4096, drop_last=True))
t = time.perf_counter()
n = 0
for b in dl:
    spin(step_s)
    n += 1
print(json.dumps({"wall_s": time.perf_counter() - t, "batches": n}))
'''


def once(script: Path, workers: int, batches: int, hooked: bool, run_dir: Path,
         step_s: float = 0.001) -> float:
    env = dict(os.environ)
    if hooked:
        env = job_env(env, run_dir, {}, None)
    cp = subprocess.run([sys.executable, str(script), str(workers), str(batches), str(step_s)],
                        env=env,
                        capture_output=True, text=True, check=True)
    return float(json.loads(cp.stdout.strip().splitlines()[-1])["wall_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--batches", type=int, default=400)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(LOOP)
        for workers in (0, 2):
            plain, hooked, ratios = [], [], []
            for i in range(args.pairs):
                run_dir = Path(tmp) / f"run{workers}-{i}"
                run_dir.mkdir()
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {h: once(script, workers, args.batches, h, run_dir) for h in order}
                assert list(run_dir.glob("part-*.json")), "the hooked run wrote no part"
                plain.append(got[False])
                hooked.append(got[True])
                ratios.append(got[True] / got[False])
            rows.append([str(workers), str(args.batches), f"{statistics.median(plain):.3f}",
                         f"{statistics.median(hooked):.3f}",
                         f"{statistics.median(ratios) - 1:+.2%} ({min(ratios) - 1:+.2%}.."
                         f"{max(ratios) - 1:+.2%})"])
        # The hooks' own cost per batch, apart from any loop: 0 workers, no step, many
        # batches; the fastest of the pairs on each side (least disturbed by other processes).
        plain0, hooked0 = [], []
        for i in range(args.pairs):
            run_dir = Path(tmp) / f"bare{i}"
            run_dir.mkdir()
            plain0.append(once(script, 0, 4 * args.batches, False, run_dir, 0.0))
            hooked0.append(once(script, 0, 4 * args.batches, True, run_dir, 0.0))
        per_batch_us = (min(hooked0) - min(plain0)) / (4 * args.batches) * 1e6
    print(table(["workers", "batches", "unhooked s (median)", "hooked s (median)",
                 "hooked / unhooked - 1, median (min..max) over pairs"], rows))
    print(f"hooks' own cost per batch (0 workers, no step, fastest of {args.pairs} runs each "
          f"side): {per_batch_us:.1f} us = {per_batch_us / 1000:.2%} of a 1 ms step")
    print(f"target: <= +2.00% (1 ms step, 4096-row batches, {args.pairs} pairs); load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
