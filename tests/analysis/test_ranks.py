"""The straggler rule, the per-step gain and the exactly-once accounting, on constructed data
(pure functions: no processes, deterministic)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
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
    c, ex, noise, named = ranks.straggler(runs)
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
        c, ex, noise, who = ranks.straggler([_runs(world, 48, 1000 * seed)])
        assert math.isfinite(noise) and noise > 0
        named.append(who)
    # the largest of N noisy stalls beats the others by about the noise: the permutation
    # null accounts for that choice, so one run names a straggler ~1% of the time
    assert sum(w is not None for w in named) <= 2, named


def test_a_small_real_straggler_is_still_found() -> None:
    # 3 ms more per fetch against 2 ms of fetch noise: 36 ms over the run
    c, ex, noise, who = ranks.straggler([_runs(4, 48, 5, {2: 0.003})])
    assert who == 2 and ex == pytest.approx(0.036, rel=0.35)


def _bursty(world: int, rng: np.random.Generator, *, aligned: bool, slow: int | None = None,
            n_steps: int = 24, groups: int = 6, step_s: float = 0.004) -> list[list[float]]:
    """Per-step own times of one run with bursty stalls (issue 25's shape): a rank pays a
    row group's cost on one step in ``n_steps / groups`` (lognormal sizes, heavy tailed) and
    a few hundred microseconds otherwise, plus a 4 ms step with 5% jitter. ``aligned``: every
    rank bursts on the same steps (same row-group layout), else at random steps. ``slow``:
    that rank pays 0.11 s more per burst (+-5%: a CPU-heavy transform on it alone, 20 us x
    5.6k rows; ~0.16 s against the others' ~0.05 s)."""
    every = n_steps // groups
    out = []
    for r in range(world):
        at = (set(range(0, n_steps, every)) if aligned
              else set(rng.choice(n_steps, size=groups, replace=False).tolist()))
        s = []
        for k in range(n_steps):
            e = 0.0002 + 0.0002 * rng.random()
            if k in at:
                e += 0.048 * rng.lognormal(0.0, 0.5)
                if r == slow:
                    e += 0.112 * (1 + 0.05 * rng.standard_normal())
            s.append(e + step_s * (1 + 0.05 * rng.standard_normal()))
        out.append(s)
    return out


TRIALS = 400


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("world", [2, 4])
def test_false_alarms_among_exchangeable_bursty_ranks_stay_near_one_percent(
        world: int, aligned: bool) -> None:
    """The stated false-alarm rate (``STRAGGLER_ALPHA``, 1%) measured by simulation on the
    shape that defeated the step-by-step shuffle: bursty stalls, two or four exchangeable
    ranks. 400 runs: at 1% the count is 4 +- 2; 10 (2.5%) would mean the rule is not what
    the docstring says."""
    rng = np.random.default_rng(25 + world + 10 * aligned)
    named = sum(ranks.straggler([_bursty(world, rng, aligned=aligned)], n_perm=200)[3]
                is not None for _ in range(TRIALS))
    assert named <= 0.025 * TRIALS, f"{named} false alarms in {TRIALS} runs"


@pytest.mark.parametrize("aligned", [True, False])
def test_a_bursty_straggler_of_two_ranks_is_named_in_one_run(aligned: bool) -> None:
    """Issue 25's case in simulation: two ranks, six row groups each, the slow rank paying
    0.11 s more per row group: named in (nearly) every run where its bursts fall on the same
    steps as the other's (same layout, the real case), where the step-by-step sign flip
    could not go below p = 1/64. With bursts at unrelated steps six bursts carry too little
    evidence for 1% (by sign p >= 1/64, by position ~1%; stated in ``analysis.ranks``): the
    test must then not name the wrong rank."""
    rng = np.random.default_rng(7 + aligned)
    named = [ranks.straggler([_bursty(2, rng, aligned=aligned, slow=1)], n_perm=200)[3]
             for _ in range(100)]
    assert named.count(1) >= (80 if aligned else 0), named
    assert named.count(0) == 0, named


def test_the_null_needs_steps_every_rank_took() -> None:
    assert ranks.null_excess([[0.1], [0.2]]) == 0.0
    assert ranks.null_excess([[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]]) == pytest.approx(0.0)


def test_own_time_is_stall_plus_step_where_recorded() -> None:
    assert ranks.own_steps([0.1, 0.2], [0.01, 0.02]) == pytest.approx([0.11, 0.22])
    assert ranks.own_steps([0.1, 0.2], []) == [0.1, 0.2]
    assert ranks.others_wait([0.8, 0.05], 1) == pytest.approx(0.75)


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


def test_the_others_wait_in_their_steps_for_a_late_rank() -> None:
    """Issue 39: in a job whose step holds its all-reduce, rank 1 arriving 30 ms late on 3
    steps makes rank 0's step 30 ms longer there: the others waited 90 ms for rank 1."""
    from stallbench.analysis.ranks import others_wait_in_step

    r0 = [0.01, 0.04, 0.01, 0.04, 0.04, 0.01]
    r1 = [0.01] * 6 + [0.5]             # a step the other rank did not take is left out
    assert others_wait_in_step([r0, r1], 1) == pytest.approx(0.09)
    assert others_wait_in_step([r0, r1], 0) == pytest.approx(-0.09)
    assert others_wait_in_step([r0], 0) == 0.0


def test_the_verdict_states_the_measured_collective_wait_named_or_not() -> None:
    """Issue 39's held-out case: rank 0 waited 0.68 s in the all-reduce for rank 1 and the
    line said only 'noise'. Named or not, the measured wait for the candidate is printed;
    a rank nobody waited for gets no such clause."""
    base = dict(world=2, spread_s=0.7, candidate=1, straggler_excess_s=0.67, noise_s=0.70,
                gain_if_median_pace_s=0.6, gain_speedup=1.2, straggler_evidence="")
    quiet = ranks.verdict(SimpleNamespace(**base, straggler=None, others_wait_s=0.68))
    assert quiet.startswith("no straggler") and "waited 0.68 s for it in the all-reduce" in quiet
    none = ranks.verdict(SimpleNamespace(**base, straggler=None, others_wait_s=0.0))
    assert "waited" not in none
    stats = [SimpleNamespace(stall_s=0.1, last_step_share=0.5, attribution=None)] * 2
    named = ranks.verdict(SimpleNamespace(**base, straggler=1, others_wait_s=0.68, ranks=stats))
    assert named.startswith("rank 1 is the straggler") and "waited 0.68 s" in named
