"""Start-up vs steady state on per-batch timelines built by construction (``measure.phases``)."""

from __future__ import annotations

import contextlib
import math

import pytest

from stallbench.measure.phases import (MIN_STEADY_BATCHES, batches_per_item, window, boundary, extrapolate,
                                       full_epoch_samples, split, summarize)

import factories


def timeline(items: list[int], produce: float, compute: float, startup: float = 0.0
             ) -> tuple[list[float], list[float], list[float], float]:
    """(t_start, wait, compute, epoch) of a trainer that produces its own batches (0 workers),
    built by hand: the first batch of each item waits ``produce`` seconds, every batch computes
    ``compute``; ``startup`` is a one-off delay before the first batch (opening files, first
    use of a code path)."""
    t, t_start, wait, comp = 0.0, [], [], []
    seen: set[int] = set()
    for i, it in enumerate(items):
        w = 0.0
        if it not in seen:
            seen.add(it)
            w = produce + (startup if i == 0 else 0.0)
        t_start.append(t)
        wait.append(w)
        comp.append(compute)
        t += w + compute
    return t_start, wait, comp, t


def test_boundary_is_the_first_batch_of_item_s() -> None:
    items = [i // 2 for i in range(20)]             # 10 items of 2 batches
    assert boundary(items, producers=0) == 2       # the trainer is the one producer
    assert boundary(items, producers=1) == 2
    assert boundary(items, producers=2) == 4       # each of 2 producers delivered its first
    assert boundary(items, producers=1, warmup_batches=5) == 5
    assert boundary(items, producers=3) == 6 and MIN_STEADY_BATCHES == 2
    # no item S, or fewer than MIN_STEADY_BATCHES after it: no steady window
    assert boundary(items, producers=10) is None
    assert boundary(items, producers=2, warmup_batches=19) is None
    assert boundary([0, 0, 1], producers=1) is None
    assert boundary([0, 0, 0, 0], producers=1) is None   # one item only: never steady


def test_a_window_shorter_than_two_whole_cycles_is_no_steady_state_and_says_why() -> None:
    """Issue 25: ``--max-batches 20`` with 8 batches per item. 0 workers: 12 batches after
    start-up, 1.5 items, fewer than 2 cycles of 8; 2 workers: 4 batches, half an item."""
    items = [i // 8 for i in range(20)]
    k, why = window(items, producers=0)
    assert k is None and why.startswith("too short for a steady state: 12 batches after")
    assert "2 whole cycles of 1 producer (16 batches)" in why
    k, why = window([0, 1] * 8 + [2, 3] * 2, producers=2)
    assert k is None and "(32 batches)" in why
    # the full run of 64 batches has 7 items' worth after start-up: steady
    assert window([i // 8 for i in range(64)], producers=0) == (8, "")
    assert batches_per_item([0, 0, 0, 1, 1, 1, 2]) == 3        # the cut last item left out


def test_a_steady_window_slower_than_the_whole_run_is_refused_not_clamped() -> None:
    """Start-up cannot make a run faster: a window whose batches come slower than the run's
    (a negative start-up cost) is not a steady state, and the split says so."""
    items = [i // 2 for i in range(20)]
    ts, wait, comp, epoch = timeline(items, produce=0.04, compute=0.01)
    # 1 s more at the end: the window's 9 items take 0.17 s each, item 0 took 0.06 s; start-up
    # would cost 0.06 - 0.17 = -0.11 s, more than half an item below 0
    p = split(ts, comp, wait, [100] * 20, items, epoch + 1.0, producers=0)
    assert not p.has_steady and p.steady_batches == 0
    assert p.no_steady_reason.startswith("refused a steady window slower per batch")
    assert "start-up would cost -" in p.no_steady_reason


def test_zero_workers_steady_is_exact_cycles_and_startup_cost_is_the_one_off() -> None:
    """0 workers: each item costs produce + 2 * compute; a one-off 0.5 s before the first
    batch is what start-up costs beyond the steady rate, the steady figures do not see it."""
    items = [i // 2 for i in range(20)]               # 10 items of 2 batches
    for one_off in (0.0, 0.5):
        ts, wait, comp, epoch = timeline(items, produce=0.04, compute=0.01, startup=one_off)
        p = split(ts, comp, wait, [100] * 20, items, epoch, producers=0)
        assert p.startup_batches == 2 and p.steady_batches == 18
        # the steady window is 9 whole cycles of 0.04 + 2 * 0.01
        assert p.steady_s == pytest.approx(9 * 0.06)
        assert p.steady_stall_share == pytest.approx(0.04 / 0.06)
        assert p.steady_epoch_s == pytest.approx(10 * 0.06)
        assert p.startup_cost_s == pytest.approx(one_off)
        assert p.startup_s + p.steady_s == pytest.approx(epoch)
        assert p.startup_stall_s + p.steady_stall_s == pytest.approx(epoch - sum(comp))


def test_tiny_run_has_no_steady_window() -> None:
    p = split([0.0, 0.1], [0.05, 0.05], [0.05, 0.0], [10, 10], [0, 0], 0.2, producers=1)
    assert not p.has_steady and p.steady_batches == 0 and p.startup_batches == 2
    assert math.isnan(p.steady_stall_share) and p.startup_s == 0.2


def test_extrapolated_full_epoch_adds_the_rest_at_the_steady_rate() -> None:
    items = [i // 2 for i in range(20)]
    ts, wait, comp, epoch = timeline(items, produce=0.04, compute=0.01, startup=0.3)
    p = split(ts, comp, wait, [100] * 20, items, epoch, producers=0)
    t, share = extrapolate(p, full_samples=20_000)          # 100x the run's 2,000 samples
    per_sample = 0.06 / 200
    assert t == pytest.approx(p.startup_s + (20_000 - 200) * per_sample)
    stall = p.startup_stall_s + (20_000 - 200) * 0.04 / 200
    assert share == pytest.approx(stall / t)


def test_summary_extrapolates_only_capped_runs() -> None:
    items = [i // 2 for i in range(20)]
    ts, wait, comp, epoch = timeline(items, produce=0.04, compute=0.01)
    reps = []
    for _ in range(2):
        f = factories.repeat(samples=2000)
        f.phases = split(ts, comp, wait, [100] * 20, items, epoch, producers=0)
        reps.append(f)
    capped = summarize(reps, 0, full_samples=20_000)
    assert capped.extrapolated_full_epoch_s is not None and capped.full_epoch_samples == 20_000
    assert capped.steady_stall_share.median == pytest.approx(0.04 / 0.06)
    whole = summarize(reps, 0, full_samples=2000)
    assert whole.extrapolated_full_epoch_s is None and whole.full_epoch_samples is None
    assert "work item 1" in whole.rule


def test_full_epoch_samples_follow_rows_kept() -> None:
    f = factories.repeat(samples=1000)
    f.stage_rows.fetch, f.stage_rows.transfer = 1000, 500      # a filter kept half
    assert full_epoch_samples(10_000, 2, [f]) == 10_000


def test_a_steady_rate_above_the_cpu_limit_is_refused_with_its_figures() -> None:
    """Issue 25: a quick look claimed 161k samples/s steady where 2 cores at 20 us of CPU per
    row allow ~100k. The measured CPU per sample bounds the rate; above it (10% tolerance)
    the window is refused, with the figures, and nothing is clamped."""
    from factories import repeat
    from stallbench.measure.phases import cpu_limit_reason, refuse
    from stallbench.results import StageSeconds

    items = [i // 2 for i in range(20)]
    ts, wait, comp, epoch = timeline(items, produce=0.04, compute=0.01)
    f = repeat(2000 / epoch, 0.5, 300.0)
    f.samples, f.batches, f.epoch_s = 2000, 20, epoch
    f.phases = split(ts, comp, wait, [100] * 20, items, epoch, producers=0)
    rate = f.phases.steady_samples / f.phases.steady_s            # 100 rows per 0.03 s
    f.stage_s = StageSeconds(preprocess=1.0, preprocess_cpu=2000 * 2 / rate)   # limit: rate
    assert cpu_limit_reason(f, cores=2) == ""                     # exactly at the limit
    f.stage_s = StageSeconds(preprocess=1.0, preprocess_cpu=2000 * 2 / rate * 1.5)
    why = cpu_limit_reason(f, cores=2)
    assert why.startswith(f"refused a steady rate of {rate:,.0f} samples/s") and "2 cores" in why
    p = refuse(f.phases, why, f.epoch_s, sum(comp), f.batches, f.samples)
    assert not p.has_steady and p.no_steady_reason == why and math.isnan(p.startup_cost_s)
    # the one rule both the runner and profile apply (issue 39: there were two copies that
    # differed): the run keeps its figures, its steady window and steady rate go
    from stallbench.measure.phases import refuse_beyond_cores
    assert refuse_beyond_cores(f, cores=2)
    assert not f.phases.has_steady and f.phases.no_steady_reason == why
    assert math.isnan(f.steady_throughput_samples_s)
    assert not refuse_beyond_cores(f, cores=2)          # nothing left to refuse


@pytest.mark.parametrize("excused", [False, True])
def test_an_excused_wait_is_not_a_stuck_producer(excused: bool) -> None:
    """``watchdog.excused``: a wait bounded elsewhere (the Ray Client pump actor's start) ticks
    the progress clock on its own, however long one call inside it blocks; the same wait
    without it ends as no progress."""
    import time as _time

    from stallbench.errors import NoProgress
    from stallbench.measure import watchdog

    def one_long_call() -> None:
        with watchdog.excused() if excused else contextlib.nullcontext():
            _time.sleep(2.5)             # one blocking call, 2.5 times the limit below

    with watchdog.Watchdog(1.0, lambda: "no progress for 1 s") as dog:
        if excused:
            with dog.waiting():
                one_long_call()
            assert dog.fired is None
        else:
            with pytest.raises(NoProgress, match="no progress for 1 s"), dog.waiting():
                one_long_call()


def _costs_split(cost: list[float]):
    """A 0-worker run whose batch i takes ``cost[i]`` (a tenth of it waiting), one item per
    batch, split."""
    t, ts = 0.0, []
    for c in cost:
        ts.append(t)
        t += c
    return split(ts, [0.9 * c for c in cost], [0.1 * c for c in cost], [8] * len(cost),
                 list(range(len(cost))), t, producers=0)


def test_variable_length_batches_keep_their_steady_window() -> None:
    """Issue 57: dynamic padding makes every batch its own length, so the first batch (the
    start-up with 0 workers) may be a short one: its being cheaper than the window's mean is
    its size, not the run being faster, and the run keeps its steady window. One batch as
    cheap against batches that do not spread is still refused."""
    import random
    rnd = random.Random(3)
    p = _costs_split([0.02] + [rnd.uniform(0.05, 0.4) for _ in range(199)])
    assert p.has_steady and p.steady_batches == 199, p.no_steady_reason
    q = _costs_split([0.02] + [0.22] * 199)
    assert not q.has_steady and q.no_steady_reason.startswith("refused a steady window")
