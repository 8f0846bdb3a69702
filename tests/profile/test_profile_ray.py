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
