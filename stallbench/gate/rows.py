"""One row builder for both gates: the rule's comparison and an interval, into a ``Row``.

The baseline gate (``gate.baseline``) compares independent repeats, the A/B gate (``gate.ab``)
measured pairs; their verdicts come from ``gate.rule`` (unpaired and paired rule) and their
intervals from different statistics, which stay different: the baseline's is a bootstrap over
the two sides resampled independently (``unpaired_interval``), the A/B's a bootstrap over whole
pairs of the paired effect (``paired_interval``). The statistic is the row builder's parameter,
so a row is built, and a not-comparable row said, one way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from ..analysis.stats import bootstrap_ci
from ..errors import UserError
from .rule import (ATTRIBUTION_METRICS, BETTER, FASTER, METRICS, NOT_COMPARABLE, SLOWER,
                   TOO_FEW, WORSE, Comparison, Metric, change_of, paired_differences)


@dataclass
class Row:
    """One compared figure. ``change`` is a ratio or a difference, as ``change_kind`` says."""

    scenario: str
    variant: str
    metric: str
    baseline: float            # median over the baseline repeats
    current: float             # median over the current repeats
    change: float              # ratio current/baseline ("ratio") or current - baseline ("points")
    change_kind: str
    ci_low: float
    ci_high: float
    p_value: float | None
    test: str                  # "mann-whitney", "ci-overlap" or "" (not compared)
    verdict: str
    n_baseline: int = 0
    n_current: int = 0
    note: str = ""
    direction: str = ""        # "worse"/"better" beyond the threshold (rule.direction), else ""

    @property
    def label(self) -> str:
        return f"{self.scenario}/{self.variant} {self.metric}"


@dataclass
class GateReport:
    rows: list[Row]
    threshold: float
    alpha: float
    fail_on_improvement: bool = False
    modes: dict[str, str] = field(default_factory=dict)    # scenario -> same-machine|cross-machine
    notes: list[str] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)

    @property
    def failing(self) -> list[Row]:
        """Rows the gate fails on: slower, and a change in the worse direction too few repeats
        can decide (``rule.TOO_FEW``); with ``fail_on_improvement`` their better twins too."""
        bad = {SLOWER, FASTER} if self.fail_on_improvement else {SLOWER}
        ways = {WORSE, BETTER} if self.fail_on_improvement else {WORSE}
        return [r for r in self.rows if r.verdict in bad
                or (r.verdict == TOO_FEW and r.direction in ways)]



def gated_metrics(names: Iterable[str], include_memory: bool) -> list[Metric]:
    """The metrics a gate compares, in order, from the names the user gave ("attribution" is
    its parts); an unknown name is bad input."""
    out: list[Metric] = []
    names = [x for n in names for x in (ATTRIBUTION_METRICS if n == "attribution" else [n])]
    for n in names + (["peak_pss_mb"] if include_memory else []):
        if n not in METRICS:
            raise UserError(f"gate: unknown metric {n!r}; choose from {', '.join(METRICS)}")
        if METRICS[n] not in out:
            out.append(METRICS[n])
    if not out:
        raise UserError("gate: no metric to compare")
    return out



def not_comparable(scenario: str, variant: str, metric: str, note: str) -> Row:
    """A row that could not be compared, and why (``note``)."""
    nan = math.nan
    return Row(scenario, variant, metric, nan, nan, nan, "", nan, nan, None, "", NOT_COMPARABLE,
               note=note)


def exit_code(report: GateReport) -> int:
    """0 nothing regressed, 1 a regression (or improvement with fail_on_improvement), or such a
    change too few repeats can decide (``GateReport.failing``)."""
    return 1 if report.failing else 0


# ------------------------------------------------------------------------------ one row

class Interval(Protocol):
    """The interval of a row's change at confidence 1 - alpha: for reading, it does not decide."""

    def __call__(self, m: Metric, base: Sequence[float], cur: Sequence[float], *, alpha: float,
                 n_boot: int, seed: int) -> tuple[float, float]: ...


def row(scenario: str, variant: str, metric: str, m: Metric, c: Comparison,
        base: Sequence[float], cur: Sequence[float], interval: Interval, *, alpha: float,
        n_boot: int, seed: int) -> Row:
    """The row of one comparison ``c`` of ``base`` against ``cur``, its interval by ``interval``."""
    if c.verdict == NOT_COMPARABLE:
        return not_comparable(scenario, variant, metric, c.note)
    lo, hi = interval(m, base, cur, alpha=alpha, n_boot=n_boot, seed=seed)
    return Row(scenario, variant, metric, c.baseline, c.current, c.change, c.change_kind, lo, hi,
               c.p_value, c.test, c.verdict, c.n_baseline, c.n_current, c.note, c.direction)


def unpaired_interval(m: Metric, base: Sequence[float], cur: Sequence[float], *, alpha: float,
                      n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap of the change of means, each side resampled on its own (the
    baseline gate's repeats are independent)."""
    stat: Callable[[dict[str, float]], float]
    if m.kind == "ratio":
        stat = lambda g: g["c"] / g["b"] if g["b"] else math.nan  # noqa: E731
    else:
        stat = lambda g: g["c"] - g["b"]  # noqa: E731
    return bootstrap_ci({"b": list(base), "c": list(cur)}, stat, confidence=1 - alpha,
                        n_boot=n_boot, seed=seed)


def paired_interval(m: Metric, base: Sequence[float], cur: Sequence[float], *, alpha: float,
                    n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap over pairs (resampled whole) of the paired change (the A/B gate's
    drift cancels within a pair, so the pair is the unit)."""
    arr = np.asarray(paired_differences(base, cur, m), dtype=float)
    if arr.size < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    draws = np.array([change_of(arr[r], m) for r in idx])
    lo, hi = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)
