"""The measured trainer loop: per-batch timestamps of waiting vs working.

For each batch the trainer records when it asked for data, how long it was blocked (wait),
how long its own share of data work took (unpack/decompress/collate/copy: trainer-side
transfer) and how long the model step took. Four ``perf_counter`` calls and a few list appends
per batch keep the overhead far below a batch's cost (``benchmarks/overhead.py`` measures it).

``stall_s`` is defined as ``epoch_s - compute_s``: every second the trainer is not computing
is a second it waits for data, which also makes the stall attribution close exactly.

Each run is also split into start-up and steady state (``phases``: the work item each batch
came from locates the end of start-up) and bracketed by a reading of the CPU that processes
outside the run took meanwhile (``load``), both outside the timed region.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .. import interrupts
from ..pipeline import Plan, ShardOutput, StageTimes
from ..results import ByteCounts, RepeatFigures, Resources, StageRows, StageSeconds, Timeline
from ..stages.batch_format import TensorBatch
from ..stages.compute import Compute
from .load import LoadMeter
from .phases import split
from .sampler import Sampler

# (batch, rows, trainer-side transfer seconds, work item it came from)
Item = tuple[TensorBatch, int, float, int]


@dataclass
class Probe:
    t_start_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    items: list[int] = field(default_factory=list)     # work item of each batch (phases)

    def timeline(self) -> Timeline:
        r = lambda xs: [round(x, 6) for x in xs]  # noqa: E731 - keep JSON small
        return Timeline(t_start_s=r(self.t_start_s), wait_s=r(self.wait_s),
                        transfer_s=r(self.transfer_s), compute_s=r(self.compute_s),
                        rows=list(self.rows))


@dataclass
class StageTotals:
    s: dict[str, float] = field(default_factory=lambda: {
        "fetch": 0.0, "fetch_io_wait": 0.0, "preprocess": 0.0, "transfer_producer": 0.0,
        "transfer_trainer": 0.0, "fetch_cpu": 0.0, "preprocess_cpu": 0.0,
        "transfer_producer_cpu": 0.0})
    rows: dict[str, int] = field(default_factory=lambda: {"fetch": 0, "preprocess": 0,
                                                          "transfer": 0})
    # raw_bytes: encoded batches before compression; wire_bytes: what producers handed over
    # (compressed size when compressed); ipc_bytes: the part of wire_bytes that crossed a
    # process boundary (0 when the trainer produced its own batches, num_workers = 0).
    bytes: dict[str, int] = field(default_factory=lambda: {"storage_bytes": 0, "raw_bytes": 0,
                                                           "wire_bytes": 0, "ipc_bytes": 0})
    workers: set[int] = field(default_factory=set)
    trainer_pid: int = field(default_factory=os.getpid)

    def add(self, out: ShardOutput) -> None:
        self.add_times(out.times)

    def add_times(self, t: StageTimes) -> None:
        self.s["fetch"] += t.fetch_s
        self.s["fetch_io_wait"] += t.fetch_io_wait_s
        self.s["preprocess"] += t.preprocess_s
        self.s["transfer_producer"] += t.transfer_s
        self.s["fetch_cpu"] += t.fetch_cpu_s
        self.s["preprocess_cpu"] += t.preprocess_cpu_s
        self.s["transfer_producer_cpu"] += t.transfer_cpu_s
        self.rows["fetch"] += t.rows_in
        self.rows["preprocess"] += t.rows_in
        self.rows["transfer"] += t.rows_out
        self.bytes["storage_bytes"] += t.storage_bytes
        self.bytes["raw_bytes"] += t.raw_bytes
        self.bytes["wire_bytes"] += t.wire_bytes
        if t.worker != self.trainer_pid:
            self.bytes["ipc_bytes"] += t.wire_bytes
        self.workers.add(t.worker)


def _batches(deliveries: Iterator[ShardOutput], plan: Plan, totals: StageTotals) -> Iterator[Item]:
    for out in deliveries:
        totals.add(out)
        for batch, rows, tx in plan.receive(out):
            yield batch, rows, tx, out.item


def _cached(plan: Plan) -> Iterator[Item]:
    """Compute-only: pre-materialised final batches, no loader at all (DS-Analyzer's
    ingestion-free rate)."""
    for item, shard in enumerate(plan.items):
        for b in plan.caches.final[shard.index]:
            yield b, int(b["label"].shape[0]), 0.0, item


class _Preload:
    """Trainer-side preload thread keeping N batches ready (trainer transfer runs here)."""

    _END = object()

    def __init__(self, source: Iterator[Item], n: int, totals: StageTotals) -> None:
        self.q: queue.Queue[Any] = queue.Queue(maxsize=n)
        self.source = source
        self.totals = totals
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._fill, name="stallbench-preload", daemon=True)
        self.thread.start()

    def _fill(self) -> None:
        try:
            for batch, rows, tx, item in self.source:
                self.totals.s["transfer_trainer"] += tx
                while not self.stop.is_set():
                    try:
                        self.q.put((batch, rows, 0.0, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    break
            self.q.put(self._END)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the trainer thread
            self.q.put(exc)
        finally:
            close = getattr(self.source, "close", None)
            if close:
                close()

    def __iter__(self) -> "_Preload":
        return self

    def __next__(self) -> Item:
        item = self.q.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stop.set()
        while self.thread.is_alive():
            try:
                self.q.get(timeout=0.05)
            except queue.Empty:
                pass
        self.thread.join()


def measured_run(plan: Plan, executor: Any, compute: Compute, *, warmup_batches: int = 0,
                 sample_interval_s: float = 0.1,
                 on_batch: Callable[[int, int, float], None] | None = None,
                 ) -> tuple[RepeatFigures, Timeline, Resources]:
    probe = Probe()
    totals = StageTotals()
    max_batches = plan.max_batches
    prefetch = plan.config.loader.prefetch_batches
    sampler = Sampler(sample_interval_s, executor.worker_pids, executor.sample_object_store_mb)
    perf = time.perf_counter
    n = samples = 0
    ttfb = math.nan
    producer_cpu0 = executor.producer_cpu_s(plan)
    producers = executor.producer_slots()
    meter = LoadMeter(executor.worker_pids)
    meter.__enter__()
    with sampler:
        t0 = perf()
        cpu0 = time.process_time()
        if plan.ablation.compute_only:
            source: Iterator[Item] = _cached(plan)
        else:
            source = _batches(executor.run(plan), plan, totals)
        if prefetch and not plan.ablation.compute_only:
            source = _Preload(source, prefetch, totals)
        try:
            while n < max_batches:
                interrupts.check()   # a signal whose exception a library swallowed
                ta = perf()
                try:
                    batch, rows, tx, item = next(source)
                except StopIteration:
                    break
                tb = perf()
                if n == 0:
                    ttfb = tb - t0
                compute.step(batch)
                compute.sync()
                tc = perf()
                probe.t_start_s.append(ta - t0)
                probe.wait_s.append(tb - ta - tx)
                probe.transfer_s.append(tx)
                probe.compute_s.append(tc - tb)
                probe.rows.append(rows)
                probe.items.append(item)
                totals.s["transfer_trainer"] += tx
                n += 1
                samples += rows
                if on_batch:
                    on_batch(n, samples, tc - t0)
            t_end = perf()
            trainer_cpu = time.process_time() - cpu0
        finally:
            close = getattr(source, "close", None)
            if close:
                close()       # shuts loader workers down (joined: their CPU is then counted)
    meter.__exit__(None, None, None)
    late = None if plan.ablation.compute_only else executor.late_stage_times()
    if late is not None:
        totals.add_times(late)
    producer_cpu1 = executor.producer_cpu_s(plan) if producer_cpu0 is not None else None
    producer_cpu = None if producer_cpu1 is None else max(producer_cpu1 - producer_cpu0, 0.0)
    epoch = t_end - t0
    compute_s = sum(probe.compute_s)
    warm = min(max(warmup_batches, 1), n)
    if n > warm:
        t_warm = probe.t_start_s[warm]
        steady = sum(probe.rows[warm:]) / max(epoch - t_warm, 1e-9)
    else:
        steady = samples / epoch if epoch > 0 else math.nan
    s = totals.s
    fig = RepeatFigures(
        epoch_s=epoch, samples=samples, batches=n, trainer_cpu_s=trainer_cpu,
        producer_cpu_s=producer_cpu,
        throughput_samples_s=samples / epoch if epoch > 0 else math.nan,
        steady_throughput_samples_s=steady,
        stall_s=epoch - compute_s, wait_s=sum(probe.wait_s),
        trainer_transfer_s=s["transfer_trainer"], compute_s=compute_s,
        time_to_first_batch_s=ttfb, peak_pss_mb=sampler.peak_pss_mb,
        stage_s=StageSeconds(
            fetch=s["fetch"], fetch_io_wait=s["fetch_io_wait"], preprocess=s["preprocess"],
            transfer=s["transfer_producer"] + s["transfer_trainer"],
            transfer_producer=s["transfer_producer"], transfer_trainer=s["transfer_trainer"],
            fetch_cpu=s["fetch_cpu"], preprocess_cpu=s["preprocess_cpu"],
            transfer_producer_cpu=s["transfer_producer_cpu"]),
        stage_rows=StageRows(**totals.rows), bytes=ByteCounts(**totals.bytes),
        producer_processes=len(totals.workers),
        executor_figures=executor.run_figures() if not plan.ablation.compute_only else {},
        phases=split(probe.t_start_s, probe.compute_s, probe.wait_s, probe.rows, probe.items,
                     epoch, producers, warmup_batches),
        load=meter.load,
    )
    return fig, probe.timeline(), sampler.resources()
