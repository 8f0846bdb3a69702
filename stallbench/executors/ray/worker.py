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


def identity_batch(batch: Any) -> Any:
    """Ray Data UDF (task pool) of the warm-up pass: no work, only the map path."""
    return batch


class IdentityActor:
    """The same for an actor pool: Ray runs only callable classes on actors."""

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
