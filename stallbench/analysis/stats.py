"""Small, honest statistics for few repeats on a noisy shared machine.

Every interval here is computed from raw repeats, seeded so a report or a gate decision is
reproducible from the same result files.
"""

from __future__ import annotations

import math
import numbers
import statistics
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..results import Summary


def t_interval(values: Sequence[float], confidence: float = 0.9) -> tuple[float, float]:
    """Student-t interval of the mean; degenerate (the value itself) with one sample."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return (math.nan, math.nan)
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return (m, m)
    # The t quantile from scipy.special (what scipy.stats.t.ppf calls): importing scipy.stats
    # costs every `stallbench run` ~1.2 s more at start; lazy keeps `stallbench --help` fast.
    from scipy.special import stdtrit

    se = statistics.stdev(vals) / math.sqrt(len(vals))
    h = float(stdtrit(len(vals) - 1, 0.5 + confidence / 2)) * se
    return (m - h, m + h)


# Below this stall share the data pipeline keeps up: the variant is compute-bound, "stall-free".
# The one threshold the attribution, the what-if and tune all judge by (here, not in
# ``differential``, because the what-if must not import torch).
COMPUTE_BOUND_SHARE = 0.05


def finite_median(values: Iterable[Any], empty: Any = math.nan) -> Any:
    """The median of the finite numbers among ``values`` (None, NaN and infinities are not
    measurements and are left out); ``empty`` when there is none. The one median of figures
    that may be missing, so a missing repeat is skipped the same way everywhere."""
    xs = [float(v) for v in values
          if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)]
    return statistics.median(xs) if xs else empty


def finite_summary(values: Iterable[Any]) -> Summary:
    """A ``Summary`` over repeats of the finite numbers among ``values`` (the rule of
    ``finite_median``: a missing repeat is left out, never a NaN median)."""
    return Summary.of([float(v) for v in values
                       if isinstance(v, numbers.Real) and not isinstance(v, bool)
                       and math.isfinite(v)])


def bootstrap_medians(groups: Mapping[str, Sequence[float]], n_boot: int = 2000,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """``n_boot`` bootstrap medians of each group, every group's repeats resampled on its own
    (one seeded stream, in the groups' order): the one bootstrap of per-run medians that the
    attributions (``differential``, ``waits``) and ``profile``'s differences share. A part
    linear in the medians is then evaluated on the whole arrays at once."""
    rng = np.random.default_rng(seed)
    return {k: np.median(rng.choice(np.asarray(v, dtype=float), size=(n_boot, len(v)),
                                    replace=True), axis=1)
            for k, v in groups.items()}


def percentile_interval(draws: Any, confidence: float = 0.9) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of bootstrap draws."""
    lo, hi = np.quantile(np.asarray(draws, dtype=float),
                         [0.5 - confidence / 2, 0.5 + confidence / 2])
    return float(lo), float(hi)


def bootstrap_ci(
    groups: Mapping[str, Sequence[float]],
    statistic: Callable[[Mapping[str, float]], float],
    confidence: float = 0.9,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap of ``statistic`` over independently resampled groups.

    Each group (e.g. the repeats of one ablation) is resampled with replacement and reduced to
    its mean; ``statistic`` combines the group means. With one repeat per group the interval
    collapses to the point estimate, which is the honest answer: no spread was measured.
    """
    rng = np.random.default_rng(seed)
    arrays = {k: np.asarray([v for v in vals if v is not None and math.isfinite(v)], dtype=float)
              for k, vals in groups.items()}
    if any(a.size == 0 for a in arrays.values()):
        return (math.nan, math.nan)
    draws = np.empty(n_boot)
    means = {k: rng.choice(a, size=(n_boot, a.size), replace=True).mean(axis=1)
             for k, a in arrays.items()}
    for i in range(n_boot):
        draws[i] = statistic({k: float(m[i]) for k, m in means.items()})
    lo, hi = np.quantile(draws, [0.5 - confidence / 2, 0.5 + confidence / 2])
    return (float(lo), float(hi))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided exact Mann-Whitney U p-value (asv's test for 'really different')."""
    if len(a) < 1 or len(b) < 1:
        return 1.0
    if len(set(a) | set(b)) == 1:
        return 1.0
    from scipy import stats as _st

    return float(_st.mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue)


def min_p_possible(n_a: int, n_b: int) -> float:
    """Smallest two-sided exact U p-value reachable with these sample sizes.

    When it is above the gate's alpha, the rank test can never decide, and the gate must fall
    back to non-overlapping intervals (asv does the same).
    """
    return 2.0 / math.comb(n_a + n_b, n_a)


# ------------------------------------------------------------------------------ paired

def signed_rank_p(d: Sequence[float]) -> float:
    """Two-sided exact Wilcoxon signed-rank p-value of paired differences ``d`` (zeros dropped,
    Wilcoxon's convention; ties get mid-ranks and SciPy's exact distribution handles them)."""
    vals = [float(x) for x in d if x is not None and math.isfinite(x)]
    if not any(vals):
        return 1.0
    from scipy import stats as _st

    return float(_st.wilcoxon(vals, method="exact").pvalue)


def min_p_signed_rank(n: int) -> float:
    """Smallest two-sided exact signed-rank p-value with ``n`` non-zero differences: every pair
    moved the same way, 2 / 2**n (n = 7: 0.016, n = 8: 0.0078, n = 10: 0.002)."""
    return 2.0 / 2.0 ** n if n > 0 else 1.0


def hodges_lehmann(d: Sequence[float]) -> float:
    """Hodges-Lehmann estimate of the centre of paired differences: the median of the Walsh
    averages (d_i + d_j) / 2 over i <= j. It is the estimate the signed-rank test is built
    around, robust to one disturbed pair, and ~95% as efficient as the mean on normal noise."""
    a = np.asarray([x for x in d if x is not None and math.isfinite(x)], dtype=float)
    if a.size == 0:
        return math.nan
    i, j = np.triu_indices(a.size)
    return float(np.median((a[i] + a[j]) / 2.0))


def paired_t_interval(d: Sequence[float], confidence: float) -> tuple[float, float]:
    """Student-t interval of the mean paired difference (the fallback when the signed-rank test
    cannot reach alpha with this few pairs; ``t_interval`` on the differences)."""
    return t_interval(d, confidence)
