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

A storage-latency curve (``--latency-ms 40 --row-group-rows 4096 --cpu-us 1``: the producers
mostly wait, so the cores carry ``whatif_models.IO_PRODUCERS_PER_CORE`` of them each) gives
the held-out check its points on a small machine too: 0..8 workers on 2 cores.

Goal (issue 39, predictions that cover or none): each measured count held out of BOTH the fit
and its interval (the model fitted on the others, the interval from the back-test of the others
alone, ``backtest.vouch``), the interval holds the measured steady rate in >= 90% of the
held-out points it predicts, and the worst point error is <= 10%; a count the back-test of
the others does not vouch for is "not predicted" (counted apart, with its reason). A 90%
interval misses about one point in ten, so one curve of 7 points cannot show it: several
curves, measured in turn in one run and pooled, can::

    python3 benchmarks/whatif_accuracy.py --curve 40:1 --curve 20:2 --curve 30:1.5
    python3 benchmarks/whatif_accuracy.py --from a.json b.json c.json     # pooled again

(``--curve LATENCY_MS:CPU_US``: a storage-latency curve, 4,096-row items by default.)
Run on demand, not in CI.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from stallbench import results, scenario  # noqa: E402
from stallbench.analysis import backtest, whatif, whatif_models  # noqa: E402

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
[storage]
latency_ms = {latency_ms}
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
    from stallbench.run.runner import RunOptions, run_scenario

    text = TEXT.format(rows=args.rows, row_group_rows=args.row_group_rows, cpu_us=args.cpu_us,
                       latency_ms=args.latency_ms,
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
    ap.add_argument("--from", dest="src", nargs="+", default=None,
                    help="evaluate saved results, measure nothing (several: coverage pooled)")
    ap.add_argument("--curve", action="append", default=[], metavar="LATENCY_MS:CPU_US",
                    help="measure this storage-latency curve (repeatable: each measured in "
                         "turn, the held-out coverage pooled over them)")
    ap.add_argument("--workers", default=None, help="worker counts, e.g. 0,1,2,4,8,12")
    ap.add_argument("--fit", default=None, help="the (at most 2) worker counts to fit on")
    ap.add_argument("--rows", type=int, default=786_432)
    ap.add_argument("--row-group-rows", type=int, default=None,
                    help="rows per work item (default 16,384; 4,096 on a storage-latency curve)")
    ap.add_argument("--cpu-us", type=float, default=15.0)
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="EMULATED storage latency per row group (a wait, no CPU): with it the "
                         "producers mostly wait and the cores carry more of them")
    ap.add_argument("--step-ms", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/benchmarks")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    cores = _cores()
    if args.row_group_rows is None:
        args.row_group_rows = 4096 if args.curve or args.latency_ms > 0 else 16_384
    given_workers = bool(args.workers)
    if args.workers:
        args.workers = [int(x) for x in args.workers.split(",")]
    else:
        args.workers = ([0, 1, 2, 4, 8, 12] if cores >= 14 else
                        [0, 1, 2, 3, 4, 6, 8] if args.latency_ms > 0 else [0, 1, 2])
    curves: list[tuple[Path, str]] = []
    if args.src:
        for src in args.src:
            r = results.load(src)
            curves.append((Path(src), f"saved result measured on {r.machine.cores:g} cores "
                           f"({r.machine.cpu_model}); load average at start "
                           f"{r.machine.load_avg_at_start}"))
    elif args.curve:
        for c in args.curve:
            lat, _, cpu = c.partition(":")
            args.latency_ms, args.cpu_us = float(lat), float(cpu or args.cpu_us)
            if not given_workers:
                args.workers = [0, 1, 2, 4, 8, 12] if cores >= 14 else [0, 1, 2, 3, 4, 6, 8]
            print(f"curve: storage latency {args.latency_ms:g} ms, {args.cpu_us:g} us/row CPU",
                  flush=True)
            curves.append(measure(args))
    else:
        curves.append(measure(args))
    status, pooled = 0, HeldOut()
    for path, cond in curves:
        r = results.load(path)
        print(f"\nresult: {path}")
        print(cond)
        cores = r.machine.cores
        fit = ([int(x) for x in args.fit.split(",")] if args.fit
               else ([1, 4] if cores >= 14 else [1, 2]))
        ok, held = evaluate(r, fit)
        status |= 0 if ok else 1
        pooled = pooled.add(held)
    if len(curves) > 1:
        passed = pooled.passed()
        print(f"\npooled over {len(curves)} curves: {pooled.line()}: "
              f"{'PASS' if passed else 'FAIL'}")
        return 0 if passed and status == 0 else 1
    return status


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def predict_all(r: Any, fit: list[int]) -> tuple[Any, list[tuple[int, float, float, float, float]]]:
    """The model fitted on the variants with these worker counts, and per measured count:
    (n, measured whole, predicted whole, measured steady, predicted steady)."""
    by_n = {whatif.workers_of(v): v for v in r.variants}
    m = whatif_models.fit_best([by_n[n] for n in fit if n in by_n], r.machine, r.dataset)
    rows = []
    for n, v in sorted(by_n.items()):
        samples = statistics.median(f.samples for f in v.repeats)
        run = whatif.predict_run(m, n, samples)
        steady = statistics.median(f.steady_throughput_samples_s for f in v.repeats)
        rows.append((n, v.throughput_samples_s.median, run.whole_samples_s, steady,
                     run.steady_samples_s))
    return m, rows


def errors(rows: list[tuple[int, float, float, float, float]], fit: list[int],
           up_to: int) -> tuple[float, float]:
    """Worst absolute whole-run and steady errors over the measured counts not fitted on."""
    out = [(abs(pw / w - 1), abs(ps / st - 1)) for n, w, pw, st, ps in rows
           if n not in fit and n <= up_to]
    return (max((e for e, _ in out), default=math.nan), max((e for _, e in out), default=math.nan))


@dataclass(frozen=True)
class HeldOut:
    """The held-out check's tally of one curve, or of several pooled (a 90% interval is
    expected to miss about one point in ten: one curve of 7 points cannot show 90%)."""

    covered: int = 0
    predicted: int = 0
    not_predicted: int = 0
    worst: float = 0.0

    def add(self, o: "HeldOut") -> "HeldOut":
        return HeldOut(self.covered + o.covered, self.predicted + o.predicted,
                       self.not_predicted + o.not_predicted, max(self.worst, o.worst))

    def passed(self) -> bool:
        return self.predicted > 0 and self.covered / self.predicted >= 0.9 and self.worst <= 0.10

    def line(self) -> str:
        if not self.predicted:
            return "coverage: no held-out point was predicted"
        return (f"coverage {self.covered} of {self.predicted} predicted held-out points "
                f"({self.covered / self.predicted:.0%}, goal >= 90%); worst point error "
                f"{self.worst:.1%} (goal <= 10%); {self.not_predicted} not predicted")


def evaluate(r: Any, fit: list[int]) -> tuple[bool, HeldOut]:
    from stallbench.report.tables import table

    cores = r.machine.cores
    counts = sorted(whatif.workers_of(v) for v in r.variants)
    m, rows = predict_all(r, fit)
    print(f"\nfitted on {len(fit)} worker count(s) {fit}: {m.kind} model"
          + (f" ({m.contention_fit})" if m.contention_fit else "")
          + (f"; calibrated: {m.calibration}" if m.calibration else ""))
    print(table(["workers", "measured whole", "PREDICTED", "error", "measured steady", "PREDICTED",
                 "error", ""],
                [[n, f"{w:,.0f}", f"{pw:,.0f}", _pct(pw / w - 1), f"{st:,.0f}", f"{ps:,.0f}",
                  _pct(ps / st - 1), "fit" if n in fit else ""] for n, w, pw, st, ps in rows],
                right={1, 2, 3, 4, 5, 6}))
    ok = True
    if cores >= 14:
        whole, steady = errors(rows, fit, 12)
        passed = whole <= 0.10 and steady <= 0.05
        ok &= passed
        print(f"goal (16-core machine): fitted on <= 2 worker counts, predictions up to 12 workers "
              f"within 10% whole run and 5% steady: worst {whole:.1%} whole, {steady:.1%} steady: "
              f"{'PASS' if passed else 'FAIL'}")
        print("every pair of counts up to 4 as the fit (worst error on the other counts <= 12):")
        for pair in itertools.combinations([n for n in counts if 1 <= n <= 4], 2):
            pm, prow = predict_all(r, list(pair))
            w, st = errors(prow, list(pair), 12)
            print(f"  {pair}: {pm.kind}, worst {w:.1%} whole, {st:.1%} steady")
        pm, prow = predict_all(r, [1])
        w, st = errors(prow, [1], 12)
        print(f"  (1,) alone: {pm.kind}, worst {w:.1%} whole, {st:.1%} steady")
    held = heldout(r)
    ok &= held.passed()
    bt = backtest.backtest(r.variants, r.machine, r.dataset)
    if bt is not None:
        print("\nback-test (each measured count predicted by a fit on all the others):")
        print(table(["workers", "model", "fitted on", "error whole", "error steady", "in interval"],
                    [[p.n, p.model, ",".join(x.split("=")[-1] for x in p.fitted_on), _pct(p.error),
                      _pct(p.steady_error), {None: "-", True: "yes", False: "no"}[p.covered]]
                     for p in bt.points], right={3, 4}))
        print(f"worst {bt.max_abs_error:.1%} / mean {bt.mean_abs_error:.1%} whole run; worst "
              f"{bt.max_abs_steady_error:.1%} / mean {bt.mean_abs_steady_error:.1%} steady; "
              f"{bt.interval_level:.0%} interval x/ {math.exp(bt.interval_log_half_width):.3f}, "
              f"covered {bt.covered} of {bt.checked}")
        if cores < 14:
            small = [p for p in bt.points if p.n <= 2 and p.error is not None]
            worst = max(abs(p.error) for p in small) if small else math.nan
            passed = worst <= 0.10
            ok &= passed
            print(f"goal (small machine): 0-2 workers, each predicted without it, within 10% "
                  f"(whole run): worst {worst:.1%}: {'PASS' if passed else 'FAIL'}")
    return ok, held


def heldout(r: Any) -> HeldOut:
    """Issue 39's goal: every measured count predicted by the model fitted on the others, its
    interval from the back-test of the others alone (the point enters neither); prints each
    point, the coverage of the predicted ones and the worst point error."""
    from stallbench.report.tables import table

    pts = whatif_models.measured(r.variants)
    rows, covered, predicted, worst = [], 0, 0, 0.0
    for v in pts:
        others = [o for o in pts if o is not v]
        if not whatif_models.producer_counts(others):
            continue
        m = whatif_models.fit_best(others, r.machine, r.dataset)
        if m is None:
            continue
        n = whatif_models.producers(v)
        named = {o.name: o for o in others}
        fit_counts = [whatif_models.producers(named[f]) for f in m.fit_variants if f in named]
        said = backtest.vouch(backtest.backtest(others, r.machine, r.dataset), m.kind, n,
                              fit_counts)
        samples = statistics.median(f.samples for f in v.repeats)
        pred = whatif.predict_run(m, n, samples).steady_samples_s
        got = statistics.median(f.steady_throughput_samples_s for f in v.repeats)
        err = pred / got - 1 if got > 0 else math.nan
        if said.not_predicted:
            rows.append([n, m.kind, f"{got:,.0f}", "not predicted", _pct(err), "-",
                         said.not_predicted[:90]])
            continue
        w = said.log_half_width or 0.0
        lo, hi = pred * math.exp(-w), pred * math.exp(w)
        inside = lo <= got <= hi
        predicted += 1
        covered += inside
        worst = max(worst, abs(err)) if math.isfinite(err) else worst
        rows.append([n, m.kind, f"{got:,.0f}", f"{pred:,.0f} [{lo:,.0f}, {hi:,.0f}]", _pct(err),
                     "yes" if inside else "NO", ""])
    print("\nheld out of the fit AND of its interval (issue 39), steady state:")
    print(table(["workers", "model", "measured", "PREDICTED [interval]", "error", "covered", "or"],
                rows, right={2, 4}))
    held = HeldOut(covered, predicted, len(rows) - predicted, worst)
    print(f"{held.line()}: {'PASS' if held.passed() else 'FAIL'}")
    return held


if __name__ == "__main__":
    sys.exit(main())
