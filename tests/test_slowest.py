"""tests/slowest.py: the summary tests/run_suite.sh prints at the end of every run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.executors.test_ray" name="test_a[1]" time="12.5" />
<testcase classname="tests.test_cli" name="test_b" time="0.25"><skipped message="x"/></testcase>
<testcase classname="tests.gate.test_gate" name="test_c" time="40.0"><failure message="y"/></testcase>
</testsuite></testsuites>
"""


def test_the_slowest_tests_of_every_pass_and_each_pass_time(tmp_path: Path) -> None:
    (tmp_path / "a.xml").write_text(REPORT)
    (tmp_path / "c.xml").write_text(REPORT.replace('tests="3"', 'tests="3" time="77.5"'))
    (tmp_path / "b.xml").write_text(REPORT.replace("test_a[1]", "test_d").replace('12.5', '20'))
    r = subprocess.run([sys.executable, str(HERE / "slowest.py"), "--top", "2",
                        f"parallel pass (2 worker(s))={tmp_path / 'a.xml'}=100",
                        f"timing pass (alone)={tmp_path / 'b.xml'}=61",
                        f"lost={tmp_path / 'missing.xml'}=3",
                        f"lane={tmp_path / 'c.xml'}=beside"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "the 2 slowest tests (setup + call + teardown):"
    assert lines[1].split() == ["40.0", "s", "tests/gate/test_gate.py::test_c",
                                "[parallel", "pass,", "failed]"]
    assert lines[2].split()[:3] == ["40.0", "s", "tests/gate/test_gate.py::test_c"]
    assert "parallel pass (2 worker(s)): 100 s wall, 3 tests, 53 s of test time" in lines
    assert "timing pass (alone): 61 s wall, 3 tests, 60 s of test time" in lines
    assert "lost: 3 s, no report written" in lines
    assert "lane: 78 s wall (not in the total), 3 tests, 53 s of test time" in lines
    assert lines[-1] == "tests in all: 164 s (2.7 min)"
