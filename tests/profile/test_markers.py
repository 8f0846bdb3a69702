"""``stallbench.watch`` and ``stallbench.stage``: a stage timed in DataLoader workers reaches
the trainer's result (wall and thread CPU), a watched generator is a loader stream of its own;
unprofiled, both do nothing; ``import stallbench`` imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import profile_helpers as helpers

DECODE_MS, GEN_MS = 3.0, 10.0


@pytest.mark.groundtruth
def test_stage_in_workers_and_watch_are_measured(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cp = helpers.profile(["--out", str(out), "--", sys.executable,
                          helpers.script("marked_train.py"), str(DECODE_MS), str(GEN_MS)],
                         cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    r = helpers.load(out)
    loaders = {lo.name: lo for lo in r.variants[0].profile.loaders}
    assert set(loaders) == {"Decoded#0", "slow_items#1"}
    decode = next(s for s in loaders["Decoded#0"].stages if s.name == "decode")
    assert decode.where == "workers" and decode.calls == 64
    # the thread's CPU clock is the truth the burn spun on: exact whatever the load
    assert abs(decode.cpu_s - 64 * DECODE_MS / 1e3) <= 0.10 * 64 * DECODE_MS / 1e3, decode
    assert decode.wall_s >= decode.cpu_s * 0.99
    watched = loaders["slow_items#1"]
    assert watched.kind == "stallbench.watch" and watched.batches == 20
    want = 20 * GEN_MS / 1e3
    assert want <= watched.wait_s <= want * 1.5, watched.wait_s
    # the headline is the stream with most batches: the watched generator (20 > 8)
    assert loaders["slow_items#1"].headline


def test_unprofiled_markers_do_nothing_and_import_little(tmp_path: Path) -> None:
    cp = subprocess.run([sys.executable, helpers.script("marked_train.py"), "1", "1", "--plain"],
                        cwd=tmp_path, env=helpers.env(), capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert "done True" in cp.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys, stallbench; stallbench.stage; "
                            "print(sorted(m for m in sys.modules if m.startswith(('stallbench', "
                            "'torch', 'numpy', 'pyarrow'))))"], cwd=tmp_path, env=helpers.env(),
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == ("['stallbench', 'stallbench.profile', "
                                    "'stallbench.profile.markers']"), probe
