"""``stallbench gate``: the CI regression gate on the command line (logic in stallbench.gate.baseline).

Exit 0: nothing regressed. Exit 1: a regression (or an improvement with --fail-on-improvement).
Bad input raises UserError/ResultError, which the CLI prints as one line with exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import outputs
from ..gate import baseline as gate
from ..gate import formats, rows
from ..gate.rule import METRICS, SLOWER, TOO_FEW, WORSE
from ..errors import ResultError, UserError
from ..results import find, load

DEFAULT_METRICS = ("throughput", "stall_share", "attribution")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "gate", help="fail CI on a real, significant slowdown against a baseline",
        description="Compare current results with a baseline; exit 1 on a regression beyond the "
                    "threshold that is also statistically significant (asv's rule). With "
                    "--against REF SCENARIO.toml...: run REF's code and the working tree's on "
                    "the scenarios in this job, interleaved, and gate on the paired "
                    "differences; with --calibrate SCENARIO.toml...: measure this machine's "
                    "noise with the same code on both sides.")
    p.add_argument("--baseline", nargs="+", metavar="DIR_OR_FILE",
                   help="baseline result files or directories (searched one level deep); with "
                        "--against/--calibrate, the directory the calibration lives under "
                        "(default results/baseline)")
    p.add_argument("--current", nargs="+", metavar="DIR_OR_FILE",
                   help="current result files or directories (searched one level deep)")
    p.add_argument("--threshold", default=None,
                   help="smallest effect that fails, e.g. 10%% or 0.1 (stall share: share points;"
                        " default 10%%, 5%% with --against/--calibrate)")
    p.add_argument("--alpha", default=None,
                   help="significance level (default 0.01; 0.05 with --against/--calibrate, "
                        "where a confirmation rerun must agree)")
    p.add_argument("--metric", action="append", choices=[*METRICS, "attribution"],
                   dest="metrics",
                   help="metric to gate, repeatable (default: throughput, stall_share and, where "
                        "results carry an attribution, its parts; 'attribution' names the four "
                        "parts)")
    p.add_argument("--memory", action="store_true", help="also gate peak memory (peak_pss_mb)")
    p.add_argument("--format", choices=list(formats.FORMATTERS), default="table")
    p.add_argument("--fail-on-improvement", action="store_true",
                   help="exit 1 on a significant improvement too, so a stale baseline "
                        "gets refreshed")
    p.add_argument("--update-baseline", action="store_true",
                   help="after a gate with nothing slower, copy the current results into the "
                        "baseline directory (creates it when there is no baseline yet)")
    mg = p.add_mutually_exclusive_group()
    mg.add_argument("--same-machine", dest="machine", action="store_const", const="same",
                    help="compare absolute figures even if the machines differ")
    mg.add_argument("--cross-machine", dest="machine", action="store_const", const="cross",
                    help="compare within-run ratios to the reference variant even on one machine")
    from . import gate_ab

    gate_ab.add_arguments(p)
    p.set_defaults(machine="auto", func=run)
    return p


def parse_threshold(text: str) -> float:
    """``10%`` or ``0.1``; a bare ``10`` is refused (10x or 10%? say which)."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise UserError(f"--threshold: expected a percentage like 10% or a fraction like 0.1, "
                        f"got {text!r}") from None
    if not 0 < value < 1:
        hint = f" (did you mean {s}%?)" if not s.endswith("%") and 1 <= value < 100 else ""
        raise UserError(f"--threshold: must be between 0 and 100% (exclusive), got {text!r}{hint}")
    return value


def parse_alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--alpha: expected a number like 0.01, got {text!r}") from None
    if not 0 < value < 0.5:
        raise UserError(f"--alpha: must be between 0 and 0.5 (exclusive), got {text!r}")
    return value


def _baseline_dir(args: argparse.Namespace) -> Path:
    if len(args.baseline) != 1 or (Path(args.baseline[0]).exists()
                                   and not Path(args.baseline[0]).is_dir()):
        raise UserError("--update-baseline: --baseline must be a single directory")
    return Path(args.baseline[0])


def _load_all(paths: list[Path], side: str, sources: dict[int, str] | None = None) -> list:
    if not paths:
        raise ResultError(f"gate: no {side} result files found")
    out = [load(p) for p in paths]
    if sources is not None:
        sources.update({id(r): str(p) for r, p in zip(out, paths)})
    return out


def _check_baseline_outputs(bdir: Path, current_files: list[Path]) -> None:
    """Where --update-baseline will write, checked before the gate runs."""
    outputs.check_dir(bdir, "--update-baseline", [p.name for p in current_files])
    for p in current_files:
        outputs.check_file(bdir / p.name, outputs.RESULT, "--update-baseline")


def run(args: argparse.Namespace) -> int:
    from . import gate_ab

    gate_ab.parse_counts(args)
    if gate_ab.wanted(args):
        return gate_ab.run(args, parse_threshold, parse_alpha, DEFAULT_METRICS)
    if args.scenarios:
        raise UserError("gate: scenario files are run only with --against REF or --calibrate; "
                        "to compare result files use --baseline and --current")
    if not args.baseline or not args.current:
        raise UserError("gate: needs --baseline and --current result files (or --against REF "
                        "SCENARIO.toml... to run both sides here)")
    # Parsed here, not via argparse ``type=``: a bad value is a UserError (one line, exit 2).
    threshold = parse_threshold(args.threshold or "10%")
    alpha = parse_alpha(args.alpha or "0.01")
    sources: dict[int, str] = {}
    current_files = find(args.current)
    current = _load_all(current_files, "current", sources)
    if args.update_baseline:
        bdir = _baseline_dir(args)
        _check_baseline_outputs(bdir, current_files)
        if not bdir.is_dir() or not find([bdir]):
            written = gate.update_baseline(current_files, bdir)
            print(f"gate: no baseline yet; created {bdir} with {len(written)} result file(s)",
                  file=sys.stderr)
            return 0
    baseline = _load_all(find(args.baseline), "baseline", sources)
    report = gate.compare(baseline, current, threshold=threshold, alpha=alpha,
                          metrics=args.metrics or DEFAULT_METRICS,
                          include_memory=args.memory,
                          fail_on_improvement=args.fail_on_improvement,
                          machine=getattr(args, "machine", None) or "auto", sources=sources)
    sys.stdout.write(formats.FORMATTERS[args.format](report))
    code = rows.exit_code(report)
    if args.update_baseline:
        _update(report, current_files, _baseline_dir(args))
    return code


def _update(report: rows.GateReport, current_files: list[Path], bdir: Path) -> None:
    """Refresh only when nothing is slower: a refresh must never swallow a regression (nor a
    worse change too few repeats could decide)."""
    if report.count(SLOWER):
        print(f"gate: baseline NOT updated: {report.count(SLOWER)} row(s) slower",
              file=sys.stderr)
        return
    undecided = sum(r.verdict == TOO_FEW and r.direction == WORSE for r in report.rows)
    if undecided:
        print(f"gate: baseline NOT updated: {undecided} row(s) worse beyond the threshold with "
              f"{TOO_FEW} to decide", file=sys.stderr)
        return
    written = gate.update_baseline(current_files, bdir)
    print(f"gate: baseline updated: {', '.join(str(p) for p in written)}", file=sys.stderr)
