"""Differential attribution on synthetic epoch times with known answers."""

from __future__ import annotations

import math

import pytest

from stallbench.analysis.differential import ablations_for, analyze, attribute
from stallbench.analysis import differential, figures


def chain_epochs(full=10.0, nf=7.0, nfp=4.0, free=3.5, compute=3.0, n=3, jitter=0.0):
    names = ["full", "no_fetch", "no_fetch_preprocess", "no_fetch_preprocess_transfer", "compute_only"]
    vals = [full, nf, nfp, free, compute]
    return {k: [v + jitter * (i - 1) for i in range(n)] for k, v in zip(names, vals)}


def test_chain_parts_close_and_bound() -> None:
    a = analyze(chain_epochs(), "chain")
    assert a.fetch_stall_s == pytest.approx(3.0)
    assert a.preprocess_stall_s == pytest.approx(3.0)
    assert a.transfer_stall_s == pytest.approx(0.5)
    assert a.overhead_s == pytest.approx(0.5)
    assert a.compute_s == pytest.approx(3.0)
    assert a.closure_error == pytest.approx(0.0)
    assert a.bound_by in {"fetch", "preprocess"}
    assert a.attributed_stall_share == pytest.approx(0.7)
    assert a.ideal_speedup == pytest.approx(10 / 7)
    assert "-bound (70% of the epoch is attributed stall): ideal" in a.verdict
    assert a.basis == "whole run" and a.startup_cost_s == 0.0


def test_intervals_collapse_without_spread_and_widen_with_it() -> None:
    a = analyze(chain_epochs(n=1), "chain")
    lo, hi = a.intervals.fetch_stall_s.low, a.intervals.fetch_stall_s.high
    assert lo == pytest.approx(hi) == pytest.approx(3.0)
    b = analyze(chain_epochs(n=5, jitter=0.2), "chain")
    lo, hi = b.intervals.fetch_stall_s.low, b.intervals.fetch_stall_s.high
    assert lo < 3.0 < hi


def test_compute_bound_verdict() -> None:
    a = analyze(chain_epochs(full=3.05, nf=3.04, nfp=3.03, free=3.02, compute=3.0), "chain")
    assert a.bound_by == "compute" and a.ideal_speedup == 1.0
    assert a.verdict.startswith("compute-bound")


def _computes(values: list[float]) -> dict[str, list[float]]:
    names = ["full", "no_fetch", "no_fetch_preprocess", "no_fetch_preprocess_transfer", "compute_only"]
    return {k: [v] for k, v in zip(names, values)}


def test_noise_floor_is_the_spread_of_the_same_compute_across_runs() -> None:
    # full 10 s, fetch stall 3 s: the compute of the same steps varied by 0.4 s -> conclusive
    a = analyze(chain_epochs(n=1), "chain", computes=_computes([3.0, 3.1, 2.9, 3.3, 3.0]))
    assert a.compute_noise_s == pytest.approx(0.4)
    assert a.compute_noise_share == pytest.approx(0.04)
    assert a.conclusive is True and not a.verdict.startswith("inconclusive")


def test_stage_stall_within_noise_is_inconclusive() -> None:
    # preprocess "stall" 0.6 s, but the same model steps took 3.0 .. 4.0 s in different runs
    e = chain_epochs(full=4.4, nf=4.3, nfp=3.7, free=3.6, compute=3.5, n=1)
    a = analyze(e, "chain", computes=_computes([3.6, 4.0, 3.0, 3.5, 3.5]))
    assert a.bound_by == "preprocess"
    assert a.compute_noise_s == pytest.approx(1.0)
    assert a.conclusive is False
    assert a.verdict.startswith("inconclusive (leaning preprocess-bound)")


def test_compute_bound_needs_noise_below_the_threshold() -> None:
    e = chain_epochs(full=3.05, nf=3.04, nfp=3.03, free=3.02, compute=3.0, n=1)
    quiet = analyze(e, "chain", computes=_computes([3.0, 3.0, 3.01, 3.0, 3.0]))
    assert quiet.bound_by == "compute" and quiet.conclusive is True
    noisy = analyze(e, "chain", computes=_computes([2.8, 3.0, 3.0, 3.0, 3.0]))  # 0.2 s = 6.6%
    assert noisy.conclusive is False and "leaning compute-bound" in noisy.verdict


def test_without_compute_figures_the_noise_is_unknown_not_zero() -> None:
    a = analyze(chain_epochs(n=1), "chain")
    assert a.compute_noise_s is None and a.conclusive is True


def test_shapley_splits_overlapping_stages_symmetrically() -> None:
    # Two stages of 1 s each in one worker, overlapped with 1.5 s of compute: removing either
    # alone brings the producer to 1 s (< 1.5 s compute), so order matters for the chain.
    v = {}
    for ab in ablations_for("shapley"):
        producer = (0 if ab.fetch else 1.0) + (0 if ab.preprocess else 1.0)
        v[ab.name] = max(producer, 1.5) if not ab.compute_only else 1.5
    parts = attribute(v, "shapley")
    assert parts["fetch_stall_s"] == pytest.approx(0.25)
    assert parts["preprocess_stall_s"] == pytest.approx(0.25)
    assert parts["transfer_stall_s"] == pytest.approx(0.0)
    assert sum(parts.values()) == pytest.approx(v["full"])
    chain = attribute(v, "chain")
    assert chain["fetch_stall_s"] == pytest.approx(0.5) and chain["preprocess_stall_s"] == pytest.approx(0.0)


def test_missing_runs_are_an_error() -> None:
    with pytest.raises(ValueError, match="missing ablation runs"):
        analyze({"full": [1.0]}, "chain")


def test_negative_part_is_said_and_the_ideal_speedup_stays_finite() -> None:
    # removing fetch made the run 1.5 s slower; transfer's part then exceeds the epoch
    e = chain_epochs(full=5.5, nf=7.0, nfp=6.4, free=0.1, compute=0.08, n=1)
    a = analyze(e, "chain")
    assert a.bound_by == "transfer" and a.transfer_stall_s == pytest.approx(6.3)
    assert math.isfinite(a.ideal_speedup) and a.ideal_speedup == pytest.approx(5.5 / 0.08)
    assert a.negative_parts == ["fetch"]
    # said, never printed as a negative figure (issue 39)
    assert "fetch part came out below 0 (taken as 0): making it ideal slowed the run" in a.verdict
    assert "-1.50" not in a.verdict
    assert analyze(chain_epochs(n=1), "chain").negative_parts == []


def test_a_negative_part_whose_interval_spans_zero_is_noise_not_a_finding() -> None:
    e = {"full": [6.5, 7.5, 8.5], "no_fetch": [7.3, 7.8, 7.6], "no_fetch_preprocess": [6.7, 8.3, 8.2],
         "no_fetch_preprocess_transfer": [0.08] * 3, "compute_only": [0.08] * 3}
    a = analyze(e, "chain")
    assert a.preprocess_stall_s < 0 and a.intervals.preprocess_stall_s.high > 0
    assert a.negative_parts == []


def test_named_stage_whose_interval_includes_zero_is_inconclusive() -> None:
    e = {"full": [1.4, 1.0, 1.6], "no_fetch": [1.0, 1.3, 1.2], "no_fetch_preprocess": [1.0] * 3,
         "no_fetch_preprocess_transfer": [1.0] * 3, "compute_only": [1.0] * 3}
    a = analyze(e, "chain", computes={k: [0.9] * 3 for k in e})
    assert a.bound_by == "fetch" and a.intervals.fetch_stall_s.low <= 0
    assert a.conclusive is False and a.inconclusive_because == "interval"
    assert a.verdict.startswith("inconclusive (leaning fetch-bound): its stall's interval")
    clear = analyze(chain_epochs(n=5, jitter=0.2), "chain")        # 3 s stall, +-0.4 s spread
    assert clear.conclusive is True


def test_steady_basis_puts_startup_apart_and_still_closes() -> None:
    """The issue's case: a compute-bound pipeline whose start-up (0.3 s to the first batch)
    only the transfer-free runs escape. On whole runs the start-up reads as a transfer stall;
    on steady state (each run's steady window scaled to all its batches) it is compute-bound
    and start-up is its own part; the parts still sum to the median epoch."""
    names = ["full", "no_fetch", "no_fetch_preprocess", "no_fetch_preprocess_transfer",
             "compute_only"]
    whole = dict(zip(names, [[2.32, 2.31, 2.33], [2.31, 2.30, 2.32], [2.30, 2.31, 2.30],
                             [2.0, 2.01, 2.0], [1.99, 2.0, 1.99]]))
    steady = dict(zip(names, [[2.02, 2.01, 2.03], [2.01, 2.0, 2.02], [2.0, 2.01, 2.0],
                              [2.0, 2.01, 2.0], [1.99, 2.0, 1.99]]))
    old = analyze(whole, "chain")
    assert old.bound_by == "transfer"
    a = analyze(whole, "chain", steady=steady, steady_computes=steady)
    assert a.basis == "steady state" and a.bound_by == "compute"
    assert a.steady_epoch_s == pytest.approx(2.02)
    assert a.startup_cost_s == pytest.approx(2.32 - 2.02)
    assert a.startup_cost_share == pytest.approx(0.30 / 2.32)
    parts = a.compute_s + a.fetch_stall_s + a.preprocess_stall_s + a.transfer_stall_s + a.overhead_s
    assert parts + a.startup_cost_s == pytest.approx(a.epoch_s) and a.closure_error == pytest.approx(0)
    assert a.steady_attributed_stall_share == pytest.approx(0.03 / 2.02)
    assert a.startup_cost_interval.low <= 0.30 <= a.startup_cost_interval.high
    assert a.verdict.startswith("compute-bound (data stages 1% of steady state)")
    assert "start-up 300 ms (13% of this run) is apart" in a.verdict


def test_runs_without_a_steady_window_fall_back_to_whole_runs() -> None:
    from stallbench.analysis.differential import analyze_runs
    from stallbench.measure.phases import split

    import factories

    def run(epoch: float, batches: int) -> object:
        f = factories.repeat(samples=1000)
        f.epoch_s, f.batches = epoch, batches
        items = list(range(batches))                 # one batch per work item
        f.phases = split([i * epoch / batches for i in range(batches)], [0.0] * batches,
                         [0.0] * batches, [1] * batches, items, epoch, producers=2)
        return f

    names = ["full", "no_fetch", "no_fetch_preprocess", "no_fetch_preprocess_transfer",
             "compute_only"]
    a = analyze_runs({k: [run(1.0, 8)] for k in names})
    assert a.basis == "steady state"
    short = analyze_runs({k: [run(1.0, 3)] for k in names})    # 2 producers, 3 items
    assert short.basis.startswith("whole run (no steady window in 5 run(s)")
    assert short.startup_cost_s == 0.0 and short.steady_epoch_s is None


def test_on_a_users_job_the_bound_is_named_after_the_jobs_own_stage() -> None:
    """Issue 42: on a profiled job "fetch" is whatever its dataset's ``__getitem__`` did (a
    hashing loop in memory, in the trial), read as storage I/O: the verdict names the job's
    stage; a scenario's verdict keeps the scenario's word."""
    epochs = {"full": [2.0, 2.02, 1.98], "no_fetch": [1.0, 1.01, 0.99],
              "no_fetch_preprocess": [0.95, 0.96, 0.94],
              "no_fetch_preprocess_transfer": [0.94, 0.95, 0.93], "compute_only": [0.9, 0.91, 0.89]}
    a = differential.analyze(epochs, "chain")
    assert a.bound_by == "fetch" and a.verdict.startswith("fetch-bound")
    job = differential.verdict(a, on_job=True)
    assert job.startswith("dataset __getitem__-bound (") and "fetch" not in job, job
    assert "ideal dataset __getitem__ would give" in job, job
    # an iterable dataset's items come from its __iter__: the job's stages name the part
    it = differential.verdict(a, on_job=True, stage_map={"dataset.__iter__": "fetch",
                                                          "collate_fn": "preprocess"})
    assert it.startswith("dataset __iter__-bound (") and "__getitem__" not in it, it


def test_part_names_come_from_the_stages_the_job_ran() -> None:
    """Issue 42: ``ProfileAnalysis.stage_map`` holds the automatic stages the headline loader
    timed (``ablate.job_stage_map``), and every surface names a part by them; a result of
    before, whose map listed every automatic stage, says it cannot tell which dataset kind."""
    from types import SimpleNamespace

    from stallbench.profile.ablate import job_stage_map

    iterable = [SimpleNamespace(stages={"dataset.__iter__": [8, 1.0, 0.9, "workers"],
                                        "collate_fn": [8, 0.1, 0.1, "workers"],
                                        "decode": [8, 0.5, 0.5, "workers"]})]
    m = job_stage_map(iterable)
    assert m == {"dataset.__iter__": "fetch", "collate_fn": "preprocess"}, m
    assert figures.part_name("fetch", True, m) == "dataset __iter__"
    assert figures.part_name("transfer", True, m) == "pin_memory"        # not run: usual name
    assert figures.part_name("fetch", False, m) == "fetch"                # a scenario's word
    assert job_stage_map([SimpleNamespace(stages={})]) == {}
    old = {"dataset.__getitem__": "fetch", "dataset.__iter__": "fetch",
           "collate_fn": "preprocess", "pin_memory": "transfer"}
    assert figures.part_name("fetch", True, old) == "dataset __getitem__/__iter__"
    assert figures.part_name("fetch", True, None) == "dataset __getitem__"
