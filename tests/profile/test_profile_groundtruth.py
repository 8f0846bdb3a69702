"""Ground truth: an ordinary PyTorch script (tests/profile/scripts/user_train.py, importing
nothing of stallbench) with a known per-item cost and a known step, profiled with 0 and 2
loader workers; stallbench must recover the exposed stall within 10%.

The costs are sleeps, and the truth is what the script measured of them itself (every item's
cost, the loop's own step and its own seconds in ``next()``), so scheduling noise on a busy
machine moves the truth and the measurement together. With W workers, each batch of B items
costs P = B x item on one worker, and in steady state the loop waits per batch
max(P / W - C, 0), C its step; with 0 workers it waits P per batch (the items are made in
its own ``next()``). ``loadcheck.attempts`` re-measures and skips, with the figures, only
when every attempt was wrong while other processes left the case too little CPU.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

import profile_helpers as helpers
import loadcheck

pytestmark = pytest.mark.groundtruth

ITEM_MS, STEP_MS, BATCH = 4.0, 12.0, 16


def _case(tmp_path: Path, workers: int) -> list[str]:
    data, out = tmp_path / "data", tmp_path / "out"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script("user_train.py"), str(data), str(workers),
                          str(ITEM_MS), str(STEP_MS)], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    t = helpers.truth(cp.stdout)
    items = helpers.item_seconds(data)
    r = helpers.load(out)
    v = r.variants[0]
    f = v.repeats[0]
    problems = []
    if f.batches != t["batches"]:
        problems.append(f"batches {f.batches} != {t['batches']}")
    # the loop's own seconds in next() and between batches: the same clocks from outside
    if abs(f.wait_s - t["next_s"]) > 0.10 * t["next_s"] + 0.01:
        problems.append(f"wait {f.wait_s:.3f} s vs the loop's own next() {t['next_s']:.3f} s")
    if abs(f.compute_s - t["step_s"]) > 0.10 * t["step_s"]:
        problems.append(f"step {f.compute_s:.3f} s vs the loop's own {t['step_s']:.3f} s")
    per_batch_p = statistics.mean(items) * BATCH
    step = t["step_s"] / t["batches"]
    if workers == 0:
        want = sum(items)                       # every item made inside next()
        got = f.wait_s
        label = "exposed stall (0 workers)"
    else:
        ph = f.phases
        assert ph is not None and ph.has_steady, ph
        want = max(per_batch_p / workers - step, 0.0) * ph.steady_batches
        got = ph.steady_wait_s
        label = f"steady exposed stall ({workers} workers)"
    if abs(got - want) > 0.10 * want:
        problems.append(f"{label}: {got:.3f} s measured vs {want:.3f} s truth "
                        f"({got / want - 1:+.1%})")
    stage = next(s for s in v.profile.loaders[0].stages if s.name == "dataset.__getitem__")
    if abs(stage.wall_s - sum(items)) > 0.10 * sum(items):
        problems.append(f"dataset.__getitem__ {stage.wall_s:.3f} s vs items {sum(items):.3f} s")
    if stage.calls != len(items):
        problems.append(f"dataset.__getitem__ calls {stage.calls} != items {len(items)}")
    return problems


@pytest.mark.parametrize("workers", [0, 2])
def test_exposed_stall_recovered(tmp_path: Path, workers: int) -> None:
    # sleeps need little CPU: the trainer and its workers need well under a core each
    loadcheck.attempts(f"profile[{workers}]", lambda: _case(tmp_path, workers), 3, 1.0)
