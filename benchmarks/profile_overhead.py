"""What `stallbench profile`'s hooks cost a training loop, plain and under `--live` (issues 23
and 60), measured side by side in one run.

Issue 23's goal: at most 2% of the unhooked loop's wall time (1 ms step, 4096-row batches, 0
and 2 loader workers). Issue 60's, for `--live` (cheap enough to leave on): at most 1% of the
step at 1 ms steps with 0 and 2 workers, and at most 5 us per batch.

Two measurements, each with every side in the same run:

1. **Per pair of fresh processes** (``pairs``): the same loop script run unhooked, hooked (the
   bootstrap + hooks exactly as `stallbench profile` injects them, no sampler: the hooks
   alone) and hooked with `--live`'s settings (``wire.LiveSettings``: windows, the per-batch
   cap, the live records' thread), in an order rotated every pair; the loop times itself
   (perf_counter around the whole epoch). Printed: each side's median wall, and per side the
   median over pairs of its ratio to the unhooked run of the same pair, with min..max and the
   ratio of the fastest runs (least disturbed by other processes).
2. **Per batch, in one process per side** (``per_batch``): a hooked job (plain, then
   `--live`) swaps the hooked methods (``DataLoader.__iter__``,
   ``_BaseDataLoaderIter.__next__``, the fetcher's ``fetch``) for torch's own (their
   ``__wrapped__``) between blocks of ``--block`` batches of a tiny dataset (no step: every
   microsecond is the hooks' or torch's), alternating unhooked / hooked blocks (ABBA); each
   block continues one long pass with ``next()`` (no epoch end inside the figure; the
   periodic flushes are in it), the live loader first run past its per-batch cap (what a job
   of days runs in). Printed: the median over rounds of (block - the round's unhooked block)
   / batches, with quartiles.

Run: .venv/bin/python benchmarks/profile_overhead.py [--pairs 9] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stallbench.profile.agent import wire  # noqa: E402
from stallbench.profile.launcher import job_env  # noqa: E402
from stallbench.report.tables import table  # noqa: E402

LIVE_STEP_GOAL = 0.01           # issue 60: <= 1% of the step at 1 ms steps
LIVE_BATCH_GOAL_US = 5.0        # issue 60: <= 5 us per batch
HOOKED_GOAL = 0.02              # issue 23: <= 2%
SIDES = ("unhooked", "hooked", "live")

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

PER_BATCH = r'''
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
import torch.utils.data.dataloader as dlm
import torch.utils.data._utils.fetch as fm

class Tiny(Dataset):
    def __init__(self): self.x = torch.zeros(8)
    def __len__(self): return 10 ** 9
    def __getitem__(self, i): return self.x

block, rounds, past_cap = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
spots = [(dlm.DataLoader, "__iter__"), (dlm._BaseDataLoaderIter, "__next__"),
         (fm._MapDatasetFetcher, "fetch")]
hooked = {s: s[0].__dict__[s[1]] for s in spots}
plain = {s: getattr(f, "__wrapped__", f) for s, f in hooked.items()}
assert all(plain[s] is not hooked[s] for s in spots), "the hooks are not installed"

def use(methods):
    for (cls, name), f in methods.items():
        setattr(cls, name, f)

side = sys.argv[4]                          # "hooked" or "live": what this process runs
use(plain)
plain_it = iter(DataLoader(Tiny(), batch_size=None))
use(hooked)
its = {"unhooked": plain_it, side: iter(DataLoader(Tiny(), batch_size=None))}
for _ in range(past_cap):                   # a live loader past its per-batch cap
    next(its[side])
sides = {"unhooked": plain, side: hooked}
got = {k: [] for k in sides}
for r in range(rounds + 2):
    for k in (list(sides) if r % 2 else list(sides)[::-1]):
        use(sides[k])
        it = its[k]
        t = time.perf_counter()
        for _ in range(block):
            next(it)
        if r >= 2:
            got[k].append(time.perf_counter() - t)
use(hooked)
print(json.dumps(got))
'''


def once(script: Path, workers: int, batches: int, side: str, run_dir: Path,
         step_s: float = 0.001) -> float:
    env = dict(os.environ)
    if side != "unhooked":
        env = job_env(env, run_dir, {}, None,
                      live=wire.LiveSettings() if side == "live" else None)
    cp = subprocess.run([sys.executable, str(script), str(workers), str(batches), str(step_s)],
                        env=env, capture_output=True, text=True, check=True)
    if side != "unhooked":
        assert list(run_dir.glob("part-*.json")), "the hooked run wrote no part"
    if side == "live":
        assert list(run_dir.glob("live-*.json")), "the live run wrote no live record"
    return float(json.loads(cp.stdout.strip().splitlines()[-1])["wall_s"])


def _ratio_text(ratios: list[float], fastest: float) -> str:
    return (f"{statistics.median(ratios) - 1:+.2%} ({min(ratios) - 1:+.2%}.."
            f"{max(ratios) - 1:+.2%}); fastest {fastest - 1:+.2%}")


def pairs(tmp: Path, n_pairs: int, batches: int) -> tuple[list[list[str]], dict]:
    """Per worker count: every side once per pair, in a rotated order; the ratios."""
    script = tmp / "loop.py"
    script.write_text(LOOP)
    rows, figures = [], {}
    for workers in (0, 2):
        walls: dict[str, list[float]] = {s: [] for s in SIDES}
        for i in range(n_pairs):
            order = SIDES[i % 3:] + SIDES[:i % 3]
            for side in order:
                run_dir = tmp / f"w{workers}-{i}-{side}"
                run_dir.mkdir()
                walls[side].append(once(script, workers, batches, side, run_dir))
        for side in ("hooked", "live"):
            ratios = [h / u for h, u in zip(walls[side], walls["unhooked"])]
            fastest = min(walls[side]) / min(walls["unhooked"])
            figures[(workers, side)] = (statistics.median(ratios), fastest)
            rows.append([str(workers), side, str(batches),
                         f"{statistics.median(walls['unhooked']):.3f}",
                         f"{statistics.median(walls[side]):.3f}",
                         _ratio_text(ratios, fastest)])
    return rows, figures


def per_batch(tmp: Path, rounds: int, block: int) -> dict[str, tuple[float, float, float]]:
    """Per side, in a process of its own: (median, lower quartile, upper quartile) us per
    batch above the same process's unhooked blocks; "unhooked": its own us per batch."""
    script = tmp / "per_batch.py"
    script.write_text(PER_BATCH)
    out = {}
    for side in ("hooked", "live"):
        run_dir = tmp / f"per-batch-{side}"
        run_dir.mkdir()
        settings = wire.LiveSettings() if side == "live" else None
        env = job_env(dict(os.environ), run_dir, {}, None, live=settings)
        past = settings.keep_batches + block if settings else 0
        cp = subprocess.run([sys.executable, str(script), str(block), str(rounds), str(past),
                             side], env=env, capture_output=True, text=True, check=True)
        got = json.loads(cp.stdout.strip().splitlines()[-1])
        d = [(a - b) / block * 1e6 for a, b in zip(got[side], got["unhooked"])]
        q = statistics.quantiles(d, n=4)
        out[side] = (statistics.median(d), q[0], q[2])
        out.setdefault("unhooked", (statistics.median(got["unhooked"]) / block * 1e6,) * 3)
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=2000)
    args = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        rows, figures = pairs(tmp, args.pairs, args.batches)
        pb = per_batch(tmp, args.rounds, args.block)
    load1 = os.getloadavg()
    print(table(["workers", "side", "batches", "unhooked s (median)", "side s (median)",
                 "side / unhooked - 1: median (min..max) over pairs; fastest/fastest"], rows))
    print(f"per batch, one process, {args.rounds} rounds of {args.block} batches (tiny "
          f"dataset, no step): unhooked {pb['unhooked'][0]:.2f} us; hooks' own cost: "
          + "; ".join(f"{s} {m:.2f} us (quartiles {lo:.2f}..{hi:.2f})"
                      for s, (m, lo, hi) in ((k, pb[k]) for k in ("hooked", "live"))))
    checks = [(f"live, {w} workers: <= +{LIVE_STEP_GOAL:.0%} of a 1 ms step",
               figures[(w, "live")][0] - 1 <= LIVE_STEP_GOAL) for w in (0, 2)]
    checks.append((f"live: <= {LIVE_BATCH_GOAL_US:g} us per batch",
                   pb["live"][0] <= LIVE_BATCH_GOAL_US))
    checks += [(f"hooked, {w} workers: <= +{HOOKED_GOAL:.0%}",
                figures[(w, "hooked")][0] - 1 <= HOOKED_GOAL) for w in (0, 2)]
    for what, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what} (median over pairs)")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"load average {load0[0]:.2f} at start, {load1[0]:.2f} at end; commit {_commit()}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
