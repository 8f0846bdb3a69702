"""Ground truth for the straggler when its cost comes in bursts (issue 25): a transform
imported by path (the user's own code) that, only in the process whose ``RANK`` is 1, burns
20 us of CPU per row (once per row group: with 0 loader workers a whole row group's cost
lands on one step) or sleeps 0.1 s per row group (a storage-like latency, no CPU). Two
ranks, one run, 0 loader workers. stallbench must name rank 1 and say the other rank waited for it in the
all-reduce; with the same CPU burn on every rank (exchangeable, bursty) it must name none.

Timing tests on a shared machine: up to three measurements each under ``tests/loadcheck.py``'s
rule (skip, printing every attempt's verdict and load, only when every attempt was wrong while
other processes left the two ranks less than their two cores; fail otherwise). Kept few and
small (12 row groups, 24 steps per rank: six bursts per rank, the fewest the burst test can
judge at 1% with the costs here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loadcheck
import pytest

from stallbench import scenario
from stallbench.run.runner import RunOptions, run_scenario

pytestmark = pytest.mark.groundtruth

ATTEMPTS = 3
USER = '''
import os
import time

def _burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def cpu_on_rank_1(table):
    if os.environ.get("RANK") == "1":
        _burn(20e-6 * table.num_rows)
    return table

def cpu_on_every_rank(table):
    _burn(20e-6 * table.num_rows)
    return table

def sleep_on_rank_1(table):
    if os.environ.get("RANK") == "1":
        time.sleep(0.1)
    return table
'''
TEXT = """
name = "bursty-straggler"
[dataset]
rows = 49152
row_group_rows = 4096
files = 1
dense_features = 4
sparse_features = 2
sequence_features = 0
[model]
kind = "emulated"
step_ms = 4
[preprocess]
transforms = ["sb_bursty_user:{fn}"]
[loader]
batch_size = 1024
num_workers = {workers}
[executor]
kind = "local"
[trainers]
ranks = 2
[analysis]
differential = false
[run]
repeats = 1
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bursty-cache")


@pytest.fixture()
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's module on the import path of this process and of the rank processes."""
    (tmp_path / "sb_bursty_user.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import os
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _measure(cache: Path, fn: str, workers: int) -> Any:
    sc = scenario.parse(TEXT.format(fn=fn, workers=workers), "<bursty>")
    return run_scenario(sc, RunOptions(cache_dir=cache, progress=False)).variants[0].ranks


def _attempts(cache: Path, fn: str, workers: int, want: int | None) -> None:
    """The verdict compares the ranks' wall times: a rank that loses its core to another
    process meanwhile is a straggler the test did not inject, so the case needs one core per
    rank (and per loader worker)."""
    def check() -> list[str]:
        s = _measure(cache, fn, workers)
        ok = s.straggler == want
        if want is not None:
            ok = ok and s.others_wait_s > 0 and "waited" in s.verdict
        if ok:
            return []
        return [f"wanted {want}, named {s.straggler}, excess {s.straggler_excess_s:.3f} s, "
                f"noise {s.noise_s:.3f} s, others waited {s.others_wait_s:.3f} s: {s.verdict}"]
    loadcheck.attempts(fn, check, ATTEMPTS, 2 * (1 + workers))


def test_cpu_cost_straggler_in_a_user_transform_is_named(cache: Path, user_code: None) -> None:
    # 0 workers only: with 2 workers per rank on this small dataset rank 1's whole cost lands
    # on its first step (both workers transform a row group before the first batch) and one
    # more, too few informative steps for 1% from one run (issue 25: left open, see report)
    _attempts(cache, "cpu_on_rank_1", 0, 1)


def test_storage_latency_straggler_is_named(cache: Path, user_code: None) -> None:
    _attempts(cache, "sleep_on_rank_1", 0, 1)


def test_exchangeable_bursty_ranks_name_no_straggler(cache: Path, user_code: None) -> None:
    _attempts(cache, "cpu_on_every_rank", 0, None)
