"""The same-job A/B gate: REF's code against the working tree's, paired, with a confirmation.

``stallbench gate --against REF SCENARIO.toml...``:

1. REF is checked out into a temporary git worktree (``worktree.checkout``; removed afterwards,
   also on errors, Ctrl-C and SIGTERM).
2. ``ab.run_pairs`` measures N pairs of runs (REF, working tree), interleaved, one repeat a run.
3. ``paired_report`` makes one row per scenario / variant / metric with the paired rule of
   ``compare.compare_paired`` (Wilcoxon signed-rank on per-pair log ratios, Hodges-Lehmann
   effect, asv's threshold): the same verdict names and exit codes as the baseline gate.
4. Confirmation: a scenario with a failing row ("slower", or "faster" with
   ``--fail-on-improvement``) is measured again, N new pairs; a row fails the gate only when
   the rerun gives it the same verdict. Both runs are printed. Under no change, one run's
   false-alarm rate p becomes about p**2 (independent reruns); a real slowdown is seen twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from . import pairs as ab
from . import metrics as metric_values
from . import worktree
from . import rows
from .rule import (FASTER, INCONCLUSIVE, METRICS, MIN_REPEATS, NOT_COMPARABLE, SLOWER, TOO_FEW,
                   Metric, compare_paired)
from .rows import GateReport, Row, gated_metrics
from .. import interrupts
from ..analysis.stats import finite_median
from ..errors import ResultError
from ..results import Result

# 12 pairs: at alpha 0.05 the signed-rank test tolerates up to 13 rank points against (two or
# three small opposite pairs); with 5% noise per pair a 10% slower epoch is caught in ~99% of
# gates (confirmed), with 10% noise in ~2/3: a noisier machine needs the calibration's pairs.
DEFAULT_PAIRS = 12
# Drift cancels within a pair, so the threshold can sit below the baseline gate's 10%: a 10%
# slower epoch (-9.1% throughput) must clear it with room to spare.
DEFAULT_AB_THRESHOLD = 0.05
# A slower verdict stands only when an independent rerun says slower too, so one row's false
# alarm rate is about (alpha / 2) ** 2 (0.06% at 0.05); the baseline gate, which cannot rerun,
# keeps 0.01.
DEFAULT_AB_ALPHA = 0.05


# ------------------------------------------------------------------------------ rows

def _value(results: Result, variant: str, m: Metric) -> float:
    """One run's figure: the median of its repeats (one repeat per run in the A/B)."""
    try:
        v = results.variant(variant)
    except KeyError:
        return math.nan
    if not metric_values.available(v, m):
        return math.nan
    return finite_median(metric_values.per_repeat(v, m))


def paired_values(pairs: Sequence[ab.Pair], scenario: str, variant: str,
                  m: Metric) -> tuple[list[float], list[float]]:
    """(REF values, working-tree values), pair by pair."""
    a = [_value(p.a[scenario], variant, m) for p in pairs]
    b = [_value(p.b[scenario], variant, m) for p in pairs]
    return a, b


def paired_row(scenario: str, variant: str, m: Metric, a: list[float], b: list[float], *,
               threshold: float, alpha: float, n_boot: int = 1000, seed: int = 0) -> Row:
    c = compare_paired(a, b, m, threshold=threshold, alpha=alpha)
    return rows.row(scenario, variant, m.name, m, c, a, b, rows.paired_interval, alpha=alpha,
                    n_boot=n_boot, seed=seed)


def variant_names(pairs: Sequence[ab.Pair], scenario: str) -> list[str]:
    names: list[str] = []
    for p in pairs:
        for side in (p.a, p.b):
            for v in side[scenario].variants:
                if v.name not in names:
                    names.append(v.name)
    return names


def paired_report(pairs: Sequence[ab.Pair], *, threshold: float, alpha: float,
                  metrics: Sequence[str] = ("throughput", "stall_share", "attribution"),
                  include_memory: bool = False, fail_on_improvement: bool = False,
                  n_boot: int = 1000, seed: int = 0) -> GateReport:
    """One row per scenario / variant / metric present in the pairs, by the paired rule."""
    chosen = gated_metrics(metrics, include_memory)
    report = GateReport([], threshold, alpha, fail_on_improvement)
    if not pairs:
        return report
    for scenario in pairs[0].a:
        report.modes[scenario] = "paired"
        _fingerprint_note(report, pairs, scenario)
        for vname in variant_names(pairs, scenario):
            for m in chosen:
                present = [metric_values.available(v, m) for p in pairs
                           for side in (p.a, p.b) for v in side[scenario].variants
                           if v.name == vname]
                if not any(present):
                    continue
                a, b = paired_values(pairs, scenario, vname, m)
                report.rows.append(paired_row(scenario, vname, m, a, b, threshold=threshold,
                                              alpha=alpha, n_boot=n_boot, seed=seed))
    return report


def _fingerprint_note(report: GateReport, pairs: Sequence[ab.Pair], scenario: str) -> None:
    fa = {p.a[scenario].scenario.fingerprint for p in pairs}
    fb = {p.b[scenario].scenario.fingerprint for p in pairs}
    if fa != fb:
        report.notes.append(
            f"{scenario}: the two sides resolve the scenario to different knobs (fingerprint "
            f"{', '.join(sorted(fa))} vs {', '.join(sorted(fb))}): a default changed between "
            "them; the comparison measures the code with its own defaults")


# ------------------------------------------------------------------------------ the gate

@dataclass
class ABOutcome:
    """Both runs of an A/B gate and what the confirmation decided."""

    ref: str                       # as the user named it
    commit: str                    # REF's commit id
    ref_label: str                 # "<short id> <subject>"
    first: GateReport
    rerun: GateReport | None = None
    confirmed: list[Row] = field(default_factory=list)       # failing in both runs
    unconfirmed: list[Row] = field(default_factory=list)     # failing in the first run only
    pairs: int = 0
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.confirmed)


def _key(r: Row) -> tuple[str, str, str]:
    return (r.scenario, r.variant, r.metric)


def confirm(first: GateReport, rerun: GateReport) -> tuple[list[Row], list[Row]]:
    """(confirmed, unconfirmed): a failing row of the first run is confirmed when the rerun's
    row for the same scenario/variant/metric fails in the same direction (a slower row and a
    worse change too few pairs could decide, ``rule.TOO_FEW``, confirm each other; with
    enough pairs that is the same verdict)."""
    again = {_key(r): r for r in rerun.failing}
    confirmed, unconfirmed = [], []
    for r in first.failing:
        other = again.get(_key(r))
        (confirmed if other is not None and other.direction == r.direction
         else unconfirmed).append(r)
    return confirmed, unconfirmed


@dataclass
class ABSettings:
    threshold: float
    alpha: float
    pairs: int
    metrics: Sequence[str] = ("throughput", "stall_share", "attribution")
    include_memory: bool = False
    fail_on_improvement: bool = False
    confirm: bool = True


def run_gate(scenarios: Sequence[Path], ref: str, settings: ABSettings, *, cwd: Path,
             say: Callable[[str], None] = lambda s: None,
             on_report: Callable[[str, GateReport], None] = lambda title, r: None) -> ABOutcome:
    """REF's code against the working tree's on ``scenarios``; see the module docstring.
    ``on_report`` sees each run's report as soon as it exists (printing both runs)."""
    import time

    t0 = time.perf_counter()
    repo = worktree.toplevel(cwd)
    commit = worktree.resolve(repo, ref)
    label = worktree.describe(repo, commit)
    with interrupts.SigtermAsInterrupt():
        say(f"gate: checking out {ref} ({label}) into a temporary worktree")
        with worktree.checkout(repo, commit) as ref_root:
            a = ab.Side(f"REF {ref}", ref_root)
            b = ab.Side("working tree", repo)

            def measure(files: Sequence[Path]) -> GateReport:
                pairs = ab.run_pairs(files, a, b, settings.pairs, cwd=cwd, work_root=repo,
                                     say=say)
                report = paired_report(pairs, threshold=settings.threshold,
                                       alpha=settings.alpha, metrics=settings.metrics,
                                       include_memory=settings.include_memory,
                                       fail_on_improvement=settings.fail_on_improvement)
                _label(report, ref, label, len(pairs))
                if not any(r.verdict != NOT_COMPARABLE for r in report.rows):
                    raise ResultError("gate --against: nothing comparable between REF and the "
                                      "working tree (no variant and metric with >= "
                                      f"{MIN_REPEATS} complete pairs)")
                return report

            first = measure(scenarios)
            on_report("first run", first)
            out = ABOutcome(ref, commit, label, first, pairs=settings.pairs)
            if first.failing and settings.confirm:
                names = {r.scenario for r in first.failing}
                files = [s for s in scenarios if _scenario_name(s) in names] or list(scenarios)
                say(f"gate: {len(first.failing)} row(s) failing; confirmation rerun of "
                    f"{', '.join(sorted(names))} ({settings.pairs} new pairs)")
                out.rerun = measure(files)
                on_report("confirmation rerun", out.rerun)
                out.confirmed, out.unconfirmed = confirm(first, out.rerun)
            elif first.failing:
                out.confirmed = list(first.failing)
    out.seconds = time.perf_counter() - t0
    return out


def _scenario_name(path: Path) -> str:
    from ..scenario import load

    return load(path).name


def _label(report: GateReport, ref: str, label: str, pairs: int) -> None:
    report.notes.insert(0, f"same-job A/B: baseline = REF {ref} ({label}), current = the working "
                           f"tree; {pairs} interleaved pairs, one run each; paired rule "
                           "(Wilcoxon signed-rank on per-pair differences, Hodges-Lehmann change)")


def summary(out: ABOutcome) -> str:
    """The gate's last line: PASS/FAIL and why, naming the confirmed or unconfirmed rows."""
    def names(rows: list[Row]) -> str:
        return ", ".join(f"{r.label} {r.verdict}" for r in rows)

    if out.confirmed and out.rerun is not None:
        return f"gate FAIL: confirmed by the rerun: {names(out.confirmed)}"
    if out.confirmed:
        return f"gate FAIL (no confirmation rerun): {names(out.confirmed)}"
    if out.unconfirmed:
        return (f"gate PASS: {names(out.unconfirmed)} in the first run, not confirmed by the "
                "rerun (counted as noise)")
    maybe = [r for r in out.first.rows if r.verdict in (INCONCLUSIVE, TOO_FEW)]
    if maybe:
        what = ("inconclusive" if all(r.verdict == INCONCLUSIVE for r in maybe) else
                f"inconclusive or {TOO_FEW} (better)")
        return (f"gate PASS: nothing slower than REF; {len(maybe)} row(s) {what} (over "
                "the threshold, not significant: more pairs, --repeats, would tell)")
    return "gate PASS: nothing slower than REF"


# re-exported for the CLI
__all__ = ["ABOutcome", "ABSettings", "DEFAULT_AB_THRESHOLD", "DEFAULT_PAIRS", "METRICS",
           "MIN_REPEATS", "FASTER", "SLOWER", "confirm", "paired_report", "run_gate", "summary"]
