"""``stallbench run``: scenarios -> measured results in ``--out``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import interrupts, outputs, results, scenario
from ..report import tables
from . import numbers

MAX_REPEATS = 1000            # the same bound as run.repeats
MAX_BATCHES = 10**9           # the same bound as loader.max_batches


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="run scenarios and write results",
                       description="Run scenario files; one JSON result per scenario lands in --out.")
    p.add_argument("scenarios", nargs="+", help="scenario TOML files (globs are expanded)")
    p.add_argument("--out", default="results", help="result directory (default: results/)")
    p.add_argument("--repeats", default=None, metavar="N",
                   help=f"measured runs per variant, 1..{MAX_REPEATS} (default: the scenario's "
                        "run.repeats)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--analyze", dest="analyze", action="store_true", default=None,
                   help="run the differential ablations (default: the scenario's analysis.differential)")
    g.add_argument("--no-analyze", dest="analyze", action="store_false")
    p.add_argument("--max-batches", default=None, metavar="N",
                   help=f"cap every run at N batches, 1..{MAX_BATCHES:.0e} (a quick look; "
                        "results say so)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where generated datasets are cached (default: $STALLBENCH_CACHE or .cache/stallbench)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
    return p


def _check_outputs(scenarios: list[scenario.Scenario], out: Path, cache: Path | None,
                   cache_flag: str) -> None:
    """Every place the run will write, checked before the first variant runs."""
    outputs.check_dir(out, "--out", [results.store.longest_name(sc.name) for sc in scenarios])
    if cache is not None and any(v.config.dataset.path is None
                                 for sc in scenarios for v in sc.variants):
        from ..data.synthetic import longest_temp_name

        outputs.check_dir(cache / "datasets", cache_flag, [longest_temp_name()])


def run(args: argparse.Namespace) -> int:
    repeats = numbers.integer(args.repeats, "--repeats", 1, MAX_REPEATS)
    max_batches = numbers.integer(args.max_batches, "--max-batches", 1, MAX_BATCHES)
    # Check every scenario first: a typo in the third file fails before the first one runs,
    # and so does an output path that cannot be written or a variant this machine cannot hold
    # (the cheap checks before torch is imported).
    scenarios = [scenario.load(p) for p in scenario.expand_files(args.scenarios)]
    out = Path(args.out)
    cache_flag = "--cache-dir" if args.cache_dir else "$STALLBENCH_CACHE (the dataset cache)"
    _check_outputs(scenarios, out, args.cache_dir or outputs.default_cache_dir(), cache_flag)
    from ..measure.load import busy_summary
    from ..run.runner import RunOptions, preflight, run_scenario  # heavy (torch)

    opts = RunOptions(repeats=repeats, analyze=args.analyze, cache_dir=args.cache_dir,
                      progress=not args.no_progress and sys.stderr.isatty(),
                      max_batches=max_batches)
    recommendations: list[str] = []
    for sc in scenarios:
        preflight(sc, opts)
    written: list[Path] = []
    try:
        for sc in scenarios:
            print(f"scenario {sc.name} ({sc.path}): {len(sc.variants)} variant(s)", flush=True)
            result = run_scenario(sc, opts, say=lambda s: print(s, flush=True))
            with interrupts.deferred():      # published and recorded, or neither
                path = results.save(result, out)
                written.append(path)
                outputs.published(path)     # named on stderr if stdout fails (`| head`)
            print()
            print(tables.run_table(result))
            note = tables.au_note(result)
            if note:
                print(note)
            device = tables.device_table(result)
            if device:
                print()
                print("host -> device copies (CUDA events; per batch, medians over repeats):")
                print(device)
            for line in tables.warnings(result):
                print(line)
            ranks = tables.rank_table(result)
            if ranks:
                print()
                print("data-parallel ranks (exposed stall = run - model steps - all-reduce; "
                      "medians over repeats):")
                print(ranks)
                for line in tables.rank_verdicts(result):
                    print(f"  {line}")
            attribution = tables.attribution_table(result)
            if attribution:
                print()
                print(tables.attribution_title(result))
                print(attribution)
                if "~0 [" in attribution:
                    print(tables.ZERO_NOTE)
            for line in tables.verdicts(result) + tables.phase_lines(result):
                print(f"  {line}")
            note = tables.emulated_note(result)
            if note:
                print(note)
            startup = tables.startup_note(result)
            if startup:
                print(startup)
            for line in tables.faults_lines(result):
                print(line)
            busy = busy_summary(result)
            if busy:
                print(f"WARNING: BUSY MACHINE: {busy}")
            print(f"result: {path}", flush=True)
            rec = tables.recommendation_line(result)
            if rec:
                print(rec)
                recommendations.append(rec)
            print(flush=True)
        if len(recommendations) > 1:      # the run ends with each scenario's next step
            print("next step per scenario:")
            for rec in recommendations:
                print(f"  {rec}")
        interrupts.check()
    except interrupts.Interrupted as exc:
        exc.outcome = ("no result written" if not written else
                       f"kept the result(s) written before it: {', '.join(map(str, written))}")
        raise
    return 0
