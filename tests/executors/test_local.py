"""The on-trainer executor: bulk vs streaming, worker hand-off through the buffer pool, bytes
that crossed a process boundary, and clean shutdown when the trainer stops early."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from stallbench import scenario
from stallbench.executors import EXECUTORS
from stallbench.executors.local import pool_shape
from stallbench.measure.probe import measured_run
from stallbench.pipeline import FULL, Plan, ShardOutput, StageCaches, dataset_for
from stallbench.stages.ablation import Ablation
from stallbench.stages.buffers import PooledBuffer

BASE = """
name = "local"
[dataset]
rows = 1200
row_group_rows = 200
files = 2
dense_features = 3
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
[model]
kind = "emulated"
[loader]
batch_size = 100
"""


class StampedPlan(Plan):
    """Records when each work item finished, on a clock shared by all processes."""

    def produce(self, item: int, shared: Any = False, fetched: Any = None,
                local: bool = False) -> ShardOutput:
        out = super().produce(item, shared, fetched, local)
        out.done_at = time.monotonic()   # type: ignore[attr-defined]
        return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local-cache")


def _setup(cache: Path, loader: str, plan_cls: type[Plan] = Plan) -> tuple[Plan, Any]:
    cfg = scenario.parse(BASE + loader, "local.toml").base
    plan = plan_cls.create(cfg, dataset_for(cfg, cache, "local.toml"), scenario_file="local.toml")
    return plan, EXECUTORS.get("local")(cfg, "local.toml")


@pytest.mark.parametrize("workers", [0, 2])
def test_bulk_produces_the_whole_epoch_before_the_first_batch(cache: Path, workers: int) -> None:
    for execution, everything_first in (("bulk", True), ("streaming", False)):
        plan, ex = _setup(cache, f'num_workers = {workers}\nexecution = "{execution}"\n'
                                 f'prefetch_factor = 1\n', StampedPlan)
        with ex:
            run = ex.run(plan)
            first = next(run)
            received_at = time.monotonic()
            rest = list(run)
        outs = [first, *rest]
        assert [o.item for o in outs] == list(range(len(plan.items)))
        all_before = all(o.done_at <= received_at for o in outs)
        assert all_before == everything_first, execution


def test_worker_batches_cross_through_the_pool_and_count_as_ipc(cache: Path) -> None:
    plan, ex = _setup(cache, 'num_workers = 2\nbatch_format = "single_buffer"\n')
    seen = []
    with ex:
        for out in ex.run(plan):
            seen += [type(p.data) for p in out.payloads]
        figs = ex.run_figures()["buffer_pool"]
    assert set(seen) == {PooledBuffer}                # only a reference was pickled
    assert figs["pooled_batches"] == len(seen) and figs["fresh_shared_batches"] == 0

    with ex:
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
    assert fig.bytes.ipc_bytes == fig.bytes.wire_bytes > 0
    assert fig.producer_processes == 2


def test_bulk_overflows_the_pool_into_fresh_shared_memory(cache: Path) -> None:
    plan, ex = _setup(cache, 'num_workers = 1\nbatch_format = "single_buffer"\n'
                             'execution = "bulk"\nprefetch_factor = 1\n')
    parts, slots, _ = pool_shape(plan)
    total = sum(-(-s.rows // 100) for s in plan.items)
    assert parts * slots < total                      # this test is about the overflow
    with ex:
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
    pool = fig.executor_figures["buffer_pool"]
    assert pool["pooled_batches"] == parts * slots
    assert pool["pooled_batches"] + pool["fresh_shared_batches"] == total == fig.batches


@pytest.mark.parametrize("loader", ['num_workers = 0\n', 'num_workers = 0\nbatch_format = "single_buffer"\n',
                                    'num_workers = 0\ncompression = "zstd"\n'])
def test_nothing_crosses_a_process_without_workers(cache: Path, loader: str) -> None:
    plan, ex = _setup(cache, loader)
    with ex:
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
    assert fig.bytes.ipc_bytes == 0 and fig.bytes.wire_bytes > 0 and fig.producer_processes == 1
    if "single_buffer" in loader:                     # the trainer recycles its own buffers
        assert fig.executor_figures["buffer_pool"]["pooled_batches"] == fig.batches
        assert fig.executor_figures["buffer_pool"]["fresh_batches"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_processes_cpu_is_measured_whole(cache: Path, workers: int) -> None:
    """Ground truth: a preprocess that burns 200 us of CPU per row, 1200 rows = 0.24 s of
    CPU in the producers, which their own clocks must see (plus decode and hand-off)."""
    cfg = scenario.parse(BASE + f"num_workers = {workers}\n[preprocess]\ncpu_cost_us_per_row = 200\n",
                         "local.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, cache, "local.toml"), scenario_file="local.toml")
    with EXECUTORS.get("local")(cfg, "local.toml") as ex:
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
    if workers == 0:
        assert fig.producer_cpu_s is None                  # nothing runs outside the trainer
        assert fig.stage_s.preprocess_cpu >= 0.24 * 0.95
        return
    stage_cpu = fig.stage_s.fetch_cpu + fig.stage_s.preprocess_cpu + fig.stage_s.transfer_producer_cpu
    assert fig.stage_s.preprocess_cpu >= 0.24 * 0.95, fig.stage_s
    assert fig.producer_cpu_s is not None and fig.producer_cpu_s >= stage_cpu * 0.98, (fig.producer_cpu_s, stage_cpu)


def _record_forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the loader workers forked from now on, recorded as they start: listing
    the test's children later races with the early shutdown, which may have reaped them."""
    from stallbench.executors import local

    pids: list[int] = []
    fork = local._CheckedForkProcess.start

    def recorded_start(self: Any) -> None:
        fork(self)
        pids.append(self.pid)

    monkeypatch.setattr(local._CheckedForkProcess, "start", recorded_start)
    return pids


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_workers_exit_once_the_last_item_has_arrived(cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the run's last work item is in the trainer's hands the workers have nothing left
    to do: they are told to exit then, not only when the trainer asks for an item past the
    last (so their exit overlaps the trainer consuming that item). Held at the last item,
    the workers are gone (the wait is a bound, not a timing: without the early shutdown they
    never exit here); the stream then ends with every item delivered once, in order."""
    plan, ex = _setup(cache, "num_workers = 2\n")
    forked = _record_forks(monkeypatch)
    with ex:
        stream = ex.run(plan)
        got = [next(stream) for _ in range(len(plan.items))]
        assert len(forked) == 2, forked
        deadline = time.monotonic() + 30    # gone already (reaped by the shutdown) or exiting
        while any(_running(p) for p in forked) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [p for p in forked if _running(p)], forked
        assert list(stream) == []
    assert [o.item for o in got] == list(range(len(plan.items)))


def _digests(plan: Plan, ex: Any) -> list[tuple[int, int, str]]:
    """(work item, rows, digest of every tensor) per batch of one pass of ``ex`` over ``plan``."""
    out = []
    for shard_out in ex.run(plan):
        for batch, rows, _ in plan.receive_host(shard_out):
            h = hashlib.sha256()
            for k in sorted(batch):
                h.update(k.encode() + batch[k].numpy().tobytes())
            out.append((shard_out.item, rows, h.hexdigest()))
    return out


def test_persistent_workers_serve_every_run_and_their_cpu_counts(cache: Path) -> None:
    """``loader.persistent_workers``: the same two workers serve a variant's runs (also when
    each run is a new plan built from the same parts, as the runner's ``with_ablation`` does),
    with the same batches in the same order as workers forked per run; each run's producer CPU
    still holds the ground truth (200 us/row over 1,200 rows = 0.24 s, measured on workers
    that are alive, not reaped); a run stopped early and ``stop`` leave no worker behind."""
    cost = "[preprocess]\ncpu_cost_us_per_row = 200\n"
    plan, forked = _setup(cache, "num_workers = 2\n" + cost)
    with forked:
        want = _digests(plan, forked)
        assert forked.workers_reused() is False       # forked for the run: nothing kept
    plan, ex = _setup(cache, "num_workers = 2\npersistent_workers = true\n" + cost)
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    with ex:
        assert _digests(plan, ex) == want
        assert ex.workers_reused() is False           # the first run forks the workers it keeps
        workers = {c.pid for c in me.children()} - before
        assert len(workers) == 2, workers
        for _ in range(2):
            fig, _, _ = measured_run(dataclasses.replace(plan), ex, plan.build_compute())
            assert {c.pid for c in me.children()} - before == workers     # not forked again
            assert ex.workers_reused() is True        # and the executor says so
            stage_cpu = (fig.stage_s.fetch_cpu + fig.stage_s.preprocess_cpu
                         + fig.stage_s.transfer_producer_cpu)
            assert fig.stage_s.preprocess_cpu >= 0.24 * 0.95, fig.stage_s
            assert fig.producer_cpu_s is not None and fig.producer_cpu_s >= stage_cpu * 0.98, (
                fig.producer_cpu_s, stage_cpu)
        assert _digests(plan, ex) == want
        stream = ex.run(plan)                       # stopped early: its workers are shut down
        next(stream)
        stream.close()
        _, alive = psutil.wait_procs([psutil.Process(p) for p in workers if psutil.pid_exists(p)],
                                     timeout=30)
        assert not alive, alive
        assert _digests(plan, ex) == want           # and the next run forks new ones
        assert ex.workers_reused() is False
        again = {c.pid for c in me.children()} - before
        assert len(again) == 2 and not again & workers, (again, workers)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in again if psutil.pid_exists(p)],
                                 timeout=30)
    assert not alive, alive


def test_persistent_workers_serve_the_ablation_runs_between_full_runs(cache: Path) -> None:
    """A differential run interleaves each full run with ablation runs (plans built by
    ``with_ablation`` from the same parts): kept workers serve those too, each item under its
    own run's ablation, instead of being shut down and forked again at every switch (inside
    the next run's clock), also a run with no pool (transfer ablated away). By construction:
    200 us/row of preprocess (0.24 s over 1,200 rows) is in every full run's preprocess CPU
    and not in the ablated runs'; each run's batches are those of workers forked for it."""
    cost = "[preprocess]\ncpu_cost_us_per_row = 200\n"
    ideal, free = Ablation(preprocess=True), Ablation(True, True, True)
    plan, forked = _setup(cache, "num_workers = 2\n" + cost)
    caches = StageCaches.build(plan)
    with forked:
        want = {a: _digests(plan.with_ablation(a, caches), forked) for a in (FULL, ideal)}
    assert want[FULL] == want[ideal]          # an ideal stage hands over the same batches
    plan, ex = _setup(cache, "num_workers = 2\npersistent_workers = true\n" + cost)
    caches = StageCaches.build(plan)
    compute = plan.build_compute()
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    with ex:
        workers: set[int] | None = None
        for r in range(2):
            for a in (FULL, ideal, free):
                p = plan.with_ablation(a, caches)
                assert (pool_shape(p) is None) is (a == free)
                fig, _, _ = measured_run(p, ex, compute)
                now = {c.pid for c in me.children()} - before
                assert len(now) == 2 and (workers is None or now == workers), (r, a, now, workers)
                workers = now
                assert ex.workers_reused() is (r > 0 or a != FULL), (r, a)
                if a == FULL:
                    assert fig.stage_s.preprocess_cpu >= 0.24 * 0.95, fig.stage_s
                else:
                    assert fig.stage_s.preprocess_cpu < 0.24 * 0.5, fig.stage_s
                if a != free:
                    assert _digests(p, ex) == want[a]
    assert workers is not None
    _, alive = psutil.wait_procs([psutil.Process(p) for p in workers if psutil.pid_exists(p)],
                                 timeout=30)
    assert not alive, alive


def test_persistent_workers_without_workers_is_a_labelled_no_op(cache: Path) -> None:
    plan, ex = _setup(cache, "num_workers = 0\npersistent_workers = true\n")
    assert "no-op" in ex.notes({})["persistent_workers"]
    assert type(ex).workers_kept(plan.config) is None       # nothing to keep, nothing to try
    with ex:
        _digests(plan, ex)
        assert ex.workers_reused() is None
    _, ex = _setup(cache, "num_workers = 2\npersistent_workers = true\n")
    assert "persistent_workers" not in ex.notes({})


def test_stopping_early_shuts_workers_down(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process the run started is gone after it. Only those: the test process may have
    children of its own before (the session's Ray runtime, whose gcs_server and raylet made
    this fail whenever a Ray test of the session ran first). The workers are recorded as they
    are forked: seen from the model step, they could already be gone (the early shutdown once
    the last work item arrived), which made "the test saw no workers" fail on a quiet machine."""
    me = psutil.Process()

    def alive() -> set[int]:
        out = set()
        for c in me.children(recursive=True):
            try:
                if c.status() != psutil.STATUS_ZOMBIE:
                    out.add(c.pid)
            except psutil.Error:
                pass
        return out

    started = _record_forks(monkeypatch)
    before = alive()
    plan, ex = _setup(cache, 'num_workers = 2\nmax_batches = 3\nbatch_format = "single_buffer"\n'
                             'prefetch_batches = 2\n')
    with ex:
        fig, _, _ = measured_run(plan, ex, plan.build_compute())
    assert fig.batches == 3
    assert len(started) >= 2, started         # the run forked the workers this checks for
    deadline = time.monotonic() + 5
    while alive() & set(started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive() & set(started)
    assert not alive() - before


def test_pool_slots_are_reclaimed_between_runs(cache: Path) -> None:
    """A run stopped early leaves references nobody resolved (their slots stay taken); the
    next run reclaims them before its workers start, so slots never leak across runs."""
    plan, ex = _setup(cache, 'num_workers = 1\nmax_batches = 1\nbatch_format = "single_buffer"\n')
    with ex:
        for _ in range(3):
            fig, _, _ = measured_run(plan, ex, plan.build_compute())
            assert fig.batches == 1 and fig.executor_figures["buffer_pool"]["fresh_shared_batches"] == 0
            pool = ex._pool
            assert pool.state.sum() >= 1              # the unread second batch of the item
            pool.reclaim()
            assert pool.state.sum() == 0              # the trainer holds nothing now


def test_forked_workers_memory_is_not_double_counted() -> None:
    """peak_pss_mb is the tree's PSS sum: pages a forked child shares with the trainer count
    once, where an RSS sum counts them once per process."""
    import os
    import signal

    import numpy as np

    from stallbench.measure.sampler import Sampler, tree_pss_mb, tree_rss_mb

    block = np.ones(200 * 2**20 // 8)                 # 200 MB, touched
    pid = os.fork()
    if pid == 0:                                      # child: share the pages, do nothing
        time.sleep(30)
        os._exit(0)
    try:
        time.sleep(0.2)
        me = psutil.Process()
        rss, pss = tree_rss_mb(me), tree_pss_mb(me)
        assert rss - pss > 150, (rss, pss)            # RSS counts the block twice
        with Sampler(0.01) as s:
            time.sleep(0.1)
        res = s.resources()
        assert res.pss_exact_sweeps >= 1
        assert s.peak_pss_mb < max(res.rss_sum_mb) - 150
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    del block


def test_handed_over_shared_memory_counts_even_untouched() -> None:
    """A batch in shared memory that no process has touched since its producer let go (a
    bulk epoch waiting in the trainer) is in nobody's PSS; it is memory all the same."""
    import torch

    from stallbench.measure.sampler import tree_pss_mb, tree_rss_mb

    me = psutil.Process()
    pss0, rss0 = tree_pss_mb(me), tree_rss_mb(me)
    held = torch.UntypedStorage._new_shared(64 * 2**20)      # mapped, never touched here
    assert tree_pss_mb(me) - pss0 > 60
    assert tree_rss_mb(me) - rss0 < 10
    del held


def test_batches_that_outgrow_their_slots_size_the_next_runs_pool(tmp_path: Path) -> None:
    """Slots of a jagged pool are sized for sequences averaging up to sequence_max_len ids;
    existing data with longer ones overflows them into fresh memory once, and the next run's
    pool is sized from what that run carried: every batch pooled."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 1600
    pq.write_table(pa.table({
        "f": pa.array(rng.random(n, dtype=np.float32)),
        "hist": pa.array([rng.integers(0, 99, rng.integers(60, 80)).tolist() for _ in range(n)],
                         pa.list_(pa.int64())),
        "label": pa.array(np.zeros(n, dtype=np.float32))}), tmp_path / "long.parquet",
        row_group_size=400)
    cfg = scenario.parse(f'name = "grow"\n[dataset]\npath = "{tmp_path / "long.parquet"}"\n'
                         f'sequence_max_len = 8\n[model]\nkind = "emulated"\n'
                         f'[loader]\nbatch_size = 400\n', "grow.toml").base
    plan = Plan.create(cfg, dataset_for(cfg, tmp_path, "grow.toml"), scenario_file="grow.toml")
    ex = EXECUTORS.get("local")(cfg, "grow.toml")
    with ex:
        first, _, _ = measured_run(plan, ex, plan.build_compute())
        second, _, _ = measured_run(plan, ex, plan.build_compute())
    before, after = (f.executor_figures["buffer_pool"] for f in (first, second))
    assert before["fresh_batches"] == first.batches == 4 and before["pooled_batches"] == 0
    assert after["fresh_batches"] == 0 and after["pooled_batches"] == second.batches == 4
    assert after["slot_bytes"] > before["slot_bytes"]


class CountingPlan(Plan):
    """Counts fetches started and work items produced (one process: no workers), so a test
    can see how far the fetch-ahead thread ran ahead of the consumer."""

    def fetch_item(self, item: int) -> Any:
        self.log.append(("fetch", item))   # type: ignore[attr-defined]
        return super().fetch_item(item)

    def produce(self, item: int, shared: Any = False, fetched: Any = None,
                local: bool = False) -> ShardOutput:
        self.log.append(("produce", item))   # type: ignore[attr-defined]
        return super().produce(item, shared, fetched, local)


def _batches(plan: Plan, ex: Any) -> list[dict[str, Any]]:
    out = []
    with ex:
        for o in ex.run(plan):
            out += [{k: v.clone() for k, v in plan.transfer.receive_host(p).items()}
                    for p in o.payloads]
    return out


@pytest.mark.parametrize("fmt", ["jagged", "columnar", "single_buffer", "arrow"])
def test_fetch_ahead_hands_over_the_same_batches(cache: Path, fmt: str) -> None:
    """Fetching ahead in a thread changes when a row group is decoded, never what a batch
    holds: every tensor of every batch is equal with and without it."""
    ref = _batches(*_setup(cache, f'batch_format = "{fmt}"\n'))
    got = _batches(*_setup(cache, f'batch_format = "{fmt}"\nfetch_ahead = 2\n'))
    assert len(got) == len(ref) > 1
    for a, b in zip(ref, got):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and bool((a[k] == b[k]).all()), k


@pytest.mark.parametrize("depth", [1, 3])
def test_fetch_ahead_runs_at_most_its_depth_ahead(cache: Path, depth: int) -> None:
    """Bounded memory: while the consumer holds item i, at most ``depth`` later items have
    been fetched (the thread waits for room before each fetch)."""
    plan, ex = _setup(cache, f"fetch_ahead = {depth}\n", CountingPlan)
    object.__setattr__(plan, "log", [])
    def fetched() -> int:
        return max((i for k, i in plan.log if k == "fetch"), default=-1)

    ahead = []
    with ex:
        for out in ex.run(plan):
            # a slow consumer: wait (on any machine's speed) until the thread has filled the
            # room it has, then a little longer, in which it must not run further
            room = min(depth, len(plan.items) - 1 - out.item)
            deadline = time.monotonic() + 60
            while fetched() - out.item < room and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.01)
            ahead.append(fetched() - out.item)
    assert max(ahead) == min(depth, len(plan.items) - 1)
    assert all(a <= depth for a in ahead)


def test_fetch_ahead_thread_ends_when_the_trainer_stops_early(cache: Path) -> None:
    plan, ex = _setup(cache, "fetch_ahead = 2\n")
    with ex:
        run = ex.run(plan)
        next(run)
        run.close()
    import threading

    assert not [t for t in threading.enumerate() if t.name == "stallbench-fetch-ahead"]


def test_fetch_ahead_raises_the_fetch_error_in_the_consumer(cache: Path) -> None:
    """A row group that cannot be read, fetched ahead, is the run's error as it is without
    fetch-ahead (raised when the consumer reaches that item, not lost in the thread)."""
    from stallbench.errors import DataError

    class Broken(Plan):
        def fetch_item(self, item: int) -> Any:
            if item == 2:
                raise DataError("row group 2 is not readable (injected)")
            return super().fetch_item(item)

    plan, ex = _setup(cache, "fetch_ahead = 1\n", Broken)
    got = []
    with ex, pytest.raises(DataError, match="injected"):
        for out in ex.run(plan):
            got.append(out.item)
    assert got == [0, 1]


@pytest.mark.parametrize("loader, noted", [("fetch_ahead = 1\n", False),
                                            ("fetch_ahead = 1\nnum_workers = 2\n", True)])
def test_fetch_ahead_is_noted_where_it_does_nothing(cache: Path, loader: str, noted: bool) -> None:
    plan, ex = _setup(cache, loader)
    notes = ex.notes(plan.transfer.notes())
    assert ("fetch_ahead" in notes) == noted
    if noted:
        assert "no-op" in notes["fetch_ahead"]
