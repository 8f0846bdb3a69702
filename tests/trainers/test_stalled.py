"""``trainers.base.stalled``: the one rule by which every rank launcher (local processes, Ray
actors) ends a job that makes no progress. The slots are what ranks publish
(``measure.watchdog.publish``): per rank its last progress (CLOCK_MONOTONIC) and its state;
a launcher with shared producers (Ray's split coordinator) adds a slot pair after the ranks'.
No clock is raced: the published times are set far in the past or at now."""

from __future__ import annotations

import time

from stallbench.measure import watchdog
from stallbench.trainers.base import stalled

W, C, S, B = watchdog.WAITING, watchdog.COLLECTIVE, watchdog.SETUP, watchdog.BUSY


def _line(slots: list[float], pending: list[int] = (0, 1)) -> str | None:
    return stalled("s.toml", slots, list(pending), lambda r: 100 + r, slots[0] - 1, 3.0,
                   lambda: "the source of its data")


def test_ranks_waiting_alike_are_named_together() -> None:
    old = time.monotonic() - 60
    line = _line([old, W, old, W, old, 0.0])
    assert line == ("s.toml: run.progress_timeout_s: no trainer rank made progress for 3 s: "
                    "trainer ranks 0 (pid 100) and 1 (pid 101) were waiting for their next "
                    "batch from the source of its data; no result written"), line


def test_only_ranks_that_wait_on_data_or_set_up_are_blamed() -> None:
    old = time.monotonic() - 60
    line = _line([old, C, old, S])
    assert line is not None and "trainer rank 1 (pid 101) was setting up" in line, line
    assert "rank 0" not in line, line
    assert _line([old, C, old, B]) is None       # the all-reduce and a model step: no blame


def test_progress_anywhere_holds_the_job() -> None:
    old, now = time.monotonic() - 60, time.monotonic()
    assert _line([old, W, now, W]) is None                  # another rank progressed
    assert _line([old, W, old, W, now, 0.0]) is None        # the shared producers did
