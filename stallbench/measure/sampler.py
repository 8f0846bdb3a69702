"""Background resource sampler: CPU per core, RSS of the whole producer tree, object store, GPU.

Runs in a thread at a coarse period (default 100 ms) so it costs well under 1% of a core;
RSS is summed over the trainer, its children (loader workers) and any extra pids an executor
names (Ray workers), because a loader's memory is the point of bulk-vs-streaming comparisons.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import psutil


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


def gpu_info() -> list[dict[str, Any]]:
    g = _Gpu()
    out = []
    for h in g.handles:
        name = g.nvml.nvmlDeviceGetName(h)
        out.append({"name": name.decode() if isinstance(name, bytes) else name,
                    "memory_mb": g.nvml.nvmlDeviceGetMemoryInfo(h).total / 2**20})
    return out


def tree_rss_mb(proc: psutil.Process, extra_pids: list[int] = ()) -> float:
    total = 0
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
    seen = set()
    for p in procs:
        if p.pid in seen:
            continue
        seen.add(p.pid)
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


class Sampler:
    def __init__(self, interval_s: float = 0.1,
                 extra_pids: Callable[[], list[int]] | None = None,
                 object_store_mb: Callable[[], float | None] | None = None) -> None:
        self.interval = interval_s
        self.extra_pids = extra_pids or (lambda: [])
        self.object_store = object_store_mb or (lambda: None)
        self.proc = psutil.Process()
        self.gpu = _Gpu()
        self.series: dict[str, Any] = {"t_s": [], "cpu_percent_per_core": [], "rss_mb": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        s = self.series
        s["t_s"].append(round(time.perf_counter() - self._t0, 4))
        s["cpu_percent_per_core"].append(psutil.cpu_percent(percpu=True))
        s["rss_mb"].append(round(tree_rss_mb(self.proc, self.extra_pids()), 1))
        store = self.object_store()
        if store is not None:
            s.setdefault("object_store_mb", []).append(round(store, 1))
        if self.gpu.handles:
            s.setdefault("gpu_util_percent", []).append(self.gpu.util())

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
    def peak_rss_mb(self) -> float:
        return max(self.series["rss_mb"], default=0.0)

    def resources(self) -> dict[str, Any]:
        """Per-core lists transposed to one series per core, as the report plots them."""
        out = dict(self.series)
        per = self.series["cpu_percent_per_core"]
        out["cpu_percent_per_core"] = [list(c) for c in zip(*per)] if per else []
        return out
