"""``stallbench tune -- CMD`` against an exhaustive bare grid, side by side (issue 41).

    .venv/bin/python benchmarks/tune_job.py                  # every case (~11 min on 2 cores)
    .venv/bin/python benchmarks/tune_job.py --case knee-1    # one case

For each case of ``examples/tune_loader.py`` (its best setting known by construction) and the
Ray Data loop of ``examples/tune_ray.py``, this measures the job bare (no stallbench) under
every setting of the grid (``num_workers`` x ``persistent_workers``; with the trainer's threads at 1 too for the
thread-storm case; ``prefetch_batches`` 1, 2, 4, 8 for Ray), then runs ``stallbench tune`` on it, and prints, per case: the grid's
best and its rate, the setting tune chose and its bare rate, the share of the grid's best it
reached (goal >= 90%), the trials it took beside the job as written and the ceiling (goal
<= 6), the trials until its best reached 90% of the grid's best (each trial's setting
measured bare, from the grid), and the runs and wall time of the tune. Every rate is the job's
own meter (samples/s from its second epoch on), measured in this run: ratios, never a fixed
number. Exit 1 when a case misses a goal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "tune_loader.py")
CASES = {
    # workers forked every epoch cost more than they save; kept, they pay
    "persistent": ["--item-ms", "2", "--step-ms", "20", "--worker-init-ms", "300",
                   "--epochs", "10"],
    # a cheap item and a slow step: one worker removes the wait, a second only costs
    "knee-1": ["--item-ms", "1", "--step-ms", "30", "--worker-init-ms", "0", "--epochs", "8",
               "--items", "80"],
    # the fetch is under 5% of the step: nothing to buy
    "ceiling": ["--item-ms", "0.05", "--step-ms", "60", "--worker-init-ms", "0",
                "--epochs", "6"],
    # CPU-bound items (a busy loop) on this machine's cores, workers forked every epoch
    "cpu-bound": ["--burn", "--item-ms", "3", "--step-ms", "10", "--worker-init-ms", "100",
                  "--epochs", "10"],
    # a step computed on the CPU (an MLP, torch's intra-op threads) beside CPU-bound workers:
    # the thread storm, where the trainer's threads must shrink for the workers to pay
    "threads": ["--hidden", "1024", "--batch", "64", "--items", "1024", "--burn",
                "--item-ms", "0.3", "--worker-init-ms", "0", "--epochs", "6"],
}
THREAD_CASES = {"threads"}      # their grid adds the trainer's threads (OMP_NUM_THREADS=1)


RAY_EXAMPLE = str(ROOT / "examples" / "tune_ray.py")
RAY_CASE = ["--epochs", "5"]      # a Ray Data loop: prefetch_batches is its one setting


def bare(job: list[str], setting: tuple, script: str = EXAMPLE) -> float:
    env = dict(os.environ)
    if len(setting) > 2 and setting[2]:
        env["OMP_NUM_THREADS"] = str(setting[2])
    cp = subprocess.run([sys.executable, script, *job, *flags(setting)], capture_output=True,
                        text=True, timeout=600, env=env)
    if cp.returncode != 0:
        raise SystemExit(f"bare run failed: {cp.stderr[-400:]}")
    line = [x for x in cp.stdout.splitlines() if x.startswith("rate: ")][-1]
    return float(json.loads(line[len("rate: "):])["steady_samples_s"])


def flags(setting: tuple) -> list[str]:
    if setting and setting[0] == "prefetch":
        return ["--prefetch-batches", str(setting[1])]
    workers, persistent = setting[:2]
    out = ["--num-workers", str(workers)] if workers else []
    return out + (["--persistent-workers"] if persistent and workers else [])


def setting_of(settings: dict, ray: bool = False, threads: bool = False) -> tuple:
    if ray:
        return ("prefetch", int(settings.get("prefetch_batches") or 1))
    out = (int(settings.get("num_workers") or 0), bool(settings.get("persistent_workers")))
    return out + (int(settings.get("torch.num_threads") or 0),) if threads else out


def run_case(name: str, job: list[str], workers: list[int]) -> dict:
    ray = name == "ray"
    script = RAY_EXAMPLE if ray else EXAMPLE
    if ray:
        grid = [("prefetch", p) for p in (1, 2, 4, 8)]
        keys = "ray.prefetch_batches"
    elif name in THREAD_CASES:
        grid = [(0, False, 0)] + [(w, p, t) for w in workers if w for p in (False, True)
                                  for t in (0, 1)]
        keys = "dataloader.num_workers,dataloader.persistent_workers,torch.num_threads"
    else:
        grid = [(0, False)] + [(w, p) for w in workers if w for p in (False, True)]
        keys = "dataloader.num_workers,dataloader.persistent_workers"
    rates = {g: bare(job, g, script) for g in grid}
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        cp = subprocess.run([sys.executable, "-m", "stallbench", "tune", "--out", out, "--keys",
                             keys, "--", sys.executable, script, *job], capture_output=True,
                            text=True, timeout=1800, cwd=ROOT)
        wall = time.perf_counter() - t0
        if cp.returncode != 0:
            raise SystemExit(f"{name}: tune failed: {cp.stderr[-600:]}")
        data = json.loads(sorted(Path(out).glob("*.json"))[-1].read_text())
    tune = data["tune"]
    top = max(rates.values())
    best = max(rates, key=rates.get)
    chosen = setting_of(tune["best"]["settings"], ray, name in THREAD_CASES)
    if chosen not in rates:
        rates[chosen] = bare(job, chosen, script)
    to90, so_far = None, 0.0
    for i, tr in enumerate(tune["trials"]):
        if tr["outcome"] != "measured":
            continue
        s = setting_of(tr["settings"], ray, name in THREAD_CASES)
        if s not in rates:
            rates[s] = bare(job, s, script)
        so_far = max(so_far, rates[s])
        if to90 is None and so_far >= 0.9 * top:
            to90 = i          # trials beside the job as written (0: the job as written)
    return {"case": name, "grid_best": best, "grid_best_rate": top, "chosen": chosen,
            "chosen_rate": rates[chosen], "reached": rates[chosen] / top,
            "trials": len(tune["trials"]) - 1, "to90": to90, "runs": tune["runs"],
            "wall_s": wall, "stop": tune["best"]["stop_reason"],
            "speedup": tune["best"]["speedup"], "ceiling_share": tune["best"]["ceiling_share"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", choices=sorted(CASES) + ["ray"], action="append",
                   help="default: every case, the Ray Data loop (ray, ~5 min) last")
    p.add_argument("--workers", default="1,2", help="worker counts of the grid (default 1,2)")
    a = p.parse_args()
    workers = [int(w) for w in a.workers.split(",")]
    print(f"machine: {os.cpu_count()} cores; load average at start "
          f"{os.getloadavg()[0]:.2f}; grid: num_workers 0,{a.workers} x persistent_workers")
    rows, ok = [], True
    for name in a.case or [*CASES, "ray"]:
        r = run_case(name, RAY_CASE if name == "ray" else CASES[name], workers)
        rows.append(r)
        good = r["reached"] >= 0.9 and r["trials"] <= 6
        ok = ok and good
        fmt = (lambda s: f"prefetch_batches={s[1]}" if s[0] == "prefetch" else  # noqa: E731
               f"nw={s[0]}{',persistent' if s[1] else ''}"
               f"{f',threads={s[2]}' if len(s) > 2 and s[2] else ''}")
        print(f"{name:10s} grid best {fmt(r['grid_best'])} {r['grid_best_rate']:,.0f}/s; tune "
              f"chose {fmt(r['chosen'])} {r['chosen_rate']:,.0f}/s bare = {r['reached']:.0%} "
              f"of it; {r['trials']} trial(s), 90% reached after {r['to90']}; {r['runs']} runs "
              f"in {r['wall_s']:.0f} s; stop {r['stop']}; tune's own speedup "
              f"{r['speedup']:.2f}x, {r['ceiling_share'] or float('nan'):.0%} of its ceiling: "
              + ("PASS" if good else "FAIL"))
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
