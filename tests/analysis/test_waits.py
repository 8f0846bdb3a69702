"""Attribution from the measured waits (``analysis.waits``, issue 39), on synthetic runs
whose waits and steps are known by construction: each run is a per-batch timeline (one
stream, as ``profile`` merges it), so ``Phases`` and the stall are measured the same way as
on a user's job."""

from __future__ import annotations

import math
import re

import pytest

from stallbench.analysis import differential, figures, waits
from stallbench.measure.load import HEAVY_CORES
from stallbench.profile import merge
from stallbench.results import ForeignLoad

NAMES = ("full", "no_fetch", "no_fetch_preprocess", "no_fetch_preprocess_transfer",
         "compute_only")
N = 200


def run(wait: float, step: float, first: float = 0.0, busy: bool = False):
    """A run of N batches: the first waits ``first`` (start-up), every other ``wait``; every
    step takes ``step``."""
    s = merge.StreamRun(name="D#0", kind="torch.DataLoader", rank=0, key="0:0", settings={},
                        notes=[])
    s.wait = [first] + [wait] * (N - 1)
    s.step = [step] * N
    s.rows = [8] * N
    t, starts = 0.0, []
    for w, c in zip(s.wait, s.step):
        starts.append(t)
        t += w + c
    s.t_start = starts
    s.epoch_s = t
    f = merge.figures(s)
    if busy:
        f.load = ForeignLoad(wall_s=t, busy_cpu_s=0, own_cpu_s=0, foreign_cpu_s=0,
                             foreign_cores=HEAVY_CORES + 1, cores=2)
    return f


def attribute(full, items, batch, free, only_step, reps=1):
    only = [(only_step * N, only_step * N, only_step)] * reps
    return waits.attribute([full] * reps, [items] * reps, [batch] * reps, [free] * reps,
                           [o[0] for o in only], [o[1] for o in only], [o[2] for o in only],
                           NAMES)


def test_wait_bound_takes_the_larger_share() -> None:
    assert figures.wait_bound(0.2, 0.5) == pytest.approx(2.0)
    assert figures.wait_bound(0.5, None) == pytest.approx(2.0)
    assert figures.wait_bound(0.0, 0.0) == pytest.approx(1.0)
    assert figures.wait_bound(1.0) == math.inf
    assert math.isnan(figures.wait_bound(math.nan, None))


def test_parts_from_waits_sum_to_the_measured_stall_and_the_step_change_is_interference() -> None:
    # the full run waits 6 ms (fetch 4, collate 1.5, hand-off 0.5) and its step is 10 ms
    # where served batches step in 7 ms: the data path slows the step by 3 ms (interference)
    full = run(0.006, 0.010, first=0.5)
    a = attribute(full, run(0.002, 0.007), run(0.0005, 0.007), run(0.0005, 0.007), 0.007)
    assert a.fetch_stall_s == pytest.approx(0.004 * N, rel=0.02)
    assert a.preprocess_stall_s == pytest.approx(0.0015 * N, rel=0.02)
    assert a.overhead_s == pytest.approx(0.0005 * N, rel=0.05)
    assert a.attributed_stall_s + a.startup_cost_s == pytest.approx(full.stall_s, rel=0.01)
    assert a.conclusive, a.verdict
    assert a.interference_s == pytest.approx(0.003 * N, rel=0.05)
    # an epoch difference would have charged the step's 3 ms to data: the waits do not
    assert a.fetch_stall_s < 0.005 * N
    # no gain beyond what the wait allows
    share = full.stall_s / full.epoch_s
    assert a.ideal_speedup <= figures.wait_bound(share, full.phases.steady_stall_share) + 1e-9
    assert figures.data_ideal_speedup(a) <= a.wait_bound_speedup + 1e-9
    assert "interference" in a.verdict or "interference" in differential.verdict(a)


def test_a_negative_part_is_stored_as_zero_and_named() -> None:
    # the collate-served run waited more than the dataset-served one (less than the full
    # run): collate came out negative
    a = attribute(run(0.004, 0.01), run(0.001, 0.01), run(0.003, 0.01), run(0.003, 0.01),
                  0.01)
    assert a.preprocess_stall_s == 0.0 and "preprocess" in a.negative_parts
    assert min(a.fetch_stall_s, a.preprocess_stall_s, a.transfer_stall_s, a.overhead_s) >= 0
    # the clamped part breaks the sum beyond the stall's interval: not conclusive, said why,
    # and its parts withheld (issue 57: never printed as figures under that verdict)
    assert not a.conclusive and a.inconclusive_because == "closure"
    assert figures.withheld(a) and "parts withheld" in a.verdict
    assert not re.search(r"-\d", a.verdict), a.verdict     # no negative figure printed
    # nor stored as an interval below zero, and a job's verdict names the part as its
    # table does (collate_fn, never "preprocess")
    iv = a.part_interval("preprocess")
    assert 0.0 <= iv.low <= iv.high, iv
    job = differential.verdict(a, on_job=True, stage_map={"collate_fn": "preprocess"})
    assert "collate_fn came out negative" in job, job
    assert not re.search(r"\bpreprocess\b", job) and not re.search(r"-\d", job), job


def test_a_served_run_that_waited_longer_than_the_full_run_withholds_the_parts() -> None:
    """Serving that costs more than the stage it replaces (issue 57: 2 workers serving an
    imagenet batch from the recording took longer than FakeData made it): the served run
    waits more than the full run, and a part built on it would exceed the stall: withheld,
    with the run named in the job's words."""
    names = {"fetch": "dataset __iter__", "preprocess": "collate_fn"}
    only = [0.01 * N]
    a = waits.attribute([run(0.004, 0.01)], [run(0.002, 0.01)], [run(0.006, 0.01)],
                        [run(0.006, 0.01)], only, only, [0.01], NAMES, part_names=names)
    assert not a.conclusive and a.inconclusive_because == "serving", a.verdict
    assert figures.withheld(a)
    assert "the run with dataset __iter__ and collate_fn served waited 1.20 s" in a.refused
    assert "more than the full run's 0.80 s" in a.refused


def test_a_stage_that_moved_without_being_served_withholds_the_parts() -> None:
    """The busy machine of issue 57: collate_fn (not served in the dataset-served run) ran
    35% longer there than in the full run, which moves the dataset's and collate's parts by
    as much; the step did not move, so the step's guard alone called it conclusive."""
    full, items = run(0.005, 0.01), run(0.003, 0.01)
    batch = run(0.0005, 0.01)
    full.stage_s.preprocess, items.stage_s.preprocess = 0.4, 0.54
    a = attribute(full, items, batch, batch, 0.01)
    assert not a.conclusive and a.inconclusive_because == "stage_moved", a.verdict
    assert a.stage_ratio == {"no_fetch:preprocess": pytest.approx(1.35)}
    assert "preprocess took 1.35x its full-run seconds (0.54 s against 0.40 s) in the run " \
           "with fetch served" in a.refused, a.refused
    # in 8 worker processes side by side, 0.14 s of collate reaches the loop's wait by
    # 0.0175 s at most: below the closure's floor (0.02 s here)
    b = waits.attribute([full], [items], [batch], [batch], [0.01 * N], [0.01 * N], [0.01],
                        NAMES, producers=8)
    assert b.conclusive and not b.stage_ratio, b.verdict
    # within its noise (10%), or by less than the closure's floor in seconds: the same stage
    items.stage_s.preprocess = 0.43
    assert attribute(full, items, batch, batch, 0.01).conclusive
    full.stage_s.preprocess, items.stage_s.preprocess = 0.004, 0.008
    assert attribute(full, items, batch, batch, 0.01).conclusive


def test_a_loop_waiting_30_percent_on_a_quiet_machine_is_conclusive() -> None:
    # wait 4.3 ms of a 14.3 ms batch (30%), all of it fetch; served runs step 20% faster
    a = attribute(run(0.0043, 0.010), run(0.0, 0.008), run(0.0, 0.008), run(0.0, 0.008), 0.008)
    assert a.conclusive and a.bound_by == "fetch", a.verdict
    assert a.ideal_speedup == pytest.approx(1 / (1 - 0.3), rel=0.02)


def test_a_step_change_on_a_busy_machine_withholds_the_parts() -> None:
    a = attribute(run(0.0043, 0.010, busy=True), run(0.0, 0.008), run(0.0, 0.008),
                  run(0.0, 0.008), 0.008)
    assert not a.conclusive and a.inconclusive_because == "busy_machine"
    assert "withheld" in a.verdict
    # the same busy machine with a step that did not move: nothing to withhold
    b = attribute(run(0.0043, 0.010, busy=True), run(0.0, 0.010), run(0.0, 0.010),
                  run(0.0, 0.010), 0.010)
    assert b.conclusive and b.interference_s is None


def _v(stall: float, epoch: float, startup_stall: float, first: float):
    from types import SimpleNamespace as NS
    return NS(stall_s=NS(median=stall), epoch_s=NS(median=epoch),
              phases=NS(startup_stall_s=NS(median=startup_stall)),
              time_to_first_batch_s=NS(median=first), attribution=None)


def test_the_headline_puts_a_start_up_dominated_wait_before_the_first_batch() -> None:
    # the Ray loop of issue 39: 15.8 s of its 15.97 s wait before its first batch
    line = waits.wait_headline(_v(15.82, 15.97, 15.80, 15.78))
    assert "waited 15.82 s" in line and "15.80 s in start-up" in line
    assert "15.78 s before the first batch" in line and "0.02 s in steady state" in line
    # start-up a twentieth of the wait: one figure, no split
    assert "start-up" not in waits.wait_headline(_v(2.0, 10.0, 0.1, 0.05))


def test_workers_forked_every_epoch_pay_the_start_up_every_epoch() -> None:
    """Two epochs of a DataLoader with 2 workers that are not persistent: the second epoch
    forks them again, so its start-up sits in the steady window; the headline says so and
    never that a longer run pays the start-up once (persistent workers: it does)."""
    from types import SimpleNamespace as NS

    def job(persistent: bool, epochs: int = 2):
        v = _v(6.2, 9.3, 3.03, 3.0)
        v.profile = NS(loaders=[NS(headline=True, set_keys=["dataloader", "torch"], epochs=epochs,
                                   settings={"num_workers": 2,
                                             "persistent_workers": persistent})])
        return waits.wait_headline(v)

    line = job(False)
    assert "1 later epoch(s)' start-up" in line and "persistent_workers=False" in line, line
    assert "pays the start-up once" not in line
    for same in (job(True), job(False, epochs=1)):
        assert "a longer run pays the start-up once" in same, same


def test_an_unpinned_job_has_transfer_zero_with_a_zero_interval() -> None:
    full, items, batch = ([run(w, 0.01) for _ in range(3)] for w in (0.004, 0.002, 0.001))
    a = waits.attribute(full, items, batch, batch, [2.0] * 3, [2.0] * 3, [0.01] * 3, NAMES)
    assert a.transfer_stall_s == 0.0
    assert a.intervals.transfer_stall_s.low == a.intervals.transfer_stall_s.high == 0.0


def test_the_compute_only_floor_is_scaled_to_the_full_runs_batch_sizes() -> None:
    """Issue 57, dynamic padding: a step of 1 ms + 2 us per value. The compute-only run
    served a few kept lengths; the full run's batches hold others. The floor is the step at
    the full run's sizes, not at the kept ones'."""
    def step(z: int) -> float:
        return 0.001 + 2e-6 * z
    full = [200, 400, 800, 1600] * 50                     # mean 750 values
    truth = sum(step(z) for z in full) / len(full)
    kept = [200, 200, 400] * 10                           # short ones kept: mean 267
    got = waits.size_scaled([step(z) for z in kept], kept, full)
    assert got == pytest.approx(truth, rel=1e-9)
    # one kept length: proportional, the best a single point allows
    one = waits.size_scaled([step(300)] * 5, [300] * 5, full)
    assert one == pytest.approx(step(300) * 750 / 300)
    # sizes that do not vary: the plain mean, as before; no sizes: nothing to scale by
    assert waits.size_scaled([0.01, 0.012], [500, 500], [500] * 9) == pytest.approx(0.011)
    assert waits.size_scaled([0.01, 0.012], [0, 0], full) is None
    assert waits.size_scaled([0.01], [500], []) is None


def test_a_part_below_zero_within_its_runs_noise_breaks_no_closure() -> None:
    """Issue 57: non-persistent workers forked every epoch make a run's waits spread (a
    restart of ~60 ms among waits of ~1 ms), so collate's ~0 part came out -40 ms and a
    plain job was "inconclusive" on a quiet machine. Each run's stall has a standard error
    from its batches' spread (``stall_se``); a part below 0 within 2 of them is 0 within its
    noise. Far below it, the closure still refuses."""
    assert waits.stall_se([0.01] * 10, None) == pytest.approx(0.0)
    assert waits.stall_se([0.0, 0.2] * 5, 2) == pytest.approx(10 * 0.1069 / math.sqrt(8),
                                                              rel=1e-3)
    assert waits.stall_se([0.1, 0.1], None) is None
    full, items = run(0.006, 0.01), run(0.001, 0.01)
    batch = run(0.0012, 0.01)        # collate's part: -0.04 s over 200 batches
    for f in (full, items, batch):
        f.stall_se_s = 0.05          # each run's stall known to +-0.05 s
    a = attribute(full, items, batch, batch, 0.01)
    assert a.conclusive and a.preprocess_stall_s == 0.0 and "preprocess" in a.negative_parts
    for f in (full, items, batch):
        f.stall_se_s = 0.005         # a quiet, even run: -0.04 s is beyond its noise
    b = attribute(full, items, batch, batch, 0.01)
    assert not b.conclusive and b.inconclusive_because == "closure", b.verdict
