"""analysis.stats' own distributions (the core install has no SciPy, issue 42) equal SciPy's,
the reference they replace: the t quantile (``scipy.stats.t.ppf``) and the exact two-sided
rank tests (``mannwhitneyu`` and ``wilcoxon``, ``method="exact"``), ties and zeros included."""

from __future__ import annotations

import random
import warnings

import pytest

from stallbench.analysis.stats import (mann_whitney_p, min_p_possible, min_p_signed_rank,
                                       signed_rank_p, t_interval, t_quantile)

stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 9, 14, 29, 60, 200, 5000])
def test_t_quantile_is_scipys(df: int) -> None:
    for p in (0.5, 0.6, 0.9, 0.95, 0.975, 0.99, 0.995, 0.9995, 1 - 1e-6, 0.05, 0.001):
        assert t_quantile(df, p) == pytest.approx(float(stats.t.ppf(p, df)), rel=1e-10, abs=1e-12)


def test_t_interval_known_value() -> None:
    """Mean 2, sd 1, n = 4: half-width t(3, 0.95) * 1 / 2 = 2.3534 / 2 (a printed table)."""
    a = 3 ** 0.5 / 2            # sample sd of [2-a, 2+a, 2-a, 2+a] is 1
    lo, hi = t_interval([2 - a, 2 + a, 2 - a, 2 + a], 0.9)
    assert (lo + hi) / 2 == pytest.approx(2.0)
    assert (hi - lo) / 2 == pytest.approx(2.353363 / 2, rel=1e-6)


def _draw(rng: random.Random, n: int) -> list[float]:
    """Values with frequent ties (small integers) among continuous ones."""
    return [rng.choice([rng.gauss(0, 1), float(rng.randint(-2, 2))]) for _ in range(n)]


def test_mann_whitney_p_is_scipys_exact() -> None:
    rng = random.Random(7)
    for _ in range(300):
        a, b = _draw(rng, rng.randint(1, 14)), _draw(rng, rng.randint(1, 14))
        want = 1.0 if len(set(a) | set(b)) == 1 else float(
            stats.mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue)
        assert mann_whitney_p(a, b) == pytest.approx(want, rel=1e-9, abs=1e-15), (a, b)
    n = 6
    assert mann_whitney_p(list(range(n)), list(range(n, 2 * n))) == pytest.approx(
        min_p_possible(n, n))


def test_signed_rank_p_is_scipys_exact() -> None:
    rng = random.Random(11)
    for _ in range(300):
        d = _draw(rng, rng.randint(1, 24))
        if not any(d):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # scipy warns that ties make "exact" inexact
            want = float(stats.wilcoxon(d, method="exact").pvalue)
        assert signed_rank_p(d) == pytest.approx(want, rel=1e-9, abs=1e-15), d
    assert signed_rank_p([0.1 * (i + 1) for i in range(9)]) == pytest.approx(min_p_signed_rank(9))
