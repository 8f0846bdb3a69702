"""What every Ray worker process of a stallbench runtime runs first (``worker_process_setup_hook``).

Ray imports this module by name in *every* worker it starts, Ray Data's helper actors
included, so it lives outside ``stallbench.executors``: importing anything under that package
imports every executor (and torch) first. Keep it free of stallbench imports.
"""

from __future__ import annotations

import sys


def avoid_fsspec_import_race() -> None:
    """Ray Data resolves file paths in threads and each imports fsspec's HTTP filesystem;
    without aiohttp that import fails, and when two threads race one sees a half-initialised
    module and raises ImportError instead of ModuleNotFoundError (which Ray catches), so
    ``read_parquet`` of a file list fails at random. Marking the module absent makes every
    attempt fail the same, caught way. Only done when it could never import anyway."""
    if "fsspec.implementations.http" in sys.modules:
        return
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        sys.modules["fsspec.implementations.http"] = None  # type: ignore[assignment]


def worker_setup() -> None:
    """The hook: the same fsspec guard in each worker (Ray Data lists files inside tasks too)."""
    avoid_fsspec_import_race()


RUNTIME_ENV = {"worker_process_setup_hook": f"{__name__}.worker_setup"}


class _NoDriverPaths(list):
    """``JobConfig._py_driver_sys_path`` that stays empty: ``ray.init`` extends it with the
    driver's working directory (and script directory), which every worker then puts first on
    its ``sys.path``: a ``cython.py`` or ``uarray.py`` there would run in every Ray worker.
    Stallbench ships a scenario's own modules by file path instead (``registry.locate``)."""

    def extend(self, paths: object) -> None:   # type: ignore[override]
        return None


def job_config() -> object:
    """The ``job_config`` for every ``ray.init`` of stallbench's: no directory of the driver's
    on the workers' import path."""
    from ray.job_config import JobConfig

    cfg = JobConfig()
    cfg._py_driver_sys_path = _NoDriverPaths()
    return cfg
