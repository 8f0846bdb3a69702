"""torchdata's doors (issue 40), each as a user runs it (tests/profile/scripts/user_torchdata.py,
importing nothing of stallbench): a ``StatefulDataLoader`` (its ``__iter__`` does not call
DataLoader's: it ended in "no DataLoader ... was seen", exit 2) and a torchdata.nodes
``Loader`` (no DataLoader at all). The truth is the loop's own seconds in ``iter()`` and
``next()`` (a nodes ``iter()`` starts its threads) and between batches; profile's wait and
step must match them within 10% (+10 ms), its batches and samples exactly (samples from the
batch structure: dicts of paths, lists of samples).

torchdata is in the ``dev`` extra (pinned); without it these tests are skipped, saying so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import loadcheck
import profile_helpers as helpers

pytest.importorskip("torchdata", reason="torchdata is in the dev extra: pip install -e '.[dev]'")

ITEM_MS, STEP_MS = 3.0, 5.0
KINDS = {"stateful": "torchdata.StatefulDataLoader", "nodes": "torchdata.nodes.Loader"}


def _case(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script("user_torchdata.py"), str(ITEM_MS), str(STEP_MS)],
                         cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    truth = helpers.truth(cp.stdout)
    loaders = {lo.kind: lo for lo in helpers.load(out).variants[0].profile.loaders}
    assert sorted(loaders) == sorted(KINDS.values()), sorted(loaders)
    problems = []
    for name, kind in KINDS.items():
        t, lo = truth[name], loaders[kind]
        assert (lo.batches, lo.samples) == (t["batches"], t["samples"]), (name, lo, t)
        if abs(lo.wait_s - t["next_s"]) > 0.10 * t["next_s"] + 0.01:
            problems.append(f"{name}: wait {lo.wait_s:.3f} s vs the loop's {t['next_s']:.3f} s")
        if abs(lo.step_s - t["step_s"]) > 0.10 * t["step_s"] + 0.01:
            problems.append(f"{name}: step {lo.step_s:.3f} s vs the loop's {t['step_s']:.3f} s")
        if not lo.wait_s > 0.2 * lo.epoch_s:      # items cost more than the step: a stall
            problems.append(f"{name}: wait {lo.wait_s:.3f} s of {lo.epoch_s:.3f} s, no stall")
    return problems


@pytest.mark.groundtruth     # figures read off timings: the timing pass (tests/run_suite.sh)
def test_torchdata_loops_are_measured(tmp_path: Path) -> None:
    # sleeps: the job and its threads need well under a core
    loadcheck.attempts("torchdata", lambda: _case(tmp_path), 3, 1.0)
