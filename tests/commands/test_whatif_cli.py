"""``stallbench whatif``: inputs (files, directories, newest per scenario), collapsed rows, and
wording that follows the axis. Runs the real command on the committed example results."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from stallbench.commands.whatif import collapse_rows

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "results" / "examples"


def whatif(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallbench", "whatif", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_collapse_rows_merges_identical_consecutive_predictions() -> None:
    rows = [[0, "10", "5%", "fetch", "a"], [1, "20", "0%", "compute", "b"],
            [2, "20", "0%", "compute", "b"], [3, "20", "0%", "compute", "b"],
            [4, "30", "0%", "compute", "c"], [5, "20", "0%", "compute", "b"]]
    assert [r[0] for r in collapse_rows(rows)] == ["0", "1..3", "4", "5"]


def test_directory_gives_the_newest_result_of_each_scenario(tmp_path: Path) -> None:
    r = whatif(str(EXAMPLES), "--workers", "0..16")
    assert r.returncode == 0, r.stderr
    # both committed examples (two scenarios), each with its own table
    assert r.stdout.count("what-if for ") == 2
    assert "PREDICTED samples/s" in r.stdout
    # 17 counts, but saturated counts collapse into one range row
    assert "..16 " in r.stdout


def test_several_files_and_newest_of_one_scenario(tmp_path: Path) -> None:
    data = json.loads((EXAMPLES / "schema-v2.json").read_text())
    newer = tmp_path / "a.json"          # named first, created last: creation time decides
    newer.write_text(json.dumps(data))
    data["created_utc"] = "2000-01-01T00:00:00+00:00"
    older = tmp_path / "b.json"
    older.write_text(json.dumps(data))
    r = whatif(str(older), str(newer))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("what-if for ") == 1 and "a.json" in r.stdout


def test_knee_wording_follows_the_axis() -> None:
    r = whatif(str(EXAMPLES / "schema-v2.json"), "--nodes", "1..8")
    assert r.returncode == 0, r.stderr
    knee = next(line for line in r.stdout.splitlines() if line.startswith("knee:"))
    assert "node" in knee and "worker" not in knee, knee
    head = next(line for line in r.stdout.splitlines() if "PREDICTED samples/s" in line)
    assert head.startswith("nodes")


def test_every_prediction_names_its_model_and_the_back_test_is_printed() -> None:
    r = whatif(str(EXAMPLES / "schema-v2.json"), "--workers", "0..4")
    assert r.returncode == 0, r.stderr
    head = next(line for line in r.stdout.splitlines() if "PREDICTED samples/s" in line)
    assert "model" in head.split()
    rows = [line for line in r.stdout.splitlines()
            if re.fullmatch(r"\d+(\.\.\d+)?", (line.split() or [""])[0])]
    assert rows and all(("one-point" in row) or ("contention" in row) for row in rows)
    assert "back-test (each measured point predicted by a fit without it" in r.stdout
    bad = whatif(str(EXAMPLES / "schema-v2.json"), "--variant", "num_workers=1,ranks=1", "--model",
                 "contention")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--model" in bad.stderr

