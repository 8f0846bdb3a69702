"""``stallbench tune -- CMD``'s trial stop rule and confirmation (issue 55): decided in
``analysis.trials`` from measured rates, so they are checked here without running a job."""

from __future__ import annotations

import math

import pytest

from stallbench.analysis import trials


def span(t0: float, t1: float, n: int = 10, rows: int = 320, ended: bool = True) -> tuple:
    return (t0, t1, n, rows, ended)


def test_a_rate_is_known_when_its_interval_is_within_five_percent() -> None:
    assert trials.known([100.0]) is None                       # one rate: no interval
    assert trials.known([100.0, 100.0, 100.0]) == 0.0
    within = trials.known([100.0, 101.0, 99.0, 100.0])
    assert within is not None and 0 < within <= trials.KNOWN_WITHIN
    assert trials.known([100.0, 150.0]) is None                 # +-25%: not yet
    assert trials.known([0.0, 0.0]) is None                     # no rate to be a share of


def test_epoch_rates_leave_out_the_first_epoch_and_the_ones_not_ended() -> None:
    spans = [span(0.0, 5.0), span(5.0, 6.0), span(6.0, 7.0, ended=False), span(7.0, 9.0),
             span(9.0, 9.0)]                                     # no time: no rate
    assert trials.epoch_rates(spans) == [320.0, 160.0]


def test_one_long_epochs_window_in_chunks_after_its_first_tenth() -> None:
    n = 100
    wait, step, rows = [1.0] * 10 + [0.01] * 90, [0.01] * n, [32] * n
    got = trials.window_rates(wait, step, rows, n)
    assert len(got) == trials.WINDOW_CHUNKS and got == pytest.approx([1600.0] * 4)
    assert trials.window_rates(wait[:40], step[:40], rows[:40], 40) == []   # chunks too short


def test_a_trial_ends_at_its_batch_count_or_the_deadline() -> None:
    assert trials.stop_by_count(50, 50, False) == "--trial-batches 50 reached"
    assert trials.stop_by_count(49, 50, False) == ""
    assert trials.stop_by_count(10, None, True) == "the tune's budget ran out"
    assert trials.stop_by_count(0, None, True) == ""            # not before its first batch


def test_a_trial_ends_once_its_steady_rate_is_known() -> None:
    spans = [span(0.0, 5.0)] + [span(5.0 + i, 6.0 + i) for i in range(3)]
    why = trials.stop_by_rate(spans, [], [], [], 40, 10.0, math.inf)
    assert why == "its steady rate was known within +-0.0% after 4 epochs"
    assert trials.stop_by_rate(spans[:2], [], [], [], 20, 10.0, math.inf) == ""


def test_one_long_epoch_ends_on_its_window_only_after_window_after_s() -> None:
    n = 100
    args = ([span(0.0, 0.0, n, 3200, False)], [0.01] * n, [0.01] * n, [32] * n, n)
    assert trials.stop_by_rate(*args, 10.0, 60.0) == ""
    assert trials.stop_by_rate(*args, 75.0, 60.0) == (
        "one epoch still running after 75 s: its steady window's rate was known within +-0.0%")


def test_a_confirmed_best_keeps_its_speedup_and_the_pairs_range() -> None:
    c = trials.confirm("nw=2", [100.0, 102.0], [157.0, 160.0], [1.57, 1.58, 1.56], [], True)
    assert c.why_not == "" and c.rounds == 2
    assert c.speedup == pytest.approx(158.5 / 101.0) and c.steady_samples_s == 158.5
    assert (c.low, c.high) == (1.56, 1.58)


def test_an_unconfirmed_best_gives_the_job_as_written_at_one() -> None:
    c = trials.confirm("nw=2", [100.0, 100.0], [101.0, 102.0], [1.01, 1.02], [], True)
    assert "under 3%" in c.why_not
    assert c.speedup == 1.0 and c.steady_samples_s == 100.0 and c.low is None
    assert c.rounds == 1                    # the rounds it measured are still counted
    lost = trials.confirm("nw=2", [100.0], [160.0], [1.6], ["confirmation 1: exit 1"], True)
    assert "exit 1" in lost.why_not and lost.speedup == 1.0


def test_the_job_as_written_as_best_needs_no_confirmation() -> None:
    c = trials.confirm("default", [100.0], [100.0], [], [], False)
    assert c == trials.Confirmation(steady_samples_s=100.0, speedup=1.0, low=None, high=None,
                                    rounds=0, why_not="")


def test_the_whole_job_counts_its_first_epoch() -> None:
    """Issue 58: 1.31x from epoch 2 onward was 0.98x over the whole 3-epoch job: a first
    epoch that pays the start-up weighs in the whole job."""
    from stallbench.analysis import trials as tr
    base = [(0.0, 10.0, 10, 100, True), (10.0, 20.0, 10, 100, True), (20.0, 30.0, 10, 100, True)]
    kept = [(0.0, 16.0, 10, 100, True), (16.0, 23.6, 10, 100, True)]       # stopped by tune
    x, how = tr.whole_job((base, False), (kept, True), 3)
    assert abs(x - 30.0 / (16.0 + 2 * 7.6)) < 1e-9
    assert how.startswith("ESTIMATED")
    x, how = tr.whole_job((base, False), (base, False), 3)
    assert x == 1.0 and how.startswith("measured")
    x, how = tr.whole_job((base, True), (kept, True), None)
    assert x is None and "epoch count is unknown" in how
