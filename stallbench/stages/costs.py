"""Costs injected on purpose: emulated waits and calibrated CPU burn.

Ground-truth tests and what-if studies need costs that are known by construction. Two kinds:
- *waits* (remote storage, a network link, an accelerator step) leave the CPU free, so they
  sleep; ``time.sleep`` overshoots by ~0.1-0.2 ms here, so we sleep short and spin the rest.
- *CPU work* (``cpu_cost_us_per_row``) must really occupy a core, so it spins on the thread's
  own CPU clock: the cost is exact in CPU time whatever else the machine is doing.
"""

from __future__ import annotations

import time

_SLEEP_SLACK_S = 0.0005


def precise_wait(seconds: float) -> None:
    """Block for ``seconds`` of wall time without burning CPU for all but the last ~0.5 ms."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    coarse = seconds - _SLEEP_SLACK_S
    if coarse > 0:
        time.sleep(coarse)
    while time.perf_counter() < end:
        pass


def burn_cpu(seconds: float) -> None:
    """Consume ``seconds`` of this thread's CPU time (not wall time)."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for _ in range(200):
            x += 1
