"""The slowest tests of a suite run and each pass's time, from pytest's JUnit XML reports.

``tests/run_suite.sh`` prints this at the end of every run (so CI's log shows it), so that a
test that makes the suite slow is seen the day it lands. Usage::

    python tests/slowest.py [--top N] "LABEL=REPORT.xml=WALL_SECONDS" ...

``WALL_SECONDS`` is ``beside`` for a pass that ran beside another (``run_suite.sh``'s waits
lane): its wall time is pytest's own session time from its report, not added to the total.

A test's time is pytest's for that test: setup, call and teardown together (a module
fixture's setup is charged to the first test that uses it). A report that is missing (a pass
that crashed before writing it) is said, not an error: the suite's own exit says what failed.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    nodeid: str
    seconds: float
    outcome: str


def cases(report: Path) -> list[Case]:
    """Every test case of one JUnit report."""
    out = []
    for tc in ET.parse(report).getroot().iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        path = cls.replace(".", "/") + ".py"        # tests.executors.test_ray -> its file
        outcome = ("failed" if tc.find("failure") is not None or tc.find("error") is not None
                   else "skipped" if tc.find("skipped") is not None else "passed")
        out.append(Case(f"{path}::{name}", float(tc.get("time", 0) or 0), outcome))
    return out


def session_seconds(report: Path) -> float:
    """pytest's own wall time of the session that wrote ``report``."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return float(suite.get("time", 0) or 0) if suite is not None else 0.0


def summary(passes: list[tuple[str, Path, float | None]], top: int) -> str:
    """``passes``: (label, report, wall seconds, or None for a pass run beside another)."""
    lines, every = [], []
    for label, report, _ in passes:
        if report.exists():
            every += [(c, label) for c in cases(report)]
    every.sort(key=lambda x: -x[0].seconds)
    lines.append(f"the {min(top, len(every))} slowest tests (setup + call + teardown):")
    for c, label in every[:top]:
        lines.append(f"  {c.seconds:7.1f} s  {c.nodeid}  [{label.split(' (')[0]}"
                     f"{', ' + c.outcome if c.outcome != 'passed' else ''}]")
    total = 0.0
    for label, report, wall in passes:
        total += wall or 0.0
        if not report.exists():
            lines.append(f"{label}: {wall or 0:.0f} s, no report written")
            continue
        cs = cases(report)
        took = session_seconds(report) if wall is None else wall
        lines.append(f"{label}: {took:.0f} s wall{' (not in the total)' if wall is None else ''}"
                     f", {len(cs)} tests, {sum(c.seconds for c in cs):.0f} s of test time")
    lines.append(f"tests in all: {total:.0f} s ({total / 60:.1f} min)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--top", type=int, default=15)
    p.add_argument("passes", nargs="+", metavar="LABEL=REPORT=WALL_S")
    args = p.parse_args(argv)
    passes = []
    for spec in args.passes:
        label, report, wall = spec.rsplit("=", 2)
        passes.append((label, Path(report), None if wall == "beside" else float(wall)))
    print(summary(passes, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
