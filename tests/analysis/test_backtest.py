"""The leave-one-out back-test and its interval, on exact data and on known residuals."""

from __future__ import annotations

import math

import pytest

from stallbench.analysis import backtest, whatif

from scaling_data import machine, point, result


def test_half_width_is_the_wider_of_the_conformal_rank_and_the_t_bound() -> None:
    from scipy.special import stdtrit

    # a heavy tail: the rank (k = ceil(10 * 0.9) = 9: the largest) is wider than t x rms
    tail = [0.0] * 8 + [0.5]
    assert backtest.half_width(tail, 0.9) == (pytest.approx(0.5), 0.9)
    # three points: the rank alone is the largest (75%); the t bound t(3) x rms is wider
    w, level = backtest.half_width([0.3, 0.1, 0.2], 0.9)
    rms = math.sqrt((0.09 + 0.01 + 0.04) / 3)
    assert w == pytest.approx(float(stdtrit(3, 0.95)) * rms) and w > 0.3 and level == 0.9
    assert backtest.half_width([], 0.9) is None


def test_the_interval_covers_a_new_point_at_its_level_with_few_points() -> None:
    """Ground truth by construction: log errors drawn N(0, s); an interval built from the
    n = 2..5 others must hold a new draw >= 88% of the time (nominal 90%); the conformal rank
    alone (what the back-test used before issue 39) holds it only n/(n+1) of the time."""
    import random

    rng = random.Random(39)
    for n in (2, 3, 5):
        inside = rank_inside = 0
        trials = 3000
        for _ in range(trials):
            errs = [rng.gauss(0.0, 0.07) for _ in range(n)]
            new = abs(rng.gauss(0.0, 0.07))
            inside += new <= backtest.half_width([abs(e) for e in errs], 0.9)[0]
            rank_inside += new <= max(abs(e) for e in errs)
        assert inside / trials >= 0.88, (n, inside / trials)
        assert rank_inside / trials < 0.86, (n, rank_inside / trials)


def test_coverage_rebuilds_each_interval_without_its_point() -> None:
    # the largest error is outside the interval made of the others; the rest are inside
    assert backtest.coverage([0.1, -0.2, 0.05, 0.5]) == [True, True, True, False]
    assert backtest.coverage([0.1]) == [None]


def test_exact_curve_back_tests_to_zero_error_with_each_point_left_out() -> None:
    r = result([0, 1, 2, 4, 8])
    bt = backtest.backtest(r.variants, r.machine, None)
    # the no-worker point is predicted too (from the contention fit of the others)
    assert [p.n for p in bt.points] == [0, 1, 2, 4, 8]
    for p in bt.points[1:]:
        assert p.variant not in p.fitted_on and p.model == "contention"
        assert abs(p.error) < 1e-6 and abs(p.steady_error) < 1e-6, p
    assert bt.max_abs_error is not None and bt.mean_abs_error <= bt.max_abs_error
    assert bt.checked == 5 and bt.coverage is not None
    assert 0 < bt.interval_level <= 0.9


def test_a_point_whose_removal_leaves_no_producers_is_not_back_tested() -> None:
    r = result([0, 1])
    bt = backtest.backtest(r.variants, r.machine, None)
    assert [p.n for p in bt.points] == [0] and bt.points[0].model == "one-point"
    assert bt.checked == 0 and bt.coverage is None


def test_validate_stores_the_back_test_and_an_interval_band() -> None:
    r = result([1, 2, 4, 8], wobble=(0.0, 0.0))
    w = whatif.validate(r)
    assert w.model.kind == "contention" and w.backtest is not None
    assert all(m.is_fit and m.model == "contention" for m in w.measured)
    band = [p for p in w.points if p.low_samples_s is not None]
    assert band and all(p.low_samples_s <= p.predicted_samples_s <= p.high_samples_s for p in band)
    assert "back-tested" in w.note


def test_one_point_misses_what_contention_catches() -> None:
    """Ground truth by construction: 2% contention per busy core. Fitted on 1 and 4 workers,
    the contention model predicts 12 within 1e-6; the one-point model (1 worker) misses by
    the 22% it has no term for."""
    pts = [point(1), point(4)]
    far = point(12)
    from stallbench.analysis import whatif_models
    for model, want in (("contention", 0.0), ("one-point", 0.22)):
        m = whatif_models.fit_best(pts, machine(), None, model=model)
        got = whatif.predict(m, 12).throughput_samples_s / far.repeats[0].steady_throughput_samples_s - 1
        assert got == pytest.approx(want, abs=1e-6), model
    assert math.isfinite(far.repeats[0].steady_throughput_samples_s)


def test_each_row_says_how_far_it_extrapolated_and_every_model_is_back_tested() -> None:
    """Issue 25: a prediction is vouched for by back-tests at the same or a larger
    extrapolation, by the model that makes it; so each row says how far outside its fit the
    held-out count lay, and the other models' leave-one-out rows are kept beside."""
    r = result([0, 1, 2, 4])
    bt = backtest.backtest(r.variants, r.machine, None)
    rows = {p.variant: p for p in bt.points}
    four, two, zero = rows["num_workers=4"], rows["num_workers=2"], rows["num_workers=0"]
    assert (four.model, four.extrapolation, four.direction) == ("contention", 2, "above")
    assert (two.model, two.extrapolation, two.direction) == ("contention", 0, "")
    assert (zero.extrapolation, zero.direction) == (1, "below")
    alt = {p.variant: p for p in bt.alternatives}
    assert all(p.model == "one-point" for p in bt.alternatives)
    # the one-point model is fitted on the fewest producers (1): 4 is 3 above it
    assert (alt["num_workers=4"].extrapolation, alt["num_workers=4"].direction) == (3, "above")
    # the summary is the richest model's, as before: alternatives do not enter it
    assert bt.checked == 4


def _row(model: str, error: float, far: int, direction: str):
    from stallbench.results import BackTestPoint
    return BackTestPoint(n=0, variant=f"{model}{far}{direction}", model=model, fitted_on=[],
                         measured_samples_s=1.0, predicted_run_samples_s=1.0, error=error,
                         steady_error=error, extrapolation=far, direction=direction)


def test_evidence_takes_the_rows_that_extrapolated_as_far_the_same_way() -> None:
    from stallbench.results import BackTest
    bt = BackTest(method="m", points=[_row("one-point", -0.36, 1, "below"),
                                      _row("one-point", 0.04, 1, "above"),
                                      _row("one-point", 0.08, 3, "above")])
    up1 = backtest.evidence(bt, "one-point", 1, "above")
    assert [p.extrapolation for p in up1.rows] == [1, 3] and up1.worst == pytest.approx(0.08)
    assert up1.log_half_width == pytest.approx(
        backtest.half_width([math.log(1.04), math.log(1.08)])[0])
    assert "1 producer above its fit or further: 2 point(s)" in up1.scope
    up2 = backtest.evidence(bt, "one-point", 2, "above")
    assert [p.extrapolation for p in up2.rows] == [3]
    # nothing reaches 5 above: the back-test cannot vouch (no row stands in for it)
    far = backtest.evidence(bt, "one-point", 5, "above")
    assert far.rows == [] and math.isnan(far.worst)
    assert "no count of this run was back-tested 5 producers above the fit" in far.scope
    # between the fit counts every row counts; a model never back-tested has no evidence
    assert len(backtest.evidence(bt, "one-point", 0, "").rows) == 3
    assert backtest.evidence(bt, "contention", 1, "above") is None


def test_a_model_its_back_test_misses_gives_no_figure_but_the_reason() -> None:
    """Issue 39 ("try num_workers=1: PREDICTED 3.17x" from a back-test 100-199% off): a
    curve whose 8-worker point runs at a third of the law's rate is missed by 200% when left
    out; no point of the curve is then given as a figure, each says why, and so does the knee."""
    import factories
    from scaling_data import point

    pts = [point(n) for n in (1, 2, 4)] + [point(8, wobble=(2.0, 2.0))]
    w = whatif.validate(factories.result(pts, machine=machine(16), scenario="curve"))
    assert max(abs(p.steady_error) for p in w.backtest.points) > backtest.MAX_ERROR
    for p in w.points:
        assert p.not_predicted and p.low_samples_s is None and p.high_samples_s is None, p
        assert "back-test missed a measured count by" in p.not_predicted \
            or "not back-tested this far" in p.not_predicted, p.not_predicted
    assert "above 25%" in w.points[3].not_predicted
    assert w.knee.not_predicted


def test_an_exact_curve_is_predicted_with_its_interval_within_the_back_test_reach() -> None:
    """The same curve on the law: every count the back-test reaches is predicted with an
    interval holding the law's rate; beyond the farthest back-tested extrapolation (8 left
    out of 1,2,4: 4 above), nothing is predicted."""
    from scaling_data import rate

    w = whatif.validate(result([1, 2, 4, 8], wobble=(0.0, 0.0)))
    by_n = {p.n: p for p in w.points}
    for n in range(0, 13):
        p, (law, _) = by_n[n], rate(n, p1=20e-6, sigma=0.02, t=1e-6, cores=16)
        assert not p.not_predicted, (n, p.not_predicted)
        assert p.low_samples_s * (1 - 1e-6) <= law <= p.high_samples_s * (1 + 1e-6), n
    assert "not back-tested this far above" in by_n[13].not_predicted
