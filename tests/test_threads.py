"""Thread budgets: resolved as documented, applied in every producer process (forked loader
workers, Ray workers; Flight servers in tests/executors/test_flight.py) and in the trainer
for one variant only, and recorded in results."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from stallbench import scenario, threads
from stallbench.executors import EXECUTORS
from stallbench.pipeline import Plan, dataset_for
from stallbench.run.runner import RunOptions, run_scenario

BASE = """
name = "threads"
[dataset]
rows = 1200
row_group_rows = 200
files = 2
dense_features = 2
sparse_features = 1
sequence_features = 1
sequence_max_len = 3
[preprocess]
transforms = ["recorder:record"]
[model]
kind = "emulated"
[loader]
batch_size = 100
"""

RECORDER = '''
import os
import pyarrow as pa
import torch

def record(table, **kw):
    """Write what this process's pools are when it preprocesses: pid, pyarrow, torch, OMP."""
    with open(os.path.join(os.environ["THREADS_DIR"], str(os.getpid())), "w") as f:
        f.write(f"{pa.cpu_count()} {torch.get_num_threads()} {os.environ.get('OMP_NUM_THREADS')}")
    return table
'''


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "recorder.py").write_text(RECORDER)
    out = tmp_path / "seen"
    out.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("THREADS_DIR", str(out))
    for k in threads.ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    return out


def _seen(d: Path) -> dict[int, tuple[int, int, str]]:
    out = {}
    for f in d.iterdir():
        pa_n, torch_n, omp = f.read_text().split()
        out[int(f.name)] = (int(pa_n), int(torch_n), omp)
    return out


def test_budget_resolution() -> None:
    assert threads.producer_budget(None, 4, cores=16) == 4       # cores split between them
    assert threads.producer_budget(None, 4, cores=2) == 1        # at least one
    assert threads.producer_budget(None, 0, cores=8) == 8
    assert threads.producer_budget(3, 4, cores=2) == 3           # as written
    assert threads.producer_budget(threads.UNBOUNDED, 4, cores=2) is None


def test_apply_and_restore_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in threads.ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    before = (pa.cpu_count(), torch.get_num_threads())
    prev = threads.apply(3)
    try:
        assert (pa.cpu_count(), torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]) == (3, 3, "3")
    finally:
        threads.restore(prev)
    assert (pa.cpu_count(), torch.get_num_threads()) == before
    assert "OMP_NUM_THREADS" not in os.environ


@pytest.mark.parametrize("setting", [None, 3, 0])
def test_forked_loader_workers_get_the_budget(recorder: Path, setting: int | None) -> None:
    text = BASE + "num_workers = 2\n" + (f"producer_threads = {setting}\n" if setting is not None else "")
    cfg = scenario.parse(text, "t.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, recorder.parent / "cache", "t.toml"))
    with EXECUTORS.get("local")(cfg, "t.toml") as ex:
        list(ex.run(plan))
        budget = ex.producer_threads()
    seen = _seen(recorder)
    assert len(seen) == 2 and os.getpid() not in seen           # the two workers did the work
    cores = threads.machine_cores()
    want = {None: max(1, cores // 2), 3: 3, 0: None}[setting]
    assert budget == want
    for pa_n, torch_n, omp in seen.values():
        if want is None:                                         # no budget: every core
            assert pa_n == cores and omp == "None"
        else:
            assert (pa_n, torch_n, omp) == (want, want, str(want))


def test_ray_tasks_budget_is_their_cpu_and_applied_per_job() -> None:
    from stallbench.executors.ray import worker

    cfg = scenario.parse(BASE + '[executor]\nkind = "ray"\n', "t.toml").base
    assert EXECUTORS.get("ray")(cfg, "t.toml").producer_threads() == 1
    cfg3 = scenario.parse(BASE + 'producer_threads = 3\n[executor]\nkind = "ray"\n', "t.toml").base
    assert EXECUTORS.get("ray")(cfg3, "t.toml").producer_threads() == 3
    prev = threads.apply(None, torch_too=False)
    try:
        worker.PlanCache.get(worker.Job("job-1", None, threads=2))   # type: ignore[arg-type]
        assert pa.cpu_count() == 2
    finally:
        worker.PlanCache.clear()
        threads.restore(prev)


def test_trainer_budget_holds_for_its_variant_and_is_recorded(recorder: Path) -> None:
    before = pa.cpu_count()
    text = BASE + "num_workers = 0\ntrainer_threads = 1\n[analysis]\ndifferential = false\n"
    sc = scenario.parse(text, "t.toml")
    result = run_scenario(sc, RunOptions(cache_dir=recorder.parent / "cache", progress=False))
    seen = _seen(recorder)
    assert list(seen) == [os.getpid()] and seen[os.getpid()][0] == 1   # the trainer decoded
    assert pa.cpu_count() == before                                      # and got its pool back
    t = result.variants[0].threads
    assert t is not None and t.trainer_threads == 1 and t.local_producers == 0
    assert t.cores == threads.machine_cores()
