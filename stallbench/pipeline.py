"""A variant's pipeline: the stages wired together, and the ablated forms of each.

``Plan.produce`` is what a producer (loader worker, Ray task, or the trainer itself) runs for
one unit of work; ``Plan.receive`` is the trainer's half. An ``Ablation`` replaces stages by
their ideal form using caches filled *before* the timed run, which is how the differential
analysis isolates each stage (DS-Analyzer's method): the pipeline around them stays the same.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa

from . import interrupts
from .data.parquet import Dataset, open_dataset
from .data.schema import FeatureSchema, Shard
from .errors import ScenarioError
from .scenario import Config
from .stages import compute as compute_mod
# the plan's vocabulary, defined apart so that reading results never imports torch
from .stages.ablation import ALL_ABLATIONS, COMPUTE_ONLY, FULL, Ablation  # noqa: F401
from .stages.batch_format import SequenceCounts, TensorBatch
from .stages.buffers import SlotAllocator
from .stages.sizes import ceil_div
from .stages.fetch import Fetch
from .stages.preprocess import Preprocess, TransformSpecError
from .stages.transfer import Payload, Transfer


@dataclass
class StageTimes:
    """Producer-side time per stage for one unit of work (wall and thread CPU)."""

    fetch_s: float = 0.0
    fetch_io_wait_s: float = 0.0     # emulated storage wait inside fetch_s
    preprocess_s: float = 0.0
    transfer_s: float = 0.0          # encode + compress (+ emulated wire wait)
    fetch_cpu_s: float = 0.0
    preprocess_cpu_s: float = 0.0
    transfer_cpu_s: float = 0.0
    rows_in: int = 0
    rows_out: int = 0
    storage_bytes: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0
    worker: int = 0                  # pid of the producer
    sequences: SequenceCounts | None = None   # ids cut by a padded format (None: none padded)


@dataclass(frozen=True)
class Fetched:
    """One work item's fetch, done: its table (None where fetch and preprocess are both
    ideal) and what it cost, on the clocks of the thread that fetched it."""

    item: int
    table: pa.Table | None
    wall_s: float
    cpu_s: float
    io_wait_s: float = 0.0
    storage_bytes: int = 0


@dataclass
class ShardOutput:
    item: int                                 # position in the run's work list
    shard: int
    payloads: list[Payload] | None            # None: transfer is ideal, trainer uses its cache
    batches: int
    rows: int
    times: StageTimes = field(default_factory=StageTimes)


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything one measured run needs, as an immutable value: the stages are built once
    (``Plan.create``) and a variation of a plan (another ablation, fewer items) is a
    ``dataclasses.replace`` of it. Picklable, so executors ship it to workers (forked loader
    workers, Ray tasks)."""

    config: Config
    dataset: Dataset
    ablation: Ablation
    fetch: Fetch
    preprocess: Preprocess
    transfer: Transfer
    schema: FeatureSchema              # the preprocessed tables' schema (what batches carry)
    items: tuple[Shard, ...]           # the run's work list (shards x epochs, capped)
    max_batches: float                 # math.inf: no cap
    caches: "StageCaches | None" = None
    home_pid: int = field(default_factory=os.getpid)  # the trainer's; producers elsewhere differ

    @classmethod
    def create(cls, config: Config, dataset: Dataset, ablation: Ablation = FULL,
               scenario_file: str = "<scenario>") -> "Plan":
        """Build the stages of ``config`` over ``dataset``; a bad transform is a ScenarioError."""
        try:
            preprocess = Preprocess(config.preprocess, dataset.schema, seed=config.dataset.seed,
                                    scenario_file=scenario_file)
        except TransformSpecError as exc:
            raise ScenarioError(scenario_file, f"preprocess.transforms[{exc.index}]", str(exc)) from None
        schema = preprocess.output_schema
        return cls(config=config, dataset=dataset, ablation=ablation,
                   fetch=Fetch(dataset, config.storage), preprocess=preprocess,
                   transfer=Transfer(config.loader, schema), schema=schema,
                   items=tuple(select_work(dataset.shards, config)),
                   max_batches=config.loader.max_batches or math.inf)

    def with_ablation(self, ablation: Ablation, caches: "StageCaches | None") -> "Plan":
        return dataclasses.replace(self, ablation=ablation, caches=caches)

    # ---------------------------------------------------------------------- producer side
    def fetch_item(self, item: int) -> "Fetched":
        """The fetch stage of one work item alone, timed on the calling thread's clocks: what
        a fetch-ahead thread (``loader.fetch_ahead``) runs while the item before it is being
        preprocessed and packed. An ideal fetch (ablation) reads its cache."""
        shard = self.items[item]
        a, c = self.ablation, self.caches
        cpu = self._cpu_clock()
        w0, c0 = time.perf_counter(), cpu()
        table, io_wait, stored = None, 0.0, 0
        if a.fetch:
            if not a.preprocess:
                table = c.fetched[shard.index]
        else:
            table = self.fetch(shard)   # real even when preprocess is ideal: its cost stays in
            io_wait = self.fetch.emulated_io_s(shard)
            stored = shard.compressed_bytes
        return Fetched(item, table, time.perf_counter() - w0, cpu() - c0, io_wait, stored)

    def produce(self, item: int, shared: bool | SlotAllocator = False,
                fetched: "Fetched | None" = None, local: bool = False) -> ShardOutput:
        """Fetch, preprocess and encode one work item. ``shared``: the payloads will cross to
        another process (True: fresh shared memory where the format can use it; a
        ``SlotAllocator``: the calling worker's partition of a ``BufferPool``, or the
        trainer's own with 0 workers). ``fetched``: the item's fetch, already done (by a
        fetch-ahead thread). ``local``: the payloads stay in this process (0 loader
        workers), so a format may hand over finished tensors (``Transfer.send_table``)."""
        shard = self.items[item]
        t = StageTimes(worker=os.getpid())
        a, c = self.ablation, self.caches
        if fetched is None:
            fetched = self.fetch_item(item)
        elif fetched.item != item:
            raise ValueError(f"fetched work item {fetched.item} handed to item {item}")
        table = fetched.table
        t.fetch_s, t.fetch_cpu_s = fetched.wall_s, fetched.cpu_s
        t.fetch_io_wait_s, t.storage_bytes = fetched.io_wait_s, fetched.storage_bytes
        cpu = self._cpu_clock()
        w1, c1 = time.perf_counter(), cpu()
        t.rows_in = shard.rows
        table = c.prepped[shard.index] if a.preprocess else self.preprocess(table, shard.index)
        w2, c2 = time.perf_counter(), cpu()
        t.preprocess_s, t.preprocess_cpu_s = w2 - w1, c2 - c1
        t.rows_out = table.num_rows
        n_batches = ceil_div(table.num_rows, self.config.loader.batch_size)
        payloads = None
        if not a.transfer:
            payloads = self.transfer.send_table(table, str(shard.index), shared,
                                                  local=local)
            t.raw_bytes = sum(p.raw_bytes for p in payloads)
            t.wire_bytes = sum(p.wire_bytes for p in payloads)
            for p in payloads:
                if p.sequences is not None:
                    if t.sequences is None:
                        t.sequences = SequenceCounts(p.sequences.seq_len)
                    t.sequences.add(p.sequences)
        w3, c3 = time.perf_counter(), cpu()
        t.transfer_s, t.transfer_cpu_s = w3 - w2, c3 - c2
        return ShardOutput(item, shard.index, payloads, n_batches, table.num_rows, t)

    def _cpu_clock(self) -> Callable[[], float]:
        """The CPU clock that sees all of a stage's work. pyarrow decodes on its own thread
        pool, which a thread clock misses; a producer process (a forked loader worker, a Ray
        worker) runs one work item at a time, so its process clock is the stage's CPU. In the
        trainer's own process (0 workers) the process clock would also count the model step
        and helper threads, so there the thread clock is used: it undercounts decode threads,
        which results say (``fetch_cpu`` is a lower bound at 0 workers)."""
        return time.thread_time if os.getpid() == self.home_pid else time.process_time

    # ----------------------------------------------------------------------- trainer side
    def receive(self, out: ShardOutput) -> Iterator[tuple[TensorBatch, int, float]]:
        """Yield (batch on the trainer's device, rows, trainer-side transfer seconds) for one
        delivered unit, serially (the measured run uses ``receive_host`` + ``stages.device``)."""
        for batch, rows, tx in self.receive_host(out):
            t0 = time.perf_counter()
            batch = self.transfer.to_device(batch)
            yield batch, rows, tx + time.perf_counter() - t0

    def receive_host(self, out: ShardOutput) -> Iterator[tuple[TensorBatch, int, float]]:
        """Yield (host batch, rows, seconds to decompress and decode it) for one delivered
        unit; a transfer-ablated unit yields its cached final batches (already on the
        trainer's device) in no time."""
        if out.payloads is None:
            for b in self.caches.final[out.shard]:
                yield b, int(b["label"].shape[0]), 0.0
            return
        for p in out.payloads:
            t0 = time.perf_counter()
            batch = self.transfer.receive_host(p)
            yield batch, p.rows, time.perf_counter() - t0

    def build_compute(self, scenario_file: str | None = None) -> compute_mod.Compute:
        """The model of this plan; its errors name ``scenario_file``, by default the file the
        plan was made from (a trainer rank has no other: it said ``<scenario>``)."""
        return compute_mod.build(self.config.model, self.schema,
                                 scenario_file or self.preprocess.scenario_file)


@dataclass
class StageCaches:
    """Stage outputs computed ahead of ablation runs, so a stage can be made free.

    Filled once per variant outside any timed region and shared by all its ablations.
    """

    fetched: dict[int, pa.Table] = field(default_factory=dict)
    prepped: dict[int, pa.Table] = field(default_factory=dict)
    final: dict[int, list[TensorBatch]] = field(default_factory=dict)

    @classmethod
    def build(cls, plan: Plan, on_item: Callable[[], None] | None = None) -> "StageCaches":
        """``on_item``: called after each row group (a rank's progress watchdog)."""
        c = cls()
        seen: set[int] = set()
        for shard in plan.items:
            if shard.index in seen:
                continue
            interrupts.check()
            seen.add(shard.index)
            table = plan.dataset.read_shard(shard)
            c.fetched[shard.index] = table
            prepped = plan.preprocess(table, shard.index)
            c.prepped[shard.index] = prepped
            batches = []
            for i, b in enumerate(plan.transfer.split(prepped)):
                p = plan.transfer.send(b, f"{shard.index}:{i}", shared=False, emulate_wire=False)
                batches.append({k: v.clone() for k, v in plan.transfer.receive(p).items()})
            c.final[shard.index] = batches
            if on_item is not None:
                on_item()
        return c


def select_work(shards: list[Shard], config: Config) -> list[Shard]:
    """The run's work list: shards x epochs, cut once enough batches are covered."""
    cap = config.loader.max_batches
    bs = config.loader.batch_size
    out: list[Shard] = []
    covered = 0
    for _ in range(config.loader.epochs):
        for s in shards:
            if cap and covered >= cap:
                return out
            out.append(s)
            covered += ceil_div(s.rows, bs)
    return out


_DATASETS: dict[tuple, Dataset] = {}


def dataset_for(config: Config, cache_dir: Path, scenario_file: str) -> Dataset:
    """Open (and generate if synthetic) a dataset once per process and spec."""
    key = (repr(config.dataset), str(cache_dir))
    if key not in _DATASETS:
        _DATASETS[key] = open_dataset(config.dataset, cache_dir, scenario_file)
    return _DATASETS[key]
