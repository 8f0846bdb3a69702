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

from pathlib import Path

import pytest

import profile_helpers as helpers

pytest.importorskip("torchdata", reason="torchdata is in the dev extra: pip install -e '.[dev]'")

ITEM_MS, STEP_MS = 3.0, 5.0
KINDS = {"stateful": "torchdata.StatefulDataLoader", "nodes": "torchdata.nodes.Loader"}


def test_torchdata_loops_are_measured(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script("user_torchdata.py"), str(ITEM_MS), str(STEP_MS)],
                         cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    truth = helpers.truth(cp.stdout)
    loaders = {lo.kind: lo for lo in helpers.load(out).variants[0].profile.loaders}
    assert sorted(loaders) == sorted(KINDS.values()), sorted(loaders)
    for name, kind in KINDS.items():
        t, lo = truth[name], loaders[kind]
        assert (lo.batches, lo.samples) == (t["batches"], t["samples"]), (name, lo, t)
        assert abs(lo.wait_s - t["next_s"]) <= 0.10 * t["next_s"] + 0.01, (name, lo.wait_s, t)
        assert abs(lo.step_s - t["step_s"]) <= 0.10 * t["step_s"] + 0.01, (name, lo.step_s, t)
        assert lo.wait_s > 0.2 * lo.epoch_s      # items cost more than the step: a stall
