"""``stallbench whatif RESULT.json``: predicted throughput for more workers/nodes, cache and
storage bandwidth, from the rates one measured configuration gave (every figure PREDICTED)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from ..errors import UserError
from . import numbers


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("whatif", help="predict throughput for more CPU workers/nodes, cache, bandwidth",
                       description="Fit the bottleneck model on one measured variant and predict "
                                   "other configurations. Every figure printed is a prediction.")
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="result files or directories (searched one level deep); the newest result "
                        "of each scenario is used")
    p.add_argument("--variant", help="fit the one-point model on this variant only (default: the "
                                     "result's scaling curve, as its stored validation did); with "
                                     "several scenarios, in each that has it")
    p.add_argument("--model", choices=["auto", "one-point", "contention"], default="auto",
                   help="what-if model (default auto: contention when the result measured two or "
                        "more producer counts, else one-point)")
    axis = p.add_mutually_exclusive_group()
    axis.add_argument("--workers", default=None, help="worker counts: N, A..B or A,B,C (default 0..16)")
    axis.add_argument("--nodes", default=None, help="CPU node counts: N, A..B or A,B,C")
    p.add_argument("--cpus-per-node", default=None, metavar="N",
                   help=f"cores per CPU node, 1..{MAX_CPUS_PER_NODE} (default: the fit variant's "
                        "executor.cpus_per_node)")
    p.add_argument("--ranks", default=None, metavar="N",
                   help=f"data-parallel trainer ranks, 1..{MAX_RANKS} (default: the fit variant's "
                        "trainers.ranks); with a loader per rank, --workers counts workers per rank")
    p.add_argument("--cores", default=None, metavar="N",
                   help="cores shared by trainer and workers (default: the measured machine's)")
    p.add_argument("--cache", default="0", metavar="SHARE",
                   help="share of data already in memory, 0..1 (1 excluded)")
    p.add_argument("--bandwidth-mb-s", default=None, metavar="MB_S",
                   help="storage bandwidth per stream in MB/s (replaces the measured storage wait)")
    p.add_argument("--storage-cap-mb-s", default=None, metavar="MB_S",
                   help="aggregate storage bandwidth cap")
    p.add_argument("--cpu-node-cost", default=None, metavar="PRICE",
                   help="price of a CPU node per hour")
    p.add_argument("--gpu-node-cost", default=None, metavar="PRICE",
                   help="price of the trainer node per hour")
    p.set_defaults(func=run)
    return p


# Bounds of the flags (docs/whatif-and-tune.md): finite, and small enough that the table is instant.
MAX_COUNT = 100_000            # workers or nodes in one configuration
MAX_VALUES = 1_000             # configurations in one table
MAX_CPUS_PER_NODE = 4096
MAX_RANKS = 4096
MAX_CORES = 1e6
MAX_BANDWIDTH_MB_S = 1e9
# Positive quantities the models divide by: a subnormal (1e-320) passed "(0, ...]" and came
# out as "inf us/sample", 300-digit figures, and workers PREDICTED to remove the stall of a
# 1e-320 MB/s disk (inf * 0 = nan in the comparisons). The floors are far below anything real.
MIN_CORES = 0.01              # a hundredth of a core
MIN_BANDWIDTH_MB_S = 0.001    # 1 KB/s
MAX_COST = 1e9


def parse_range(text: str, flag: str) -> list[int]:
    return numbers.counts(text, flag, MAX_COUNT, MAX_VALUES)


def _parse(args: argparse.Namespace) -> dict:
    """Every numeric flag, checked before any result is read."""
    return {
        "cpus_per_node": numbers.integer(args.cpus_per_node, "--cpus-per-node", 1,
                                         MAX_CPUS_PER_NODE),
        "ranks": numbers.integer(args.ranks, "--ranks", 1, MAX_RANKS),
        "cores": numbers.number(args.cores, "--cores", MIN_CORES, MAX_CORES),
        "cache": numbers.number(args.cache, "--cache", 0, 1, hi_open=True),
        "bandwidth_mb_s": numbers.number(args.bandwidth_mb_s, "--bandwidth-mb-s",
                                         MIN_BANDWIDTH_MB_S, MAX_BANDWIDTH_MB_S),
        "storage_cap_mb_s": numbers.number(args.storage_cap_mb_s, "--storage-cap-mb-s",
                                           MIN_BANDWIDTH_MB_S, MAX_BANDWIDTH_MB_S),
        "cpu_node_cost": numbers.number(args.cpu_node_cost, "--cpu-node-cost", 0, MAX_COST),
        "gpu_node_cost": numbers.number(args.gpu_node_cost, "--gpu-node-cost", 0, MAX_COST),
        "nodes": parse_range(args.nodes, "--nodes") if args.nodes is not None else None,
        "workers": parse_range(args.workers or "0..16", "--workers"),
    }


def _check_fit(model: Any, v: Any, file: Any) -> None:
    """A fit on figures that are not measured (null) or impossible (negative) is bad input."""
    terms = {"p_wall": model.p_wall, "p_cpu": model.p_cpu, "t_trainer": model.t_trainer,
             "t_cpu": model.t_cpu, "cores": model.cores}
    for name, x in terms.items():
        if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0) or (
                name == "cores" and x <= 0):
            raise UserError(f"{file}: variant {v.name!r}: its figures give the what-if model "
                            f"{name} = {x!r} (a figure is null, negative or zero): not a result "
                            "the model can fit on")
    thr = v.throughput_samples_s.median
    if not (math.isfinite(thr) and thr > 0):
        raise UserError(f"{file}: variant {v.name!r}: throughput_samples_s.median is "
                        f"{'null' if not math.isfinite(thr) else thr}: nothing measured to fit on")


def run(args: argparse.Namespace) -> int:
    from .. import results

    a = _parse(args)
    files = results.find(args.results)
    if not files:
        raise UserError(f"no result files (*.json) in {', '.join(args.results)}")
    newest = results.newest_by_scenario([(f, results.load(f)) for f in files])
    for i, (path, r) in enumerate(newest):
        if i:
            print()
        _one(args, a, path, r)
    return 0


def _one(args: argparse.Namespace, a: dict, path: Any, r: Any) -> None:
    from ..report import tables
    from ..analysis import backtest, figures, whatif, whatif_models

    stored = r.analysis.whatif
    group = [] if args.variant else whatif.scaling_group(r)
    for g in group:      # every variant the models read from: measured, possible figures
        _check_fit(whatif.fit(g, r.machine), g, path)
    if group:
        model = None if args.model == "auto" else args.model
        m = whatif_models.fit_best(group, r.machine, r.dataset, model=model)
        if m is None:
            raise UserError(f"{path}: --model {args.model}: needs "
                            f"{whatif_models.MODELS.get(args.model).min_counts} measured producer "
                            f"counts, the result has {len(whatif_models.producer_counts(group))}")
        v = r.variant(m.fit_variant)
    else:
        name = args.variant or (stored.fit_variant if stored else None) or (
            r.variants[0].name if r.variants else None)
        if name is None:
            raise UserError(f"{path}: no variants: nothing measured to fit on")
        try:
            v = r.variant(name)
        except KeyError:
            raise UserError(f"{path}: no variant {name!r} (have: "
                            f"{', '.join(x.name for x in r.variants)})") from None
        if not v.repeats or not v.repeats[0].samples:
            raise UserError(f"{path}: variant {name!r} has no measured runs to fit on")
        if args.model == "contention":
            raise UserError("--model contention: fits a scaling curve, not one variant; "
                            "drop --variant")
        m = whatif.fit(v, r.machine, r.dataset)
    _check_fit(m, v, path)
    cpn = a["cpus_per_node"] or m.cpus_per_node
    if a["nodes"] is not None:
        nodes = a["nodes"]
        counts = [n * cpn for n in nodes]
        unit = "node"
        # real nodes bring their own cores; the trainer keeps the measured machine's
        cores = lambda c: (a["cores"] or m.cores) + c  # noqa: E731
        # and their producers contend only with their own node's
        busy = lambda c: whatif.busy_of(m, c, cap=cpn)  # noqa: E731
    else:
        nodes = a["workers"]
        counts = nodes
        unit = "worker"
        cores = lambda c: a["cores"] or m.cores  # noqa: E731
        busy = lambda c: None  # noqa: E731
    kw = dict(cache=a["cache"], bandwidth_mb_s=a["bandwidth_mb_s"],
              storage_cap_mb_s=a["storage_cap_mb_s"], ranks=a["ranks"])
    preds = [whatif.predict(m, c, cores=cores(c), busy_cores=busy(c), **kw) for c in counts]
    samples = v.repeats[0].samples
    priced = a["cpu_node_cost"] is not None or a["gpu_node_cost"] is not None
    # the back-test is recomputed from the measured variants (results written before it
    # existed get one too); it always fits the richest model the other points allow
    bt = backtest.backtest(group, r.machine, r.dataset) if group and args.model == "auto" else None
    named = {x.name: x for x in group}
    fit_counts = [whatif.workers_of(named[f]) for f in m.fit_variants if f in named]
    # issue 39: each figure carries the interval of the back-test rows that vouch for it, or
    # is not predicted where they missed by more than the threshold (analysis decides)
    points = whatif.points_at(preds, bt, m, fit_counts)
    costs = []
    for n, p in zip(nodes, preds):
        hours = samples / p.throughput_samples_s / 3600 if p.throughput_samples_s else math.inf
        cpu_nodes = n if unit == "node" else 0
        costs.append(hours * ((a["cpu_node_cost"] or 0) * cpu_nodes + (a["gpu_node_cost"] or 0)))
    rows = []
    for n, pt, cost in zip(nodes, points, costs):
        if pt.not_predicted:
            rows.append([n, "not predicted", "-", "-", "-", pt.model]
                        + (["-"] if priced else []) + [f"not predicted ({pt.not_predicted})"])
            continue
        row = [n, tables.format_number(pt.predicted_samples_s)]
        if bt is not None:
            row.append(f"{tables.format_number(pt.low_samples_s)}.."
                       f"{tables.format_number(pt.high_samples_s)}"
                       if pt.low_samples_s is not None else "-")
        row += [tables.format_percent(pt.stall_share), pt.bound_by, pt.model]
        if priced:
            row.append(f"{cost:.6f}")
        rows.append(row + [pt.why])
    per_rank = unit == "worker" and (a["ranks"] or m.ranks) > 1 and m.producers_per_rank
    axis = "workers per rank" if per_rank else f"{unit}s"
    level = f"{bt.interval_level:.0%} interval" if bt and bt.interval_level else "interval"
    head = ([axis, "PREDICTED samples/s"] + ([level] if bt is not None else [])
            + ["stall %", "bound by", "model"] + (["cost/run"] if priced else []))
    fitted = (f"{m.kind} model fitted on {', '.join(m.fit_variants) or v.name}"
              if group else f"{m.kind} model fitted on this variant's measured rates")
    print(f"what-if for {r.scenario.name} / {v.name} from {path} ({fitted}; every figure below "
          f"is PREDICTED)")
    ranks = a["ranks"] or m.ranks
    print(f"measured: {v.throughput_samples_s.median:,.0f} samples/s with "
          f"{whatif.workers_of(v)} producer(s)"
          + (f" per rank x {m.ranks} ranks" if m.ranks > 1 and m.producers_per_rank else
             f", {m.ranks} ranks" if m.ranks > 1 else "") + f" on {m.cores:g} cores"
          + (f"; predicting for {ranks} ranks" if ranks != m.ranks else ""))
    print(f"rates are steady state (a run adds its start-up: {m.startup_s:.2f} s to the first "
          f"batch at the fit)" + (f"; calibrated at the fit: {m.calibration}" if m.calibration else ""))
    if m.contention_fit:
        print(f"contention: {m.contention_fit}")
    for x in group or [v]:     # MEASURED, the figures the verdict and the report print
        print(f"measured {figures.measured_line(x)}")
    right = set(range(1, 3 if bt is None else 4)) | ({len(head) - 1} if priced else set())
    print(tables.table(head + ["why"], collapse_rows(rows), right=right))
    candidates = [(n, c) for n, c in zip(nodes, counts) if c > 0]
    shown = dict((c, n) for n, c in candidates)
    k = whatif.knee(m, [c for _, c in candidates], cores_for=cores, unit=unit, shown=shown, **kw)
    # withheld where its count was not measured and its point is not predicted (the rule
    # ``validate`` stores for the profile's and the report's knee), on the axis shown
    k = whatif.knee_withheld(k, [dataclasses.replace(pt, n=n) for n, pt in zip(nodes, points)],
                             [shown[c] for c in map(whatif.workers_of, group or [v]) if c in shown])
    at = k.n if k.n is not None else k.saturates_at
    print(f"knee: {at} {unit}(s), not predicted ({k.not_predicted})" if k.not_predicted
          else f"knee: {k.explanation}")
    pick = whatif.cheapest(points, costs) if priced else None
    if pick is not None:
        print(f"cheapest configuration without stall: {nodes[pick]} {unit}(s), "
              f"{costs[pick]:.6f} per run")
    check = stored.measured if stored and not group else []
    if check:
        errs = [f"{x.n}: {figures.signed_percent(x.error, 0)}" for x in check
                if not x.is_fit and x.error is not None]
        steady = [f"{x.n}: {figures.signed_percent(x.steady_error, 0)}" for x in check
                  if not x.is_fit and x.steady_error is not None]
        if errs:
            print(f"validation in this result (fitted on {stored.fit_variant}): prediction error "
                  + ", ".join(errs) + (f" (steady state, after the first batch: {', '.join(steady)})"
                                       if steady else ""))
    if bt:
        for line in backtest_lines(bt):
            print(line)


def backtest_lines(bt: Any) -> list[str]:
    """The back-test as the result stores it: per point, then the summary."""
    from ..analysis import figures
    from ..report.tables import format_percent

    def pct(x: float | None) -> str:
        return format_percent(x, ".1%")

    per = ", ".join(
        f"{p.n}: {figures.signed_percent(p.error)}"
        + (f" / {figures.signed_percent(p.steady_error)}" if p.steady_error is not None else "")
        + f" ({p.model})" for p in bt.points if p.error is not None)
    out = [f"back-test (each measured point predicted by a fit without it; whole run / steady): {per}",
           f"  error whole run: worst {pct(bt.max_abs_error)}, mean {pct(bt.mean_abs_error)}; "
           f"steady: worst {pct(bt.max_abs_steady_error)}, mean {pct(bt.mean_abs_steady_error)}"]
    if bt.interval_log_half_width is not None:
        w = bt.interval_log_half_width
        out.append(f"  {bt.interval_level:.0%} prediction interval: predicted x/ "
                   f"{math.exp(w):.3f} ({figures.signed_percent(math.exp(-w) - 1)} .. "
                   f"{figures.signed_percent(math.exp(w) - 1)}, "
                   f"jackknife or Student-t on the leave-one-out errors, the wider); "
                   + (f"covered {bt.covered} of {bt.checked} points when rebuilt without each"
                      if bt.checked else "coverage not checkable with one back-tested point"))
    return out


def collapse_rows(rows: list[list[Any]]) -> list[list[str]]:
    """Consecutive counts whose predictions are identical (every cell after the count, the
    explanation included) read as one row ``A..B``: once a bound saturates, 15 equal rows
    say less than one."""
    out: list[list[Any]] = []
    for row in rows:
        if out and out[-1][1:] == row[1:]:
            out[-1][0] = (out[-1][0][0], row[0])
        else:
            out.append([(row[0], row[0]), *row[1:]])
    return [[str(a) if a == b else f"{a}..{b}", *rest] for (a, b), *rest in out]
