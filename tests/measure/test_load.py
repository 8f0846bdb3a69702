"""Foreign load (``measure.load``): a known CPU burn outside the run's process tree is counted
as foreign, the run's own work (its threads, a child it reaps) is not."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from stallbench.measure.load import HEAVY_CORES, LoadMeter, heavy, own_cpu_s
from stallbench.results import ForeignLoad
from stallbench.stages.costs import burn_cpu

pytestmark = pytest.mark.groundtruth

TICK = 0.05     # /proc/stat and the process clocks count 10 ms ticks; a few per reading


def _child_burn(seconds: float) -> None:
    burn_cpu(seconds)


def test_own_threads_and_reaped_children_are_not_foreign() -> None:
    with LoadMeter() as m:
        burn_cpu(0.3)                                       # the trainer's own thread
        p = multiprocessing.get_context("fork").Process(target=_child_burn, args=(0.3,))
        p.start()
        p.join()                                            # reaped: its CPU is ours
    ld = m.load
    assert ld is not None
    assert ld.own_cpu_s >= 0.6 - TICK, ld                   # both burns counted as the run's
    assert ld.busy_cpu_s >= ld.own_cpu_s - TICK, ld         # the machine saw at least that


def test_a_burner_outside_the_tree_is_foreign() -> None:
    # A process the run did not start (the shell that launched it exits at once, so it is
    # nobody's child here): a known foreign CPU consumer, its own clock the truth.
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while 1: pass' "
                          ">/dev/null 2>&1 </dev/null & echo $!"],
                         capture_output=True, text=True, timeout=10)
    pid = int(out.stdout.strip())
    try:
        burner = psutil.Process(pid)
        assert pid not in {c.pid for c in psutil.Process().children(recursive=True)}
        time.sleep(0.2)
        c0 = sum(burner.cpu_times()[:2])
        with LoadMeter() as m:
            time.sleep(1.0)
        truth = sum(burner.cpu_times()[:2]) - c0
        ld = m.load
        assert ld is not None
        # everything the burner took is in the foreign figure (other processes may add more)
        assert ld.foreign_cpu_s >= truth - TICK, (ld, truth)
        assert ld.own_cpu_s < 0.2, ld                        # we slept
        assert ld.foreign_cores == pytest.approx(ld.foreign_cpu_s / ld.wall_s)
    finally:
        os.kill(pid, signal.SIGKILL)


_AUTO_REAPED = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from stallbench.stages.costs import burn_cpu
signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # as Ray's raylet: children auto-reaped
pid = os.fork()
if pid == 0:
    burn_cpu(0.6)
    os._exit(0)
while True:                                        # until the kernel has reaped it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.02)
"""


def test_a_child_reaped_by_the_kernel_is_still_the_runs_when_observed() -> None:
    # A grandchild whose parent ignores SIGCHLD (Ray's raylet does) is reaped by the kernel:
    # its CPU reaches nobody's children clock, and the readings before and after alone miss
    # it. Observed as the run goes (the sampler's tick), its last reading is kept.
    from pathlib import Path
    from stallbench.measure.sampler import Sampler
    code = _AUTO_REAPED.format(root=str(Path(__file__).resolve().parents[2]))
    runs = {}
    for observed in (False, True):
        m = LoadMeter()
        with m, Sampler(interval_s=0.05, on_tree=m.observe if observed else None):
            subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        runs[observed] = m.load
    # both runs start the same Python; only the observed one keeps the 0.6 s burn (its last
    # tick up to 50 ms before the end, and a tick of start-up noise)
    gained = runs[True].own_cpu_s - runs[False].own_cpu_s
    assert gained >= 0.6 - 0.05 - 2 * TICK, runs


def test_own_cpu_counts_extra_pids_once() -> None:
    me = os.getpid()
    assert own_cpu_s([me, me]) == pytest.approx(own_cpu_s(), abs=TICK)


def test_heavy_is_foreign_plus_steal_above_the_level() -> None:
    light = ForeignLoad(1.0, 1.0, 0.9, 0.1, 0.1, steal_cores=0.1, cores=2)
    assert not heavy(light) and not heavy(None)
    assert heavy(ForeignLoad(1.0, 1.0, 0.5, 0.5, 0.2, steal_cores=HEAVY_CORES, cores=2))
