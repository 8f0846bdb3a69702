"""``stallbench tune SCENARIO.toml``: search for the cheapest configuration without a data stall,
write it as a scenario file, and confirm it with a measured run (``stallbench.run.tune``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import interrupts, outputs
from . import numbers

MAX_BUDGET_MINUTES = 24 * 60
MAX_COST = 1e9                 # the same bound as ``stallbench whatif``'s prices


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help="find the cheapest stall-free configuration and confirm it",
                       description="Measure the base scenario, remove what bounds it one knob at a "
                                   "time (guided by the attribution and the what-if), write the "
                                   "best configuration as a scenario file and confirm it with a "
                                   "measured run. Time-boxed by --budget-minutes.")
    p.add_argument("scenario", metavar="SCENARIO.toml", help="the scenario to tune (its matrix is ignored)")
    p.add_argument("--budget-minutes", default="10", metavar="MINUTES",
                   help=f"time for the search and the confirmation, in (0, {MAX_BUDGET_MINUTES}] "
                        "(default 10)")
    p.add_argument("--cpu-node-cost", default=None, metavar="PRICE",
                   help="price of a CPU node per hour (with --gpu-node-cost: rank by cost per epoch)")
    p.add_argument("--gpu-node-cost", default=None, metavar="PRICE",
                   help="price of the trainer (GPU) node per hour")
    p.add_argument("--out", default="results", help="result directory (default: results/); the tune "
                                                    "result and the scenario file go to its tune/")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where generated datasets are cached (default: $STALLBENCH_CACHE or .cache/stallbench)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
    return p


def _parse(args: argparse.Namespace) -> dict:
    """Every numeric flag, checked before the scenario is read (issue 13's rule: finite,
    bounded, one line and exit 2 otherwise)."""
    return {
        "budget_minutes": numbers.number(args.budget_minutes, "--budget-minutes", 0,
                                         MAX_BUDGET_MINUTES, lo_open=True),
        "cpu_node_cost": numbers.number(args.cpu_node_cost, "--cpu-node-cost", 0, MAX_COST),
        "gpu_node_cost": numbers.number(args.gpu_node_cost, "--gpu-node-cost", 0, MAX_COST),
    }


def run(args: argparse.Namespace) -> int:
    from .. import results, scenario
    from .run import default_cache_dir

    a = _parse(args)
    b = a["budget_minutes"]
    sc = scenario.load(args.scenario)
    # every place the tune writes, checked before the first measured run (as ``run`` does)
    out = Path(args.out)
    tuned = results.store.longest_name(sc.name + "-tuned")   # the confirmation; the .toml
    outputs.check_dir(out, "--out", [tuned])
    outputs.check_dir(out / results.store.TUNE_DIR, "--out",
                      [results.store.longest_name(sc.name + "-tune"), tuned])
    if sc.base.dataset.path is None:
        from ..data.synthetic import longest_temp_name

        outputs.check_dir((args.cache_dir or default_cache_dir()) / "datasets",
                          "--cache-dir" if args.cache_dir else "$STALLBENCH_CACHE (the dataset cache)",
                          [longest_temp_name()])
    from ..run.tune import TuneOptions, tune  # heavy (torch): only when tuning
    from ..measure.load import HEAVY_CORES
    from ..analysis import figures
    from ..report.tables import format_percent
    from ..run.preflight import check_scenario

    check_scenario(sc)
    opts = TuneOptions(budget_s=b * 60.0, cpu_node_cost=a["cpu_node_cost"],
                       gpu_node_cost=a["gpu_node_cost"], out_dir=out,
                       cache_dir=args.cache_dir,
                       progress=not args.no_progress and sys.stderr.isatty())
    print(f"tune {sc.name} ({sc.path}): budget {b:g} min; every step is one measured run "
          f"(two where loader workers are kept: judged on the one that reused them)", flush=True)
    r = tune(sc, opts, say=lambda s: print(s, flush=True))
    with interrupts.deferred():      # published whole, or not at all
        path = results.save_tune(r, out)
    rec, conf = r.recommendation, r.confirmation
    print()
    if rec is not None:
        m = rec.measured
        price = (f", cost/epoch {m.cost_per_epoch:.4g}" if m.cost_per_epoch is not None else "")
        print(f"recommendation: {rec.variant} ({'stall-free' if rec.stall_free else 'still stalled'})"
              f": {rec.why}{price}")
        knobs = ", ".join(f"{k} = {v!r}" for k, v in rec.knobs.items()) or "(the base scenario as is)"
        print(f"  knobs: {knobs}")
        print(f"  scenario file: {rec.scenario_path}")
    if conf is not None and rec is not None:
        pred = (f"{conf.predicted_samples_s:,.0f} samples/s PREDICTED ({rec.predicted_by})"
                if conf.predicted_samples_s else "no prediction")
        goal = "" if conf.within_goal is None else (" (within 10%)" if conf.within_goal
                                                     else " (NOT within 10%)")
        print(f"confirmation: measured {conf.measured.throughput_samples_s:,.0f} samples/s, "
              f"steady stall {format_percent(conf.measured.steady_stall_share, '.1%')} "
              f"({conf.measured.repeats} repeat(s)"
              + (f" that reused kept workers; {conf.measured.runs_not_counted} more forked them, "
                 f"not counted" if conf.measured.runs_not_counted else "")
              + f") vs {pred}: error {figures.signed_percent(conf.error)}{goal}")
        print(f"  confirmation result: {conf.result_path}")
    if r.foreign_cores is not None:
        print(f"conditions: other processes kept {r.foreign_cores:.1f} of {r.machine.cores:g} cores "
              f"busy on average during the tune (the what-if assumes the cores are free"
              + ("; expect predictions and repeat runs to miss under such load)"
                 if r.foreign_cores >= HEAVY_CORES else ")"))
    print(f"tune result: {path} ({r.wall_s:.0f} s of a {r.budget_s:.0f} s budget; stopped: "
          f"{r.stopped_because})")
    return 0
