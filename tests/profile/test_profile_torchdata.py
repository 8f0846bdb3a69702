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


@pytest.mark.parametrize("kind,want", [("stateful", "torchdata.StatefulDataLoader"),
                                       ("nodes", "torchdata.nodes.Loader")])
def test_a_torchdata_loop_is_measured(tmp_path: Path, kind: str, want: str) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", helpers.sys.executable,
                          helpers.script("user_torchdata.py"), kind, str(ITEM_MS), str(STEP_MS)],
                         cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    t = helpers.truth(cp.stdout)
    v = helpers.load(out).variants[0]
    f = v.repeats[0]
    head = next(lo for lo in v.profile.loaders if lo.headline)
    assert head.kind == want, head
    assert (f.batches, f.samples) == (t["batches"], t["samples"]), (f, t)
    assert abs(f.wait_s - t["next_s"]) <= 0.10 * t["next_s"] + 0.01, (f.wait_s, t)
    assert abs(f.compute_s - t["step_s"]) <= 0.10 * t["step_s"] + 0.01, (f.compute_s, t)
    assert f.wait_s > 0.2 * f.epoch_s        # items cost more than the step: a real stall
