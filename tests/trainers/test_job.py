"""The job's figures from its ranks', the last rank per step and each rank's share of the work
(pure: constructed rank runs, no processes)."""

from __future__ import annotations

import math

import pytest

from factories import repeat
from stallbench.pipeline import Plan
from stallbench.results import StageSeconds
from stallbench.trainers.base import Delivery, RankRun, rank_plan
from stallbench.trainers.job import job_figures, last_rank_per_step


def _rank(rank: int, epoch: float, stall: float, sync: float, arrivals: list[float],
          samples: int = 1000) -> RankRun:
    f = repeat(tp=samples / epoch, share=stall / epoch, samples=samples)
    f.compute_s = epoch - stall - sync
    f.stage_s = StageSeconds(fetch=0.1 * (rank + 1), transfer_trainer=0.01)
    f.trainer_cpu_s = 0.5
    f.time_to_first_batch_s = 0.1 + rank
    return RankRun(rank=rank, pid=100 + rank, figures=f, sync_s=sync, arrivals=arrivals,
                   step_stall_s=[stall / len(arrivals)] * len(arrivals),
                   deliveries=[Delivery(rank, rank, ["x"], 10, 1)], producer_pids=[100 + rank])


def test_job_figures_keep_the_straggling_ranks_device_figures_and_sum_the_cut_ids() -> None:
    """The job's AU is that of the rank whose stall and compute it reports, over the job's
    epoch; ids cut by padding are counted over every rank (issue 15 figures under issue 18)."""
    from stallbench.results import DeviceRepeat, SequenceCut

    ranks = [_rank(0, 2.0, 0.2, 0.5, [1.0, 2.0]), _rank(1, 2.5, 0.9, 0.0, [1.5, 2.5])]
    for r, (c, cut) in zip(ranks, [(1.3, 2), (1.6, 3)]):
        r.figures.device = DeviceRepeat(device="cuda:0", compute_kind="gpu",
                                        compute_clock="cuda_events", compute_s=c,
                                        au=c / r.figures.epoch_s, h2d_batches=2, h2d_bytes=10)
        r.figures.sequence_cut = SequenceCut(seq_len=8, sequences=100, sequences_cut=cut,
                                             ids=500, ids_cut=cut * 4, longest=8 + cut)
    f = job_figures(ranks, 1.0, None, {})
    assert f.device is not None and f.device.compute_s == 1.6        # rank 1: the largest stall
    assert f.device.au == pytest.approx(1.6 / 2.5)
    assert ranks[1].figures.device.au == pytest.approx(1.6 / 2.5)    # the rank's own untouched
    assert f.sequence_cut == SequenceCut(seq_len=8, sequences=200, sequences_cut=5, ids=1000,
                                         ids_cut=20, longest=11)
    ranks[0].figures.device = ranks[1].figures.device = None
    ranks[0].figures.sequence_cut = ranks[1].figures.sequence_cut = None
    f = job_figures(ranks, 1.0, None, {})
    assert f.device is None and f.sequence_cut is None


def test_job_figures_take_the_max_stall_and_sum_the_work() -> None:
    ranks = [_rank(0, 2.0, 0.2, 0.5, [1.0, 2.0, 3.0]),
             _rank(1, 2.1, 0.7, 0.0, [1.5, 2.5, 3.5]),
             _rank(2, 1.9, 0.3, 0.4, [1.1, 2.1])]
    f = job_figures(ranks, peak_pss_mb=900.0, shared_producer_cpu_s=None, extra={})
    assert f.epoch_s == 2.1                                   # the last rank to finish
    assert f.samples == 3000 and f.throughput_samples_s == pytest.approx(3000 / 2.1)
    assert f.stall_s == pytest.approx(0.7)                    # max over ranks
    assert f.compute_s == pytest.approx(ranks[1].figures.compute_s)   # of that same rank
    assert f.time_to_first_batch_s == pytest.approx(2.1)     # the last rank's first batch
    assert f.stage_s.fetch == pytest.approx(0.6) and f.trainer_cpu_s == pytest.approx(1.5)
    assert f.peak_pss_mb == 900.0 and f.producer_processes == 3
    assert [r.rank for r in f.ranks] == [0, 1, 2]
    assert [r.last_steps for r in f.ranks] == [0, 3, 0]
    assert [r.sync_s for r in f.ranks] == [0.5, 0.0, 0.4]
    assert f.steady_throughput_samples_s == pytest.approx(
        sum(r.figures.steady_throughput_samples_s for r in ranks))


def test_last_rank_per_step_among_the_ranks_that_stepped() -> None:
    ranks = [_rank(0, 1, 0.1, 0, [5.0, 6.0, 9.0]), _rank(1, 1, 0.1, 0, [5.5, 5.9])]
    assert last_rank_per_step(ranks) == [1, 0, 0]


def test_rank_plans_are_disjoint_and_cover_the_job(tmp_path) -> None:
    from stallbench import scenario
    from stallbench.pipeline import dataset_for

    cfg = scenario.parse('name = "p"\n[dataset]\nrows = 700\nrow_group_rows = 100\nfiles = 1\n'
                         '[loader]\nbatch_size = 50\nmax_batches = 9\n', "p.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path, "p.toml"))
    shares = [rank_plan(plan, r, 3) for r in range(3)]
    assert sorted(s.index for p in shares for s in p.items) == sorted(s.index for s in plan.items)
    assert [len(p.items) for p in shares] == [2, 2, 1]        # 5 items cover the 9-batch cap
    assert all(p.max_batches == 3 for p in shares)            # ceil(9 / 3) steps each
    assert math.isinf(rank_plan(plan.__class__.create(cfg.replace(
        loader=cfg.loader.__class__(batch_size=50)), plan.dataset), 0, 2).max_batches)


def _job_variant(name: str, straggler_stall: float) -> "VariantResult":
    from stallbench.results import ExecutorFacts, Summary, VariantResult

    reps = []
    for i in range(5):
        jitter = 0.01 * i
        ranks = [_rank(0, 2.0, 0.20 + jitter, 0.3, [1.0, 2.0]),
                 _rank(1, 2.0, straggler_stall + jitter, 0.0, [1.1, 2.1]),
                 _rank(2, 2.0, 0.22 + jitter, 0.3, [1.0, 2.0])]
        reps.append(job_figures(ranks, 500.0, None, {}))
    return VariantResult(
        name=name, knobs={}, config={}, emulated=[],
        executor=ExecutorFacts(kind="local", producer_slots=0, has_producers=False),
        throughput_samples_s=Summary.of([f.throughput_samples_s for f in reps]),
        epoch_s=Summary.of([f.epoch_s for f in reps]),
        stall_s=Summary.of([f.stall_s for f in reps]),
        stall_share=Summary.of([f.stall_s / f.epoch_s for f in reps]),
        time_to_first_batch_s=Summary.of([f.time_to_first_batch_s for f in reps]),
        peak_pss_mb=Summary.of([f.peak_pss_mb for f in reps]), repeats=reps)


def test_the_gate_compares_the_slowest_ranks_stall() -> None:
    """One rank's stall growing by 30% of the epoch is a regression of the job's stall share,
    even though the other ranks (and the median rank) did not change."""
    from factories import result
    from stallbench.gate import baseline as gate, rows

    base = result([_job_variant("4-ranks", 0.25)])
    cur = result([_job_variant("4-ranks", 0.85)])
    rep = gate.compare([base], [cur], threshold=0.10)
    (row,) = [r for r in rep.rows if r.metric == "stall_share"]
    assert row.verdict == "slower" and row.change == pytest.approx(0.30, abs=0.01)
    assert rows.exit_code(rep) == 1


def test_row_hashes_of_jagged_batches_include_each_rows_sequences() -> None:
    """Exactly-once checks hash rows; a ``jagged`` batch has no ``seq`` tensor, so its rows'
    ids come from values + offsets: rows equal but for their sequences hash differently, and
    moving an id from one sequence to the next changes the hash."""
    import torch

    from stallbench.trainers.rank import row_hashes

    def batch(values: list[int], offsets: list[int]) -> dict[str, torch.Tensor]:
        return {"dense": torch.zeros(2, 1), "sparse": torch.zeros(2, 1, dtype=torch.int64),
                "label": torch.zeros(2), "seq_values": torch.tensor(values),
                "seq_offsets": torch.tensor(offsets)}

    a = row_hashes(batch([1, 2, 3], [0, 1, 3]))          # Q=1: row 0 [1], row 1 [2, 3]
    assert a[0] != a[1]
    assert row_hashes(batch([1, 2, 3], [0, 1, 3])) == a  # deterministic
    assert row_hashes(batch([1, 2, 3], [0, 2, 3]))[0] != a[0]
