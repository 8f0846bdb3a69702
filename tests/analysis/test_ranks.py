"""The straggler rule, the per-step gain and the exactly-once accounting, on constructed data
(pure functions: no processes, deterministic)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from stallbench.analysis import ranks
from stallbench.trainers.base import Delivery


def test_excess_is_over_the_median_of_the_other_ranks() -> None:
    assert ranks.excess([1.0, 1.5, 1.0, 1.2], 1) == pytest.approx(0.5)
    # with two ranks the other's stall itself, not the average of both
    assert ranks.excess([1.0, 1.4], 1) == pytest.approx(0.4)


def test_gain_counts_only_steps_where_the_candidate_was_slowest() -> None:
    # step 0: rank 1 slowest by 0.3 over the next (0.1 -> 0.4); step 1: rank 0 slowest, so
    # rank 1 keeping pace changes nothing; step 2: only rank 1 stepped (counts 0)
    steps = [[0.1, 0.5], [0.4, 0.2, 0.3], [0.05, 0.0]]
    assert ranks.gain_if_median_pace(steps, 1) == pytest.approx(0.4 - 0.1)


def _runs(world: int, n_steps: int, seed: int, extra: dict[int, float] | None = None,
          item_every: int = 4, noise: float = 0.002):
    """Per-step exposed stalls of a synchronous job: every ``item_every`` steps each rank
    fetches (10 ms +- noise); ``extra`` adds a known latency to one rank's fetches."""
    rng = random.Random(seed)
    steps = []
    for r in range(world):
        s = []
        for k in range(n_steps):
            e = 0.0002 + rng.random() * 0.0001
            if k % item_every == 0:
                e += 0.010 + rng.gauss(0, noise) + (extra or {}).get(r, 0.0)
            s.append(max(e, 0.0))
        steps.append(s)
    return steps


@pytest.mark.parametrize("world", [2, 4])
def test_an_injected_straggler_is_named_and_its_excess_recovered(world: int) -> None:
    delay = 0.020
    runs = [_runs(world, 48, seed, {world - 1: delay}) for seed in range(3)]
    stalls = [[sum(s) for s in run] for run in runs]
    c, ex, noise, named = ranks.straggler(stalls, runs)
    truth = 12 * delay                               # 48 steps, a fetch every 4th
    assert (c, named) == (world - 1, world - 1)
    assert ex == pytest.approx(truth, rel=0.10)
    assert noise < truth
    gain = ranks.gain_if_median_pace(runs[0], c)
    assert gain == pytest.approx(truth, rel=0.15)


@pytest.mark.parametrize("world", [2, 4])
def test_exchangeable_ranks_name_no_straggler(world: int) -> None:
    named = []
    for seed in range(40):
        runs = [_runs(world, 48, 1000 * seed)]
        stalls = [[sum(s) for s in run] for run in runs]
        c, ex, noise, who = ranks.straggler(stalls, runs)
        assert math.isfinite(noise) and noise > 0
        named.append(who)
    # the largest of N noisy stalls beats the others by about the noise: the permutation
    # null accounts for that choice, so one run names a straggler ~1% of the time
    assert sum(w is not None for w in named) <= 2, named


def test_a_small_real_straggler_is_still_found() -> None:
    # 3 ms more per fetch against 2 ms of fetch noise: 36 ms over the run
    runs = [_runs(4, 48, 5, {2: 0.003})]
    c, ex, noise, who = ranks.straggler([[sum(s) for s in runs[0]]], runs)
    assert who == 2 and ex == pytest.approx(0.036, rel=0.35)


def test_the_null_needs_steps_every_rank_took() -> None:
    assert ranks.null_excess([[0.1], [0.2]]) == 0.0
    assert ranks.null_excess([[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]]) == pytest.approx(0.0)


def _plan(items: list[int], batch_size: int = 100, cap: float = math.inf) -> SimpleNamespace:
    return SimpleNamespace(items=[SimpleNamespace(rows=r) for r in items], max_batches=cap,
                           config=SimpleNamespace(loader=SimpleNamespace(batch_size=batch_size)))


def _run(*deliveries: Delivery) -> SimpleNamespace:
    return SimpleNamespace(deliveries=list(deliveries))


def test_exactly_once_counts_drops_and_duplicates() -> None:
    plan = _plan([300, 300, 150])                      # 3 + 3 + 2 batches
    ok = [_run(Delivery(0, 0, ["0:0", "0:1", "0:2"], 300, 3, 300),
               Delivery(2, 2, ["2:0", "2:1"], 150, 2, 150)),
          _run(Delivery(1, 1, ["1:0", "1:1", "1:2"], 300, 3, 300))]
    e = ranks.exactly_once(ok, plan)
    assert (e.expected_batches, e.delivered_batches, e.duplicate_batches, e.dropped_batches) == \
        (8, 8, 0, 0)
    assert (e.delivered_rows, e.dropped_rows) == (750, 0)
    # an equal split cut item 2 in two parts for two ranks and dropped its last batch
    split = [_run(Delivery(0, 0, ["0:0", "0:1", "0:2"], 300, 3, 300),
                  Delivery(2, 2, ["2:0"], 100, 2, 150)),
             _run(Delivery(1, 1, ["1:0", "1:1", "1:2"], 300, 3, 300))]
    e = ranks.exactly_once(split, plan)
    assert (e.delivered_batches, e.dropped_batches, e.dropped_rows) == (7, 1, 50)
    dup = [*ok, _run(Delivery(1, 1, ["1:2"], 100, 3))]
    assert ranks.exactly_once(dup, plan).duplicate_batches == 1
    assert ranks.exactly_once(ok, _plan([300, 300, 150], cap=4)) is None
