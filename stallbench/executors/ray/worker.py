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
        self.ds: Any = None
        self.it: Any = None

    def start(self, job: Job, n: int, map_kwargs: dict[str, Any], actors: bool, bulk: bool,
              prefetch: int) -> int:
        self.ds = build_dataset(job, n, map_kwargs, actors, bulk)
        self.it = iter(self.ds.iter_batches(batch_size=None, batch_format="pyarrow",
                                            prefetch_batches=prefetch))
        return os.getpid()

    def next(self, k: int) -> list[pa.Table]:
        """Up to ``k`` blocks; an empty list at the end."""
        out = []
        for b in self.it:
            out.append(b)
            if len(out) >= k:
                break
        return out

    def figures(self) -> dict[str, Any]:
        from . import stats

        return stats.operator_figures(self.ds) if self.ds is not None else {}
