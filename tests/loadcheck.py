"""Measure, re-measure, and skip only above a stated load: how timing tests with injected
costs live on a shared machine.

A ground-truth case injects a known cost and checks the harness finds it. CPU that other
processes take meanwhile stretches what the case runs (a CPU burn spinning on its thread's
clock takes longer in wall time; workers get less than their core), so a case can be wrong
for the machine's sake. ``attempts`` measures up to N times, each bracketed by
``measure.load.LoadMeter`` (CPU taken by processes outside this test's process tree, plus
hypervisor steal), and:

- passes as soon as one attempt is right;
- skips, printing every attempt's problems and load, only when EVERY attempt was wrong AND
  ran with more than ``limit(need)`` cores taken: ``max(HEAVY_CORES, cores - need)``, i.e.
  other processes left the case less than the ``need`` cores it runs on (on a 2-core machine
  and a case that needs 1.25 cores: 0.75 cores, so one busy process is above it only if the
  case also failed every time);
- fails otherwise: wrong on a machine with room is a harness error.

``make test`` runs pytest with ``-rs``, so every skip prints its reason and figures.
"""

from __future__ import annotations

from typing import Callable

import psutil
import pytest

from stallbench.measure.load import HEAVY_CORES, LoadMeter


def limit(need: float) -> float:
    """Cores others may take before a case that runs on ``need`` cores has less than that."""
    return max(HEAVY_CORES, float(psutil.cpu_count() or 1) - need)


def attempts(name: str, check: Callable[[], list[str]], n: int, need: float) -> list[dict]:
    """Run ``check`` (returns what disagrees with the truth) up to ``n`` times; pass, skip or
    fail as the module docstring says. Returns the attempts (for a test to print)."""
    seen: list[dict] = []
    for _ in range(n):
        with LoadMeter() as m:
            problems = check()
        ld = m.load
        seen.append({"problems": problems,
                     "foreign_cores": round(ld.foreign_cores, 2) if ld else None,
                     "steal_cores": round(ld.steal_cores or 0.0, 3) if ld else None,
                     "taken_cores": round(ld.taken_cores, 2) if ld else None})
        if not problems:
            return seen
    lim = limit(need)
    if all(a["taken_cores"] is not None and a["taken_cores"] > lim for a in seen):
        pytest.skip(f"{name}: wrong in all {n} attempts, each while other processes and steal "
                    f"took more than {lim:.2f} cores (the case needs {need:g} of "
                    f"{psutil.cpu_count()}): {seen}")
    pytest.fail(f"{name}: wrong in all {n} attempts: {seen}")
