"""Small, honest statistics for few repeats on a noisy shared machine.

Every interval here is computed from raw repeats, seeded so a report or a gate decision is
reproducible from the same result files.
"""

from __future__ import annotations

import math
import numbers
import statistics
from functools import lru_cache
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
    se = statistics.stdev(vals) / math.sqrt(len(vals))
    h = t_quantile(len(vals) - 1, 0.5 + confidence / 2) * se
    return (m - h, m + h)


# ------------------------------------------------------------------ distributions, no SciPy
# The few distributions the gate and the analysis need, in the standard library: SciPy is not a
# dependency of the core install (it lands in the user's training image, issue 42). The tests
# check each against SciPy's own (scipy.stats.t.ppf, mannwhitneyu and wilcoxon, method="exact").

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz, Numerical
    Recipes 6.4); converges fast for x < (a + 1) / (a + b + 2)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@lru_cache(maxsize=1024)
def t_quantile(df: float, p: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (scipy.stats.t.ppf):
    bisection on the tail, to the last bits of a float (cached: the same few (df, p) pairs
    recur across a result's variants)."""
    if not 0.0 < p < 1.0:
        return math.inf if p >= 1.0 else -math.inf
    if p < 0.5:
        return -t_quantile(df, 1.0 - p)
    q = 1.0 - p
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > q:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_sf(mid, df) > q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _poly_times(c: list[int], k: int) -> list[int]:
    """``c`` times (1 - q**k), coefficients of q**0.. in a list."""
    out = c + [0] * k
    for i, v in enumerate(c):
        out[i + k] -= v
    return out


def _poly_over(c: list[int], k: int) -> list[int]:
    """``c`` divided by (1 - q**k) (exact: ``c`` is a multiple of it)."""
    out = list(c)
    for i in range(k, len(out)):
        out[i] += out[i - k]
    return out[:len(out) - k]


@lru_cache(maxsize=256)
def _rank_sum_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1 + n2, n1) orderings without ties give U = 0, 1, .., n1 * n2:
    the coefficients of the Gaussian binomial [n1 + n2, n1]_q (exact integers)."""
    k, n = min(n1, n2), n1 + n2
    c = [1]
    for i in range(1, k + 1):
        c = _poly_times(c, n - k + i)
        c = _poly_over(c, i)
    return tuple(c[:n1 * n2 + 1])


@lru_cache(maxsize=256)
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2**n sign patterns give W+ = 0, 1, .., n (n + 1) / 2: the
    coefficients of prod (1 + q**i), i = 1..n."""
    c = [1]
    for i in range(1, n + 1):
        out = c + [0] * i
        for j, v in enumerate(c):
            out[j + i] += v
        c = out
    return tuple(c)


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
    # SciPy's exact method: U from mid-ranks, its larger side truncated to an integer, against
    # the distribution without ties, two-sided by doubling (capped at 1).
    n1, n2 = len(a), len(b)
    r1 = sum(_mid_ranks([*a, *b])[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2
    u = int(max(u1, n1 * n2 - u1))
    counts = _rank_sum_counts(n1, n2)
    return min(1.0, 2.0 * sum(counts[u:]) / math.comb(n1 + n2, n1))


def _mid_ranks(xs: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``xs``, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def min_p_possible(n_a: int, n_b: int) -> float:
    """Smallest two-sided exact U p-value reachable with these sample sizes.

    When it is above the gate's alpha, the rank test can never decide, and the gate must fall
    back to non-overlapping intervals (asv does the same).
    """
    return 2.0 / math.comb(n_a + n_b, n_a)


# ------------------------------------------------------------------------------ paired

def signed_rank_p(d: Sequence[float]) -> float:
    """Two-sided exact Wilcoxon signed-rank p-value of paired differences ``d`` (zeros dropped,
    Wilcoxon's convention; ties get mid-ranks, judged against the distribution without ties, as
    SciPy's ``wilcoxon(method="exact")`` does)."""
    vals = [float(x) for x in d if x is not None and math.isfinite(x)]
    if not any(vals):
        return 1.0
    # SciPy's exact method: W+ from mid-ranks of |d| over the non-zero d, against the
    # distribution without ties; a non-integer W+ is rounded away from the centre on each side.
    nz = [x for x in vals if x != 0]
    ranks = _mid_ranks([abs(x) for x in nz])
    w = sum(r for r, x in zip(ranks, nz) if x > 0)
    counts = _signed_rank_counts(len(nz))
    total = 2 ** len(nz)
    sf = sum(counts[math.floor(w):]) / total
    cdf = sum(counts[:math.ceil(w) + 1]) / total
    return min(1.0, 2.0 * min(sf, cdf))


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
