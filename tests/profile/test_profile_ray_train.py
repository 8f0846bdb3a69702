"""Ray Train under ``stallbench profile`` (issue 40): a ``TorchTrainer`` with 2 CPU workers, its
own local Ray started by the script, each worker looping 2 epochs over
``get_dataset_shard("train").iter_torch_batches(...)`` (tests/profile/scripts/user_ray_train.py,
importing nothing of stallbench). The result must hold per-rank figures for ranks 0 and 1.

Two truths per rank, both measured inside that worker in the same run:

- the worker's own clocks: its seconds in ``iter()`` + ``next()`` on the shard's iterable and
  between batches. Profile's wait and step of that rank within 10% + 50 ms; its batches and
  samples exactly (Ray ends each worker with ``ray.kill``, no ``atexit``: before the Ray
  Train door wrote at ``RayTrainWorker.shutdown``, a deferred last epoch end lost 2 of each
  rank's 16 batches). Rank 1's steps are 3x rank 0's, so swapped ranks fail the step check.
- Ray Data's own blocked-time stat for that iterator: the shard's
  ``DatasetStats.iter_total_blocked_s`` (what ``shard.stats()`` prints as "Total time user
  thread is blocked by Ray Data iter_batches", checked equal to that text within its
  rounding). Ray times each ``next()`` of its batch iterator, the final StopIteration's too,
  but starts that clock only after the iterator's set-up, which it counts apart as
  ``iter_initialize_s`` (``_to_ref_bundle_iterator`` + building the batch iterator: ~1.2-1.5
  s over the two epochs here). That set-up runs inside the loop's first ``next()`` (Ray's
  iterable is a generator), so the loop was blocked for it: profile's wait (the first batch
  waits from ``iter()``) must be within 10% + 50 ms of blocked + initialize, and never below
  Ray's blocked alone (- 50 ms).

Ray start-up costs ~6 s and burns CPU on 2 cores; every injected cost is a sleep. One run
takes ~30 s: a ground truth in the timing pass, measured again once under load.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import loadcheck
import profile_helpers as helpers

pytestmark = [pytest.mark.ray, pytest.mark.groundtruth]
ITEM_MS, STEP_MS, ROWS, BATCH = 2.0, 5.0, 256, 16
EPOCHS, WORLD = 2, 2


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= 0.10 * want + 0.05


def _case(tmp_path: Path) -> list[str]:
    out, truth_dir = tmp_path / "out", tmp_path / "truth"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(truth_dir, ignore_errors=True)
    cp = helpers.profile(["--out", str(out), "--", sys.executable,
                          helpers.script("user_ray_train.py"), str(truth_dir), str(ITEM_MS),
                          str(STEP_MS), str(ROWS), str(BATCH)],
                         cwd=tmp_path, timeout=600, RAY_USAGE_STATS_ENABLED="0")
    assert cp.returncode == 0, cp.stderr[-3000:]
    truth = helpers.truth(cp.stdout)
    v = helpers.load(out).variants[0]
    assert v.ranks is not None and v.ranks.world == WORLD, v.ranks
    loaders = {lo.rank: lo for lo in v.profile.loaders}
    assert sorted(loaders) == [0, 1], [(lo.name, lo.rank) for lo in v.profile.loaders]
    figures = {f.rank: f for f in v.repeats[0].ranks}
    assert sorted(figures) == [0, 1], figures
    problems = []
    for rank in (0, 1):
        t, lo, f = truth[str(rank)], loaders[rank], figures[rank]
        # Ray Train's torch backend sets RANK to the worker's world rank: the hooks' rank
        assert t["rank_env"] == str(rank), t
        assert lo.kind == "ray.iter_torch_batches" and lo.headline, lo
        assert t["batches"] == EPOCHS * ROWS // WORLD // BATCH, t
        assert (lo.batches, lo.samples) == (t["batches"], t["samples"]), (rank, lo, t)
        assert (f.batches, f.samples) == (t["batches"], t["samples"]), (rank, f, t)
        assert abs(f.wait_s - lo.wait_s) < 1e-6, (f, lo)
        blocked, init = t["ray_blocked_s"], t["ray_init_s"]
        assert blocked is not None and init is not None, t        # what Ray 2.60 exposes
        text = t["ray_stats_blocked_s"]           # Ray's fmt: 2 decimals of s, ms or us
        assert text is not None and abs(text - blocked) <= 0.006, t
        if not _close(lo.wait_s, t["next_s"]):
            problems.append(f"rank {rank}: wait {lo.wait_s:.3f} s vs the worker's own "
                            f"{t['next_s']:.3f} s")
        if not _close(lo.step_s, t["step_s"]):
            problems.append(f"rank {rank}: step {lo.step_s:.3f} s vs the worker's own "
                            f"{t['step_s']:.3f} s")
        if not _close(lo.wait_s, blocked + init):
            problems.append(f"rank {rank}: wait {lo.wait_s:.3f} s vs Ray's blocked "
                            f"{blocked:.3f} s + iterator set-up {init:.3f} s")
        if lo.wait_s < blocked - 0.05:
            problems.append(f"rank {rank}: wait {lo.wait_s:.3f} s below Ray's blocked "
                            f"{blocked:.3f} s")
    return problems


def test_ray_train_ranks_match_each_workers_blocked_time(tmp_path: Path) -> None:
    loadcheck.attempts("ray train", lambda: _case(tmp_path), 2, 1.0)
