"""``analysis.stats.mann_whitney_p`` computes SciPy's exact two-sided Mann-Whitney p-value
without importing ``scipy.stats`` (~1 s of every report and gate run). Ground truth: SciPy
itself on the same samples: with and without ties, equal and unequal sizes, U at the middle
(p clipped to 1) and at the extremes, and samples large enough to go to SciPy."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as st

from stallbench.analysis.stats import mann_whitney_p


def scipy_p(a: list[float], b: list[float]) -> float:
    return float(st.mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue)


def test_matches_scipy_on_random_samples_with_and_without_ties() -> None:
    rng = random.Random(7)
    for _ in range(400):
        n1, n2 = rng.randint(1, 12), rng.randint(1, 12)
        levels = rng.choice([3, 6, 1000])       # few levels: many ties; 1000: almost none
        a = [rng.randrange(levels) / 7 for _ in range(n1)]
        b = [rng.randrange(levels) / 7 + rng.choice([0, 0.3]) for _ in range(n2)]
        if len(set(a) | set(b)) == 1:
            continue
        assert mann_whitney_p(a, b) == pytest.approx(scipy_p(a, b), rel=1e-9, abs=1e-15), (a, b)


@pytest.mark.parametrize("a,b", [
    ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),                  # fully separated: smallest p
    ([1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5]),             # interleaved: p clipped to 1
    ([5.0] * 5, [5.0] * 4 + [6.0]),                      # nearly all tied
    ([0.0, -0.0, 1.0], [2.0, math.inf]),                 # -0.0 == 0.0, an infinite value
])
def test_matches_scipy_at_the_edges(a: list[float], b: list[float]) -> None:
    assert mann_whitney_p(a, b) == pytest.approx(scipy_p(a, b), rel=1e-9, abs=1e-15)


def test_large_samples_and_nan_as_scipy() -> None:
    rng = random.Random(3)
    a = [rng.random() for _ in range(70)]
    b = [rng.random() + 0.1 for _ in range(70)]
    assert mann_whitney_p(a, b) == pytest.approx(scipy_p(a, b), rel=1e-9)
    assert math.isnan(mann_whitney_p([1.0, math.nan], [2.0, 3.0]))
    assert math.isnan(scipy_p([1.0, math.nan], [2.0, 3.0]))
    assert mann_whitney_p([2.0], [2.0]) == 1.0
    assert mann_whitney_p([], [1.0, 2.0]) == 1.0
