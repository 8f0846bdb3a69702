"""Class 3 of issue 13: ``[executor] ray_pool = "actors"`` runs, end to end, from the CLI.

It never ran: the warm-up passed a plain function to ``map_batches`` with an actor pool, Ray
refused, and a broad ``except`` reported "the Ray cluster could not run a producer task"
(fixed in issue 12; ``tests/executors/test_ray.py::test_actor_pool_runs_end_to_end`` covers
the executor in-process). Here: the real command, a scenario file, nothing patched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reliability_helpers import TINY, sb, write


@pytest.mark.ray
def test_actor_pool_from_the_cli(tmp_path: Path, env: dict) -> None:
    pytest.importorskip("ray")
    write(tmp_path, TINY + '[executor]\nkind = "ray"\ncpus = 1\nconcurrency = 1\n'
                           'ray_pool = "actors"\n')
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # Not closed (reported in issue 13's notes): Ray's C++ core logs, at ERROR on the driver's
    # stderr, that an actor pool's constructor arguments live in the object store (Ray Data
    # puts them there); no Python-side switch silences that one line. Nothing else may appear.
    other = [ln for ln in r.stderr.splitlines()
             if not ("core_worker.cc" in ln and "constructor arguments in the object store" in ln)]
    assert not other, r.stderr[-3000:]
    (result,) = (tmp_path / "out").glob("tiny-*.json")
    v = json.loads(result.read_text())["variants"][0]
    ray = v["repeats"][0]["executor_figures"]["ray"]
    assert ray["pool"] == "actors" and ray["complete"], ray
    assert any("Producer" in op["name"] for op in ray["operators"]), ray["operators"]
    assert v["repeats"][0]["samples"] == 4096
