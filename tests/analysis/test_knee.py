"""The knee advice decided once in ``analysis.knee`` (issue 39), ground truth by construction."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

from stallbench.analysis import knee
from stallbench.results import KneeAdvice, codec


def _wi(knee_n: int | None, point: NS | None, steady=(1000.0, 1200.0)) -> NS:
    measured = [NS(n=0, variant="num_workers=0", measured_samples_s=900.0,
                   measured_steady_samples_s=steady[0]),
                NS(n=2, variant="num_workers=2", measured_samples_s=1100.0,
                   measured_steady_samples_s=steady[1])]
    return NS(measured=measured, knee=NS(n=knee_n, saturates_at=None, explanation="why"),
              points=[point] if point else [])


def _point(n: int, rate: float, not_predicted: str = "") -> NS:
    return NS(n=n, predicted_samples_s=rate, low_samples_s=rate * 0.9,
              high_samples_s=rate * 1.1, not_predicted=not_predicted)


def test_a_vouched_prediction_faster_than_the_best_measured_is_tried() -> None:
    adv = knee.decide(_wi(4, _point(4, 1800.0)))
    assert (adv.action, adv.n, adv.best_variant) == ("try", 4, "num_workers=2")
    assert math.isclose(adv.predicted_gain, 1.5)
    assert math.isclose(adv.predicted_gain_low, 1.35) and math.isclose(adv.predicted_gain_high, 1.65)


def test_an_unvouched_or_slower_prediction_is_not_advised() -> None:
    missed = knee.decide(_wi(4, _point(4, 1800.0, "back-test missed by 150%")))
    assert missed.action == "measure" and math.isnan(missed.predicted_gain)
    assert missed.reason == "back-test missed by 150%"
    assert knee.decide(_wi(4, _point(4, 1100.0))).action == "keep"
    nothing_steady = knee.decide(_wi(4, _point(4, 1800.0), steady=(math.nan, math.nan)))
    assert nothing_steady.action == "measure" and math.isnan(nothing_steady.predicted_gain)


def test_a_measured_knee_is_set_or_a_faster_measured_variant_kept() -> None:
    assert knee.decide(_wi(2, None)).action == "set"
    kept = knee.decide(_wi(0, None))
    assert (kept.action, kept.best_variant, kept.knee_variant) == ("keep", "num_workers=2",
                                                                   "num_workers=0")
    assert knee.decide(_wi(None, None)).action == "none"


def test_the_advice_survives_the_result_file() -> None:
    adv = knee.decide(_wi(4, _point(4, 1800.0)))
    back = codec.from_json(KneeAdvice, codec.to_json(adv), "r.json:")
    assert isinstance(back, KneeAdvice) and codec.to_json(back) == codec.to_json(adv)
    assert back.action == "try" and math.isnan(back.knee_rate)


def test_a_measured_knee_that_still_waits_does_not_say_the_stall_is_gone() -> None:
    """Issue 39: the model's "2 worker(s) remove the data stall" beside a MEASURED knee whose
    variant still waited 12% of its steady state is a prediction the measurement contradicts:
    said as such; under 5% (compute-bound by the verdicts' rule) it stands."""
    from stallbench.analysis.knee import measured_knee_explanation

    text = "2 worker(s) remove the data stall: the trainer binds: 30.0 us/sample compute"
    got = measured_knee_explanation(text, 0.12)
    assert got.startswith("PREDICTED to remove the data stall") and "12%" in got, got
    assert "the trainer binds" in got
    assert measured_knee_explanation(text, 0.03) == text
    assert measured_knee_explanation(text, None) == text
    other = "no worker count removes the stall; from 2 worker(s) on, CPU-bound"
    assert measured_knee_explanation(other, 0.5) == other
