"""``stallbench tune SCENARIO.toml``: search for the cheapest configuration without a data stall,
write it as a scenario file, and confirm it with a measured run (``stallbench.run.tune``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import interrupts, outputs
from ..analysis import knob_table
from . import numbers

MAX_BUDGET_MINUTES = 24 * 60
MAX_REPEATS = 100
MAX_BATCHES = 10**9
MAX_COST = 1e9                 # the same bound as ``stallbench whatif``'s prices
NODE_PORT_DOES = ("hands each trial's settings to the other nodes and takes their figures "
                  "(-- torchrun --nnodes N: one tune per node, node rank 0 chooses); the same "
                  "on every node. The nodes sign what they send with the token in "
                  "$STALLBENCH_NODE_TOKEN (needed beyond loopback)")


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help="find the loader settings that remove the stall, and confirm them",
                       usage="stallbench tune [options] SCENARIO.toml\n"
                             "       stallbench tune [options] -- COMMAND [ARGS...]",
                       description="SCENARIO.toml: measure the base scenario, remove what bounds "
                                   "it one knob at a time (guided by the attribution and the "
                                   "what-if), write the best configuration as a scenario file and "
                                   "confirm it with a measured run. -- COMMAND: the same on your "
                                   "own training job, unchanged: the job as written, its "
                                   "compute-only ceiling, then one trial of its loader settings "
                                   "at a time, each chosen from what the last measured; the best "
                                   "confirmed against the job as written. Time-boxed by "
                                   "--budget-minutes.")
    p.add_argument("scenario", metavar="SCENARIO.toml", nargs="?",
                   help="the scenario to tune (its matrix is ignored); or -- COMMAND")
    p.add_argument("--name", default=None, help="-- COMMAND: result name (default: the script's stem)")
    p.add_argument("--repeats", default="1", metavar="N",
                   help=f"-- COMMAND: confirmation rounds, the best and the job as written "
                        f"interleaved, 1..{MAX_REPEATS} (default 1)")
    p.add_argument("--trial-batches", default=None, metavar="N",
                   help="-- COMMAND: end a trial after N batches (default: once its steady rate "
                        "is known within +-5%%, or at the job's end)")
    p.add_argument("--keys", default=None, metavar="K1,K2",
                   help="-- COMMAND: the settings it may change (default all it knows: "
                        + knob_table.listed(knob_table.searched(), notes=False) + ")")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="-- COMMAND: write a Chrome trace-event JSON of every run's batches")
    p.add_argument("--progress-timeout", default=None, metavar="S",
                   help="-- COMMAND: end the job (exit 2) when no batch came for S seconds")
    p.add_argument("--record-argv", action="store_true",
                   help="-- COMMAND: record every value of the command (secret-looking ones "
                        "redacted), not only numbers, booleans and enumerations")
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
    numbers.add_node_args(p, NODE_PORT_DOES)

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
    cmd = getattr(args, "cmd", None)
    if cmd is not None:
        return run_job(args, cmd)
    from ..errors import UserError
    if args.scenario is None:
        raise UserError("tune: expected SCENARIO.toml, or -- and your command: stallbench tune "
                        "-- python train.py [ARGS...]")
    only = [f for f, v in (("--name", args.name), ("--trial-batches", args.trial_batches),
                           ("--keys", args.keys), ("--trace", args.trace),
                           ("--progress-timeout", args.progress_timeout),
                           ("--record-argv", args.record_argv or None),
                           ("--node-port", args.node_port), ("--node-wait", args.node_wait))
            if v is not None]
    if only or args.repeats != "1":
        raise UserError(f"tune: {(only or ['--repeats'])[0]} applies to -- COMMAND, not to a "
                        "scenario")
    return run_scenario(args)


def run_scenario(args: argparse.Namespace) -> int:
    from .. import results, scenario

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

        outputs.check_dir((args.cache_dir or outputs.default_cache_dir()) / "datasets",
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


def _keys(text: str | None) -> list[str]:
    from ..errors import UserError
    if text is None:
        return []
    known = [k.key for k in knob_table.searched()]
    keys = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in keys if k not in known]
    if bad or not keys:
        raise UserError(f"tune: --keys {bad[0] if bad else text!r}: expected a comma-separated "
                        f"list of {', '.join(known)}")
    return keys


def run_job(args: argparse.Namespace, cmd: list[str]) -> int:
    """``stallbench tune -- COMMAND``: the search on the user's job (``profile.tune``)."""
    from .. import results
    from ..errors import UserError
    from ..profile import jobrun, record, session
    from ..profile import tune as job_tune

    if args.scenario is not None:
        raise UserError(f"tune: give a scenario or -- COMMAND, not both (got {args.scenario!r} "
                        "and a command)")
    scenario_only = [f for f, v in (("--cpu-node-cost", args.cpu_node_cost),
                                    ("--gpu-node-cost", args.gpu_node_cost),
                                    ("--cache-dir", args.cache_dir)) if v is not None]
    if scenario_only:
        raise UserError(f"tune: {scenario_only[0]} applies to a scenario, not to -- COMMAND")
    if not cmd:
        raise UserError("tune: expected the command after --: stallbench tune [options] -- "
                        "python train.py [ARGS...]")
    minutes = numbers.number(args.budget_minutes, "--budget-minutes", 0, MAX_BUDGET_MINUTES,
                             lo_open=True)
    repeats = numbers.integer(args.repeats, "--repeats", 1, MAX_REPEATS) or 1
    trial_batches = numbers.integer(args.trial_batches, "--trial-batches", 2, MAX_BATCHES)
    progress = numbers.number(args.progress_timeout, "--progress-timeout",
                              jobrun.MIN_PROGRESS_S, jobrun.MAX_PROGRESS_S)
    keys = _keys(args.keys)
    node_port, node_wait = numbers.node_args(args)
    job_tune.nodes_of(cmd, node_port)           # across nodes: refused here, before any run
    name = jobrun.result_name(args.name, session.default_name(cmd), "tune")
    out = Path(args.out)
    outputs.check_dir(out, "--out", [results.store.longest_name(name)])
    trace = outputs.check_file(args.trace, outputs.TRACE, "--trace") if args.trace else None
    opts = job_tune.Options(argv=cmd, name=name, out=out, budget_s=minutes * 60.0,
                            repeats=repeats, trial_batches=trial_batches, keys=keys,
                            progress_timeout=progress, trace=[] if trace is not None else None,
                            record_argv=bool(args.record_argv), node_port=node_port,
                            node_wait=node_wait)
    print(f"tune -- {record.shown(cmd, args.record_argv)}: budget {minutes:g} min; the job as written, its "
          "compute-only ceiling, then one trial at a time", flush=True)
    done = jobrun.measure_and_publish(lambda: job_tune.tune(opts, say=_say), out, trace,
                                      opts.trace)
    return _printed(done)


def _printed(done: Any) -> int:
    """The tune's answer on stdout once published, or the line it ended with; its code."""
    from ..outputs import one_line
    from ..report import profile_lines
    if done.result is None:
        print(f"stallbench: {done.line}", file=sys.stderr)
        return done.code
    print()
    for line in profile_lines.tune_lines(done.result):
        print(line)
    print(f"result: {one_line(done.path)}")
    for line in done.lines:     # a node missing from a multi-node result: said last, exit 3
        print(f"stallbench: WARNING: a node is missing from this result: {one_line(line)}",
              file=sys.stderr)
    return done.code


def _say(line: str) -> None:
    """A progress line of the runs, on stderr (stdout is the search and its answer)."""
    print(f"stallbench: {line}", file=sys.stderr, flush=True)
