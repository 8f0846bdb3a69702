"""Fixtures shared by every test directory.

``ray_session``: one real local Ray per test file that asks for it (2 CPUs, a 256 MB object
store, no dashboard), started on first use and shut down when the file ends. Ray costs ~6-10 s
to start here, so a file's Ray tests share it; stallbench's ``RayExecutor`` sees Ray already
initialised and reuses it (and never shuts it down). Tests that need a runtime of their own (a
simulated multi-node cluster, the CLI) run stallbench in a subprocess instead.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler for ``tests/run_suite.sh`` (``--dist loadscope``), with scopes
    of our own (``_worker_group``). xdist's ``loadgroup`` marks are not it: with pytest 9 its
    worker's renaming of test ids is lost, and every test was scheduled alone (checked)."""
    from xdist.scheduler import LoadScopeScheduling

    root = Path(str(config.rootpath))

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _worker_group(root / nodeid.split("::", 1)[0])

    return ByScope(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """pytest's rewritten test modules cached (tests/**/__pycache__, ignored by git) even where
    PYTHONDONTWRITEBYTECODE is set, as on this machine: without the cache every pytest process
    of tests/run_suite.sh (five) rewrites them all again, ~4 s of CPU each. Only while the
    test modules are collected: what the tests import or start afterwards keeps the
    environment's setting."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


# ``tests/slow_tests.txt``: the tests ``make test`` (and so CI) leaves out, marked ``slow`` at
# collection (the list's header says how they were chosen). Its entries by test file, and
# those matched, so that an entry naming no test of a collected file is an error, not a test
# that silently came back into CI or never left it.
_SLOW_LIST = Path(__file__).resolve().parent / "slow_tests.txt"
_SLOW_SEEN: dict = {"files": set(), "matched": set()}


@functools.lru_cache(maxsize=None)
def _slow_entries() -> frozenset[str]:
    """The listed node ids: a test's (every parameter of it) or one parameter's."""
    if not _SLOW_LIST.exists():
        return frozenset()
    out = set()
    for line in _SLOW_LIST.read_text(encoding="utf-8").splitlines():
        entry = line.split("  #", 1)[0].strip()
        if entry and not entry.startswith("#"):
            out.add(entry)
    return frozenset(out)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks ``slow`` what ``tests/slow_tests.txt`` lists, before ``-m`` selects: the item's
    own id, else its test's (the id before its parameters)."""
    nodeid, entries = item.nodeid, _slow_entries()
    _SLOW_SEEN["files"].add(nodeid.split("::", 1)[0])
    for entry in (nodeid, nodeid.split("[", 1)[0]):
        if entry in entries:
            item.add_marker(pytest.mark.slow)
            _SLOW_SEEN["matched"].add(entry)
            return


def pytest_collection_finish(session: pytest.Session) -> None:
    stale = sorted(e for e in _slow_entries() if e.split("::", 1)[0] in _SLOW_SEEN["files"]
                   and e not in _SLOW_SEEN["matched"])
    if stale:
        raise pytest.UsageError(f"{_SLOW_LIST.name}: no test matches {stale[0]!r} (renamed or "
                                f"removed? {len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'})")


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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The longest scope first: xdist hands scopes out in this order, and the one lane
        # that cannot be split (``_worker_group``) would otherwise start last and end alone.
        lane = [i for i in items if _worker_group(Path(str(i.path))) == RAYSTART]
        if lane:
            moved, n = {id(i) for i in lane}, len(items)
            items[:] = lane + [i for i in items if id(i) not in moved]
            assert len(items) == n, f"reordering lost or duplicated tests: {n} -> {len(items)}"
    gpu = [i for i in items if i.get_closest_marker("gpu")]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False "
                                           "on this machine)")
            for i in gpu:
                i.add_marker(skip)


# A test file that starts real clusters with ``ray start`` (tests/raystart.py): a head and
# nodes, a dozen processes.
RAYSTART = "raystart"
_RAYSTART = re.compile(r"\bRayStartCluster\(")


@functools.lru_cache(maxsize=None)
def _worker_group(path: Path) -> str:
    """The pytest-xdist scope of a test file (``pytest_xdist_make_scheduler``): its own, so its
    module fixtures are made once, except that the files that start ``ray start`` clusters
    share one, so that two such clusters (a dozen processes, ~10 s of CPU to start each) never
    start side by side on a 2-core machine. Leftover checks find processes by a tag of their
    own test (``STALLBENCH_TEST_TAG``, raystart's ``TAG``), never by name, so they hold side
    by side. Every other file, Ray and Flight ones included,
    runs beside any other: a file's in-process Ray is its worker's own (``ray_session``),
    servers bind port 0, and the one refused connection once blamed on running side by side
    was a double close in one process (tests/executors/test_flight_lifecycle.py).
    """
    return RAYSTART if _RAYSTART.search(path.read_text()) else str(path)


@pytest.fixture(scope="module")
def ray_session() -> Iterator[Any]:
    """One in-process Ray runtime per test file that asks for it, stopped when the file ends.

    Per file, not per session: an idle runtime (its GCS, raylet, agents, idle workers and Ray
    Data's actors) takes ~6% of a core while the xdist worker that started it goes on with
    other files for the rest of the pass (three workers: a sixth of a core for ten minutes,
    more than the few starts it saves), and in the timing pass it would be a busy neighbour
    of every later ground truth."""
    ray = pytest.importorskip("ray")
    from stallbench.executors.ray.cluster import LEAN_SYSTEM_CONFIG, RUNTIME_ENV, import_ray

    import_ray()
    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=2, object_store_memory=256 * 2**20,
                 include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 namespace="stallbench-tests", runtime_env=RUNTIME_ENV,
                 _system_config=LEAN_SYSTEM_CONFIG)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
