"""Background resource sampler: CPU per core, memory of the whole producer tree, object store, GPU
utilisation and GPU memory (NVML, where a GPU exists).

Runs in a thread at a coarse period (default 100 ms) so it costs well under 1% of a core.
Memory is summed over the trainer, its children (loader workers) and any extra pids an executor
names (Ray workers), because a loader's memory is the point of bulk-vs-streaming comparisons.

The figure is the tree's **PSS** (proportional set size) sum, not its RSS sum: loader workers are
forked, so they share the trainer's heap copy-on-write and the shared-memory batches they hand
over; summing RSS counts those pages once per process (a 2-worker loader looks ~3x its real
size). Shared memory the loader creates (torch shared tensors, the single-buffer pool) is
counted once per object at its allocated size instead of by PSS, because pages handed over
and not yet touched by the trainer are in no process's PSS (see ``tree_memory_bytes``).
Results call it ``peak_pss_mb`` and the series ``pss_mb``; the raw RSS sum is kept beside it
as ``rss_sum_mb``. Where PSS cannot be read, that process counts its
RSS.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterable

import psutil

from ..results import Resources


class _Gpu:
    """NVML, only where a GPU exists; never required."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no driver, no library, no device: all mean "no GPU"
            self.handles = []

    def util(self) -> list[float]:
        return [float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles]

    def memory_mb(self) -> list[float]:
        """Device memory in use per GPU (NVML: every process's, the caching allocator's
        reserve included, which is what a co-located job would find taken)."""
        return [self.nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20 for h in self.handles]


def gpu_info() -> list[dict[str, Any]]:
    g = _Gpu()
    out = []
    for h in g.handles:
        name = g.nvml.nvmlDeviceGetName(h)
        out.append({"name": name.decode() if isinstance(name, bytes) else name,
                    "memory_mb": g.nvml.nvmlDeviceGetMemoryInfo(h).total / 2**20})
    return out


def _tree(proc: psutil.Process, extra_pids: Iterable[int] = ()) -> list[psutil.Process]:
    """The trainer, its descendants (loader workers) and extra pids (Ray workers), once each."""
    procs = [proc]
    try:
        procs += proc.children(recursive=True)
    except psutil.Error:
        pass
    for pid in extra_pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    seen: set[int] = set()
    out = []
    for p in procs:
        if p.pid not in seen:
            seen.add(p.pid)
            out.append(p)
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def _pss(p: psutil.Process) -> int:
    """Proportional set size (shared pages split between their users); RSS where the kernel
    or permissions do not give it (e.g. another user's Ray worker)."""
    try:
        return p.memory_full_info().pss
    except (psutil.Error, AttributeError, OSError):
        return _rss(p)


# Shared memory the loader itself creates: torch's shared tensors, our buffer pool and any
# other anonymous shared mapping (and memfds). Other shared mappings (files on disk, Ray's
# object store, which is reported on its own) stay with plain PSS.
_OWN_SHM = ("/dev/shm/torch_", "/dev/zero", "/memfd:", "[anon_shmem]")


def _rollup_kb(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    out = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0])
    return out if "Pss" in out else None


def _shm_objects(pid: int, into: dict[tuple[str, int], int]) -> None:
    """Add the loader's shared-memory objects mapped by ``pid`` (keyed by device and inode, so
    one object mapped by several processes counts once) with their allocated bytes."""
    try:
        with open(f"/proc/{pid}/maps") as fh:
            lines = fh.readlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[1][3:4] != "s" or not parts[5].startswith(_OWN_SHM):
            continue
        key = (parts[3], int(parts[4]))
        if key in into:
            continue
        try:
            st = os.stat(f"/proc/{pid}/map_files/{parts[0]}")
            into[key] = st.st_blocks * 512           # pages allocated, resident or not
        except OSError:
            lo, hi = parts[0].split("-")
            into[key] = int(hi, 16) - int(lo, 16)


def tree_memory_bytes(procs: list[psutil.Process]) -> int:
    """The tree's memory: per process PSS without its shared-memory part, plus every shared
    memory object the tree maps, counted once at its allocated size.

    Plain PSS is not enough for batches handed over in shared memory: a page a worker wrote
    and then unmapped, which the trainer has mapped but not yet touched (a bulk epoch waiting
    to be trained on), is in no process's page tables and so in nobody's PSS, yet it is
    memory the job holds. Falls back to plain PSS (or RSS) where smaps_rollup is missing.
    """
    total = 0
    shm: dict[tuple[str, int], int] = {}
    for p in procs:
        roll = _rollup_kb(p.pid)
        if roll is None or "Pss_Shmem" not in roll:
            total += _pss(p)
            continue
        total += (roll["Pss"] - roll["Pss_Shmem"]) * 1024
        _shm_objects(p.pid, shm)
    return total + sum(shm.values())


def tree_rss_mb(proc: psutil.Process, extra_pids: Iterable[int] = ()) -> float:
    """Sum of RSS over the tree. Over-counts: pages a forked worker shares with the trainer
    (copy-on-write heap, shared-memory batches) are counted once per process."""
    return sum(_rss(p) for p in _tree(proc, extra_pids)) / 2**20


def tree_pss_mb(proc: psutil.Process, extra_pids: Iterable[int] = ()) -> float:
    """The tree's memory by ``tree_memory_bytes``: PSS, with shared memory counted once at
    its allocated size; the honest "memory this training job uses" when workers are forked."""
    return tree_memory_bytes(_tree(proc, extra_pids)) / 2**20


class TreeMemory:
    """The tree's PSS sum, sampled within a CPU budget.

    Reading PSS makes the kernel walk every page table (``/proc/<pid>/smaps_rollup``): about
    2 ms for a process with torch loaded and ~6 ms at 500 MB here, per process, which at 10 Hz
    over three processes would take ~10 % of a core from the pipeline being measured. So
    exact PSS sweeps are spaced to cost at most ``budget`` of one core (and forced whenever
    the set of processes changes); the cheap RSS sum is read every tick and scaled by the
    latest sweep's PSS/RSS ratio in between. Peaks are therefore exact at sweeps and
    ratio-scaled between them.

    Finding the tree is not free either: ``children(recursive=True)`` reads every process's
    ``/proc/<pid>/stat`` (~1 ms with 70 processes, several ms on a machine running Ray), all
    while holding the GIL the trainer's threads need; the tree is refreshed every
    ``tree_refresh_s`` instead of every tick (loader workers live for a whole run).
    """

    def __init__(self, proc: psutil.Process, budget: float = 0.02,
                 tree_refresh_s: float = 0.5) -> None:
        self.proc = proc
        self.budget = budget
        self.tree_refresh_s = tree_refresh_s
        self.ratio = 1.0
        self.next_exact = 0.0
        self.pids: frozenset[int] = frozenset()
        self.exact_sweeps = 0
        self.sweep_s = 0.0
        self._procs: list[psutil.Process] = []
        self.procs: list[psutil.Process] = []     # the tree at the latest sample
        self._extra: tuple[int, ...] = ()
        self._next_tree = 0.0

    def _current_tree(self, extra_pids: Iterable[int]) -> list[psutil.Process]:
        extra = tuple(extra_pids)
        now = time.perf_counter()
        if now >= self._next_tree or extra != self._extra:
            self._procs = _tree(self.proc, extra)
            self._extra = extra
            self._next_tree = now + self.tree_refresh_s
        return [p for p in self._procs if p.pid == self.proc.pid or _alive(p)]

    def sample(self, extra_pids: Iterable[int] = ()) -> tuple[float, float]:
        """(PSS-sum estimate in MB, RSS sum in MB) of the tree now."""
        procs = self.procs = self._current_tree(extra_pids)
        rss = sum(_rss(p) for p in procs)
        pids = frozenset(p.pid for p in procs)
        now = time.perf_counter()
        if now >= self.next_exact or pids != self.pids:
            t0 = time.perf_counter()
            pss = tree_memory_bytes(procs)
            cost = time.perf_counter() - t0
            self.sweep_s += cost
            self.exact_sweeps += 1
            self.next_exact = now + cost / self.budget
            self.pids = pids
            self.ratio = pss / rss if rss else 1.0
            return pss / 2**20, rss / 2**20
        return rss * self.ratio / 2**20, rss / 2**20


class Sampler:
    def __init__(self, interval_s: float = 0.1,
                 extra_pids: Callable[[], list[int]] | None = None,
                 object_store_mb: Callable[[], float | None] | None = None,
                 on_tree: Callable[[list[psutil.Process]], None] | None = None) -> None:
        """``on_tree``: given the tree each tick (``measure.load.LoadMeter.observe``: the tree
        is walked once, for both)."""
        self.interval = interval_s
        self.extra_pids = extra_pids or (lambda: [])
        self.object_store = object_store_mb or (lambda: None)
        self.on_tree = on_tree
        self.proc = psutil.Process()
        self.gpu = _Gpu()
        self.memory = TreeMemory(self.proc)
        self.series: dict[str, Any] = {"t_s": [], "cpu_percent_per_core": [], "pss_mb": [],
                                       "rss_sum_mb": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        s = self.series
        s["t_s"].append(round(time.perf_counter() - self._t0, 4))
        s["cpu_percent_per_core"].append(psutil.cpu_percent(percpu=True))
        pss, rss = self.memory.sample(self.extra_pids())
        if self.on_tree is not None:
            self.on_tree(self.memory.procs)
        s["pss_mb"].append(round(pss, 1))
        s["rss_sum_mb"].append(round(rss, 1))
        store = self.object_store()
        if store is not None:
            s.setdefault("object_store_mb", []).append(round(store, 1))
        if self.gpu.handles:
            s.setdefault("gpu_util_percent", []).append(self.gpu.util())
            s.setdefault("gpu_memory_mb", []).append([round(x, 1) for x in self.gpu.memory_mb()])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "Sampler":
        self._t0 = time.perf_counter()
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval to measure
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="stallbench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._sample()

    @property
    def peak_pss_mb(self) -> float:
        """Peak of the tree's PSS sum (see the module docstring for why not RSS)."""
        return max(self.series["pss_mb"], default=0.0)

    def resources(self) -> Resources:
        """Per-core lists transposed to one series per core, as the report plots them."""
        s = self.series
        per = s["cpu_percent_per_core"]
        return Resources(t_s=s["t_s"], cpu_percent_per_core=[list(c) for c in zip(*per)] if per else [],
                         pss_mb=s["pss_mb"], rss_sum_mb=s["rss_sum_mb"],
                         object_store_mb=s.get("object_store_mb"),
                         gpu_util_percent=s.get("gpu_util_percent"),
                         gpu_memory_mb=s.get("gpu_memory_mb"),
                         pss_exact_sweeps=self.memory.exact_sweeps,
                         pss_sweep_s=round(self.memory.sweep_s, 4))
