"""The slowest tests of a suite run and each pass's time, from pytest's JUnit XML reports.

``tests/run_suite.sh`` prints this at the end of every run (so CI's log shows it), so that a
test that makes the suite slow is seen the day it lands. Usage::

    python tests/slowest.py [--top N] "LABEL=REPORT.xml=WALL_SECONDS" ...

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


def summary(passes: list[tuple[str, Path, float]], top: int) -> str:
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
        total += wall
        if not report.exists():
            lines.append(f"{label}: {wall:.0f} s, no report written")
            continue
        cs = cases(report)
        lines.append(f"{label}: {wall:.0f} s wall, {len(cs)} tests, "
                     f"{sum(c.seconds for c in cs):.0f} s of test time")
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
        passes.append((label, Path(report), float(wall)))
    print(summary(passes, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
