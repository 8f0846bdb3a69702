"""Change points in a performance history: where did a series of results shift, and at which
commit?

A gate compares two points; a history of nightly or per-commit results shows slow creep and
shifts no single comparison was sure of. Following Apache Otava (formerly Hunter, Fleming et
al., "Hunter: Using Change Point Detection to Hunt for Performance Regressions", ICPE 2023) and
MongoDB's use of it (Daly et al., ICPE 2020), change points are found with **E-divisive
means** (Matteson and James, "A Nonparametric Approach for Multiple Change Point Analysis of
Multivariate Data", JASA 2014), with alpha = 1:

For a segment x_1..x_n and a split tau (A = x_1..x_tau, B = x_tau+1..x_n, m = |A|, k = |B|),

    E(A, B) = 2/(m k) sum_{a in A, b in B} |a - b|
              - 1/C(m, 2) sum_{a < a' in A} |a - a'| - 1/C(k, 2) sum_{b < b' in B} |b - b'|
    Q(tau)  = m k / (m + k) * E(A, B)

E is the energy distance between the two sides: zero when they come from one distribution,
positive when their distributions (not only their means) differ. Bisection: in every current
segment take the split with the largest Q (both sides at least ``min_size`` points), keep the
best over all segments, and test it with a permutation test: shuffle that segment
``permutations`` times (seeded: the same history gives the same answer), recompute its best Q,
p = (1 + #{shuffled >= observed}) / (1 + permutations). Accept when p < ``max_p`` and go on
splitting; stop at the first rejection. Each change point is then described by its neighbouring
segments (medians before and after, the relative change); like Otava, a change smaller than
``min_change`` is dropped from the output as too small to act on.

Pure functions on floats (``change_points``) are kept apart from reading results
(``series_of``), so the method is tested on series of known shape.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Sequence

import numpy as np

from ..analysis import figures
from . import metrics as metric_values
from .rule import METRICS
from ..results import Result

DEFAULT_MAX_P = 0.05
DEFAULT_PERMUTATIONS = 199
DEFAULT_MIN_SIZE = 3
DEFAULT_MIN_CHANGE = 0.0


def _q_all(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """(best split, its Q) of one segment; splits leave >= min_size points a side. A split
    index tau means the change is between x[tau-1] and x[tau]."""
    n = x.size
    if n < 2 * min_size:
        return -1, -math.inf
    d = np.abs(x[:, None] - x[None, :])
    p = np.zeros((n + 1, n + 1))
    p[1:, 1:] = d.cumsum(0).cumsum(1)
    taus = np.arange(min_size, n - min_size + 1)
    m = taus.astype(float)
    k = n - m
    cross = p[taus, n] - p[taus, taus]
    within_a = p[taus, taus]
    within_b = p[n, n] - 2 * p[taus, n] + p[taus, taus]
    e = 2 * cross / (m * k) - within_a / (m * (m - 1)) - within_b / (k * (k - 1))
    q = m * k / (m + k) * e
    best = int(np.argmax(q))
    return int(taus[best]), float(q[best])


@dataclass(frozen=True)
class ChangePoint:
    index: int               # first point of the new level
    p_value: float
    q: float
    before: float            # median of the segment before
    after: float             # median of the segment after
    change: float            # after / before - 1 (NaN when before is 0)


def change_points(values: Sequence[float], *, max_p: float = DEFAULT_MAX_P,
                  permutations: int = DEFAULT_PERMUTATIONS, min_size: int = DEFAULT_MIN_SIZE,
                  min_change: float = DEFAULT_MIN_CHANGE, seed: int = 0) -> list[ChangePoint]:
    """E-divisive means change points of ``values`` (see the module docstring), sorted."""
    x = np.asarray([float(v) for v in values], dtype=float)
    if x.size and not np.isfinite(x).all():
        raise ValueError("change_points: values must be finite")
    rng = np.random.default_rng(seed)
    cuts: list[int] = []
    accepted: dict[int, tuple[float, float]] = {}
    while True:
        bounds = [0, *sorted(cuts), x.size]
        best: tuple[float, int, int, int] | None = None   # (q, tau, start, stop)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            tau, q = _q_all(x[lo:hi], min_size)
            if tau > 0 and (best is None or q > best[0]):
                best = (q, lo + tau, lo, hi)
        if best is None:
            break
        q, tau, lo, hi = best
        seg = x[lo:hi].copy()
        hits = 0
        for _ in range(permutations):
            rng.shuffle(seg)
            if _q_all(seg, min_size)[1] >= q - 1e-12:
                hits += 1
        p = (1 + hits) / (1 + permutations)
        if p >= max_p:
            break
        cuts.append(tau)
        accepted[tau] = (p, q)
    out = []
    bounds = [0, *sorted(cuts), x.size]
    for i, tau in enumerate(sorted(cuts), start=1):
        before = float(np.median(x[bounds[i - 1]:tau]))
        after = float(np.median(x[tau:bounds[i + 1]]))
        change = after / before - 1 if before != 0 else math.nan
        if math.isfinite(change) and abs(change) < min_change:
            continue
        out.append(ChangePoint(tau, accepted[tau][0], accepted[tau][1], before, after, change))
    return out


# ------------------------------------------------------------------------------ results

@dataclass
class Series:
    """One variant's metric over a scenario's results, oldest first."""

    scenario: str
    variant: str
    metric: str
    values: list[float]                      # the median of each result's repeats
    created: list[str]
    commits: list[str]                       # machine.git.commit ("" when unknown)
    dirty: list[bool]
    points: list[ChangePoint] = field(default_factory=list)


def _when(r: Result) -> tuple[int, datetime | str]:
    try:
        return (0, datetime.fromisoformat(r.created_utc))
    except (TypeError, ValueError):
        return (1, str(r.created_utc))


def ordered(results: Sequence[Result]) -> list[Result]:
    """Oldest first, by ``created_utc``."""
    return sorted(results, key=lambda r: (_when(r)[0], str(r.created_utc)))


def series_of(results: Sequence[Result], metrics: Sequence[str] = ("throughput", "stall_share"),
              ) -> list[Series]:
    """Every variant's series per metric, for each scenario in ``results``."""
    by_scenario: dict[str, list[Result]] = {}
    for r in results:
        by_scenario.setdefault(r.scenario.name, []).append(r)
    out = []
    for name, rs in by_scenario.items():
        rs = ordered(rs)
        names: list[str] = []
        for r in rs:
            names += [v.name for v in r.variants if v.name not in names]
        for vname in names:
            for mname in metrics:
                m = METRICS[mname]
                values, created, commits, dirty = [], [], [], []
                for r in rs:
                    try:
                        v = r.variant(vname)
                    except KeyError:
                        continue
                    if not metric_values.available(v, m):
                        continue
                    vals = [x for x in metric_values.per_repeat(v, m) if math.isfinite(x)]
                    if not vals:
                        continue
                    values.append(statistics.median(vals))
                    created.append(r.created_utc)
                    git = r.machine.git
                    commits.append(git.commit if git else "")
                    dirty.append(bool(git and git.dirty))
                if values:
                    out.append(Series(name, vname, mname, values, created, commits, dirty))
    return out


def analyze(series: Sequence[Series], **kw: float | int) -> list[Series]:
    for s in series:
        s.points = change_points(s.values, **kw)  # type: ignore[arg-type]
    return list(series)


def _fmt(metric: str, x: float) -> str:
    if METRICS[metric].kind == "points":
        return f"{x * 100:.1f}%"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def format_history(series: Sequence[Series], *, max_p: float, permutations: int,
                   min_size: int) -> str:
    lines = []
    scenarios: dict[str, list[Series]] = {}
    for s in series:
        scenarios.setdefault(s.scenario, []).append(s)
    for name, ss in scenarios.items():
        n = max(len(s.values) for s in ss)
        first = min((c for s in ss for c in s.created), default="?")
        last = max((c for s in ss for c in s.created), default="?")
        lines.append(f"history of {name}: {n} results, {first} .. {last}; E-divisive means, "
                     f"p < {max_p:g} ({permutations} permutations), segments >= {min_size}")
        for s in ss:
            if len(s.values) < 2 * min_size:
                lines.append(f"  {s.variant} {s.metric}: {len(s.values)} results, too few to "
                             f"split (needs {2 * min_size})")
                continue
            if not s.points:
                lines.append(f"  {s.variant} {s.metric}: no change point in {len(s.values)} "
                             "results")
                continue
            lines.append(f"  {s.variant} {s.metric}: {len(s.points)} change point(s)")
            for cp in s.points:
                i = cp.index
                commit = s.commits[i][:12] if s.commits[i] else "unknown commit"
                if s.dirty[i]:
                    commit += " (dirty)"
                kind = METRICS[s.metric].kind
                delta = (figures.signed_points(cp.after - cp.before) if kind == "points"
                         else figures.signed_percent(cp.change))
                lines.append(f"    at result #{i + 1} ({s.created[i]}, commit {commit}): "
                             f"{_fmt(s.metric, cp.before)} -> {_fmt(s.metric, cp.after)} "
                             f"({delta}), p = {cp.p_value:.3f}")
    return "\n".join(lines) + "\n"
