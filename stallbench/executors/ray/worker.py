"""Code that runs inside Ray workers: the producer UDFs of stallbench mode and their plan.

Everything here is shipped to (or imported by) Ray worker processes, so it must be picklable
and import Ray only where it runs. A task receives a ``Job``: the plan without its caches,
plus ``ObjectRef``s of the cached tables the ablation reads, one per shard; a task ``ray.get``s
the one table its shard needs (zero-copy on the same node, a pull elsewhere).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ... import threads
from ...pipeline import Plan, StageCaches
from . import codec


@dataclass
class Job:
    """What every producer task needs, shipped once per dataset execution: the plan without
    its caches, and ObjectRefs of the cached tables the ablation reads (per shard)."""

    token: str
    plan: Plan
    refs: dict[str, dict[int, Any]] = field(default_factory=dict)
    threads: int | None = None       # the producer thread budget (None: no budget)


class PlanCache:
    """One plan per worker process and job, so per-process caches (Parquet footers) survive
    from one task to the next; a new job replaces the old one."""

    _plans: dict[str, Plan] = {}

    @classmethod
    def get(cls, job: Job) -> Plan:
        plan = cls._plans.get(job.token)
        if plan is None:
            cls._plans.clear()
            plan = cls._plans[job.token] = job.plan
            threads.apply(job.threads)     # this worker's thread budget, once per job
        return plan

    @classmethod
    def clear(cls) -> None:
        cls._plans.clear()


def cached_tables(job: Job, shard_index: int) -> StageCaches | None:
    if not job.refs:
        return None
    import ray

    c = StageCaches()
    for kind, refs in job.refs.items():
        getattr(c, kind)[shard_index] = ray.get(refs[shard_index])
    return c


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001
        return "?"


def produce_items(batch: dict[str, np.ndarray], job: Job) -> pa.Table:
    """Ray Data UDF (task pool): work item indices -> encoded batches."""
    plan = PlanCache.get(job)
    node = _node_id()
    contiguous = plan.transfer.format.contiguous_buffer
    tables = []
    for item in batch["id"]:
        item = int(item)
        p = plan
        caches = cached_tables(job, plan.items[item].index)
        if caches is not None:
            p = dataclasses.replace(plan, caches=caches)
        tables.append(codec.encode(p.produce(item, shared=False), node, contiguous))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


class Producer:
    """Ray Data UDF (actor pool): the same work, the plan kept by the actor."""

    def __init__(self, job: Job) -> None:
        self.job = job
        PlanCache.get(job)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        return produce_items(batch, self.job)


def warm_batch(batch: Any) -> Any:
    """Ray Data UDF (task pool) of the warm-up pass: the producers' imports, and a short hold
    so that each block of the pass lands on a worker of its own."""
    warm_worker(0.3)
    return batch


class WarmActor:
    """The same for an actor pool: Ray runs only callable classes on actors."""

    def __init__(self) -> None:
        warm_worker(0.0)

    def __call__(self, batch: Any) -> Any:
        return batch


def warm_worker(delay_s: float) -> int:
    """Import what producers need, so the first measured batch does not pay for it."""
    import pyarrow.parquet  # noqa: F401
    import ray.data  # noqa: F401

    from ... import pipeline  # noqa: F401
    from ...data import parquet  # noqa: F401

    time.sleep(delay_s)
    return os.getpid()


# ------------------------------------------------------------------ the dataset, built anywhere

def build_dataset(job: Job, n: int, map_kwargs: dict[str, Any], actors: bool, bulk: bool) -> Any:
    """``range(work items) -> map_batches(produce)``: stallbench mode's one Ray Data operator.
    Built by the trainer (a driver on the cluster) or, through Ray Client, by ``BlockPump``."""
    import ray.data

    ds = ray.data.from_items([{"id": i} for i in range(n)], override_num_blocks=n)
    if actors:
        ds = ds.map_batches(Producer, fn_constructor_args=(job,), batch_format="numpy",
                            **map_kwargs)
    else:
        ds = ds.map_batches(produce_items, fn_args=(job,), batch_format="numpy", **map_kwargs)
    return ds.materialize() if bulk else ds


class BlockPump:
    """Ray Client (``ray://``): Ray Data's streaming executor needs a real Ray driver, which a
    Client process is not, so this actor (on the head node) runs the dataset and the trainer
    pulls its output blocks, a few per call, in order. Its Ray Data settings are the
    trainer's (``context``: DataContext attributes)."""

    def __init__(self, context: dict[str, Any]) -> None:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        for k, v in context.items():
            if k == "preserve_order":
                ctx.execution_options.preserve_order = v
            else:
                setattr(ctx, k, v)
        # Its executor's completed tasks tick this process's clock, as in a trainer that runs
        # the dataset itself; the trainer asks for the count (``progress``).
        progress = progress_callback()
        if progress is not None and progress not in ctx.custom_execution_callback_classes:
            ctx.custom_execution_callback_classes.append(progress)
        self.ds: Any = None
        self.it: Any = None

    def progress(self) -> int:
        """The work its producers completed so far, as a count (``measure.watchdog.ticks``):
        answered while ``next`` waits (the actor runs two calls at once)."""
        from ...measure import watchdog

        return watchdog.ticks()

    def start(self, job: Job, n: int, map_kwargs: dict[str, Any], actors: bool, bulk: bool,
              prefetch: int) -> int:
        self.ds = build_dataset(job, n, map_kwargs, actors, bulk)
        self.it = iter(self.ds.iter_batches(batch_size=None, batch_format="pyarrow",
                                            prefetch_batches=prefetch))
        return os.getpid()

    def next(self, k: int) -> list[pa.Table]:
        """Up to ``k`` blocks; an empty list at the end."""
        from ...measure import watchdog

        out = []
        for b in self.it:
            watchdog.tick()
            out.append(b)
            if len(out) >= k:
                break
        return out

    def figures(self) -> dict[str, Any]:
        from . import stats

        return stats.operator_figures(self.ds) if self.ds is not None else {}


_PROGRESS: list[Any] = []
# A dataset's DataContext key: (file, slot, count, owner pid) of the ranks' progress slots
# (``ranks``), so an execution in another process of this node (the split coordinator of
# data-parallel ranks) publishes its producers' progress where the rank launcher reads it.
PROGRESS_KEY = "stallbench.progress_slots"


def progress_callback() -> Any:
    """A Ray Data ``ExecutionCallback`` class (Ray Data makes one per execution, in this
    process) that ticks the progress watchdog's clock whenever its executor has seen another
    task finish or another output block generated: the producers' completed work, also while
    the trainer waits for a bulk ``materialize()``. None on a Ray Data without the hook
    (then only received blocks are progress)."""
    if _PROGRESS:
        return _PROGRESS[0]
    try:
        from ray.data._internal.execution.execution_callback import ExecutionCallback
    except ImportError:
        _PROGRESS.append(None)
        return None
    from ...measure import watchdog
    from ...measure.watchdog import tick

    class Progress(ExecutionCallback):
        def __init__(self) -> None:
            self.seen = -1
            self.attached = False

        def on_execution_step(self, executor: Any) -> None:
            if not self.attached:
                self.attached = True
                _publish_elsewhere(executor, watchdog)
            try:
                done = sum(op.metrics.num_tasks_finished + op.metrics.num_task_outputs_generated
                           for op in executor._topology)
            except Exception:  # noqa: BLE001 - Ray Data's internals moved: blocks still tick
                return
            if done != self.seen:
                self.seen = done
                tick()

    Progress.__qualname__ = "stallbench_progress"
    _PROGRESS.append(Progress)
    return Progress


def _publish_elsewhere(executor: Any, watchdog: Any) -> None:
    """An execution whose dataset carries ``PROGRESS_KEY``, running in a process other than
    the one that set it (the split coordinator of Ray ranks): its ticks go into the rank
    launcher's slots too (the slot after the ranks'). Never in the owner's process, whose
    own clock is the trainer's."""
    try:
        found = executor._data_context.get_config(PROGRESS_KEY)
    except Exception:  # noqa: BLE001 - Ray Data's internals moved: ranks' batches still tick
        return
    if not found:
        return
    path, slot, count, owner = found
    if owner == os.getpid():
        return
    slots = watchdog.map_slots(path, count)
    if slots is not None:
        watchdog.publish(slots, slot)
