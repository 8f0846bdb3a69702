"""``stallbench history DIR``: change points in a series of results (logic in
``stallbench.gate.history``). Exit 0 (a history reports; it does not gate), 2 on bad input."""

from __future__ import annotations

import argparse
import sys

from . import numbers
from ..gate import history
from ..gate.rule import METRICS
from ..errors import UserError
from ..results import find, load


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "history", help="find change points in a series of results (one per commit or night)",
        description="Order the results of each scenario by time and find where each variant's "
                    "throughput and stall share shifted (E-divisive means, as in Apache Otava), "
                    "with the commit of each change point.")
    p.add_argument("paths", nargs="+", metavar="DIR_OR_FILE",
                   help="result files or directories (searched one level deep)")
    p.add_argument("--scenario", help="only this scenario (default: every scenario found)")
    p.add_argument("--metric", action="append", choices=list(METRICS), dest="metrics",
                   help="metric, repeatable (default: throughput and stall_share)")
    p.add_argument("--max-p", default=history.DEFAULT_MAX_P,
                   help=f"permutation-test significance (default {history.DEFAULT_MAX_P})")
    p.add_argument("--permutations", default=history.DEFAULT_PERMUTATIONS,
                   help=f"permutations per test (default {history.DEFAULT_PERMUTATIONS})")
    p.add_argument("--min-size", default=history.DEFAULT_MIN_SIZE,
                   help=f"fewest results in a segment (default {history.DEFAULT_MIN_SIZE})")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    # parsed here, not by argparse's type= (a usage block for 'abc' or '1e9': numbers.py)
    args.max_p = numbers.number(args.max_p, "--max-p", 0, 1, lo_open=True, hi_open=True)
    args.permutations = numbers.integer(args.permutations, "--permutations", 19, 100_000)
    args.min_size = numbers.integer(args.min_size, "--min-size", 2, 1000)
    files = find(args.paths)
    results = [load(p) for p in files]
    if args.scenario:
        results = [r for r in results if r.scenario.name == args.scenario]
    if not results:
        what = f" of scenario {args.scenario!r}" if args.scenario else ""
        raise UserError(f"history: no results{what} in {', '.join(args.paths)}")
    series = history.series_of(results, args.metrics or ("throughput", "stall_share"))
    history.analyze(series, max_p=args.max_p, permutations=args.permutations,
                    min_size=args.min_size)
    sys.stdout.write(history.format_history(series, max_p=args.max_p,
                                            permutations=args.permutations,
                                            min_size=args.min_size))
    return 0
