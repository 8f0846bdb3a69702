"""Machine and environment metadata stored with every result (pyperf's discipline): a figure
without the machine that produced it cannot be compared or trusted."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import psutil

from ..results import GitInfo, GpuInfo, MachineInfo

LIBRARIES = ("stallbench", "torch", "pyarrow", "numpy", "ray", "zstandard", "pandas", "psutil",
             "nvidia-ml-py")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(cwd: str | os.PathLike[str] = ".") -> GitInfo | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5)
        return GitInfo(commit=sha.stdout.strip(), dirty=bool(dirty.stdout.strip()))
    except (OSError, subprocess.TimeoutExpired):
        return None


def metadata() -> MachineInfo:
    from .sampler import gpu_info

    vm = psutil.virtual_memory()
    return MachineInfo(
        hostname=platform.node(),
        cpu_model=_cpu_model(),
        cores_logical=psutil.cpu_count(logical=True),
        cores_physical=psutil.cpu_count(logical=False),
        cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        memory_gb=round(vm.total / 2**30, 2),
        os=platform.platform(),
        python=platform.python_version(),
        libraries={name: _version(name) for name in LIBRARIES},
        gpu=[GpuInfo(**g) for g in gpu_info()] or None,
        git=git_commit(),
        load_avg_at_start=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    )
