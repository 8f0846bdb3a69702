"""The item-by-item replay of a run, against schedules worked out by hand."""

from __future__ import annotations

import pytest

from stallbench.analysis.schedule import simulate


def test_rounds_of_items_leave_workers_idle() -> None:
    # 12 items of 100 samples, 1 ms per sample to make, 0.1 ms to consume, 4 workers:
    # three rounds of 100 ms after a 50 ms start; each round's 4 items are consumed one after
    # the other (10 ms each), so the run ends 40 ms after the last round
    s = simulate(workers=4, samples=1200, item_rows=100, p=1e-3, t=1e-4, start_s=0.05)
    assert s.first_batch_s == pytest.approx(0.15)
    assert s.epoch_s == pytest.approx(0.05 + 0.3 + 0.04)
    # 5 workers: still three rounds, but the last holds 2 items for 5 workers (3 idle)
    assert simulate(workers=5, samples=1200, item_rows=100, p=1e-3, t=1e-4).epoch_s == \
        pytest.approx(0.3 + 0.02)
    # steady, as a run measures it: rows after the first batch over the time after it
    assert s.steady_samples_s(10, 1e-4) == pytest.approx((1200 - 10) / (0.39 - (0.15 + 1e-3)))


def test_a_slow_trainer_binds() -> None:
    s = simulate(workers=4, samples=1200, item_rows=100, p=1e-3, t=1e-3)
    assert s.epoch_s == pytest.approx(0.1 + 1.2)       # first item, then 1.2 s of consuming
    assert s.throughput_samples_s == pytest.approx(1200 / 1.3)


def test_no_workers_is_serial_and_a_partial_last_item_is_made_whole() -> None:
    s = simulate(workers=0, samples=250, item_rows=100, p=1e-3, t=1e-4)
    assert s.first_batch_s == pytest.approx(0.1)
    assert s.epoch_s == pytest.approx(3 * 0.1 + 250 * 1e-4)


def test_no_items_no_replay() -> None:
    assert simulate(workers=2, samples=100, item_rows=0, p=1e-3, t=1e-4) is None
