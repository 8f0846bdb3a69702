"""The measured trainer loop: per-batch timestamps of waiting vs working.

For each batch the trainer records when it asked for data, how long it was blocked (wait),
how long its own share of data work took (unpack/decompress/collate/copy: trainer-side
transfer) and how long the model step took. Four ``perf_counter`` calls and a few list appends
per batch keep the overhead far below a batch's cost (``benchmarks/overhead.py`` measures it).

On a GPU trainer the batches go through the device path (``stages.device``): a receive/pin
thread (``Transfer.receive_thread_depth``) decodes and stages them in pinned memory, and the
trainer thread launches each copy (``loader.device_prefetch`` batches ahead on a side stream)
and waits only for a copy that is late. Copies and GPU steps are timed by CUDA events
(``measure.device_clock``), which also gives the accelerator utilisation of every run. With a
copy preloaded, the trainer-side seconds of a batch include launching the next batch's copy.

``stall_s`` is defined as ``epoch_s - compute_s``: every second the trainer is not computing
is a second it waits for data, which also makes the stall attribution close exactly.

Each run is also split into start-up and steady state (``phases``: the work item each batch
came from locates the end of start-up) and bracketed by a reading of the CPU that processes
outside the run took meanwhile (``load``), both outside the timed region.
"""

from __future__ import annotations

import collections
import gc
import math
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .. import interrupts
from ..pipeline import Plan, ShardOutput, StageTimes
from ..results import (ByteCounts, RepeatFigures, Resources, SequenceCut, StageRows, StageSeconds,
                       Timeline)
from ..stages.batch_format import SequenceCounts, TensorBatch
from ..stages.compute import Compute
from ..stages.device import DeviceFeeder, Staging, ring_slots
from .device_clock import DeviceClock
from .load import LoadMeter
from .phases import split
from .sampler import Sampler
from .watchdog import Watchdog, ticking

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
    sequences: SequenceCounts | None = None

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
        if t.sequences is not None:
            if self.sequences is None:
                self.sequences = SequenceCounts(t.sequences.seq_len)
            self.sequences.add(t.sequences)


def _batches(deliveries: Iterator[ShardOutput], plan: Plan, totals: StageTotals) -> Iterator[Item]:
    """Host batches (decompressed, decoded) of what the executor delivers; the device path
    takes them from here."""
    for out in deliveries:
        totals.add(out)
        for batch, rows, tx in plan.receive_host(out):
            yield batch, rows, tx, out.item


def _batches_parallel(deliveries: Iterator[ShardOutput], plan: Plan, totals: StageTotals,
                      threads: int) -> Iterator[Item]:
    """``_batches`` with up to ``threads`` payloads received (decompressed, decoded) at once,
    in the order delivered. Runs inside the receive thread: zstd decompresses without holding
    the GIL, so a compressed stream is no longer limited by one thread's decompression rate."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="stallbench-receive")
    pending: collections.deque = collections.deque()

    def receive(p: Any, item: int) -> Item:
        t0 = time.perf_counter()
        batch = plan.transfer.receive_host(p)
        return batch, p.rows, time.perf_counter() - t0, item

    try:
        for out in deliveries:
            totals.add(out)
            if out.payloads is None:
                while pending:
                    yield pending.popleft().result()
                for batch, rows, tx in plan.receive_host(out):
                    yield batch, rows, tx, out.item
                continue
            for p in out.payloads:
                pending.append(pool.submit(receive, p, out.item))
                while len(pending) > threads:
                    yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)


def _cached(plan: Plan) -> Iterator[Item]:
    """Compute-only: pre-materialised final batches, no loader at all (DS-Analyzer's
    ingestion-free rate)."""
    for item, shard in enumerate(plan.items):
        for b in plan.caches.final[shard.index]:
            yield b, int(b["label"].shape[0]), 0.0, item


class _Preload:
    """Trainer-side receive thread keeping N batches ready: trainer transfer runs here
    (decompress, decode and, on a GPU with ``pin_memory``, staging in pinned memory: then it
    is the pin thread). Its seconds count as trainer-side transfer, off the trainer thread."""

    _END = object()

    def __init__(self, source: Iterator[Item], n: int, totals: StageTotals,
                 stage: Callable[[Any], Any] | None = None,
                 stop: threading.Event | None = None) -> None:
        self.q: queue.Queue[Any] = queue.Queue(maxsize=n)
        self.source = source
        self.totals = totals
        self.stage = stage
        self.stop = stop or threading.Event()
        self.thread = threading.Thread(target=self._fill, name="stallbench-preload", daemon=True)
        self.thread.start()

    def _fill(self) -> None:
        try:
            for batch, rows, tx, item in self.source:
                if self.stage is not None:
                    t0 = time.perf_counter()
                    batch = self.stage(batch)
                    tx += time.perf_counter() - t0
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
        """Stop the thread, then close its source: a run stopped early (``max_batches``) must
        shut the executor's stream down now (loader workers joined, their CPU and the
        executor's figures final), not whenever the generator is collected."""
        self.stop.set()
        while self.thread.is_alive():
            try:
                self.q.get(timeout=0.05)
            except queue.Empty:
                pass
        self.thread.join()
        close = getattr(self.source, "close", None)
        if close:
            close()


def stall_line(plan: Plan, executor: Any, timeout_s: float) -> str:
    """The one line of a wait without progress: the executor and what it waited for."""
    what = getattr(executor, "waiting_for", None)
    on = what() if callable(what) else "its producers"
    return (f"{getattr(executor, 'scenario_file', '<scenario>')}: run.progress_timeout_s: no batch arrived and no producer "
            f"completed any work for {timeout_s:g} s: the {executor.name} executor was waiting "
            f"on {on}; no result written")


def measured_run(plan: Plan, executor: Any, compute: Compute, *, warmup_batches: int = 0,
                 sample_interval_s: float = 0.1,
                 on_batch: Callable[[int, int, float], None] | None = None,
                 progress_timeout_s: float | None = None,
                 start_together: Callable[[], None] | None = None,
                 ) -> tuple[RepeatFigures, Timeline, Resources]:
    """One measured run of ``plan``: the trainer loop's clock, per-batch timestamps, stage
    totals and resources.

    ``start_together``: called as the last thing before the clock starts, after every set-up
    of the run (the heap's collection, the load meter, the sampler). Data-parallel ranks pass
    their barrier here: a rank's epoch is then measured from the moment every rank is ready,
    and no rank's epoch holds the others' set-up. (A barrier before this function put up to
    tens of ms of one rank's garbage collection into another rank's first all-reduce.)"""
    if progress_timeout_s is None:
        progress_timeout_s = plan.config.run.progress_timeout_s
    probe = Probe()
    totals = StageTotals()
    max_batches = plan.max_batches
    depth = plan.transfer.receive_thread_depth
    meter = LoadMeter(executor.worker_pids)
    sampler = Sampler(sample_interval_s, executor.worker_pids, executor.sample_object_store_mb,
                      on_tree=meter.observe)
    perf = time.perf_counter
    n = samples = 0
    ttfb = math.nan
    producer_cpu0 = executor.producer_cpu_s(plan)
    tr = plan.transfer
    api = tr.api
    # A stand-in without ``kind`` (a test's hashing step) is timed by the host clock.
    clock = DeviceClock(api, getattr(compute, "kind", "cpu"), tr.device_prefetch)
    producers = executor.producer_slots()
    # The trainer runs in the caller's process (a test session, a notebook, a scenario matrix
    # after its other variants): a full collection of that heap (~0.15 s at 500k objects)
    # falling inside a sub-second run moves it by that much. One collection here, outside
    # the clock, pays it before; the next full one waits for 25% more long-lived objects.
    gc.collect()
    meter.__enter__()
    with sampler:
        if start_together is not None:
            start_together()
        t0 = perf()
        cpu0 = time.process_time()
        stream: Iterator[Any] | None = None
        if plan.ablation.compute_only:
            source: Iterator[Item] = _cached(plan)
        else:
            threads = tr.receive_threads
            stream = ticking(executor.run(plan))
            source = (_batches_parallel(stream, plan, totals, threads)
                      if depth and threads > 1 else _batches(stream, plan, totals))
            if depth:
                stop = threading.Event()
                stage = (Staging(api, ring_slots(depth, tr.device_prefetch), stop).stage
                         if tr.pin and api is not None else None)
                source = _Preload(source, depth, totals, stage=stage, stop=stop)
            if api is not None:
                source = DeviceFeeder(source, api, tr.device_prefetch, on_copy=clock.on_copy)
        # Executors that report what they wait on also report their progress (local, Flight,
        # Ray, Ray Client too: its tasks' completions tick); the others are not watched.
        watched = callable(getattr(executor, "waiting_for", None))
        dog = Watchdog(progress_timeout_s if watched else math.inf,
                       lambda: stall_line(plan, executor, progress_timeout_s))
        try:
            dog.__enter__()
            while n < max_batches:
                interrupts.check()   # a signal whose exception a library swallowed
                ta = perf()
                try:
                    with dog.waiting():
                        batch, rows, tx, item = next(source)
                except StopIteration:
                    break
                tb = perf()
                if n == 0:
                    ttfb = tb - t0
                ev = clock.step_start()
                compute.step(batch)
                clock.step_stop(ev)
                compute.sync()
                tc = perf()
                clock.host_step(tc - tb)
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
        except BaseException:
            # Ending early (no progress, a signal, an error): an executor whose streams a
            # receive thread reads is told first, or closing that thread could wait on them.
            abort = getattr(executor, "abort", None)
            if abort is not None:
                abort()
            raise
        finally:
            dog.__exit__(None, None, None)
            for it in (source, stream):   # the chain, then the executor's own stream: its
                close = getattr(it, "close", None)   # end-of-run work (workers joined, so
                if close:                            # their CPU counts; its run figures)
                    close()                          # runs now, not at garbage collection
    meter.__exit__(None, None, None)
    late = None if plan.ablation.compute_only else executor.late_stage_times()
    if late is not None:
        totals.add_times(late)
    producer_cpu1 = executor.producer_cpu_s(plan) if producer_cpu0 is not None else None
    producer_cpu = None if producer_cpu1 is None else max(producer_cpu1 - producer_cpu0, 0.0)
    epoch = t_end - t0
    phases = split(probe.t_start_s, probe.compute_s, probe.wait_s, probe.rows, probe.items,
                   epoch, producers, warmup_batches)
    steady = phases.steady_batches > 0
    device, h2d_ms, gpu_step_ms = clock.finish(
        epoch, phases.startup_batches if steady else None, phases.steady_s if steady else None)
    timeline = probe.timeline()
    timeline.h2d_ms, timeline.gpu_step_ms = h2d_ms, gpu_step_ms
    seq = totals.sequences
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
        device=device,
        sequence_cut=SequenceCut(seq_len=seq.seq_len, sequences=seq.sequences,
                                 sequences_cut=seq.cut, ids=seq.ids, ids_cut=seq.ids_cut,
                                 longest=seq.longest) if seq is not None else None,
        phases=phases,
        load=meter.load,
    )
    return fig, timeline, sampler.resources()
