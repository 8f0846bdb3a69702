"""Fixtures shared by every test directory.

``ray_session``: ONE real local Ray per test session (2 CPUs, a 256 MB object store, no
dashboard), started on first use and shut down at the end. Ray costs ~6-10 s to start here, so
every Ray test shares it; stallbench's ``RayExecutor`` sees Ray already initialised and reuses
it (and never shuts it down). Tests that need a runtime of their own (a simulated multi-node
cluster, the CLI) run stallbench in a subprocess instead.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator

import pytest


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler for ``tests/run_suite.sh`` (``--dist loadscope``), with scopes
    of our own (``_worker_group``). xdist's ``loadgroup`` marks are not it: with pytest 9 its
    worker's renaming of test ids is lost, and every test was scheduled alone (checked)."""
    from xdist.scheduler import LoadScopeScheduling

    root = Path(str(config.rootpath))

    class FileOrGrpc(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _worker_group(root / nodeid.split("::", 1)[0])

    return FileOrGrpc(config, log)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Timing tests with injected costs (``groundtruth``) run first: before the session's Ray
    runtime exists (idle, its daemons take ~5% of a core here, in bursts) and before other
    tests leave anything behind. Their relative order is kept. Those that need Ray themselves
    (also marked ``ray``) keep their place: moved first, they would start the session's
    runtime before every other test."""
    timing = [i for i in items if i.get_closest_marker("groundtruth")
              and not i.get_closest_marker("ray")]
    if timing:
        # Every item exactly once: a filter on the marker alone once dropped the ground-truth
        # tests that need Ray (in neither list), silently, from every run.
        moved, n = {id(i) for i in timing}, len(items)
        items[:] = timing + [i for i in items if id(i) not in moved]
        assert len(items) == n, f"reordering lost or duplicated tests: {n} -> {len(items)}"
    gpu = [i for i in items if i.get_closest_marker("gpu")]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False "
                                           "on this machine)")
            for i in gpu:
                i.add_marker(skip)


# A test file that starts Ray or a Flight server (gRPC either way), by what its text names.
_GRPC = re.compile(r'kind = \\?"(ray|flight)|ray_session|raystart|pyarrow\.flight|flight_servers'
                   r'|import ray\b|"ray"|"flight"|ray_address|ray\.init')


@functools.lru_cache(maxsize=None)
def _worker_group(path: Path) -> str:
    """The pytest-xdist scope of a test file (``pytest_xdist_make_scheduler``): its own, so its
    module fixtures are made once, except that every file whose tests start Ray or Flight
    servers shares one scope, so they run one at a time, on one worker, as they were written
    to (their clusters and servers are the heaviest tests). This grouping did not
    stop the one failure seen with 2 workers (tests/run_suite.sh says which): parallel is
    opt-in.
    """
    return "grpc" if _GRPC.search(path.read_text()) else str(path)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from stallbench.executors.ray.cluster import RUNTIME_ENV, import_ray

    import_ray()
    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=2, object_store_memory=256 * 2**20,
                 include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 namespace="stallbench-tests", runtime_env=RUNTIME_ENV)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
