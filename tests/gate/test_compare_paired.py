"""The paired rule (compare.compare_paired) and its vectorised twin in calibration: known
differences in, the verdict the rule's formula says out."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stallbench.gate import calibration
from stallbench.analysis.stats import hodges_lehmann, min_p_signed_rank, signed_rank_p
from stallbench.gate.rule import (FASTER, INCONCLUSIVE, METRICS, NOT_COMPARABLE, SAME, SLOWER,
                                  compare_paired, paired_differences)

TP = METRICS["throughput"]
SHARE = METRICS["stall_share"]


def test_hodges_lehmann_is_the_median_of_walsh_averages() -> None:
    d = [1.0, 2.0, 9.0]
    walsh = [1.0, 1.5, 5.0, 2.0, 5.5, 9.0]
    assert hodges_lehmann(d) == pytest.approx(float(np.median(walsh)))
    assert hodges_lehmann([0.3]) == 0.3
    assert math.isnan(hodges_lehmann([]))


def test_signed_rank_p_matches_scipy_and_its_floor() -> None:
    d = [0.01, -0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]
    assert signed_rank_p(d) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)
    assert signed_rank_p([0.1 * (i + 1) for i in range(8)]) == pytest.approx(min_p_signed_rank(8))
    assert min_p_signed_rank(8) == pytest.approx(2 / 256)
    assert signed_rank_p([0.0, 0.0, 0.0]) == 1.0


def test_ten_percent_slower_in_every_pair_is_slower() -> None:
    base = [100.0, 120.0, 90.0, 150.0, 100.0, 80.0, 130.0, 110.0, 95.0, 105.0]   # drifting
    cur = [b / 1.1 for b in base]
    c = compare_paired(base, cur, TP, threshold=0.05, alpha=0.01)
    assert c.verdict == SLOWER and c.test == "wilcoxon"
    assert c.change == pytest.approx(1 / 1.1)
    assert c.p_value == pytest.approx(2 / 1024)
    # unpaired, the drift (80..150) hides the same change
    from stallbench.gate.rule import compare
    assert compare(base, cur, TP, threshold=0.05, alpha=0.01).verdict != SLOWER


def test_faster_same_and_inconclusive() -> None:
    base = [100.0 + i for i in range(10)]
    assert compare_paired(base, [b * 1.2 for b in base], TP, threshold=0.05).verdict == FASTER
    assert compare_paired(base, [b * 1.01 for b in base], TP, threshold=0.05).verdict == SAME
    # beyond the threshold on the estimate but mixed signs: not significant
    cur = [b * f for b, f in zip(base, [0.8, 1.1, 0.8, 1.1, 0.8, 1.1, 0.8, 1.1, 0.8, 1.1])]
    assert compare_paired(base, cur, TP, threshold=0.05).verdict == INCONCLUSIVE


def test_share_points_use_differences() -> None:
    base = [0.40 + 0.01 * i for i in range(10)]
    cur = [b + 0.08 for b in base]
    c = compare_paired(base, cur, SHARE, threshold=0.05)
    assert c.verdict == SLOWER and c.change == pytest.approx(0.08)
    assert paired_differences([0.4], [0.5], SHARE) == [pytest.approx(0.1)]


def test_few_pairs_fall_back_to_the_paired_t_interval() -> None:
    base = [100.0, 110.0, 90.0, 105.0]
    c = compare_paired(base, [b * 0.8 for b in base], TP, threshold=0.05, alpha=0.01)
    assert c.test == "paired-t" and c.verdict == SLOWER
    one = compare_paired([100.0], [80.0], TP)
    assert one.verdict == NOT_COMPARABLE


def test_incomplete_pairs_are_dropped_whole() -> None:
    d = paired_differences([100.0, math.nan, 100.0], [110.0, 90.0, 0.0], TP)
    assert d == [pytest.approx(math.log(1.1))]


@pytest.mark.parametrize("metric", ["throughput", "stall_share", "peak_pss_mb"])
@pytest.mark.parametrize("n", [4, 8, 10, 15])
def test_vectorised_rule_equals_compare_paired(metric: str, n: int) -> None:
    m = METRICS[metric]
    rng = np.random.default_rng(n)
    draws = rng.normal(0.0, 0.06, size=(80, n)) + rng.choice([-0.08, 0.0, 0.08], size=(80, 1))
    fast = calibration.simulate(draws, m, 0.05, 0.01)
    for row, v in zip(draws, fast):
        if m.kind == "ratio":
            c = compare_paired([1.0] * n, list(np.exp(row)), m, threshold=0.05, alpha=0.01)
        else:
            c = compare_paired([0.5] * n, list(0.5 + row), m, threshold=0.05, alpha=0.01)
        assert {SLOWER: 1, FASTER: -1}.get(c.verdict, 0) == v


def test_signed_rank_critical_values() -> None:
    assert calibration.signed_rank_critical(7, 0.01) is None       # 2/128 = 0.016
    assert calibration.signed_rank_critical(8, 0.01) == 0
    assert calibration.signed_rank_critical(10, 0.01) == 3         # p(W<=3) * 2 = 10/1024
