"""What `stallbench profile`'s hooks cost a training loop, plain and under `--live` (issues 23
and 60), measured side by side in one run.

Issue 23's goal: at most 2% of the unhooked loop's wall time (1 ms step, 4096-row batches, 0
and 2 loader workers). Issue 60's, for `--live` (cheap enough to leave on): at most 1% of the
step at 1 ms steps with 0 and 2 workers, and at most 5 us per batch.

Two measurements, each with every side in the same run:

1. **Per pair of fresh processes** (``pairs``), on three jobs: the plain DataLoader (0 and 2
   workers), a Ray Data job (``map_batches`` streamed into ``iter_torch_batches``) and a
   torchrun job (two ranks on loopback, an all-reduce per step). Each is run unhooked,
   hooked (the bootstrap + hooks exactly as `stallbench profile` injects them, no sampler:
   the hooks alone) and live (the whole ``stallbench profile --live PORT -- CMD``: hooks,
   windows, the live records' thread, and the profiling process polling them and serving
   the endpoint beside the job), in an order rotated every pair. The job times itself: its
   steady time (batch ``SKIP`` to the last: the cost per step, what "1% of the step" means)
   and its whole loop (worker start-up and the epoch end in it). Printed per side: the
   median over pairs of its steady ratio to the unhooked run of the same pair (min..max,
   and the ratio of the fastest runs), the whole loop's, and the fixed cost in ms.
2. **Per batch, in one process per side** (``per_batch``): a hooked job (plain, then
   `--live`) swaps the hooked methods (``DataLoader.__iter__``,
   ``_BaseDataLoaderIter.__next__``, the fetcher's ``fetch``) for torch's own (their
   ``__wrapped__``) between blocks of batches, alternating unhooked / hooked blocks (ABBA),
   the live loader first run past its per-batch cap (what a job of days runs in). Twice:
   "hot" (a tiny dataset, no step: the hooks' code stays in every cache, a lower bound) and
   "loop" (4096-row batches and a 1 ms step: what a loop pays, 6x the hot figure here; the
   writes due each second, beats and flushes, land in the hooked blocks only, twice their
   share: an upper bound). Printed: the median over rounds of (block - the round's unhooked
   block) / batches, with quartiles.

Run: .venv/bin/python benchmarks/profile_overhead.py [--pairs 5] [--rounds 20]
     [--jobs dataloader,ray_data,torchrun]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
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
SKIP = 50                       # batches before the steady window (start-up, first fetches)

# Every job times itself and writes {"wall_s", "steady_s", "steady_steps", "batches"} to the
# file named by $BENCH_OUT: wall from the loop's start to its end (worker start-up and the
# epoch end inside), steady from batch SKIP's arrival to the last batch's (steps only).
CLOCK = r"""
import json, os, time
def spin(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end: pass
class Clock:
    def __init__(self): self.t0, self.arrivals = time.perf_counter(), []
    def tick(self): self.arrivals.append(time.perf_counter())
    def figures(self):
        a = self.arrivals
        return {"wall_s": time.perf_counter() - self.t0, "batches": len(a),
                "steady_s": a[-1] - a[SKIP], "steady_steps": len(a) - 1 - SKIP}
    def write(self, fig):
        with open(os.environ["BENCH_OUT"], "w") as f: json.dump(fig, f)
""".replace("SKIP", str(SKIP))

LOOP = CLOCK + r"""
import sys
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

class Rows(Dataset):
    def __init__(self, n): self.x = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8)
    def __len__(self): return len(self.x)
    def __getitem__(self, idx): return self.x[idx]     # a list of 4096 indices -> one batch

workers, batches, step_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(1)
ds = Rows(4096 * batches)
dl = DataLoader(ds, batch_size=None, num_workers=workers,
                sampler=BatchSampler(SequentialSampler(ds), 4096, drop_last=True))
c = Clock()
for b in dl:
    c.tick()
    spin(step_s)
c.write(c.figures())
"""

# Ray Data: a streaming map_batches into iter_torch_batches, the loop of a Ray Data job (its
# runtime started before the clock: ~6 s here, the same on every side)
RAY_LOOP = CLOCK + r"""
import sys
import ray
workers, batches, step_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
ds = ray.data.range(4096 * batches, override_num_blocks=max(1, batches // 16))
ds = ds.map_batches(lambda b: b, batch_size=4096)
c = Clock()
for b in ds.iter_torch_batches(batch_size=4096):
    c.tick()
    spin(step_s)
fig = c.figures()
ray.shutdown()
c.write(fig)
"""

# torchrun: two ranks on loopback (gloo), each a DataLoader at 0 workers and an all-reduce per
# step as a data-parallel job does; the slower rank's figures are the job's
DDP_LOOP = CLOCK + r"""
import sys
import torch, torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

class Rows(Dataset):
    def __init__(self, n): self.x = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8)
    def __len__(self): return len(self.x)
    def __getitem__(self, idx): return self.x[idx]

workers, batches, step_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo")
ds = Rows(4096 * batches)
dl = DataLoader(ds, batch_size=None, num_workers=workers,
                sampler=BatchSampler(SequentialSampler(ds), 4096, drop_last=True))
grad = torch.zeros(1024)
c = Clock()
for b in dl:
    c.tick()
    spin(step_s)
    dist.all_reduce(grad)
fig = c.figures()
mine = torch.tensor([fig["wall_s"], fig["steady_s"]], dtype=torch.float64)
dist.all_reduce(mine, op=dist.ReduceOp.MAX)
fig["wall_s"], fig["steady_s"] = mine.tolist()
if dist.get_rank() == 0:
    c.write(fig)
dist.destroy_process_group()
"""

# (job, workers): the script and how it is launched
JOBS = {("dataloader", 0): ("loop.py", LOOP, False), ("dataloader", 2): ("loop.py", LOOP, False),
        ("ray_data", 0): ("ray_loop.py", RAY_LOOP, False),
        ("torchrun", 0): ("ddp_loop.py", DDP_LOOP, True)}

PER_BATCH = r'''
import json, sys, time
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler
import torch.utils.data.dataloader as dlm
import torch.utils.data._utils.fetch as fm

class Tiny(Dataset):
    def __init__(self): self.x = torch.zeros(8)
    def __len__(self): return 10 ** 9
    def __getitem__(self, i): return self.x

class Rows(Dataset):
    def __init__(self, n): self.x = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8)
    def __len__(self): return len(self.x)
    def __getitem__(self, idx): return self.x[idx]     # a list of 4096 indices -> one batch

def spin(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end: pass

block, rounds, past_cap, side, where = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                        sys.argv[4], sys.argv[5])
torch.set_num_threads(1)
spots = [(dlm.DataLoader, "__iter__"), (dlm._BaseDataLoaderIter, "__next__"),
         (fm._MapDatasetFetcher, "fetch")]
hooked = {s: s[0].__dict__[s[1]] for s in spots}
plain = {s: getattr(f, "__wrapped__", f) for s, f in hooked.items()}
assert all(plain[s] is not hooked[s] for s in spots), "the hooks are not installed"

def use(methods):
    for (cls, name), f in methods.items():
        setattr(cls, name, f)

if where == "hot":          # no step, a tiny dataset: the hooks' code hot in every cache
    step, make = 0.0, lambda: DataLoader(Tiny(), batch_size=None)
else:                       # a loop: 4096-row batches, a 1 ms step, epochs of 1,000 batches
    rows = Rows(4096 * 1000)
    step = 0.001
    make = lambda: DataLoader(rows, batch_size=None,
                              sampler=BatchSampler(SequentialSampler(rows), 4096, True))

class Endless:
    # next() over a loader's passes, one after the other (an epoch end every 1,000 batches
    # in the loop: its write is in the figure, as in a job's)
    def __init__(self, loader): self.loader, self.it = loader, iter(loader)
    def next(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)

use(plain)
plain_it = Endless(make())
use(hooked)
its = {"unhooked": plain_it, side: Endless(make())}
for _ in range(past_cap):                   # a live loader past its per-batch cap
    its[side].next()
sides = {"unhooked": plain, side: hooked}
got = {k: [] for k in sides}
for r in range(rounds + 2):
    for k in (list(sides) if r % 2 else list(sides)[::-1]):
        use(sides[k])
        it = its[k]
        t = time.perf_counter()
        for _ in range(block):
            it.next()
            if step:
                spin(step)
        if r >= 2:
            got[k].append(time.perf_counter() - t)
use(hooked)
print(json.dumps(got))
'''


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def once(tmp: Path, job: tuple[str, int], batches: int, side: str, run_dir: Path,
         step_s: float = 0.001) -> dict[str, float]:
    """One run of ``job`` on ``side``: unhooked (the job alone), hooked (the bootstrap and
    hooks exactly as `stallbench profile` injects them, no sampler: the hooks alone), live
    (the whole `stallbench profile --live PORT -- CMD`: hooks, windows, the live records'
    thread, and the profiling process polling them and serving the endpoint beside the
    job). The job's own figures (its clock)."""
    name, text, distributed = JOBS[job]
    script = tmp / name
    if not script.exists():
        script.write_text(text)
    cmd = [sys.executable, str(script), str(job[1]), str(batches), str(step_s)]
    if distributed:
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2",
               "--master-port", str(_free_port()), *cmd[1:]]
    fig_path = run_dir / "figures.json"
    env = dict(os.environ, BENCH_OUT=str(fig_path))
    if side == "hooked":
        env = job_env(env, run_dir, {}, None)
    elif side == "live":
        cmd = [sys.executable, "-m", "stallbench", "profile", "--live", str(_free_port()),
               "--out", str(run_dir / "out"), "--", *cmd]
    subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tmp)
    if side == "hooked":
        assert list(run_dir.glob("part-*.json")), "the hooked run wrote no part"
    if side == "live":
        assert list((run_dir / "out").glob("*.json")), "the live run wrote no result"
    return json.loads(fig_path.read_text())


def _ratio_text(ratios: list[float], fastest: float) -> str:
    return (f"{statistics.median(ratios) - 1:+.2%} ({min(ratios) - 1:+.2%}.."
            f"{max(ratios) - 1:+.2%}); fastest {fastest - 1:+.2%}")


def pairs(tmp: Path, n_pairs: int, batches: int, jobs: list[tuple[str, int]]
          ) -> tuple[list[list[str]], dict]:
    """Per job: every side once per pair, in a rotated order; per side the ratios of its
    steady per-step time (the cost per step: what 1% of the step means) and of its whole
    loop (start-up and epoch end in it) to the unhooked run of the same pair, and its fixed
    cost (whole minus steps) above the unhooked run's, in ms."""
    rows, figures = [], {}
    for job in jobs:
        runs: dict[str, list[dict]] = {s: [] for s in SIDES}
        for i in range(n_pairs):
            order = SIDES[i % 3:] + SIDES[:i % 3]
            for side in order:
                run_dir = tmp / f"{job[0]}-{job[1]}-{i}-{side}"
                run_dir.mkdir()
                runs[side].append(once(tmp, job, batches, side, run_dir))
        un = runs["unhooked"]
        per_step = [f["steady_s"] / f["steady_steps"] for f in un]
        for side in ("hooked", "live"):
            got = runs[side]
            steady = [f["steady_s"] / u["steady_s"] for f, u in zip(got, un)]
            whole = [f["wall_s"] / u["wall_s"] for f, u in zip(got, un)]
            fixed = [((f["wall_s"] - f["steady_s"]) - (u["wall_s"] - u["steady_s"])) * 1e3
                     for f, u in zip(got, un)]
            fastest = min(f["steady_s"] for f in got) / min(u["steady_s"] for u in un)
            figures[(job, side)] = {"steady": statistics.median(steady),
                                    "whole": statistics.median(whole),
                                    "fixed_ms": statistics.median(fixed)}
            rows.append([f"{job[0]}, {job[1]} workers", side,
                         f"{statistics.median(per_step) * 1e3:.3f}",
                         _ratio_text(steady, fastest),
                         f"{statistics.median(whole) - 1:+.2%}",
                         f"{statistics.median(fixed):+.0f}"])
    return rows, figures


def per_batch(tmp: Path, rounds: int, block: int, where: str
              ) -> dict[str, tuple[float, float, float]]:
    """Per side, in a process of its own: (median, lower quartile, upper quartile) us per
    batch above the same process's unhooked blocks; "unhooked": its own us per batch.
    ``where``: "hot" (a tiny dataset, no step: every cache holds the hooks' code, the lower
    bound) or "loop" (4096-row batches, a 1 ms step: what a loop pays, the hooks' code cold
    after each step; the writes due once a second, beats and flushes, all land in the hooked
    blocks, twice their share in a job: an upper bound)."""
    script = tmp / "per_batch.py"
    script.write_text(PER_BATCH)
    out = {}
    for side in ("hooked", "live"):
        run_dir = tmp / f"per-batch-{where}-{side}"
        run_dir.mkdir()
        settings = wire.LiveSettings() if side == "live" else None
        env = job_env(dict(os.environ), run_dir, {}, None, live=settings)
        past = settings.keep_batches + block if settings else 0
        cp = subprocess.run([sys.executable, str(script), str(block), str(rounds), str(past),
                             side, where], env=env, capture_output=True, text=True, check=True)
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
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=2000)
    ap.add_argument("--jobs", default="dataloader,ray_data,torchrun",
                    help="which jobs' pairs: dataloader (0 and 2 workers), ray_data, torchrun")
    args = ap.parse_args()
    wanted = set(args.jobs.split(","))
    jobs = [j for j in JOBS if j[0] in wanted]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        rows, figures = pairs(tmp, args.pairs, args.batches, jobs)
        pb = {where: per_batch(tmp, args.rounds, args.block if where == "hot" else
                               max(args.block // 4, 100), where) for where in ("hot", "loop")}
    load1 = os.getloadavg()
    print(f"{args.pairs} pairs of {args.batches}-batch loops at a 1 ms step; steady: batch "
          f"{SKIP} to the last")
    print(table(["job", "side", "unhooked ms/step (median)",
                 "steady side / unhooked - 1: median (min..max) over pairs; fastest/fastest",
                 "whole loop (median)", "fixed cost, ms (median)"], rows))
    for where, what in (("hot", "tiny dataset, no step: the lower bound"),
                        ("loop", "4096-row batches, a 1 ms step: the upper bound")):
        got = pb[where]
        print(f"per batch, one process, {args.rounds} rounds, {what}: unhooked "
              f"{got['unhooked'][0]:.2f} us; hooks' own cost: "
              + "; ".join(f"{s} {m:.2f} us (quartiles {lo:.2f}..{hi:.2f})"
                          for s, (m, lo, hi) in ((k, got[k]) for k in ("hooked", "live"))))
    checks = [(f"live, {j[0]} {j[1]} workers: <= +{LIVE_STEP_GOAL:.0%} of a 1 ms step "
               "(steady, median over pairs)", figures[(j, "live")]["steady"] - 1 <= LIVE_STEP_GOAL)
              for j in jobs]
    checks += [(f"live: <= {LIVE_BATCH_GOAL_US:g} us per batch ({where}, median over rounds)",
                pb[where]["live"][0] <= LIVE_BATCH_GOAL_US) for where in ("hot", "loop")]
    checks += [(f"hooked, dataloader {j[1]} workers: <= +{HOOKED_GOAL:.0%} (whole loop, median "
                "over pairs)", figures[(j, "hooked")]["whole"] - 1 <= HOOKED_GOAL)
               for j in jobs if j[0] == "dataloader"]
    for what, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"load average {load0[0]:.2f} at start, {load1[0]:.2f} at end; commit {_commit()}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
