"""Foreign load: CPU that processes outside the run took from the machine while it ran.

A shared machine is the rule, not the exception (a CI runner, a laptop, a VM). Load average
is recorded at the start of a result but says nothing about *this* run, and a loaded machine
slows a CPU-bound pipeline by exactly what it takes. So every measured run is bracketed by
two readings:

    busy     = machine-wide user + nice + system + irq + softirq CPU seconds (psutil.cpu_times;
               guest time is already inside user on Linux)
    own      = CPU seconds of the run's own process tree: the trainer (all threads) and every
               descendant alive at the reading (user + system), each with the CPU of the
               children it has reaped (children_user + children_system): forked loader workers
               that exit during the run land in the trainer's reaped-children clock, Ray
               workers a local raylet reaps land in the raylet's; plus the pids the executor
               names (``Executor.worker_pids``)
    foreign_cores = max(delta busy - delta own, 0) / wall seconds between the readings
    steal_cores   = delta steal / wall (hypervisor steal, where /proc/stat reports it)

A process of the run that exits and is reaped by none of the processes read takes its CPU
with it: a double fork, and every Ray worker, since Ray's raylet ignores SIGCHLD and the kernel
then reaps its children without adding their CPU to anyone's (measured on a profiled Ray Data
job on a quiet machine: 5.5 of 14.6 CPU-s gone that way, "foreign" 0.35 cores). So a meter
given the tree as it goes (``observe``, the resource sampler's tick) also keeps each process's
last CPU reading, and ``own`` is the larger of the two lower bounds: the reading above, and
the sum over every process seen of the CPU it took since the first reading (or since it was
born). ``foreign_cores`` stays an upper bound of the true foreign load (what a process did after
its last observation is missed); a Ray cluster stallbench did not start (``ray_address``) on
this machine counts as foreign.
Clock ticks are 10 ms, so a run of 0.5 s on 2 cores reads to about +-0.05 cores.

**Heavy** load is ``taken_cores`` (foreign + steal) above ``HEAVY_CORES`` = 0.25 cores: a
quarter of a core is about what moves a CPU-bound 2-core measurement by the gate's 10%.
``stallbench run`` and the report warn above it, and the gate does not call a change slower or
faster from repeats that ran above it (``stallbench.gate.rule.busy_note``).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import psutil

from ..results import ForeignLoad, Result

HEAVY_CORES = 0.25


def _machine() -> tuple[float, float | None]:
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    steal = getattr(t, "steal", None)
    return busy, steal


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


def run_tree(extra_pids: Iterable[int] = ()) -> list[psutil.Process]:
    """This process, its descendants and ``extra_pids``, each once: the run's processes."""
    me = psutil.Process()
    procs = [me]
    try:
        procs += me.children(recursive=True)
    except psutil.Error:
        pass
    seen = {p.pid for p in procs}
    for pid in extra_pids:
        if pid not in seen:
            seen.add(pid)
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
    return procs


def own_cpu_s(extra_pids: Iterable[int] = ()) -> float:
    """CPU seconds so far of this process, its descendants (with what they reaped) and
    ``extra_pids``, each process once."""
    return sum(_cpu(p) for p in run_tree(extra_pids))


def _self_cpu(p: psutil.Process) -> tuple[tuple[int, float], float] | None:
    """(identity, CPU seconds of the process itself) or None once it cannot be read; a pid
    reused by a new process is a new identity (its creation time)."""
    try:
        t = p.cpu_times()
        return (p.pid, p.create_time()), t.user + t.system
    except psutil.Error:
        return None


class LoadMeter:
    """Reads the machine and the run's tree before and after a run (outside its timed
    region): ``with LoadMeter(executor.worker_pids) as m: ...; m.load``. ``observe`` (called
    with the tree as the run goes) keeps the CPU of processes that vanish unreaped."""

    def __init__(self, extra_pids: Callable[[], Sequence[int]] = lambda: ()) -> None:
        self.extra_pids = extra_pids
        self.load: ForeignLoad | None = None
        self._base: dict[tuple[int, float], float] = {}
        self._last: dict[tuple[int, float], float] = {}
        self._before: set[int] = set()     # pids that existed when the window opened

    def observe(self, procs: Iterable[psutil.Process]) -> None:
        """Record the CPU each of ``procs`` (the run's tree) has taken so far. A process
        first seen now that existed before the window (a runtime's worker the extra pids
        named late) counts from now: its CPU before is not the run's."""
        for p in procs:
            got = _self_cpu(p)
            if got is None:
                continue
            key, cpu = got
            if key not in self._last and key not in self._base and key[0] in self._before:
                self._base[key] = cpu
            self._last[key] = cpu

    def _seen_cpu_s(self) -> float:
        """CPU the processes observed took inside the window, each once."""
        return sum(max(cpu - self._base.get(key, 0.0), 0.0) for key, cpu in self._last.items())

    def _read(self) -> tuple[float, float, float | None, float]:
        busy, steal = _machine()
        return time.perf_counter(), busy, steal, own_cpu_s(self._extra())

    def _extra(self) -> list[int]:
        try:
            return list(self.extra_pids())
        except Exception:  # noqa: BLE001 - a runtime gone mid-read: count what is left
            return []

    def __enter__(self) -> "LoadMeter":
        self._last.clear()
        self._base.clear()
        self._before = set(psutil.pids())
        self.observe(run_tree(self._extra()))
        self._base = dict(self._last)
        self._start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        t1, b1, s1, o1 = self._read()
        self.observe(run_tree(self._extra()))
        t0, b0, s0, o0 = self._start
        wall = max(t1 - t0, 1e-9)
        busy, own = max(b1 - b0, 0.0), max(o1 - o0, self._seen_cpu_s(), 0.0)
        foreign = max(busy - own, 0.0)
        steal = None if s0 is None or s1 is None else max(s1 - s0, 0.0) / wall
        self.load = ForeignLoad(wall_s=wall, busy_cpu_s=busy, own_cpu_s=own,
                                foreign_cpu_s=foreign, foreign_cores=foreign / wall,
                                steal_cores=steal, cores=float(psutil.cpu_count() or 1))


def heavy(load: ForeignLoad | None) -> bool:
    return load is not None and load.taken_cores > HEAVY_CORES


def busy_summary(result: Result) -> str | None:
    """One line when any full run of the result ran under heavy foreign load, else None."""
    runs = [(v.name, f.load) for v in result.variants for f in v.repeats]
    loads = [ld for _, ld in runs if ld is not None]
    bad = [ld for ld in loads if heavy(ld)]
    if not bad:
        return None
    worst = max(ld.taken_cores for ld in bad)
    median = sorted(ld.taken_cores for ld in loads)[len(loads) // 2]
    return (f"{len(bad)} of {len(loads)} measured runs ran while other processes "
            f"(and hypervisor steal) took more than {HEAVY_CORES:g} cores (median "
            f"{median:.2f}, worst {worst:.2f} of {bad[0].cores:g} cores): figures that need the CPU "
            f"are slower than on a quiet machine, and the gate will not call changes "
            f"slower/faster from these repeats")
