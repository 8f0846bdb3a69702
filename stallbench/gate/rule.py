"""One rule for "slower" and "faster": the gate and the report both decide with it, so a page
and a CI log can never disagree about the same two sets of repeats.

Metrics and their orientation
    ``throughput``   samples/s, higher is better. Change = current median / baseline median.
    ``stall_share``  share of the run the trainer was not computing, lower is better. It is
                     often ~0, where a ratio explodes, so its change is the *difference*
                     current - baseline in share points, and the threshold is read as points
                     (10% -> 0.10 = 10 points). With data-parallel ranks (``trainers.ranks``
                     > 1) it is the max-over-ranks exposed stall over the job's epoch, so the
                     gate compares the slowest rank's stall.
    ``peak_pss_mb``  lower is better, a ratio like throughput.
    ``fetch_stall_share``, ``preprocess_stall_share``, ``transfer_stall_share``,
    ``loader_overhead_share``
                     the attribution's parts as shares of the epoch, in points like stall_share
                     (only where the results carry an attribution; ``metric_values`` reads them).
    "slower" always means *worse* and "faster" *better*, whatever the metric's direction.

Decision rule (asv's)
    A comparison is *slower*/*faster* only when BOTH
      1. the effect is beyond the threshold: ratio < 1 - t (or > 1 + t) for ratio metrics,
         difference > +t (or < -t) for share metrics; AND
      2. it is significant: the two-sided exact Mann-Whitney U test on the raw repeats gives
         p < alpha, used whenever ``min_p_possible(n_a, n_b) < alpha`` (5 vs 5 repeats reach
         p = 0.0079, so alpha = 0.01 needs 5 repeats a side); with fewer repeats the test can
         never reach alpha, so significance falls back to non-overlapping (1 - alpha) Student-t
         intervals of the two sides' means.
    Beyond the threshold but not significant -> *inconclusive*. Within the threshold -> *same*.
    Fewer than ``MIN_REPEATS`` values on a side -> *not comparable* (one repeat measures no
    spread, so noise cannot be told from change).

Too few repeats to decide (``too_few``; both rules)
    When the exact test cannot reach alpha with these sizes at all (``min_p_possible(n_a, n_b)
    >= alpha``: fewer than 5 repeats a side at 0.01; for pairs ``min_p_signed_rank(n) >=
    alpha``: fewer than 8 differing pairs at 0.01), "not significant" says nothing about the
    change: 2 vs 2 repeats can never reach p < 1/3 in the rank test, and the fallback interval
    at 99% with 1 degree of freedom is ~64 standard errors wide, so a throughput of 0 would be
    *inconclusive* and pass. So, with too few repeats, a change beyond the threshold that the
    fallback interval does not show significant, but on which every repeat agrees (the two
    sides' ranges are apart; for pairs, every pair moved the same way: the most extreme
    arrangement the exact test can see), is *too few repeats*, not *inconclusive*: the gate
    fails on it when the change is in the worse direction (or either, with
    ``fail_on_improvement``), as it would on *slower*, and the note names the repeats a side the
    test needs (``repeats_needed``). Where the repeats disagree (ranges overlap) it stays
    *inconclusive*. Under no change, a row's ranges are apart in a given direction with chance
    1 / C(n_a + n_b, n_a) (1/6 at 2 vs 2, 1/20 at 3 vs 3) and the effect must also clear the
    threshold. With enough repeats nothing changes.

Paired rule (``compare_paired``; the same-job A/B of ``stallbench gate --against``)
    Repeat i of the baseline (REF's code) and repeat i of the current side (the working tree)
    ran back to back in one job (A B A B ...), so slow drift of the machine moves both values
    of a pair alike. The rule gates on the per-pair differences

        d_i = ln(current_i / baseline_i)   (ratio metrics)
        d_i = current_i - baseline_i        (share metrics, in share points)

    and decides with the same two conditions as above, on paired statistics:
      1. effect: the Hodges-Lehmann estimate HL = median{(d_i + d_j) / 2 : i <= j}, shown as
         the change exp(HL) (ratio metrics) or HL (points), must be beyond the threshold;
      2. significance: the two-sided exact Wilcoxon signed-rank test on the d_i gives p < alpha,
         used whenever ``min_p_signed_rank(n) = 2 / 2**n < alpha`` (n non-zero pairs; 8 pairs
         reach 0.0078, so alpha = 0.01 needs 8 pairs); with fewer pairs, the (1 - alpha)
         Student-t interval of the mean d must exclude 0 (``paired-t``).
    The verdicts and their names are the unpaired rule's: a report or a CI log reads "slower"
    the same way whichever test decided (the ``test`` column says which: ``wilcoxon`` or
    ``paired-t`` for pairs; ``mann-whitney`` or ``ci-overlap`` for independent sets).

Pre-check: a busy machine (``busy_note``, applied by ``under_load``)
    Before a *slower*/*faster* (or *too few repeats*) verdict stands, the repeats' foreign
    load is checked (``RepeatFigures.load``: CPU other processes and the hypervisor took during
    each run, ``measure.load``). When any compared repeat on either side ran with more than
    ``HEAVY_CORES`` (0.25) cores taken, the verdict becomes *busy machine*: the change may be
    the load, so it is said, never failed on; re-run on a quiet machine. Repeats without a
    load reading (older results) are not judged. The paired rule (``gate --against``) has no
    such pre-check: its A B A B pairs ran under the same load, which is what pairing is for.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ..analysis.stats import (hodges_lehmann, mann_whitney_p, min_p_possible, min_p_signed_rank,
                              signed_rank_p, t_interval)
from ..measure.load import HEAVY_CORES
from ..results import ForeignLoad, MachineInfo

FASTER, SLOWER, SAME, INCONCLUSIVE, NOT_COMPARABLE = (
    "faster", "slower", "same", "inconclusive", "not comparable")
VERDICTS = (SLOWER, FASTER, INCONCLUSIVE, SAME, NOT_COMPARABLE)
BUSY = "busy machine"        # the pre-check's verdict: slower/faster under heavy foreign load
# Beyond the threshold, and too few repeats for the exact test to ever decide (see above);
# counted after VERDICTS like BUSY, so a summary line without one reads as before.
TOO_FEW = "too few repeats"
WORSE, BETTER = "worse", "better"   # Comparison.direction of a change beyond the threshold
MIN_REPEATS = 2
DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.01


@dataclass(frozen=True)
class Metric:
    """How to read one compared figure off a variant and which direction is worse."""

    name: str
    attr: str                  # VariantResult attribute holding a Summary
    higher_is_better: bool
    kind: str                  # "ratio" (current / baseline) or "points" (current - baseline)


METRICS: dict[str, Metric] = {
    "throughput": Metric("throughput", "throughput_samples_s", True, "ratio"),
    "stall_share": Metric("stall_share", "stall_share", False, "points"),
    "peak_pss_mb": Metric("peak_pss_mb", "peak_pss_mb", False, "ratio"),
    # The differential attribution's parts, each as a share of its run's epoch (share points):
    # "preprocess stall +8 pt" reads as the preprocess stage costing 8% more of the epoch.
    # Read per repeat by ``metric_values`` (no Summary attribute holds them).
    "fetch_stall_share": Metric("fetch_stall_share", "", False, "points"),
    "preprocess_stall_share": Metric("preprocess_stall_share", "", False, "points"),
    "transfer_stall_share": Metric("transfer_stall_share", "", False, "points"),
    "loader_overhead_share": Metric("loader_overhead_share", "", False, "points"),
}
# ``--metric attribution`` names all four parts at once.
ATTRIBUTION_METRICS = ("fetch_stall_share", "preprocess_stall_share", "transfer_stall_share",
                       "loader_overhead_share")


@dataclass(frozen=True)
class Comparison:
    """Two sets of repeats of one figure, compared by the module's rule."""

    baseline: float            # median of the baseline values
    current: float             # median of the current values
    change: float              # ratio current/baseline ("ratio") or current - baseline ("points")
    change_kind: str
    p_value: float | None
    test: str                  # "mann-whitney", "ci-overlap" or "" (not compared)
    verdict: str
    n_baseline: int
    n_current: int
    note: str = ""
    direction: str = ""        # WORSE / BETTER beyond the threshold, "" within it or uncompared


def machine_key(m: MachineInfo) -> tuple[str, int | None]:
    """What makes two results' absolute figures comparable: the same CPU model and core count.
    Where it differs the gate compares within-run ratios and the report warns."""
    return (m.cpu_model, m.cores_logical)


def significance(a: Sequence[float], b: Sequence[float], alpha: float) -> tuple[bool, float, str]:
    """(significant, Mann-Whitney p, test that decided) -- asv's rule.

    The rank test decides when it can reach ``alpha`` with these sample sizes; otherwise the
    (1 - alpha) t-intervals of the two means must not overlap.
    """
    p = mann_whitney_p(list(a), list(b))
    if min_p_possible(len(a), len(b)) < alpha:
        return p < alpha, p, "mann-whitney"
    la, ha = t_interval(a, 1 - alpha)
    lb, hb = t_interval(b, 1 - alpha)
    return (ha < lb or hb < la), p, "ci-overlap"


def direction(change: float, m: Metric, threshold: float) -> str:
    """WORSE or BETTER when the effect is beyond the threshold, else "" (within it)."""
    if m.kind == "points":
        up, down = change > threshold, change < -threshold
    else:
        up, down = change > 1 + threshold, change < 1 - threshold
    worse, better = (down, up) if m.higher_is_better else (up, down)
    return WORSE if worse else BETTER if better else ""


def decide(change: float, m: Metric, threshold: float, significant: bool,
           too_few: bool = False) -> str:
    """Verdict from the effect (vs threshold), significance and ``too_few``: the exact test
    cannot reach alpha at these sizes while every repeat agrees; see the module docstring."""
    way = direction(change, m, threshold)
    if not way:
        return SAME
    if not significant:
        return TOO_FEW if too_few else INCONCLUSIVE
    return SLOWER if way == WORSE else FASTER


def repeats_needed(alpha: float, paired: bool = False) -> int:
    """The fewest repeats a side (pairs, when ``paired``) with which the exact test can reach
    ``alpha``: 5 for the rank test at 0.01 (4 at 0.05), 8 pairs at 0.01 (6 at 0.05)."""
    n = 1
    while (min_p_signed_rank(n) if paired else min_p_possible(n, n)) >= alpha:
        n += 1
    return n


def _too_few_note(n: str, alpha: float, paired: bool) -> str:
    test, interval = (("signed-rank", "paired t-intervals") if paired else
                      ("rank", "the t-intervals"))
    side = "pairs" if paired else "repeats a side"
    agree = "every pair moved the same way" if paired else "the two sides' ranges are apart"
    return (f"{n} can never reach p < {alpha:g} in the {test} test and {interval} do not "
            f"decide, while {agree}; re-run with >= {repeats_needed(alpha, paired)} {side}")


def _verdict(change: float, m: Metric, threshold: float, significant: bool, too_few: bool,
             note: str) -> tuple[str, str, str]:
    """(verdict, note, direction) of one comparison: the note says why on *too few repeats*."""
    verdict = decide(change, m, threshold, significant, too_few)
    return verdict, (note if verdict == TOO_FEW else ""), direction(change, m, threshold)


def compare(base: Sequence[float], cur: Sequence[float], m: Metric, *,
            threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Compare finite values of one figure (non-finite values must be dropped by the caller)."""
    nan = float("nan")
    nb, nc = len(base), len(cur)
    if nb < MIN_REPEATS or nc < MIN_REPEATS:
        return Comparison(nan, nan, nan, m.kind, None, "", NOT_COMPARABLE, nb, nc,
                          f"needs >= {MIN_REPEATS} repeats a side (has {nb} and {nc})")
    mb, mc = statistics.median(base), statistics.median(cur)
    if m.kind == "ratio" and mb <= 0:
        return Comparison(mb, mc, nan, m.kind, None, "", NOT_COMPARABLE, nb, nc,
                          "baseline median is 0")
    change = mc / mb if m.kind == "ratio" else mc - mb
    significant, p, test = significance(base, cur, alpha)
    apart = max(cur) < min(base) or max(base) < min(cur)
    verdict, note, way = _verdict(change, m, threshold, significant,
                                  min_p_possible(nb, nc) >= alpha and apart,
                                  _too_few_note(f"{nb} vs {nc} repeats", alpha, paired=False))
    return Comparison(mb, mc, change, m.kind, p, test, verdict, nb, nc, note, way)


def paired_differences(base: Sequence[float], cur: Sequence[float], m: Metric) -> list[float]:
    """Per-pair differences d_i on the metric's scale (see the module docstring); a pair with a
    non-finite value (or a non-positive one, for a ratio) is dropped as a whole."""
    out = []
    for b, c in zip(base, cur):
        if not (_finite(b) and _finite(c)):
            continue
        if m.kind == "ratio":
            if b > 0 and c > 0:
                out.append(math.log(c / b))
        else:
            out.append(c - b)
    return out


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def paired_significance(d: Sequence[float], alpha: float) -> tuple[bool, float, str]:
    """(significant, signed-rank p, test that decided) for paired differences: the exact
    signed-rank test when ``n`` non-zero pairs can reach ``alpha``, else a paired t interval."""
    p = signed_rank_p(d)
    nonzero = sum(1 for x in d if x != 0)
    if min_p_signed_rank(nonzero) < alpha:
        return p < alpha, p, "wilcoxon"
    lo, hi = t_interval(d, 1 - alpha)
    return (lo > 0 or hi < 0), p, "paired-t"


def change_of(d: Sequence[float], m: Metric) -> float:
    """The paired effect on the metric's display scale: exp(HL) for ratios, HL for points."""
    hl = hodges_lehmann(d)
    return math.exp(hl) if m.kind == "ratio" else hl


def compare_paired(base: Sequence[float], cur: Sequence[float], m: Metric, *,
                   threshold: float = DEFAULT_THRESHOLD,
                   alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Compare values measured in pairs (``base[i]`` beside ``cur[i]``) by the paired rule."""
    nan = float("nan")
    d = paired_differences(base, cur, m)
    n = len(d)
    if n < MIN_REPEATS:
        return Comparison(nan, nan, nan, m.kind, None, "", NOT_COMPARABLE, n, n,
                          f"needs >= {MIN_REPEATS} complete pairs (has {n})")
    kept = [(b, c) for b, c in zip(base, cur) if _finite(b) and _finite(c)
            and (m.kind != "ratio" or (b > 0 and c > 0))]
    mb = statistics.median(b for b, _ in kept)
    mc = statistics.median(c for _, c in kept)
    change = change_of(d, m)
    significant, p, test = paired_significance(d, alpha)
    nonzero = sum(1 for x in d if x != 0)
    same_way = all(x > 0 for x in d) or all(x < 0 for x in d)
    verdict, note, way = _verdict(change, m, threshold, significant,
                                  min_p_signed_rank(nonzero) >= alpha and same_way,
                                  _too_few_note(f"{nonzero} pairs that differ", alpha,
                                                paired=True))
    return Comparison(mb, mc, change, m.kind, p, test, verdict, n, n, note, way)


# ------------------------------------------------------------ pre-check: a busy machine

def busy_note(base: Sequence[ForeignLoad | None], cur: Sequence[ForeignLoad | None]) -> str | None:
    """Why the repeats cannot carry a slower/faster verdict (some ran with more than
    ``HEAVY_CORES`` cores taken by other processes and steal), or None when they can."""
    def heavy(loads: Sequence[ForeignLoad | None]) -> list[float]:
        return [ld.taken_cores for ld in loads if ld is not None and ld.taken_cores > HEAVY_CORES]

    hb, hc = heavy(base), heavy(cur)
    if not hb and not hc:
        return None
    worst = max(hb + hc)
    return (f"busy machine: {len(hb)} baseline and {len(hc)} current repeat(s) ran with more "
            f"than {HEAVY_CORES:g} cores taken by other processes (worst {worst:.2f}); "
            "re-run on a quiet machine")


def under_load(c: Comparison, base: Sequence[ForeignLoad | None],
               cur: Sequence[ForeignLoad | None]) -> Comparison:
    """``c`` with a slower/faster verdict replaced by *busy machine* when ``busy_note`` says
    the repeats ran under heavy foreign load (a *too few repeats* row too: it fails like a
    slower one); any other verdict stands."""
    if c.verdict not in (SLOWER, FASTER, TOO_FEW):
        return c
    note = busy_note(base, cur)
    return c if note is None else dataclasses.replace(c, verdict=BUSY, note=note)
