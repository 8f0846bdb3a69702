"""The knee advice of ``profile``: one decider (issue 39), stored as ``whatif.advice``.

Before, ``profile/ablate.knee_lines`` decided what to advise while printing it (printed now by
``report/profile_lines.knee_lines``, from the stored advice), so the result
never held the advice and nothing else could read it. The rules are unchanged: a knee that a
variant measured is advised from that measurement (or "keep" a faster measured variant); a
PREDICTED knee is advised only where its point carries a figure, i.e. where the back-test
vouched for it (``backtest.vouch`` sets ``not_predicted`` otherwise), and only when it beats
the best measured steady rate; with nothing measured steady there is nothing to compare.
"""

from __future__ import annotations

import math

from ..results import KneeAdvice, WhatIfValidation
from .whatif_models import producer_budget


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def measured_rate(c) -> tuple[float, str]:
    """A measured point's steady rate and its label, else its whole-run rate said as such:
    a run with no steady window has NaN there (``nan or whole`` kept the NaN)."""
    if _finite(c.measured_steady_samples_s):
        return c.measured_steady_samples_s, "steady samples/s"
    return c.measured_samples_s, "samples/s over the whole run (no steady window)"


def cores_cap(wi: WhatIfValidation) -> int | None:
    """The most workers advice may name: what the cores carry by the one cores rule
    (``whatif_models.producer_budget``, the producers' CPU share of their wall at the fit)."""
    m = getattr(wi, "model", None)
    cores = getattr(m, "cores", None)
    if not cores:
        return None         # a what-if that stored no cores: nothing to bound by
    wall = m.p_wall + m.p_extra
    share = m.p_cpu / wall if wall > 0 and math.isfinite(m.p_cpu) else None
    return max(1, int(producer_budget(cores, share)))


def decide(wi: WhatIfValidation) -> KneeAdvice:
    """The advice for the what-if ``wi`` (module doc)."""
    kn = wi.knee
    n = kn.n if kn.n is not None else kn.saturates_at
    if n is None:
        return KneeAdvice(action="none", reason=kn.explanation)
    measured = {c.n: c for c in wi.measured}
    cap = cores_cap(wi)
    if n not in measured and cap is not None and n > cap:
        # issue 58: "measure num_workers=10" on 2 cores is not advice; a knee the what-if
        # withheld stays "not predicted" (issue 57: one story), never the model's claim
        withheld = next((p.not_predicted for p in wi.points
                         if p.n == n and getattr(p, "not_predicted", "")), "")
        claim = (f"{n} workers, not predicted ({withheld})" if withheld
                 else kn.explanation)
        return KneeAdvice(action="none", n=n, reason=(
            f"{claim}; {n} workers are beyond the {cap} the machine's "
            f"{wi.model.cores:g} cores carry: not advised"))
    point = next((p for p in wi.points if p.n == n), None)
    steady = [c for c in wi.measured if _finite(c.measured_steady_samples_s)]
    best = max(steady or wi.measured, key=lambda c: measured_rate(c)[0])
    top, top_what = measured_rate(best)
    out = KneeAdvice(action="measure", n=n, reason=kn.explanation, best_variant=best.variant,
                     best_n=best.n, best_rate=top, rate_basis=top_what)
    if n in measured:
        pick = measured[n]
        rate, what = measured_rate(pick)
        out.knee_variant, out.knee_rate = pick.variant, rate
        if best is not pick and what == top_what and top > rate:
            out.action = "keep"
        else:
            out.action, out.best_variant, out.best_n = "set", pick.variant, pick.n
            out.best_rate, out.rate_basis = rate, what
        return out
    if point is None:
        return out
    if getattr(point, "not_predicted", ""):
        out.reason = point.not_predicted
        return out
    if not steady:
        out.reason = "no variant had a steady rate to compare the knee's with"
        return out
    gain = point.predicted_samples_s / top
    out.predicted_gain = gain
    if point.low_samples_s is not None:
        out.predicted_gain_low = point.low_samples_s / top
        out.predicted_gain_high = point.high_samples_s / top
    out.action = "keep" if gain <= 1.0 else "try"
    return out


def measured_knee_explanation(explanation: str, steady_wait_share: float | None) -> str:
    """The knee's explanation beside a MEASURED knee: the model's "N worker(s) remove the data
    stall" is a prediction, and where that variant still measured a steady wait of at least
    ``COMPUTE_BOUND_SHARE`` the line says so instead of contradicting the table."""
    from .stats import COMPUTE_BOUND_SHARE

    if (" remove the data stall" in explanation and _finite(steady_wait_share)
            and steady_wait_share >= COMPUTE_BOUND_SHARE):   # type: ignore[operator]
        why = explanation.partition(": ")[2]
        return (f"PREDICTED to remove the data stall, but it measured a steady wait of "
                f"{steady_wait_share:.0%} there ({why})")
    return explanation
