"""``stallbench gate --against REF SCENARIO.toml...`` and ``--calibrate SCENARIO.toml...``: the
gate that runs both sides itself (logic in ``stallbench.gate.ab`` and ``stallbench.gate.calibration``).

Exit 0: nothing slower than REF (or a slower first run the confirmation rerun did not
confirm). Exit 1: a regression confirmed by the rerun. Exit 2: bad input (REF not a commit, a
shallow clone without it, a scenario a side cannot run, a threshold below the calibrated noise).
Progress goes to stderr; stdout carries only the reports (``--format json`` stays parseable).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from . import numbers
from ..gate import formats
from ..gate.rows import GateReport
from ..gate.rule import INCONCLUSIVE, TOO_FEW
from ..errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO.toml",
                   help="scenario files to run (with --against or --calibrate)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--against", metavar="REF",
                      help="same-job A/B: run REF's code (a git commit, checked out into a "
                           "temporary worktree) and the working tree's on the scenarios, "
                           "interleaved, and gate on the paired differences")
    mode.add_argument("--calibrate", action="store_true",
                      help="A/A calibration: run the working tree against itself on the "
                           "scenarios, measure the noise, store it next to the baseline")
    p.add_argument("--repeats", default=None, metavar="N",
                   help="pairs of runs (A/B and calibration; default: what the calibration "
                        "recommends, else 12)")
    p.add_argument("--rounds", default=None, metavar="R",
                   help="--calibrate: simulated gates measured (R x N A/A pairs; default 3)")
    p.add_argument("--detect", default=None, metavar="PCT",
                   help="slowdown the calibration sizes the gate for (each run this much "
                        "longer; default 10%%)")
    p.add_argument("--no-confirm", dest="confirm", action="store_false",
                   help="--against: fail on the first run's verdict without a confirmation rerun")


def parse_counts(args: argparse.Namespace) -> None:
    """``--repeats``/``--rounds`` as numbers, in every mode of the gate (a plain gate refuses
    a bad one too): parsed here, not by argparse's ``type=``, whose error for ``x`` or ``1e3``
    was a usage block (numbers.py). Idempotent."""
    args.repeats = numbers.integer(args.repeats, "--repeats", 2, 200)
    args.rounds = numbers.integer(args.rounds, "--rounds", 1, 50)


def wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "against", None) or getattr(args, "calibrate", False))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _calibration_dir(args: argparse.Namespace) -> Path:
    if args.baseline and len(args.baseline) != 1:
        raise UserError("--baseline: with --against/--calibrate, give one directory (the "
                        "calibration lives in its calibration/ folder)")
    return Path(args.baseline[0] if args.baseline else "results/baseline") / "calibration"


def _scenario_files(args: argparse.Namespace) -> list[Path]:
    from .. import scenario

    if not args.scenarios:
        raise UserError(f"gate {'--against' if args.against else '--calibrate'}: name the "
                        "scenario files to run (e.g. scenarios/ci/*.toml)")
    files = [Path(p) for p in scenario.expand_files(args.scenarios)]
    for f in files:
        scenario.load(f)             # bad input fails here, before any checkout or run
    return files


def run(args: argparse.Namespace, parse_threshold: Callable[[str], float],
        parse_alpha: Callable[[str], float], default_metrics: tuple[str, ...]) -> int:
    """``commands.gate`` hands over its own parsers (one way to read a threshold; no import
    back into it)."""
    from ..gate.ab import DEFAULT_AB_ALPHA, DEFAULT_AB_THRESHOLD, DEFAULT_PAIRS

    if args.current:
        raise UserError("gate: --current compares result files; --against and --calibrate "
                        "measure both sides themselves")
    if args.update_baseline:
        raise UserError("gate: --update-baseline refreshes a baseline from --current results; "
                        "it does not apply to --against/--calibrate")
    threshold = parse_threshold(args.threshold or f"{DEFAULT_AB_THRESHOLD:.0%}")
    alpha = parse_alpha(args.alpha or f"{DEFAULT_AB_ALPHA:g}")
    parse_counts(args)
    files = _scenario_files(args)
    metrics = args.metrics or default_metrics
    if args.calibrate:
        detect = _detect(args, parse_threshold)
        return _calibrate(args, files, threshold, alpha, metrics, args.repeats or DEFAULT_PAIRS,
                          detect)
    if args.rounds is not None or args.detect is not None:
        raise UserError("gate: --rounds and --detect belong to --calibrate")
    return _against(args, files, threshold, alpha, metrics)


def _detect(args: argparse.Namespace, parse_threshold: Callable[[str], float]) -> float:
    from ..gate.calibration import DEFAULT_DETECT

    if args.detect is None:
        return DEFAULT_DETECT
    try:
        return parse_threshold(args.detect)
    except UserError as exc:
        raise UserError(str(exc).replace("--threshold", "--detect")) from None


def _calibrate(args: argparse.Namespace, files: list[Path], threshold: float, alpha: float,
               metrics: tuple[str, ...], pairs: int, detect: float) -> int:
    from ..gate import calibration

    rounds = calibration.DEFAULT_ROUNDS if args.rounds is None else args.rounds
    if not 1 <= rounds <= 50:
        raise UserError(f"--rounds: expected 1 to 50, got {rounds}")
    directory = _calibration_dir(args)
    _say(f"gate --calibrate: {rounds} x {pairs} A/A pairs of the working tree against itself")
    cals = calibration.calibrate(files, threshold=threshold, alpha=alpha, pairs=pairs,
                                 rounds=rounds, detect=detect, metrics=metrics, cwd=Path.cwd(),
                                 say=_say)
    for cal in cals:
        path = calibration.save(cal, directory)
        sys.stdout.write(calibration.format_calibration(cal))
        print(f"calibration: {path}")
    return 0


def _calibrations(files: list[Path], directory: Path) -> tuple[list, list[str]]:
    """Usable calibrations of these scenarios on this machine, and notes on the others."""
    from .. import scenario
    from ..gate import calibration
    from ..gate.rule import machine_key
    from ..measure.machine import metadata

    key = machine_key(metadata())
    cals, notes = [], []
    for f in files:
        sc = scenario.load(f)
        cal, why = calibration.find_for(directory, sc.name, sc.sha256, key)
        notes.append(why)
        if cal is not None:
            cals.append(cal)
    return cals, notes


def _against(args: argparse.Namespace, files: list[Path], threshold: float, alpha: float,
             metrics: tuple[str, ...]) -> int:
    from ..gate import ab as ab_gate
    from ..gate import calibration
    from ..gate import worktree

    worktree.resolve(worktree.toplevel(Path.cwd()), args.against)   # bad REF: fail first
    cals, notes = _calibrations(files, _calibration_dir(args))
    applied = calibration.apply(cals, threshold=threshold, alpha=alpha, pairs=args.repeats,
                                default_pairs=ab_gate.DEFAULT_PAIRS, metrics=metrics,
                                confirm=args.confirm)
    pairs = applied.pairs or ab_gate.DEFAULT_PAIRS
    for n in notes + applied.notes:
        _say(f"gate: {n}")
    settings = ab_gate.ABSettings(threshold=threshold, alpha=alpha, pairs=pairs,
                                  metrics=metrics, include_memory=args.memory,
                                  fail_on_improvement=args.fail_on_improvement,
                                  confirm=args.confirm)
    # github: the runs as markdown; annotations only at the end, once the rerun has decided
    fmt = formats.format_markdown if args.format == "github" else formats.FORMATTERS[args.format]
    printed: list[tuple[str, GateReport]] = []

    def on_report(title: str, report: GateReport) -> None:
        printed.append((title, report))
        if args.format != "json":
            sys.stdout.write(f"\n{title}:\n" if args.format == "table" else f"\n### {title}\n\n")
            # each run's last line counts its rows; only the final line says PASS or FAIL
            text = fmt(report).replace("gate FAIL: ", f"{title}: ").replace("gate PASS: ",
                                                                            f"{title}: ")
            sys.stdout.write(text)
            sys.stdout.flush()

    out = ab_gate.run_gate(files, args.against, settings, cwd=Path.cwd(), say=_say,
                           on_report=on_report)
    line = ab_gate.summary(out)
    if args.format == "json":
        sys.stdout.write(json.dumps({
            "passed": not out.failed, "exit_code": 1 if out.failed else 0,
            "against": out.ref, "commit": out.commit, "pairs": out.pairs,
            "seconds": round(out.seconds, 1), "summary": line,
            "runs": [{"title": t, **json.loads(formats.format_json(r))} for t, r in printed],
        }, indent=1) + "\n")
    else:
        if args.format == "github":
            sys.stdout.write(_annotations(out))
        sys.stdout.write(f"\n{line} ({out.seconds:.0f} s)\n")
    return 1 if out.failed else 0


def _annotations(out) -> str:
    """GitHub annotations: an error per confirmed row, a warning per row the rerun did not
    confirm and per inconclusive row of the first run."""
    esc = formats.escape_github
    lines = []
    for r in out.confirmed:
        what = (f"{r.verdict} than REF {out.ref}" if r.verdict != TOO_FEW else
                f"{r.direction} than REF {out.ref} beyond the threshold, {TOO_FEW} to decide")
        lines.append(f"::error title=stallbench gate::{esc(f'{r.label}: {what}, confirmed by the rerun (change {formats.format_change(r)}, p={formats.format_p(r)})')}")
    for r in out.unconfirmed:
        lines.append(f"::warning title=stallbench gate::{esc(f'{r.label}: {r.verdict} in the first run only; the rerun did not confirm it')}")
    for r in out.first.rows:
        if r.verdict == INCONCLUSIVE:
            lines.append(f"::warning title=stallbench gate::{esc(f'{r.label}: inconclusive (change {formats.format_change(r)} over the threshold, not significant)')}")
        elif r.verdict == TOO_FEW and r not in out.first.failing:
            lines.append(f"::warning title=stallbench gate::{esc(f'{r.label}: {TOO_FEW} (change {formats.format_change(r)} over the threshold): {r.note}')}")
    return "\n".join(lines) + ("\n" if lines else "")
