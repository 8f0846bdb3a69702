"""Ray Data under ``stallbench profile``: a user's read_parquet -> map_batches ->
iter_torch_batches loop (tests/profile/scripts/ray_train.py, its own Ray with one CPU) is a
loader stream, with ``ray.prefetch_batches`` applied. One test: each job starts its own Ray.

The truth used: with one CPU, Ray runs the 32 map tasks (MAP_MS each, a sleep) one after
another, and none starts before the loop's first request (Ray Data executes lazily), so the
last batch cannot arrive before 32 x MAP_MS after ``iter()``: the loop's wait is at least
that minus the time its own steps overlapped it (32 x STEP_MS). How the wait splits between
the first batch and the rest depends on how early Ray's workers come up, so only this bound
is asserted, plus every row delivered and counted. Load only lengthens the map sleeps, so
the bound holds beside other tests: it runs in the parallel pass (issue 37)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import profile_helpers as helpers

pytestmark = pytest.mark.ray
MAP_MS, STEP_MS, BATCHES = 50.0, 5.0, 32


def test_ray_data_loop_is_a_stream(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--set", "ray.prefetch_batches=2", "--",
                          sys.executable, helpers.script("ray_train.py"), str(tmp_path / "d"),
                          str(MAP_MS), str(STEP_MS)], cwd=tmp_path, timeout=600,
                         RAY_USAGE_STATS_ENABLED="0")
    assert cp.returncode == 0, cp.stderr
    assert "rows 2048" in cp.stdout
    r = helpers.load(out)
    v = r.variants[0]
    assert v.name == "prefetch_batches=2"
    lo = next(lo for lo in v.profile.loaders if lo.headline)
    assert lo.kind == "ray.iter_torch_batches"
    # made once, looped twice: the hooks keep Ray's re-iterable re-iterable (issue 38)
    assert "reiterable [4, 4]" in cp.stdout, cp.stdout
    small = [x for x in v.profile.loaders if not x.headline]
    assert [(x.epochs, x.batches) for x in small] == [(2, 8)], small
    assert lo.settings["prefetch_batches"] == 2
    assert lo.batches == BATCHES and lo.samples == 2048
    f = v.repeats[0]
    assert abs(f.wait_s + f.compute_s - f.epoch_s) < 1e-6
    assert f.wait_s >= BATCHES * (MAP_MS - STEP_MS) / 1e3, (f.wait_s, f.compute_s)
    assert r.profile.ray is not None


MAP_SPLIT_MS, STEP_SPLIT_MS, BLOCKS = 100.0, 5.0, 24


def test_ray_wait_split_by_rays_own_stats(tmp_path: Path) -> None:
    """Issue 39: a Ray Data loop's wait split by Ray's own iterator stats (the door reads
    ``iter_blocked_*`` around each batch). scripts/user_ray_split.py makes every steady wait
    production by construction (one block per read task, MAP_MS of map fused into it, one
    CPU, a step of 5 ms): Ray's ``production_wait`` must be the loop's own steady wait (its
    clock, batches 2+), within 15% + 50 ms; Ray's parts never exceed the wait; the part Ray
    leaves unattributed (the first batch's start-up) is said, and no recording run is made."""
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--analyze", "--", sys.executable,
                          helpers.script("user_ray_split.py"), str(MAP_SPLIT_MS),
                          str(STEP_SPLIT_MS), str(BLOCKS)], cwd=tmp_path, timeout=600,
                         RAY_USAGE_STATS_ENABLED="0")
    assert cp.returncode == 0, cp.stderr[-3000:]
    truth = next(json.loads(x[len("truth: "):]) for x in cp.stdout.splitlines()
                 if x.startswith("truth: "))
    v = helpers.load(out).variants[0]
    lo = next(lo for lo in v.profile.loaders if lo.headline)
    assert lo.batches == truth["batches"] == BLOCKS
    ray_parts = {s.name: s.wall_s for s in lo.stages if s.where == "ray"}
    prod = ray_parts.get("ray production_wait", 0.0)
    want = truth["rest_s"]
    assert abs(prod - want) <= 0.15 * want + 0.05, (ray_parts, truth)
    assert sum(ray_parts.values()) <= lo.wait_s + 1e-3, (ray_parts, lo.wait_s)
    line = v.notes["wait split"]
    assert "Ray Data's own split of the wait" in line and "production_wait" in line, line
    assert "not attributed to a stage by it" in line and "before the first batch" in line, line
    assert "Ray Data's own split of the wait" in cp.stdout
    # Ray's own figures are never taken for the job's stallbench.stage marks, and no
    # recording run is made for a Ray loop
    assert "cannot ablate stallbench.stage('ray" not in cp.stdout, cp.stdout
    assert "recording every fetch call" not in cp.stderr + cp.stdout
    names = {a.name for a in v.profile.analysis.ablations}
    assert not any(n.startswith("stage:ray") for n in names), names
