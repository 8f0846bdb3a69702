"""Data-parallel ranks as local processes (``trainers.ranks`` > 1, local executor): every row
once across the ranks, torch.distributed's environment in the ranks and their loader workers,
a synchronous step, real gradients kept equal, and every process stopped on errors and
signals. Real processes, a real gloo process group, real Parquet; small data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from stallbench import scenario
from stallbench.errors import UserError
from stallbench.executors import EXECUTORS
from stallbench.pipeline import FULL, Plan, dataset_for
from stallbench.trainers import job
from stallbench.trainers.rank import row_hashes

import loadcheck

# 7 row groups (6 x 450 rows + 1 x 400): 3 + 3 + ... + 2 batches of 200, uneven over 2 or 3 ranks
BASE = """
name = "ranks"
[dataset]
rows = 3100
row_group_rows = 450
files = 1
dense_features = 3
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[model]
kind = "emulated"
step_ms = 1
[loader]
batch_size = 200
num_workers = {workers}
[trainers]
ranks = {ranks}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ranks-cache")


def _plan(cache: Path, text: str) -> Plan:
    cfg = scenario.parse(text, "ranks.toml").base
    return Plan.create(cfg, dataset_for(cfg, cache, "ranks.toml"), scenario_file="ranks.toml")


def _run(plan: Plan, **kw: Any) -> job.JobRuns:
    ex = EXECUTORS.get(plan.config.executor.kind)(plan.config, "ranks.toml")
    ex.start()
    try:
        return job.run_job(plan, ex, [FULL], 1, **kw)
    finally:
        ex.stop()


def reference_rows(plan: Plan) -> Counter[int]:
    """Every row of the job's work list, produced and received in this one process."""
    out: Counter[int] = Counter()
    for i in range(len(plan.items)):
        for batch, _rows, _tx in plan.receive(plan.produce(i)):
            out.update(row_hashes(batch))
    return out


def _children_of_me() -> set[int]:
    """Our child processes, less multiprocessing's resource tracker: spawned ranks (the start
    method where a GPU exists) start it once per test process and it lives until that process
    ends, so in a fresh process (a GPU machine, an xdist worker) it appears after the first
    spawned job without being anything a launcher left behind."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.Error:
            continue
        out.add(p.pid)
    return out


@pytest.mark.parametrize("ranks,workers", [(2, 0), (3, 0), (3, 1)])
def test_every_row_once_across_the_ranks(cache: Path, ranks: int, workers: int) -> None:
    """Exactly once: the multiset of rows the ranks trained on (a hash of every feature and
    the label of each row) equals the job's rows produced in one process: no row missing, none
    twice, with and without loader workers, with shards of unequal length."""
    plan = _plan(cache, BASE.format(ranks=ranks, workers=workers))
    before = _children_of_me()
    jr = _run(plan, row_hashes=True)
    (runs,) = jr.rank_runs["full"]
    got = Counter(h for r in runs for h in r.row_hashes)
    assert got == reference_rows(plan)
    assert sum(got.values()) == 3100
    steps = [r.figures.batches for r in runs]
    assert len(set(steps)) > 1, "the shards should be uneven here"
    assert sum(steps) == 6 * 3 + 2
    items = sorted(d.item for r in runs for d in r.deliveries)
    assert items == list(range(7))
    # each rank got its own items, rank, rank + N, ...
    for r in runs:
        assert all(d.item % ranks == r.rank for d in r.deliveries)
    assert _children_of_me() <= before, "rank processes left behind"


def test_spawned_ranks_deliver_every_row_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a GPU exists the ranks are spawned, not forked (CUDA does not survive a fork):
    the same job through that path, forced here."""
    from stallbench.trainers.processes import ProcessLauncher

    monkeypatch.setattr(ProcessLauncher, "start_method", "spawn")
    plan = _plan(cache, BASE.format(ranks=2, workers=1))
    (runs,) = _run(plan, row_hashes=True).rank_runs["full"]
    assert Counter(h for r in runs for h in r.row_hashes) == reference_rows(plan)


def test_ranks_and_their_workers_carry_the_distributed_environment(cache: Path,
                                                                   tmp_path: Path) -> None:
    """A user's transform, running in each rank's loader worker, sees RANK, WORLD_SIZE and
    LOCAL_RANK (and the rendezvous address)."""
    mod = tmp_path / "rank_probe.py"
    mod.write_text(
        "import os, json\n"
        "def record(table, **kw):\n"
        f"    path = os.path.join({str(tmp_path)!r}, f'{{os.getpid()}}.json')\n"
        "    keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')\n"
        "    with open(path, 'w') as f:\n"
        "        json.dump({k: os.environ.get(k) for k in keys} | {'ppid': os.getppid()}, f)\n"
        "    return table\n")
    sys.path.insert(0, str(tmp_path))
    try:
        text = BASE.format(ranks=2, workers=1).replace(
            "[model]", '[preprocess]\ntransforms = ["rank_probe:record"]\n[model]')
        jr = _run(_plan(cache, text))
    finally:
        sys.path.remove(str(tmp_path))
    (runs,) = jr.rank_runs["full"]
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    workers = [s for s in seen if s["ppid"] in {r.pid for r in runs}]   # forked by a rank
    assert {s["RANK"] for s in workers} == {"0", "1"}
    assert all(s["WORLD_SIZE"] == "2" and s["LOCAL_RANK"] == s["RANK"] for s in workers)
    assert all(s["MASTER_ADDR"] == "127.0.0.1" and int(s["MASTER_PORT"]) > 0 for s in workers)
    assert all(r.producer_pids and r.pid not in r.producer_pids for r in runs)


@pytest.mark.groundtruth
def test_a_slow_rank_slows_every_rank(cache: Path) -> None:
    """The step is synchronous: rank 1 gets 40 ms per row group (EMULATED) and rank 0, with
    nothing injected, spends that time waiting in the all-reduce and ends with it. The shards
    are equal (3 row groups each), so the epochs differ only by what the clocks do: each rank's
    clock starts at the barrier that ends every rank's set-up of the run (a barrier before the
    heap's collection let one rank's collection, 0.12-0.17 s in a forked rank here, start its
    epoch up to 86 ms before the other's: CI, 2026-12-01, epochs 0.195 / 0.150 s). Read off
    timings, so it runs in the timing pass and is measured again under load."""
    text = (BASE.format(ranks=2, workers=0).replace("rows = 3100", "rows = 2700")
            + "straggler_rank = 1\nstraggler_delay_ms = 40\n")

    def check() -> list[str]:
        (runs,) = _run(_plan(cache, text)).rank_runs["full"]
        r0, r1 = runs
        injected = r1.straggler_delay_s
        problems = []
        if r0.figures.batches != r1.figures.batches:
            problems.append(f"shards of {r0.figures.batches} and {r1.figures.batches} batches")
        if not (injected >= 3 * 0.040 and r0.straggler_delay_s == 0.0):
            problems.append(f"injected {injected:.3f} s on rank 1, {r0.straggler_delay_s} on 0")
        # rank 0 waited for rank 1 in the all-reduce (both also pay the collective itself)
        if not r0.sync_s - r1.sync_s > 0.6 * injected:
            problems.append(f"rank 0 synced {r0.sync_s:.3f} s, rank 1 {r1.sync_s:.3f} s")
        if not abs(r0.figures.epoch_s - r1.figures.epoch_s) < 0.3 * injected:
            problems.append(f"epochs {r0.figures.epoch_s:.3f} / {r1.figures.epoch_s:.3f} s")
        return problems

    loadcheck.attempts("slow rank", check, 2, 2.0)     # two rank processes


def test_real_gradients_are_all_reduced(cache: Path) -> None:
    """With the DLRM, each rank trains on different rows; after the run the ranks' parameters
    are still equal (they started equal and every step applied the averaged gradients, sparse
    embedding gradients included)."""
    text = BASE.format(ranks=2, workers=0).replace(
        'kind = "emulated"\nstep_ms = 1', 'kind = "dlrm"\nembedding_rows = 1000')
    (runs,) = _run(_plan(cache, text), row_hashes=True).rank_runs["full"]
    d0, d1 = (r.model_digest for r in runs)
    assert d0 is not None and d0 == pytest.approx(d1, rel=1e-6, abs=1e-6)
    assert all(r.sync_s > 0 for r in runs)
    # the same run without the all-reduce would diverge: the ranks saw different rows
    assert set(runs[0].row_hashes).isdisjoint(runs[1].row_hashes)


def test_an_error_in_one_rank_stops_every_rank(cache: Path, tmp_path: Path) -> None:
    mod = tmp_path / "rank_boom.py"
    mod.write_text("import os\n"
                   "def boom(table, **kw):\n"
                   "    if os.environ.get('RANK') == '1':\n"
                   "        raise RuntimeError('injected failure in rank 1')\n"
                   "    return table\n")
    sys.path.insert(0, str(tmp_path))
    try:
        text = BASE.format(ranks=3, workers=1).replace(
            "[model]", '[preprocess]\ntransforms = ["rank_boom:boom"]\n[model]')
        plan = _plan(cache, text)
        before = _children_of_me()
        with pytest.raises(Exception, match="rank 1.*injected failure"):
            _run(plan)
    finally:
        sys.path.remove(str(tmp_path))
    deadline = time.time() + 10
    while _children_of_me() - before and time.time() < deadline:
        time.sleep(0.2)
    assert not _children_of_me() - before, "processes left behind"


def test_user_errors_in_a_rank_stay_user_errors(cache: Path) -> None:
    plan = _plan(cache, BASE.format(ranks=2, workers=0))
    from stallbench.trainers.processes import ProcessLauncher

    launcher = ProcessLauncher(None, plan, 2, ablations=False)
    err = launcher._failure(1, ("error", "user", "DataError: bad file", "tb"))
    assert isinstance(err, UserError) and "rank 1" in str(err)


# ------------------------------------------------------------------------ the CLI, signals

SLOW = BASE.format(ranks=3, workers=1).replace("step_ms = 1", "step_ms = 200") + \
    "[analysis]\ndifferential = false\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_signal_stops_every_rank(tmp_path: Path, cache: Path, sig: int) -> None:
    """Ctrl-C (or SIGTERM) during a data-parallel run: exit 130 (143), no result, and no rank or
    loader worker left behind."""
    (tmp_path / "s.toml").write_text(SLOW)
    tag = uuid.uuid4().hex
    env = {**os.environ, "STALLBENCH_CACHE": str(cache), "STALLBENCH_TEST_TAG": tag}
    proc = subprocess.Popen([sys.executable, "-m", "stallbench", "run", "s.toml",
                             "--no-progress"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if len(_tagged(tag)) >= 1 + 3 + 3:     # stallbench, 3 ranks, 3 loader workers
                break
            time.sleep(0.2)
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err[-2000:]      # 130 SIGINT, 143 SIGTERM
    assert f"interrupted by {signal.Signals(sig).name}" in err
    assert not (tmp_path / "results").exists()
    deadline = time.time() + 10
    while _tagged(tag) and time.time() < deadline:
        time.sleep(0.2)
    left = _tagged(tag)
    for p in left:
        p.kill()
    assert not left, "processes left behind"


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("STALLBENCH_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out
