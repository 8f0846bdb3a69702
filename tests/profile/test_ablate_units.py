"""The decisions of ``--analyze`` that need no job run: which part a user's stage name maps
to, how calls are keyed by their arguments, the compute-only run's extrapolation from the
batches it served, and the "cannot ablate" reasons read from the replay parts."""

from __future__ import annotations

import importlib
import itertools
from collections import UserDict

import pytest

import profile_helpers as helpers
from stallbench.analysis import figures
from stallbench.profile import ablate
from stallbench.profile.agent import doors
from stallbench.profile.agent import wire
from stallbench.profile.agent.wire import Parts
from stallbench.profile.launcher import JobRun

_copies = itertools.count()


def _replay_module():
    """A fresh agent's ``replay`` (its ``recording`` is ``.recording`` beside it)."""
    name = f"_replay_under_test_{next(_copies)}"
    helpers.load_agent(name)
    return importlib.import_module(f"{name}.replay")


@pytest.mark.parametrize("name,part", [("decode", "fetch"), ("read_parquet", "fetch"),
                                       ("augment", "preprocess"), ("Tokenize", "preprocess"),
                                       ("to_device", "transfer"), ("my_stage", "my_stage")])
def test_stage_names_map_to_parts(name: str, part: str) -> None:
    assert ablate.part_of(name) == part


def test_calls_keyed_by_their_hashable_arguments() -> None:
    rp = _replay_module()

    class Ds:
        pass
    ds = Ds()
    assert rp.arg_key((ds, 3), {}) == rp.arg_key((Ds(), 3), {})   # self stands as its type
    assert rp.arg_key((ds, 3), {}) != rp.arg_key((ds, 4), {})
    assert rp.arg_key((ds, (1, "a")), {"k": 2}) != rp.arg_key((ds, (1, "a")), {"k": 3})
    assert rp.arg_key((ds,), {}) is None          # nothing to tell calls apart by
    assert rp.arg_key((ds, [1, 2]), {}) is None


def _parts(dicts: list[dict]) -> Parts:
    """Part files as the hooks write them (the keys ``parts`` reads), typed."""
    kinds = {"trainer": wire.Trainer, "replay": wire.Replay, "worker": wire.Worker}
    got: dict = {"trainer": [], "replay": [], "worker": [], "epochs": []}
    for d in dicts:
        role = d.get("role")
        if role is None:
            got["epochs"].append(wire.Epochs.from_json(d, d.get("seq", 0)))
        else:
            got[role].append(kinds[role].from_json(d))
    return Parts(tuple(got["trainer"]), tuple(got["epochs"]), tuple(got["worker"]),
                 tuple(got["replay"]))


def _run(dicts: list[dict]) -> JobRun:
    return JobRun(exit_code=0, wall_s=1.0, parts=_parts(dicts))


def test_compute_only_extrapolates_the_served_batches() -> None:
    trainer = {"role": "trainer", "host": "h", "pid": 7, "rank": 0,
               "streams": [{"name": "D#0", "key": "7:0"}]}
    epochs = {"host": "h", "pid": 7, "seq": 0, "streams": {"7:0": [{
        "wait": [0.5, 0.1, 0.001, 0.003], "step": [0.01, 0.01, 0.020, 0.020]}]}}
    replay = {"role": "replay", "pid": 7, "served_from": {"D#0": [2]}}
    epoch, step, compute = ablate.compute_only(_run([trainer, epochs, replay]), "D#0", 10)
    assert epoch == pytest.approx(10 * (0.021 + 0.023) / 2)
    assert step == pytest.approx(0.020)
    assert compute == pytest.approx(0.2)
    # nothing served (the epoch ended within the kept batches): no figure, not a guess
    assert ablate.compute_only(_run([trainer, epochs, {**replay, "served_from": {}}]),
                                "D#0", 10) is None
    assert ablate.batch_counts(_parts([trainer, epochs])) == {"D#0": [4]}


def test_calls_in_another_order_are_served_and_said_and_missing_ones_void() -> None:
    """Issue 57: a sampler that asked for other items than the recording run (a shuffle
    without a seed) is served in the recording's order: a note, not a refusal. A call the
    recording does not hold voids the ablation, in one short line with the fix first."""
    mismatch = {"role": "replay", "served": 3, "reordered": 2, "mismatch": {
        "where": [0, 1, 0], "call": 0, "recorded": "[5, 9]", "asked": "[2, 7]"}}
    assert ablate._served_problem([_run([mismatch])], "the dataset") == ""
    note = ablate._serving_notes([_run([mismatch])])
    assert note == ["the loader's order is not seeded: the served runs were given the "
                    "recording run's batches in its order (2 of 3 calls asked for other "
                    "items)"]
    missing = {"role": "replay", "served": 3, "missing": {"where": [0, -1, 1], "call": 40,
                                                           "recorded": 40}}
    why = ablate._served_problem([_run([missing])], "the dataset")
    assert why.startswith("make the epochs the same length in every run"), why
    assert "the loop's process, epoch 1: 40 recorded" in why and len(why) < 220, why
    assert ablate._served_problem([_run([{"role": "replay", "served": 5}])], "x") == ""
    assert "no fetch call was served" in ablate._served_problem([_run([])], "x")
    late = {"role": "replay", "served": 3, "late_read_s": 0.25}
    assert "read their recording inside the measured window (0.250 s per run" in \
        ablate._serving_notes([_run([late])])[0]


def test_compute_only_is_extrapolated_to_one_ranks_batches() -> None:
    """Under torchrun the job's figures sum batches over ranks; the compute-only epoch is one
    rank's per-batch time, so it is multiplied by that rank's batches, not the sum."""
    from stallbench.profile import merge

    def stream(rank: int, n: int, stall: float) -> merge.StreamRun:
        s = merge.StreamRun(name="D#0", kind="torch.DataLoader", rank=rank, key=f"{rank}:0",
                            settings={}, notes=[])
        s.wait = [stall / n] * n
        s.step = [0.01] * n
        s.rows = [8] * n
        s.t_start = [i * 0.02 for i in range(n)]
        s.epoch_s = sum(s.wait) + sum(s.step)
        return s
    per = [(s, merge.figures(s)) for s in (stream(0, 40, 0.1), stream(1, 40, 0.3),
                                           stream(2, 40, 0.2))]
    job = merge.job_figures(per, 0.0)
    assert job.batches == 120
    assert ablate._rank_batches(job) == 40
    assert ablate._rank_batches(per[0][1]) == 40


@pytest.mark.parametrize("code,said", [(3, 3), (-9, 137), (-15, 143), (0, 0)])
def test_exit_status_says_a_signal_as_128_plus_n(code: int, said: int) -> None:
    from stallbench.profile.launcher import exit_status
    assert exit_status(code) == said


def test_a_part_whose_interval_spans_zero_prints_as_not_distinguishable_from_zero() -> None:
    """Issue 25: the profile's attribution lines print a part whose interval spans 0 as "~0"
    with the note, never as a negative stall; a part clear of 0 keeps its figure."""
    from stallbench.analysis import differential
    from stallbench.results import ProfileAnalysis

    epochs = {"full": [2.0, 2.3, 1.9], "no_fetch": [2.1, 1.8, 2.2],
              "no_fetch_preprocess": [1.0, 1.1, 1.05], "no_fetch_preprocess_transfer": [1.0, 1.02, 1.01],
              "compute_only": [0.9, 0.92, 0.91]}
    a = differential.analyze(epochs, "chain")
    assert a.fetch_stall_s < 0 and a.intervals.fetch_stall_s.low < 0 < a.intervals.fetch_stall_s.high
    from stallbench.report import profile_lines
    out = profile_lines.analysis_lines(a, ProfileAnalysis(method="m", keep_batches=8, budget_mb=1.0))
    # the job's own stage names, the report's (figures.part_name), never the scenario's words
    assert not any(x.lstrip().startswith(("fetch", "preprocess", "transfer")) for x in out)
    fetch = next(x for x in out if x.lstrip().startswith(figures.part_name("fetch", True)))
    assert fetch.split()[2] == "~0" and f"{a.fetch_stall_s:.2f}" not in fetch.split("[")[0], fetch
    assert "  ~0: not distinguishable from 0 (its interval spans 0)" in out
    prep = next(x for x in out if x.lstrip().startswith("collate_fn"))
    assert f"{figures.seconds_cell(a.preprocess_stall_s):>8} s" in prep    # analysis.figures' rule


def test_views_of_one_big_storage_record_what_they_reference(tmp_path) -> None:
    """Issue 39: a dataset whose items are rows sliced out of one big tensor (``datasets``
    with torch format) pickled the whole storage once per call: 17.7 MB a call against 69 KB
    of rows, and the budget filled at once. Ground truth by construction: 40 calls of 8 rows
    of 4 KB from a 16 MB tensor; the bytes recorded are about the rows' and their batch's
    (2.6 MB), not 40 x 16 MB, and the rows come back equal."""
    import torch

    rp = _replay_module()
    rp.setup(wire.ReplayPlan(mode="record", dir=str(tmp_path), budget_mb=64))
    rec = rp.recording
    rows = torch.arange(4_000_000, dtype=torch.float32).view(-1, 1000)   # 16 MB, 4 KB a row
    calls, per = 40, 8
    for n in range(calls):
        items = [rows[n * per + i] for i in range(per)]
        rec.record((0, -1, 0), (n, list(range(n * per, (n + 1) * per)), items,
                                torch.stack(items), ""))
    viewed = 2 * calls * per * 4000                 # the rows, and the batch stacked from them
    assert rec.STATS.budget_stop is None and rec.STATS.recorded == calls
    assert viewed <= rec.STATS.recorded_bytes <= 1.1 * viewed + calls * 4096
    for fh in rec._REC_FILES.values():
        fh.close()
    recs = rec.load((0, -1, 0))
    assert len(recs) == calls
    assert all(torch.equal(recs[5][2][i], rows[5 * per + i]) for i in range(per))
    assert torch.equal(recs[5][3], rows[40:48])

    # the same calls pickled as they were (no compaction): the 64 MB budget stops at call 4
    again = _replay_module()
    again.setup(wire.ReplayPlan(mode="record", dir=str(tmp_path / "raw"), budget_mb=64))
    (tmp_path / "raw").mkdir()
    raw = again.recording
    raw.compact = lambda obj: obj
    for n in range(calls):
        items = [rows[n * per + i] for i in range(per)]
        raw.record((0, -1, 0), (n, [], items, torch.stack(items), ""))
    assert raw.STATS.budget_stop is not None and raw.STATS.recorded < 5


def test_views_that_cover_their_storage_are_pickled_once_as_they_are() -> None:
    """Rows of one batch tensor that together reference all of it stay views: pickle keeps
    their storage once per call, which is what they reference."""
    import torch

    rp = _replay_module()
    batch = torch.zeros(64, 1000)
    entry = (0, [], list(batch.unbind(0)), batch, "")
    assert rp.recording.compact(entry) is entry


def test_the_recording_budget_follows_the_available_memory_and_says_so() -> None:
    """Issue 39: 512 MB filled with 640 images of 224 px on a machine with GBs free. A
    quarter of the available memory, shared by the recording processes, clamped."""
    from stallbench.profile import budget

    gib = 1024 ** 3
    b = budget.recording_budget(32 * gib, 1, "/proc/meminfo MemAvailable")
    assert b.mb == 8192 and "25% of 32,768 MB available (/proc/meminfo MemAvailable)" in b.basis
    four = budget.recording_budget(32 * gib, 4, "x")
    assert four.mb == 2048 and "/ 4 processes" in four.basis
    small = budget.recording_budget(gib // 8, 4, "x")      # 8 MB each: raised to the floor
    assert small.mb == budget.FLOOR_MB and "floor" in small.basis
    huge = budget.recording_budget(1024 * gib, 1, "x")
    assert huge.mb == budget.CEIL_MB and "capped" in huge.basis
    unknown = budget.recording_budget(None, 1, "available memory unknown (OSError)")
    assert unknown.mb == budget.FLOOR_MB and "unknown" in unknown.basis
    # this machine's figure is the kernel's, stated with its source
    here = budget.machine_budget()
    avail, source = budget.available_bytes()
    assert avail and avail > 0 and source in here.basis
    assert budget.FLOOR_MB <= here.mb <= budget.CEIL_MB


def test_a_ray_data_headline_gets_no_recording_run_unless_it_marks_stages() -> None:
    """Issue 39: a Ray Data iterator's stages run in Ray's tasks, where torch's fetchers
    never run: the recording run recorded nothing and cost a run of the job. It is skipped,
    and said; a stallbench.stage marked in the loop's process still gets its recording."""
    from types import SimpleNamespace as NS

    ray = NS(name="ray.iter_torch_batches#0", kind="ray.iter_torch_batches", stages={})
    assert ablate._no_recording(ray, [ray], ray.name) == doors.of(ray.kind).stages != ""
    marked = NS(name=ray.name, kind=ray.kind, stages={"decode": [1, 0.1, 0.1, "trainer"]})
    assert ablate._no_recording(marked, [marked], ray.name) == ""
    torch_dl = NS(name="DataLoader#0", kind="torch.DataLoader", stages={"collate_fn": [1]})
    assert ablate._no_recording(torch_dl, [torch_dl], torch_dl.name) == ""
    assert ablate._no_recording(None, [], None) == ""


def test_every_epochs_recording_is_read_at_the_first_serving_call(tmp_path) -> None:
    """A served run read each epoch's recording at that epoch's first call: the second and
    later epochs paid the read and its collection inside the steady window, and a 3-epoch
    job at 0 workers read 0.8 s of "loader hand-off" that no hand-off made. All epochs are
    read at the first call now (start-up), each epoch's calls kept apart."""
    rp = _replay_module()
    rp.setup(wire.ReplayPlan(mode="record", dir=str(tmp_path), budget_mb=64))
    rec = rp.recording
    for epoch in range(3):
        for n in range(4):
            rec.record((0, -1, epoch), (n, [epoch, n], None, f"batch {epoch}.{n}", ""))
    for fh in rec._REC_FILES.values():
        fh.close()
    reads = []
    real = rec.loaded
    rec.loaded = lambda files, keep, collect=True: (reads.append(list(files)),
                                                    real(files, keep, collect))[1]
    first = rec.load((0, -1, 0))
    assert [r[3] for r in first] == [f"batch 0.{n}" for n in range(4)]
    assert len(reads) == 3                       # every epoch's file, at the first call
    assert [r[3] for r in rec.load((0, -1, 2))] == [f"batch 2.{n}" for n in range(4)]
    assert [r[3] for r in rec.load((0, -1, 1))][0] == "batch 1.0"
    assert len(reads) == 3                       # nothing read in a later epoch
    assert rec.load((0, -1, 7)) == [] and len(reads) == 3   # no recording: computed, no read


def test_compute_only_scales_its_served_batches_to_the_full_runs_sizes() -> None:
    """Issue 57: the sizes each batch held (``rows.elements``) go across the wall with its
    epoch; the compute-only run's served batches (kept lengths 100 and 300, step 1 ms per
    100 values) are scaled to the full run's (mean 400)."""
    trainer = {"role": "trainer", "host": "h", "pid": 7, "rank": 0,
               "streams": [{"name": "D#0", "key": "7:0"}]}
    served = {"host": "h", "pid": 7, "seq": 0, "streams": {"7:0": [{
        "wait": [0.5, 0.1, 0.0, 0.0, 0.0, 0.0], "step": [0.001, 0.003] * 3,
        "size": [100, 300] * 3}]}}
    replay = {"role": "replay", "pid": 7, "served_from": {"D#0": [2]}}
    full = {"host": "h", "pid": 7, "seq": 0, "streams": {"7:0": [{
        "wait": [0.0] * 4, "step": [0.0] * 4, "size": [200, 400, 600, 400]}]}}
    sizes = ablate.full_sizes(_parts([trainer, full]), "D#0")
    assert sizes == [200, 400, 600, 400]
    epoch, step, compute = ablate.compute_only(_run([trainer, served, replay]), "D#0", 10,
                                                sizes)
    assert step == pytest.approx(0.004) and compute == pytest.approx(0.04)
    # without the sizes (a part of an older stallbench): the served batches' mean
    assert ablate.compute_only(_run([trainer, served, replay]), "D#0", 10)[1] == \
        pytest.approx(0.002)


def test_an_epochs_first_served_batch_does_not_count_the_loaders_start_up() -> None:
    """Issue 57, the floor within 3% of the job's own step: a second epoch's first batch
    waits from iter(), where torch forks non-persistent workers again (0.2 s here); served
    from memory, it waits as the epoch's other served batches."""
    trainer = {"role": "trainer", "host": "h", "pid": 7, "rank": 0,
               "streams": [{"name": "D#0", "key": "7:0"}]}
    epochs = {"host": "h", "pid": 7, "seq": 0, "streams": {"7:0": [
        {"wait": [0.5, 0.1, 0.001, 0.001], "step": [0.01] * 4},
        {"wait": [0.2, 0.001, 0.001, 0.001], "step": [0.01] * 4}]}}
    replay = {"role": "replay", "pid": 7, "served_from": {"D#0": [2, 0]}}
    epoch, step, _ = ablate.compute_only(_run([trainer, epochs, replay]), "D#0", 6)
    assert epoch == pytest.approx(6 * 0.011) and step == pytest.approx(0.01)


class Recursing(UserDict):
    """A batch class that pickles but cannot be unpickled: its ``__setstate__`` lookup runs
    a ``__getattr__`` that reads ``self.data``, which unpickling has not set yet (a
    tokenizer's output as a user might write it; ``transformers.BatchEncoding`` has the
    ``__setstate__`` that avoids it)."""

    def __getattr__(self, item):
        return self.data[item]


def test_a_recording_that_cannot_be_read_back_is_refused_in_the_recording_run() -> None:
    """Issue 57: found only by the served runs, it was said as an epoch the recording did
    not hold; the recording run now reads its first call back and says why, so no served
    run is spent on it; a served run that still cannot read it says so, fix first."""
    import pickle
    helpers.load_agent("_agent_unreadable")
    rec = importlib.import_module("_agent_unreadable.recording")
    why = rec._unreadable(pickle.dumps(Recursing(a=1)))
    assert why.startswith("the outputs pickle but cannot be read back (RecursionError"), why
    assert "__setstate__" in why and rec._unreadable(pickle.dumps({"a": 1})) == ""
    part = {"role": "replay", "served": 0, "unreadable": "RecursionError: depth"}
    got = ablate._served_problem([_run([part])], "the dataset")
    assert got.startswith("give the batch's class a __setstate__ to ablate the dataset"), got
