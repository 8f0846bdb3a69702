"""The leave-one-out back-test and its interval, on exact data and on known residuals."""

from __future__ import annotations

import math

import pytest

from stallbench.analysis import backtest, whatif

from scaling_data import machine, point, result


def test_half_width_is_the_conformal_rank_and_says_its_level() -> None:
    errs = [0.01 * i for i in range(1, 10)]                 # n = 9: k = ceil(10 * 0.9) = 9
    assert backtest.half_width(errs, 0.9) == (pytest.approx(0.09), 0.9)
    assert backtest.half_width(errs, 0.5) == (pytest.approx(0.05), 0.5)   # k = 5
    w, level = backtest.half_width([0.3, 0.1, 0.2], 0.9)    # k = 4 > 3: the largest, 75%
    assert w == pytest.approx(0.3) and level == pytest.approx(0.75)
    assert backtest.half_width([], 0.9) is None


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
