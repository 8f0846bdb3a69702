"""How well does the same-job A/B gate hold on this machine? (issue 19's goals)

Goals: a commit that adds a 10% calibrated cost to the pipeline is caught in >= 95% of gates;
the A/A false-alarm rate is <= 5%; one gate run of the CI scenario takes <= 5 minutes.

Setup: a temporary git repository holding the CI scenario (scenarios/ci/ci_loader.toml) with
one more transform, ``costtf:fn``, imported from the repository, and three commits:

    base   costtf.fn returns the table unchanged
    slow   costtf.fn burns busy CPU on the thread's clock: 10% of the base epoch, spread over
           the rows: a calibrated cost. The epoch is sized from a base run as an undisturbed
           machine would give it (``abrepo.idle_epoch``: step wall time + trainer CPU - the
           step's spin), so the cost does not grow with the load while sizing it
    same   base plus a comment: nothing measurable

Two measurements, both with the gate's own code paths (``stallbench.gate.pairs``, ``gate.ab``):

1. A pool of interleaved pairs: base vs slow (A/B) and base vs same (A/A), alternating, one
   subprocess a run, exactly as the gate runs them. Gates of N pairs (default 10, the gate's
   default) are then resampled from the pool (whole pairs, every row together) and decided
   by ``ab_gate.paired_report`` + ``ab_gate.confirm`` (first run and confirmation rerun drawn
   independently): the share of A/B gates that fail is the power, the share of A/A gates that
   fail the false-alarm rate. RESAMPLED: the figures are estimates from the measured pairs.
2. End-to-end trials: ``stallbench gate --against HEAD~1 scenario.toml`` run for real in the
   repository (slow commit, then same commit), timing each. MEASURED, but few.

The machine's load average is printed at the start, between phases and at the end: on a
shared machine the figures hold for that load only.

    .venv/bin/python benchmarks/gate_power.py [--pool 30] [--trials 2] [--pairs 12] [--save F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import abrepo  # noqa: E402
from stallbench.gate import pairs as ab
from stallbench.gate import ab as ab_gate  # noqa: E402
from stallbench.results import find, load  # noqa: E402


def load_avg() -> str:
    a = os.getloadavg()
    return f"{a[0]:.2f} {a[1]:.2f} {a[2]:.2f}"


def scenario_text() -> str:
    text = (ROOT / "scenarios" / "ci" / "ci_loader.toml").read_text()
    old = 'transforms = ["log_dense", {name = "hash_ids", buckets = 50000}]'
    assert old in text
    return text.replace(old, 'transforms = ["log_dense", {name = "hash_ids", buckets = 50000}, '
                             '"costtf:fn"]')


def base_epoch(repo: Path) -> tuple[float, int]:
    r = subprocess.run([sys.executable, "-m", "stallbench", "run", "scenario.toml", "--repeats",
                        "3", "--out", "calib", "--no-progress"], cwd=repo, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    res = load(find([repo / "calib"])[0])
    wall = statistics.median(e for v in res.variants for e in v.epoch_s.values)
    print(f"base epoch as measured now: {wall:.3f} s (median over variants x 3 repeats)")
    # the cost is a share of an undisturbed epoch, whatever the load while sizing it
    return (statistics.median(abrepo.idle_epoch(v) for v in res.variants),
            res.variants[0].repeats[0].samples)


def build(tmp: Path) -> tuple[Path, dict[str, Path], float]:
    repo = tmp / "repo"
    repo.mkdir()
    abrepo.git(repo, "init", "-q", "-b", "main")
    (repo / "scenario.toml").write_text(scenario_text())
    (repo / "costtf.py").write_text(abrepo.identity("base"))
    (repo / ".gitignore").write_text(".cache/\ncalib/\n")
    abrepo.git(repo, "add", "-A")
    abrepo.git(repo, "commit", "-q", "-m", "base")
    epoch, rows = base_epoch(repo)
    cost = 0.10 * epoch / rows
    trees = {"base": tmp / "t-base", "slow": tmp / "t-slow", "same": tmp / "t-same"}
    texts = {"base": abrepo.identity("base"), "slow": abrepo.burn("slow", cost),
             "same": abrepo.identity("base") + "# nothing measurable\n"}
    for name, path in trees.items():
        path.mkdir()
        (path / "costtf.py").write_text(texts[name])
    print(f"base epoch of an undisturbed run (estimate: step wall time + trainer CPU - spin, "
          f"median over variants): {epoch:.3f} s, {rows} rows: cost {cost * 1e6:.2f} us/row = "
          "10% of that epoch, busy CPU on the thread's clock")
    return repo, trees, cost


def pool(repo: Path, trees: dict[str, Path], n: int) -> dict[str, list[ab.Pair]]:
    out: dict[str, list[ab.Pair]] = {"ab": [], "aa": []}
    scen = [repo / "scenario.toml"]
    base = ab.Side("base", trees["base"])
    t0 = time.perf_counter()
    for i in range(n):
        for kind, other in (("ab", "slow"), ("aa", "same")):
            b = ab.Side(other, trees[other])
            # the gate alternates which side runs first (A B, B A, ...); so does the pool
            pr = (ab.run_pairs(scen, base, b, 1, cwd=repo, work_root=repo) if i % 2 == 0
                  else _reversed_pair(scen, base, b, repo))
            out[kind].append(pr[0])
        if (i + 1) % 5 == 0:
            print(f"  pool: {i + 1}/{n} pairs of each ({time.perf_counter() - t0:.0f} s, "
                  f"load {load_avg()})", flush=True)
    return out


def _reversed_pair(scen: list[Path], a: ab.Side, b: ab.Side, repo: Path) -> list[ab.Pair]:
    """One pair with B run first (run_pairs runs A first on its pair 0)."""
    tmp = Path(tempfile.mkdtemp(prefix="gp-"))
    try:
        rb, sb = ab.run_side(b, scen, tmp / "b", repo, repo)
        ra, sa = ab.run_side(a, scen, tmp / "a", repo, repo)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return [ab.Pair(0, "b", ra, rb, {"a": sa, "b": sb})]


def resample(pairs: list[ab.Pair], n: int, draws: int, seed: int) -> tuple[float, float, dict]:
    """(share of gates failing after confirmation, share failing the first run, rows seen)."""
    rng = np.random.default_rng(seed)
    fails = first_fails = 0
    rows: dict[str, int] = {}

    def report(idx: np.ndarray):
        return ab_gate.paired_report([pairs[i] for i in idx],
                                     threshold=ab_gate.DEFAULT_AB_THRESHOLD,
                                     alpha=ab_gate.DEFAULT_AB_ALPHA, n_boot=10)

    for _ in range(draws):
        first = report(rng.integers(0, len(pairs), n))
        if not first.failing:
            continue
        first_fails += 1
        rerun = report(rng.integers(0, len(pairs), n))
        confirmed, _ = ab_gate.confirm(first, rerun)
        if confirmed:
            fails += 1
            for r in confirmed:
                rows[r.label] = rows.get(r.label, 0) + 1
    return fails / draws, first_fails / draws, rows


def exact_ten_percent(pairs: list[ab.Pair], n: int) -> dict[str, float]:
    """Power of one gate run against an exact 10% slowdown of each throughput row, from the
    measured A/A differences shifted (``calibration.power``): it does not depend on how well
    the cost commit's size was estimated under the load of the moment."""
    from stallbench.gate import calibration
    from stallbench.gate.rule import METRICS, paired_differences

    m = METRICS["throughput"]
    out = {}
    for variant in ab_gate.variant_names(pairs, "ci_loader"):
        d = paired_differences(*ab_gate.paired_values(pairs, "ci_loader", variant, m), m)
        out[variant] = calibration.power(d, m, 0.05, 0.05, n, 0.10)
    return out


def save(p: dict[str, list[ab.Pair]], path: Path) -> None:
    """Every row's per-pair values, to re-analyze without measuring again."""
    import json

    from stallbench.gate.rule import METRICS

    data = {}
    for kind, pairs in p.items():
        for variant in ab_gate.variant_names(pairs, "ci_loader"):
            for metric in ("throughput", "stall_share"):
                a, b = ab_gate.paired_values(pairs, "ci_loader", variant, METRICS[metric])
                data[f"{kind}/{variant}/{metric}"] = {"a": a, "b": b}
    path.write_text(json.dumps(data, indent=1))


def diffs_summary(pairs: list[ab.Pair]) -> list[str]:
    from stallbench.gate.rule import METRICS, paired_differences

    out = []
    for variant in ab_gate.variant_names(pairs, "ci_loader"):
        for metric in ("throughput", "stall_share"):
            m = METRICS[metric]
            a, b = ab_gate.paired_values(pairs, "ci_loader", variant, m)
            d = paired_differences(a, b, m)
            med = statistics.median(d)
            mad = 1.4826 * statistics.median(abs(x - med) for x in d)
            unit = "%" if m.kind == "ratio" else " pt"
            out.append(f"    {variant:28s} {metric:12s} median d {med * 100:+6.1f}{unit}  "
                       f"robust sd {mad * 100:5.1f}{unit}  sd {statistics.stdev(d) * 100:5.1f}"
                       f"{unit}  (n={len(d)})")
    return out


def trials(repo: Path, trees: dict[str, Path], kind: str, n: int) -> list[tuple[int, float]]:
    """Real gates: commit the 'slow' (or 'same') transform on top of base, gate it, reset."""
    out = []
    for _ in range(n):
        abrepo.commit(repo, kind, **{"costtf.py": (trees[kind] / "costtf.py").read_text()})
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "stallbench", "gate", "--against", "HEAD~1",
                            "scenario.toml"], cwd=repo, capture_output=True, text=True)
        took = time.perf_counter() - t0
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
        print(f"  {kind}: exit {r.returncode} in {took:.0f} s (load {load_avg()}): {last}",
              flush=True)
        out.append((r.returncode, took))
        abrepo.git(repo, "reset", "-q", "--hard", "HEAD~1")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=int, default=30, help="pairs of each kind in the pool")
    ap.add_argument("--pairs", type=int, default=ab_gate.DEFAULT_PAIRS, help="pairs per gate")
    ap.add_argument("--draws", type=int, default=2000, help="resampled gates")
    ap.add_argument("--trials", type=int, default=2, help="end-to-end gates of each kind")
    ap.add_argument("--save", help="write the pool's per-pair values to this JSON file")
    args = ap.parse_args()
    print(f"gate_power: {os.cpu_count()} CPUs, load average {load_avg()} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory(prefix="stallbench-gate-power-") as t:
        tmp = Path(t)
        repo, trees, _ = build(tmp)
        t0 = time.perf_counter()
        p = pool(repo, trees, args.pool)
        took = time.perf_counter() - t0
        runs = 4 * args.pool
        print(f"pool: {runs} runs in {took:.0f} s ({took / runs:.1f} s a run); load {load_avg()}")
        for kind, label in (("ab", "A/B base vs slow (+10% cost)"), ("aa", "A/A base vs same")):
            print(f"  {label}: per-pair differences")
            print("\n".join(diffs_summary(p[kind])))
        if args.save:
            save(p, Path(args.save))
        power, power1, rows = resample(p["ab"], args.pairs, args.draws, 1)
        fa, fa1, fa_rows = resample(p["aa"], args.pairs, args.draws, 2)
        exact = exact_ten_percent(p["aa"], args.pairs)
        print(f"RESAMPLED gates of {args.pairs} pairs ({args.draws} draws, threshold "
              f"{ab_gate.DEFAULT_AB_THRESHOLD:.0%}, alpha {ab_gate.DEFAULT_AB_ALPHA:g}, "
              "confirmation rerun drawn independently):")
        print(f"  +10% cost caught: {power:.1%} after confirmation ({power1:.1%} of first runs "
              f"failing); rows confirmed: {rows}")
        print(f"  A/A false alarms: {fa:.2%} after confirmation ({fa1:.2%} of first runs "
              f"failing); rows: {fa_rows}")
        print("  an exact 10% slowdown (each run 10% longer: the A/A pairs' throughput "
              "differences shifted by ln(1/1.1), as the calibration sizes power), per row: "
              + "; ".join(f"{k} {v ** 2:.1%} confirmed ({v:.1%} one run)"
                          for k, v in exact.items()))
        print(f"  one gate run of {args.pairs} pairs ~ {2 * args.pairs * took / runs:.0f} s "
              f"(+ the same again when a confirmation rerun is needed), from the pool's pace")
        if args.trials:
            print(f"END-TO-END trials (load {load_avg()}):")
            slow = trials(repo, trees, "slow", args.trials)
            same = trials(repo, trees, "same", args.trials)
            print(f"  slow commit: {sum(c == 1 for c, _ in slow)}/{len(slow)} exit 1; same "
                  f"commit: {sum(c == 0 for c, _ in same)}/{len(same)} exit 0; gate times "
                  f"{', '.join(f'{s:.0f}' for _, s in slow + same)} s")
    print(f"gate_power: done, load average {load_avg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
