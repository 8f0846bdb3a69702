"""The issue's "done when": `stallbench profile --set dataloader.num_workers=0,2 -- python
examples/train_parquet.py` prints a table per loader and variant and a recommendation, writes a
result that `report` renders and `gate` compares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import profile_helpers as helpers

pytestmark = pytest.mark.e2e


def test_example_profiled_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cp = helpers.profile(["--out", str(out), "--repeats", "2", "--set",
                          "dataloader.num_workers=0,2", "--", sys.executable,
                          str(helpers.ROOT / "examples" / "train_parquet.py")], cwd=tmp_path,
                         TRAIN_PARQUET_DATA=str(tmp_path / "data"))
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("variant ") and "loader" in x)
    rows = lines[head + 2: head + 4]
    assert rows[0].startswith("num_workers=0  ParquetDataset#0 *")
    assert rows[1].startswith("num_workers=2  ParquetDataset#0 *")
    assert any(x.startswith("recommendation: ") and "measured" in x for x in lines)
    r = helpers.load(out)
    assert [v.name for v in r.variants] == ["num_workers=0", "num_workers=2"]
    assert all(len(v.repeats) == 2 and v.repeats[0].batches == 64 for v in r.variants)
    # the stored best speedup is the whole runs' ratio (the report prints it as "whole run"
    # beside the steady one); a profile once stored the steady ratio under that name
    if r.analysis.best_variant:
        best, base = r.variant(r.analysis.best_variant), r.variants[0]
        assert r.analysis.best_speedup == pytest.approx(
            best.throughput_samples_s.median / base.throughput_samples_s.median)
    assert r.profile.torch and r.profile.argv[-1].endswith("train_parquet.py")
    rep = subprocess.run([sys.executable, "-m", "stallbench", "report", str(out), "-o",
                          str(tmp_path / "r.html")], cwd=tmp_path, env=helpers.env(),
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert "num_workers=2" in (tmp_path / "r.html").read_text()
    gate = subprocess.run([sys.executable, "-m", "stallbench", "gate", "--baseline", str(out),
                           "--current", str(out)], cwd=tmp_path, env=helpers.env(),
                          capture_output=True, text=True, timeout=300)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "user_train" not in gate.stdout and "train_parquet  num_workers=2  throughput" in gate.stdout
