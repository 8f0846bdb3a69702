"""A tune trial whose setting hangs the job cannot block the tune (issue 41, found after it):
without ``--progress-timeout`` a trial gets a hang limit from the job as written (its longest
time without a batch, start-up included, times ``HANG_FACTOR``, at least ``HANG_MIN_S``); the
launcher stops a run that passes it and names the limit it passed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from stallbench.profile import launcher, tune
from stallbench.profile.agent import wire
from stallbench.profile.launcher import JobRun, NoProgress


def _run(first_batch_after: float, gaps: list[float]) -> JobRun:
    """A job as written: its process started at t0, its loader's batches arrived after
    ``first_batch_after`` and then every ``gaps[i]`` (the wait of each request is 0.01 s)."""
    t0 = 1000.0
    req, t = [], first_batch_after - 0.01
    for g in [0.0, *gaps]:
        t += g
        req.append(t)
    ep = wire.Epoch(t_iter=0.0, t_req=tuple(req), wait=(0.01,) * len(req),
                     step=(0.0,) * len(req), rows=(4,) * len(req), ended=True, capped=False,
                     t_end=req[-1] + 0.01, cpu_s=0.1)
    head = wire.Header(host="h", pid=1, image="i", t0_wall=t0)
    st = wire.Stream(kind="torch.DataLoader", name="D#0", order=0, key="1-i:0")
    p = wire.Parts(trainers=(wire.Trainer(header=head, streams=(st,)),),
                    epochs=(wire.Epochs(host="h", pid=1, image="i", seq=0,
                                         streams={"1-i:0": (ep,)}),))
    # request times are from the process's start: shift them to wall time via t0_wall
    return JobRun(exit_code=0, wall_s=10.0, parts=p)


def test_the_hang_limit_follows_the_longest_gap_of_the_job_as_written() -> None:
    run = _run(first_batch_after=3.0, gaps=[0.1, 0.1, 9.0, 0.1])     # a 9 s checkpoint
    assert tune.hang_seconds(run.parts) == pytest.approx(9.0)
    limit, why = tune._hang_limit(run, None)
    assert limit == pytest.approx(tune.HANG_FACTOR * 9.0)
    assert "9.0 s" in why and "hang limit" in why
    short = _run(first_batch_after=0.5, gaps=[0.1] * 5)
    assert tune._hang_limit(short, None)[0] == tune.HANG_MIN_S          # at least the floor
    assert tune._hang_limit(run, 30.0) is None          # --progress-timeout rules instead
    empty = JobRun(exit_code=0, wall_s=1.0)
    assert tune.hang_seconds(empty.parts) is None and tune._hang_limit(empty, None) is None


@pytest.mark.waits
def test_a_run_past_its_limit_is_stopped_and_the_limit_named(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with launcher.progress_limit(1.5, "the test's hang limit"):
        with pytest.raises(NoProgress) as got:
            launcher.run_once([sys.executable, "-c", "import time; time.sleep(60)"],
                              tmp_path / "run", {}, None, None)
    assert "no batch for 1.5 s (the test's hang limit)" in str(got.value)
    assert time.monotonic() - t0 < 30
