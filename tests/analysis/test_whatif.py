"""The what-if model on synthetic rates, where the right answer is known exactly."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dataclasses import replace

from stallbench.analysis.queueing import queued_rate
from stallbench.analysis.whatif import calibrate, knee, predict

from factories import whatif_model

US = 1e-6
model = whatif_model


def test_no_workers_is_sequential() -> None:
    p = predict(model(fetch=2, prep=3, xfer=5, compute=10), 0)
    assert p.throughput_samples_s == pytest.approx(1 / 20e-6)
    assert p.stall_share == pytest.approx(0.5)
    assert p.bound_by == "transfer"


def test_compute_bound_when_producers_keep_up() -> None:
    p = predict(model(compute=10), 1)                 # producer 3 us < compute 10 us
    assert p.throughput_samples_s == pytest.approx(1e5)
    assert p.bound_by == "compute" and p.stall_share == pytest.approx(0.0)


def test_one_stage_bounds_until_enough_workers() -> None:
    m = model(fetch=1, prep=38, xfer=1, compute=10)   # 40 us per sample per worker
    for n in (1, 2, 3):
        p = predict(m, n)
        assert p.bound_by == "preprocess"
        assert p.throughput_samples_s == pytest.approx(n / 40e-6)
        assert p.stall_share == pytest.approx(1 - n * 10 / 40)
    assert predict(m, 4).bound_by == "compute"
    k = knee(m, list(range(1, 9)))
    assert k.n == 4 and k.bound_by == "compute"


def test_cores_saturate() -> None:
    m = model(fetch=0, prep=100, xfer=0, compute=10, cores=2)
    assert predict(m, 2).throughput_samples_s == pytest.approx(2 / 100e-6)
    assert predict(m, 8).throughput_samples_s == pytest.approx(2 / 100e-6)   # no more cores
    assert "CPU-bound" in predict(m, 8).why
    k = knee(m, list(range(1, 9)))
    assert k.n is None and k.saturates_at == 2 and k.bound_by == "preprocess"


def test_trainer_cpu_counts_against_cores() -> None:
    m = model(fetch=0, prep=10, xfer=0, compute=1, trainer_xfer=10, cores=1)
    # all CPU work (10 producer + 10 trainer us) shares one core -> 50k samples/s
    assert predict(m, 4).throughput_samples_s == pytest.approx(1 / 20e-6)


def test_storage_wait_uses_no_cpu_and_bandwidth_replaces_it() -> None:
    m = model(fetch=90, prep=5, xfer=5, compute=10, io=80, io_bytes=800, cores=2)
    # 100 us wall per worker but only 20 us CPU: 5 workers on 2 cores -> 50k samples/s, less
    # the bursts that find both cores taken (1 core of 2 asked for: 2.4% by the queue)
    assert predict(m, 5).throughput_samples_s == pytest.approx(queued_rate(5, 80e-6, 20e-6, 2))
    assert 0.97 * 5 / 100e-6 < predict(m, 5).throughput_samples_s < 5 / 100e-6
    assert predict(m, 5).bound_by == "fetch"
    # 800 bytes at 80 MB/s = 10 us instead of 80 us of storage wait
    p = predict(m, 1, bandwidth_mb_s=80)
    assert p.throughput_samples_s == pytest.approx(1 / 30e-6)


def test_cache_removes_fetch_share() -> None:
    m = model(fetch=40, prep=5, xfer=5, compute=1)
    full = predict(m, 1).throughput_samples_s
    half = predict(m, 1, cache=0.5).throughput_samples_s
    assert full == pytest.approx(1 / 50e-6) and half == pytest.approx(1 / 30e-6)


def test_storage_cap() -> None:
    m = model(fetch=1, prep=1, xfer=1, compute=1, io_bytes=1000)
    p = predict(m, 8, storage_cap_mb_s=100)          # 100 MB/s / 1 KB = 100k samples/s
    assert p.throughput_samples_s == pytest.approx(1e5) and p.bound_by == "fetch"
    assert math.isfinite(p.stall_share)


def test_calibration_gives_the_fit_gap_to_the_binding_workers_term() -> None:
    # model: 1 worker at 30 us/sample -> 33.3k/s; measured steady 25k/s -> 10 us/sample unseen
    m = calibrate(model(fetch=10, prep=10, xfer=10, compute=1), 25_000)
    assert m.p_extra == pytest.approx(10 * US)
    assert predict(m, 1).throughput_samples_s == pytest.approx(25_000)
    assert predict(m, 2).throughput_samples_s == pytest.approx(50_000)   # 2 / 40 us
    # no workers: no hand-off, so the unseen producer time does not apply
    assert predict(m, 0).throughput_samples_s == pytest.approx(1 / (31 * US))
    assert "+10.0 us/sample" in m.calibration


def test_calibration_of_a_trainer_or_core_bound_fit() -> None:
    t = calibrate(model(fetch=1, prep=1, xfer=1, compute=10), 50_000)   # trainer: 100k -> 50k
    assert t.t_extra == pytest.approx(10 * US) and t.p_extra == 0.0
    assert predict(t, 4).throughput_samples_s == pytest.approx(50_000)
    c = calibrate(replace(model(fetch=10, prep=10, xfer=10, compute=1, cores=2.0), fit_workers=4),
                  50_000)                                                 # cores: 66.7k -> 50k
    assert c.cores_scale == pytest.approx(0.75)
    assert predict(c, 8).throughput_samples_s == pytest.approx(50_000)


def test_no_calibration_without_a_measured_rate_or_workers() -> None:
    m = model()
    assert calibrate(m, math.nan) == m
    assert calibrate(replace(m, fit_workers=0), 1e5) == replace(m, fit_workers=0)


def test_run_length_throughput_adds_the_measured_start_up() -> None:
    m = replace(model(fetch=10, prep=10, xfer=10, compute=1), startup_s=1.0)
    p = predict(m, 1)                                 # 33.3k/s steady
    assert p.over_run(m, 100_000) == pytest.approx(100_000 / (1.0 + 3.0))


def test_no_workers_uses_the_trainer_process_rate_and_no_loader_overhead() -> None:
    m = model(fetch=4, prep=3, xfer=1, compute=4)
    m = replace(m, p_solo=6 * US, t_trainer=m.t_trainer + 0.5 * US,
                stage_wall={**m.stage_wall, "overhead": 0.5 * US})
    p = predict(m, 0)
    assert p.throughput_samples_s == pytest.approx(1 / (10 * US))      # 6 + 4, no overhead
    assert "measured in the trainer's process" in p.why
    assert predict(replace(m, p_solo=None), 0).throughput_samples_s == pytest.approx(1 / (12 * US))
    # a cache halves the fetch part of the worker's rate: the solo rate scales alike
    half = predict(m, 0, cache=0.5).throughput_samples_s
    assert half == pytest.approx(1 / (6 * (6 / 8) * US + 4 * US))


def test_no_worker_run_length_starts_with_one_item_in_the_trainer() -> None:
    m = replace(model(fetch=10, prep=10, xfer=10, compute=1), startup_s=1.0, solo_item_s=0.25)
    p0, p1 = predict(m, 0), predict(m, 1)
    assert p0.over_run(m, 100_000) == pytest.approx(100_000 / (0.25 + 100_000 / p0.throughput_samples_s))
    assert p1.over_run(m, 100_000) == pytest.approx(100_000 / (1.0 + 100_000 / p1.throughput_samples_s))


def test_ranks_multiply_the_trainers_and_a_loader_per_rank_its_workers() -> None:
    # 40 us per sample per worker, 10 us per sample of one rank's trainer
    m = model(fetch=1, prep=38, xfer=1, compute=10)
    assert predict(m, 1, ranks=2).throughput_samples_s == pytest.approx(2 / 40e-6)   # 2 workers
    assert predict(m, 4, ranks=2).throughput_samples_s == pytest.approx(2 / 10e-6)   # 2 trainers
    p = predict(m, 4, ranks=2)
    assert p.bound_by == "compute" and p.stall_share == pytest.approx(0.0)
    assert "2 ranks" in p.why
    # one shared pool (Ray): 4 producers serve both ranks
    pool = replace(m, producers_per_rank=False)
    assert predict(pool, 4, ranks=2).throughput_samples_s == pytest.approx(4 / 40e-6)
    # without workers each rank does its own data work, in parallel, within the cores
    assert predict(m, 0, ranks=2).throughput_samples_s == pytest.approx(2 / 50e-6)
    few = replace(m, cores=0.5)
    assert predict(few, 0, ranks=2).binding == "cores"


def test_calibration_at_a_multi_rank_fit_reproduces_it() -> None:
    m = replace(model(fetch=1, prep=38, xfer=1, compute=10), ranks=2)
    measured = 0.8 * predict(m, 1).throughput_samples_s
    c = calibrate(m, measured)
    assert predict(c, 1).throughput_samples_s == pytest.approx(measured)


def test_a_sweep_over_ranks_alone_is_validated_on_a_ranks_axis() -> None:
    from factories import result, variant
    from stallbench.analysis.whatif import validate
    from stallbench.results import ExecutorFacts, RankFigures, RankSummary, StageSeconds, Summary

    def ranked(name: str, ranks: int, tp: float):
        v = variant(name, [tp, tp])
        v.knobs = {"trainers.ranks": ranks}
        v.executor = ExecutorFacts(kind="local", producer_slots=1, has_producers=True,
                                   scaling_knobs=["loader.num_workers"])
        for f in v.repeats:
            f.stage_s = StageSeconds(fetch=0.3 * f.epoch_s, preprocess=0.3 * f.epoch_s)
            f.ranks = [RankFigures(rank=r, epoch_s=f.epoch_s, samples=f.samples // ranks,
                                   batches=10, steady_throughput_samples_s=tp / ranks,
                                   stall_s=0.0, wait_s=0.0, trainer_transfer_s=0.0,
                                   compute_s=f.compute_s, sync_s=0.0,
                                   time_to_first_batch_s=0.1, peak_pss_mb=1.0)
                       for r in range(ranks)] if ranks > 1 else []
        if ranks > 1:
            v.ranks = RankSummary(world=ranks, launcher="processes", backend="gloo", sharding="",
                                  producers_per_rank=True, launch_s=0.0, ranks=[],
                                  max_stall_s=Summary.of([0.0]), median_stall_s=Summary.of([0.0]),
                                  spread_s=0.0, noise_s=0.0, straggler=None, candidate=0,
                                  straggler_excess_s=0.0, gain_if_median_pace_s=0.0,
                                  gain_speedup=1.0)
        return v

    r = result([ranked("1", 1, 1000.0), ranked("2", 2, 1900.0), ranked("4", 4, 3000.0)])
    wi = validate(r)
    assert wi is not None and wi.axis.startswith("ranks")
    assert [(c.n, c.ranks) for c in wi.measured] == [(1, 1), (2, 2), (4, 4)]
    assert wi.fit_variant == "1" and wi.points[0].n == 1
    assert wi.knee.saturates_at is not None and wi.knee.n is None


# ------------------------------------------------------------- nodes: whose cores (issue 16)

def test_real_nodes_bring_their_own_cores_simulated_ones_share() -> None:
    shared = model(fetch=0, prep=100, xfer=0, compute=10, cores=2)
    own = replace(shared, producer_cores="own")
    assert predict(shared, 8).throughput_samples_s == pytest.approx(2 / 100e-6)   # 2 cores
    assert predict(own, 8).throughput_samples_s == pytest.approx(8 / 100e-6)      # 2 + 8
    assert predict(own, 8).binding == "workers"


def _node_variant(n: int, tp: float, simulated: bool, share: bool = True) -> Any:
    import factories
    from stallbench.results import ExecutorFacts, StageSeconds

    reps = [factories.repeat(tp, share=0.99, samples=10_000, stage_s=StageSeconds(
        preprocess=10_000 * 100e-6 / n, preprocess_cpu=10_000 * 100e-6 / n))]
    v = factories.variant(f"nodes={n}", [tp])
    v.repeats = reps
    v.knobs = {"executor.simulated_nodes": n} if simulated else {"executor.concurrency": n}
    v.executor = ExecutorFacts(kind="ray", producer_slots=n, has_producers=True,
                               producer_nodes=n, nodes_simulated=simulated,
                               producers_share_cores=share,
                               scaling_knobs=["executor.simulated_nodes", "executor.cpus_per_node",
                                              "executor.cpus", "executor.concurrency"])
    return v


def test_node_variants_form_one_group_and_oversubscribed_points_are_marked() -> None:
    import factories
    from stallbench.analysis.whatif import validate
    from stallbench.results import MachineInfo

    machine = MachineInfo(cpu_model="x", cores_logical=2, memory_gb=8)
    # 100 us of producer CPU per sample per node: 1 node 10k/s, 2 nodes 20k/s, 4 nodes on
    # 2 shared cores measured at 20k/s (contention)
    r = factories.result([_node_variant(n, tp, simulated=True)
                          for n, tp in ((1, 1e4), (2, 2e4), (4, 2e4))], machine=machine)
    w = validate(r)
    assert w is not None and w.axis == "simulated node CPUs"
    assert [x.n for x in w.measured] == [1, 2, 4]
    over = {x.n: x.oversubscribed for x in w.measured}
    assert over == {1: False, 2: False, 4: True}
    assert "oversubscribed" in w.note and w.model.producer_cores == "shared"
    # merged with issue 17: the 4-node point is not fitted on (contention on 1 and 2 nodes,
    # both in-sample, so no out-of-sample point is left for max_abs_error) ...
    assert w.model.kind == "contention" and w.model.fit_variants == ["nodes=1", "nodes=2"]
    assert not next(x for x in w.measured if x.n == 4).is_fit and w.max_abs_error is None
    # ... and the back-test predicts it, marks it and leaves it out of its errors
    bt = w.backtest
    assert bt is not None and {p.n: p.oversubscribed for p in bt.points} == over
    counted = [abs(p.error) for p in bt.points if not p.oversubscribed]
    assert len(counted) == 2 and bt.mean_abs_error == pytest.approx(sum(counted) / 2)
    assert bt.checked == 2


def test_real_node_group_uses_their_own_cores() -> None:
    import factories
    from stallbench.analysis.whatif import validate
    from stallbench.results import MachineInfo

    machine = MachineInfo(cpu_model="x", cores_logical=2, memory_gb=8)
    r = factories.result([_node_variant(n, 1e4 * n, simulated=False, share=False)
                          for n in (1, 2, 4)], machine=machine)
    w = validate(r)
    assert w is not None and w.axis == "node CPUs" and w.model.producer_cores == "own"
    assert not any(x.oversubscribed for x in w.measured)
    four = next(x for x in w.measured if x.n == 4)
    assert four.predicted_samples_s == pytest.approx(4e4, rel=0.02)   # not capped at 2 cores


# ------------------------------------- ranks in the run replay and the contention (merge 17+18)

def test_run_replay_counts_every_ranks_trainer_and_producers() -> None:
    from stallbench.analysis.whatif import predict_run

    m = replace(model(fetch=1, prep=38, xfer=1, compute=10), item_rows=1000, batch_rows=100)
    # trainer-bound (4 workers per rank): two ranks consume twice as fast
    one, two = predict_run(m, 4, 1e6), predict_run(m, 4, 1e6, ranks=2)
    assert one.steady_samples_s == pytest.approx(1 / 10e-6, rel=1e-6)
    assert two.steady_samples_s == pytest.approx(2 / 10e-6, rel=1e-6)
    # worker-bound: 1 worker per rank x 2 ranks = 2 producers at 40 us/sample each
    assert predict_run(m, 1, 1e6, ranks=2).whole_samples_s == pytest.approx(2 / 40e-6, rel=0.01)
    # no workers: each rank does its own data work, in parallel (the steady formula's rate)
    assert predict_run(m, 0, 1e6, ranks=2).whole_samples_s == pytest.approx(
        predict(m, 0, ranks=2).throughput_samples_s, rel=1e-6)


def test_busy_cores_count_every_ranks_producers_and_a_real_nodes_own() -> None:
    from stallbench.analysis.whatif import busy_of, contention_factor

    m = replace(model(cores=64), contention_producer=0.1)
    assert busy_of(m, 2, 2) == 4                                     # a loader per rank
    assert busy_of(replace(m, producers_per_rank=False), 2, 2) == 2  # one pool
    assert busy_of(replace(m, cores=3), 2, 2) == 3                   # capped by shared cores
    assert busy_of(replace(m, producer_cores="own", cpus_per_node=2), 8) == 2
    # fitted at 1 worker, 1 rank: 4 busy producers cost 1 + 0.1 x 3 of one
    assert contention_factor(m, 0.1, 2, ranks=2) == pytest.approx(1.3)


def test_cheapest_is_the_lowest_cost_given_figure_without_a_stall() -> None:
    """One rule for "cheapest configuration without stall" (issue 39: the whatif command
    decided it while printing): a point not predicted or still stalled is never it."""
    from stallbench.analysis.stats import COMPUTE_BOUND_SHARE
    from stallbench.analysis.whatif import cheapest
    from stallbench.results import WhatIfPoint

    def pt(stall: float, why_not: str = "") -> WhatIfPoint:
        return WhatIfPoint(n=0, predicted_samples_s=1.0, stall_share=stall, bound_by="x", why="",
                           not_predicted=why_not)

    free, stalled = COMPUTE_BOUND_SHARE / 2, COMPUTE_BOUND_SHARE * 2
    assert cheapest([pt(stalled), pt(free), pt(free)], [1.0, 3.0, 2.0]) == 2
    assert cheapest([pt(free, "back-test missed"), pt(free)], [1.0, 5.0]) == 1
    assert cheapest([pt(free), pt(free)], [math.inf, 4.0]) == 1
    assert cheapest([pt(stalled), pt(free, "no")], [1.0, 1.0]) is None
