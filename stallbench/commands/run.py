"""``stallbench run``: scenarios -> measured results in ``--out``."""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

from .. import results, scenario, tables
from ..errors import UserError


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="run scenarios and write results",
                       description="Run scenario files; one JSON result per scenario lands in --out.")
    p.add_argument("scenarios", nargs="+", help="scenario TOML files (globs are expanded)")
    p.add_argument("--out", default="results", help="result directory (default: results/)")
    p.add_argument("--repeats", type=int, default=None,
                   help="measured runs per variant (default: the scenario's run.repeats)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--analyze", dest="analyze", action="store_true", default=None,
                   help="run the differential ablations (default: the scenario's analysis.differential)")
    g.add_argument("--no-analyze", dest="analyze", action="store_false")
    p.add_argument("--max-batches", type=int, default=None,
                   help="cap every run at N batches (a quick look; results say so)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where generated datasets are cached (default: $STALLBENCH_CACHE or .cache/stallbench)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
    return p


def _expand(patterns: list[str]) -> list[str]:
    out = []
    for pat in patterns:
        hits = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
        if not hits:
            raise UserError(f"{pat}: no scenario file matches")
        out.extend(hits)
    return out


def run(args: argparse.Namespace) -> int:
    if args.repeats is not None and args.repeats < 1:
        raise UserError(f"--repeats: expected a positive integer, got {args.repeats}")
    if args.max_batches is not None and args.max_batches < 1:
        raise UserError(f"--max-batches: expected a positive integer, got {args.max_batches}")
    from ..measure.load import busy_summary
    from ..runner import RunOptions, run_scenario  # heavy (torch): only when running
    from ..validate import check_scenario

    # Check every scenario first: a typo in the third file fails before the first one runs.
    scenarios = [scenario.load(p) for p in _expand(args.scenarios)]
    for sc in scenarios:
        check_scenario(sc)
    opts = RunOptions(repeats=args.repeats, analyze=args.analyze, cache_dir=args.cache_dir,
                      progress=not args.no_progress and sys.stderr.isatty(),
                      max_batches=args.max_batches)
    out = Path(args.out)
    recommendations = []
    for sc in scenarios:
        print(f"scenario {sc.name} ({sc.path}): {len(sc.variants)} variant(s)", flush=True)
        result = run_scenario(sc, opts, say=lambda s: print(s, flush=True))
        path = results.save(result, out)
        print()
        print(tables.run_table(result))
        attribution = tables.attribution_table(result)
        if attribution:
            print()
            print(tables.attribution_title(result))
            print(attribution)
        for line in tables.verdicts(result) + tables.phase_lines(result):
            print(f"  {line}")
        note = tables.emulated_note(result)
        if note:
            print(note)
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
    return 0
