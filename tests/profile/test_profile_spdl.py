"""SPDL's door (issue 40): a Meta SPDL pipeline (``spdl.pipeline``: a background event loop and
its thread pool, no DataLoader) is a loader to ``stallbench profile``, as a user runs it
(tests/profile/scripts/user_spdl.py, importing nothing of stallbench).

Two truths for the wait, both measured in the same run:

- the loop's own clocks: its seconds blocked in ``get_iterator()``/``next()``/``get_item()``
  and between batches; profile's wait and step must match them within 10% + 20 ms, its
  batches and samples exactly (samples from the batch structure: a ``Collate`` batch is a
  list of items);
- SPDL's own meter of the sink queue (``StatsQueue``'s ``QueuePerfStats``: ``ave_get_time *
  num_items``, for the loop over ``get_iterator`` whose queues are a ``StatsQueue``
  subclass). SPDL times each ``get`` on its event loop, from the moment the foreground's read
  is scheduled there to the item; the loop's wait adds the cross-thread hand-off around it
  (``run_coroutine_threadsafe`` and the future's publication: SPDL's docs measure 0.2-0.4 ms
  per call), and SPDL's count adds the gets of each epoch's end marker (which end a pass in
  profile's figures, their short waits not counted). So SPDL's figure may not exceed
  profile's by more than 10% + 20 ms, and profile's may exceed SPDL's by at most 10% + 20 ms
  + 1 ms per get (the hand-off, allowing a busy 2-core machine). Items of 8 ms, 2 at once,
  batches of 4 take ~16 ms: no get waits the 0.1 s after which SPDL's counter drops a slice.

spdl (``spdl-core``, which holds ``spdl.pipeline``) is in the ``dev`` extra (pinned); without
it these tests are skipped, saying so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import loadcheck
import profile_helpers as helpers

pytest.importorskip("spdl.pipeline",
                    reason="spdl (spdl-core) is in the dev extra: pip install -e '.[dev]'")

ITEM_MS, STEP_MS, PER_EPOCH, EPOCHS = 8.0, 5.0, 15, 2
KIND = "spdl.Pipeline"
LOOPS = {"iterator": "decode", "get_item": "fetch"}     # the loop -> its pipe stage's name


def _profile(tmp_path: Path, *args: str):
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    cp = helpers.profile(["--out", str(out), *args[:-1], "--", helpers.sys.executable,
                          helpers.script("user_spdl.py"), *args[-1].split()], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    return helpers.truth(cp.stdout), helpers.load(out).variants[0].profile.loaders


def _case(tmp_path: Path) -> list[str]:
    truth, loaders = _profile(tmp_path, f"{ITEM_MS} {STEP_MS} {PER_EPOCH} {EPOCHS}")
    assert {lo.kind for lo in loaders} == {KIND}, [(lo.name, lo.kind) for lo in loaders]
    # one stream per Pipeline object: the continuous one iterated every epoch, and one per
    # epoch where the job builds a pipeline each epoch
    streams = {loop: [lo for lo in loaders if lo.name.split("#")[0] == stage]
               for loop, stage in LOOPS.items()}
    assert [len(streams[loop]) for loop in LOOPS] == [1, EPOCHS], [lo.name for lo in loaders]
    assert streams["iterator"][0].epochs == EPOCHS
    problems = []
    for loop in LOOPS:
        t, los = truth[loop], streams[loop]
        got = (sum(lo.batches for lo in los), sum(lo.samples for lo in los))
        assert got == (t["batches"], t["samples"]) == (PER_EPOCH * EPOCHS,
                                                       PER_EPOCH * EPOCHS * 4), (loop, got, t)
        wait, step = sum(lo.wait_s for lo in los), sum(lo.step_s for lo in los)
        if abs(wait - t["next_s"]) > 0.10 * t["next_s"] + 0.02:
            problems.append(f"{loop}: wait {wait:.3f} s vs the loop's {t['next_s']:.3f} s")
        if abs(step - t["step_s"]) > 0.10 * t["step_s"] + 0.02:
            problems.append(f"{loop}: step {step:.3f} s vs the loop's {t['step_s']:.3f} s")
        if not wait > 0.2 * (wait + step):      # items cost more than the step: a stall
            problems.append(f"{loop}: wait {wait:.3f} s of {wait + step:.3f} s, no stall")
    t = truth["iterator"]
    wait, spdl, gets = streams["iterator"][0].wait_s, t["spdl_get_s"], t["spdl_gets"]
    assert t["spdl_reports"] == 1 and gets == t["batches"] + EPOCHS, t    # + the end markers
    if spdl > wait + 0.10 * wait + 0.02:
        problems.append(f"SPDL's sink get {spdl:.3f} s over profile's wait {wait:.3f} s")
    if wait > spdl + 0.10 * spdl + 0.02 + 0.001 * gets:
        problems.append(f"profile's wait {wait:.3f} s over SPDL's sink get {spdl:.3f} s "
                        f"({gets} gets) by more than the hand-off")
    return problems


@pytest.mark.groundtruth     # figures read off timings: the timing pass (tests/run_suite.sh)
def test_spdl_pipeline_loops_are_measured(tmp_path: Path) -> None:
    # sleeps: the job and SPDL's threads need well under a core
    loadcheck.attempts("spdl", lambda: _case(tmp_path), 3, 1.0)


def test_max_batches_ends_a_for_loop_over_a_pipeline(tmp_path: Path) -> None:
    """``for batch in pipeline`` (``Pipeline.__iter__``): ``--max-batches 3`` ends each epoch
    the loop sees after 3 batches (a door's hooked ``__next__`` is no user code: the core
    looks past it for the ``for`` loop), and the figures hold 3 batches per epoch."""
    truth, loaders = _profile(tmp_path, "--max-batches", "3", "1 1 10 2 for")
    assert truth["for"]["per_epoch"] == [3, 3], truth
    assert [(lo.kind, lo.epochs, lo.batches, lo.samples) for lo in loaders] == \
        [(KIND, 2, 6, 24)], loaders


def test_aggregated_images_count_as_samples_not_as_their_rows(tmp_path: Path) -> None:
    """Issue 57: ``aggregate(n)`` yields the list of its n samples; with arrays for samples
    (16 x 16 images) the list was read as columns and counted 16 samples a batch (samples/s
    4x here). The door says its lists are the samples: exactly the loop's own count."""
    truth, loaders = _profile(tmp_path, f"1 1 {PER_EPOCH} {EPOCHS} images")
    for loop, stage in LOOPS.items():
        los = [lo for lo in loaders if lo.name.split("#")[0] == stage]
        got = (sum(lo.batches for lo in los), sum(lo.samples for lo in los))
        assert got == (truth[loop]["batches"], truth[loop]["samples"]), (loop, got, truth)
        assert truth[loop]["samples"] == 4 * truth[loop]["batches"]
