"""On-trainer execution: producers are torch ``DataLoader`` workers on the trainer's machine.

Work items are shards (Parquet row groups), served by a map-style dataset in the plan's order;
the DataLoader preserves that order whatever ``num_workers`` is, so batches are identical
across worker counts.

- ``num_workers = 0``: the trainer process produces its own batches, one work item at a time
  (in the trainer thread, or in the receive thread when ``prefetch_batches > 0``). Nothing
  crosses a process boundary; batches of a poolable format (``single_buffer``) still recycle
  their memory through a small trainer-local ``BufferPool``, and a format that can (``jagged``,
  uncompressed) hands the trainer its finished tensors (``LocalBatch``): no header is written
  and nothing is decoded or re-checked, as nothing crossed a wire.
- ``num_workers > 0``: forked DataLoader workers produce whole work items; at most
  ``prefetch_factor`` items per worker are in flight (the DataLoader's bounded queue is the
  backpressure). Poolable payloads (``single_buffer``) are packed straight into shared
  memory: into the slots of a ``BufferPool`` mapped before the fork, falling back to fresh
  shared memory when no slot is free, so only a small reference crosses the process boundary.
  With ``pin_memory`` on a GPU trainer the pool is page-locked (``cudaHostRegister``) before
  the fork, so a worker's batch is already in pinned memory: the trainer copies it to the
  device straight from the slot, with no host copy.
- ``execution = "streaming"`` hands each work item to the trainer as soon as it is produced,
  so memory is bounded by what is in flight; ``"bulk"`` produces the whole epoch before the
  first batch is handed to the trainer (time to first batch and memory grow with the data).
"""

from __future__ import annotations

import multiprocessing.context
import os
import queue
import signal
import threading
from typing import Any, Iterator

import psutil
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from .. import interrupts, threads
from ..errors import ProcessDied, UserCodeError, UserError, exit_status
from ..measure.watchdog import tick
from ..pipeline import Fetched, Plan, ShardOutput
from ..scenario import Config
from ..stages.buffers import BufferPool
from ..stages.sizes import ceil_div
from .base import EXECUTORS, Executor, ProducerKnob


class _Failed:
    """A user error in a loader worker, handed to the trainer as a value: the DataLoader would
    re-raise it as a new exception of its type built from a traceback text (or as a
    RuntimeError), losing what it says; this way the trainer raises the error itself."""

    def __init__(self, error: UserError) -> None:
        self.error = error


class _Shards(Dataset):
    """The plan's work items. An index is a work item's position, or (ablation, position) from
    kept workers' ``_AblationOrder``: workers kept across a variant's runs serve its ablation
    runs too (a run's plan differs from the one they were forked with only in its ablation),
    so the differential runs interleaved between the full runs do not re-fork them."""

    def __init__(self, plan: Plan, pool: BufferPool | None) -> None:
        self.plan = plan
        self.pool = pool
        self._plans: dict[Any, Plan] = {plan.ablation: plan}

    def __len__(self) -> int:
        return len(self.plan.items)

    def _plan_for(self, ablation: Any) -> Plan:
        got = self._plans.get(ablation)
        if got is None:
            got = self._plans[ablation] = self.plan.with_ablation(ablation, self.plan.caches)
        return got

    def __getitem__(self, index: int | tuple[Any, bool, int]) -> ShardOutput | _Failed:
        plan, pooled, i = (self._plan_for(index[0]), index[1], index[2]) \
            if isinstance(index, tuple) else (self.plan, True, index)
        info = get_worker_info()
        if info is None:
            return plan.produce(i)
        # In a worker process, allocate single buffers in shared memory directly.
        try:
            return plan.produce(i, shared=self.pool.allocator(info.id) if self.pool and pooled
                                else True)
        except UserError as exc:
            if isinstance(exc, UserCodeError):
                exc.located(f"loader worker {info.id}, pid {os.getpid()}")
            return _Failed(exc)


class _AblationOrder(Sampler):
    """Kept workers' work list: every position in order, each with the ablation of the run
    being served and whether its payloads go into the workers' pool (a run whose payloads
    cannot live in one, e.g. transfer ablated away, has none); both set before each pass: the
    DataLoader re-reads its sampler every pass and sends each index to a worker."""

    def __init__(self, ablation: Any, pooled: bool, n: int) -> None:
        self.ablation, self.pooled, self.n = ablation, pooled, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[Any, bool, int]]:
        a, pooled = self.ablation, self.pooled
        return ((a, pooled, i) for i in range(self.n))


class _CheckedForkProcess(multiprocessing.context.ForkProcess):
    """A loader worker whose fork first checks for a signal: the DataLoader forks its workers
    in one loop, and a KeyboardInterrupt raised inside a fork's at-fork callbacks is lost,
    so without this a Ctrl-C while forking many workers waited for all of them."""

    def start(self) -> None:
        interrupts.check()
        super().start()


class _CheckedForkContext(multiprocessing.context.ForkContext):
    Process = _CheckedForkProcess


def _warm_record_function() -> None:
    """Import what the loader's first ``next()`` imports lazily, before its workers start.

    torch's ``record_function`` (around every DataLoader ``__next__``) imports
    ``torch.profiler._cupti_monitor`` on its first use. A worker that dies at once sends
    SIGCHLD, and torch's handler raises inside whatever the main thread runs: in that import,
    torch logs a warning with a traceback (seen under load), and the run's one-line error
    came after a page of torch's log. Imported here, nothing is left to interrupt."""
    try:
        import torch.profiler._cupti_monitor  # noqa: F401
    except Exception:  # noqa: BLE001 - absent in this torch: nothing is imported lazily
        pass


def _identity(x: Any) -> Any:
    return x


class _WorkerInit:
    """Each worker's thread budget (``stallbench.threads``): by default the machine's cores
    split between the workers, so two workers on two cores do not run four decode threads
    that only add context switches and hand-offs. Picklable, for any multiprocessing
    context."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget

    def __call__(self, worker_id: int) -> None:
        threads.apply(self.budget)
        # The DataLoader's own handlers print "ERROR: Unexpected segmentation fault
        # encountered in worker." from each dying worker; the trainer says it in one line
        # (``LocalExecutor._worker_died``), so a crash ends the worker the default way.
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (ValueError, OSError):
                pass


class _FetchAhead:
    """``loader.fetch_ahead`` at 0 workers: the fetch (read + decode) of the next ``depth``
    work items runs in a background thread while the current one is preprocessed and packed.

    Why: with no loader workers the trainer's process otherwise decodes a row group, then
    packs it, then decodes the next: pyarrow's decode releases the GIL and packing is short
    copies, so the two overlap on a second core (a plain DataLoader with 0 workers cannot).
    Bounded: at most ``depth`` decoded tables wait beyond the one being packed (a semaphore
    taken before each fetch, given back when the consumer takes a table). Each fetch is
    timed on this thread's clocks (``Plan.fetch_item``), so stage seconds stay per item; they
    now overlap the consumer's, which the stage table's wall sum shows."""

    def __init__(self, plan: Plan, depth: int) -> None:
        self._plan = plan
        self._room = threading.Semaphore(depth)
        self._ready: "queue.SimpleQueue[Fetched | BaseException]" = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="stallbench-fetch-ahead",
                                        daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            for i in range(len(self._plan.items)):
                while not self._room.acquire(timeout=0.1):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
                self._ready.put(self._plan.fetch_item(i))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._ready.put(exc)

    def take(self, item: int) -> Fetched:
        """Item ``item``'s fetch (they come in order); its error, raised here."""
        while True:
            try:
                got = self._ready.get(timeout=0.1)   # a timeout keeps Ctrl-C deliverable
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._ready.empty():
                    raise RuntimeError("the fetch-ahead thread ended early") from None
        self._room.release()
        if isinstance(got, BaseException):
            raise got
        if got.item != item:
            raise RuntimeError(f"fetch-ahead handed item {got.item} for item {item}")
        return got

    def close(self) -> None:
        """Stop fetching and wait for a fetch under way (bounded: a daemon thread after)."""
        self._stop.set()
        self._room.release()
        self._thread.join(timeout=10.0)


def _process_cpu_s(pid: int) -> float:
    """A live process's CPU seconds: the sum over its threads of the scheduler's own clock
    (``/proc/<pid>/task/*/schedstat``, nanoseconds), as ``/proc/<pid>/stat``'s clock ticks
    (10 ms) are too coarse beside the stages' clocks. A thread that ended between two readings
    drops out of the sum (a kept worker's threads live as long as it does: its pyarrow and
    torch pools, the queue's feeder); where schedstat is missing, the ticks. 0.0 when gone."""
    total, seen = 0, False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            pass
    if seen:
        return total / 1e9
    try:
        c = psutil.Process(pid).cpu_times()
        return c.user + c.system
    except (psutil.Error, TypeError, ValueError):
        return 0.0


def _kept_key(plan: Plan) -> tuple:
    """What kept workers must share with a run to serve it: they were forked with a plan
    (its config, dataset, work list and caches) and a pool. A variant's runs build a new plan
    each (``Plan.with_ablation``) from the same parts, so the parts are compared; the ablation
    is not among them, as it travels with each work item (``_AblationOrder``), and a run with
    no pool is served too (its payloads in fresh shared memory, as workers forked for it)."""
    return (id(plan.config), id(plan.dataset), plan.items, id(plan.caches))


def _close_early(shutdown: Any) -> threading.Thread:
    """Shut the loader's workers down on a helper thread: called once the run's last work
    item is in the trainer's hands, so the workers, idle from then on, exit while the trainer
    consumes that item's batches instead of after it (the DataLoader joins them only when
    asked for an item past the last). The stream joins this thread before it ends, so the
    workers are reaped (their CPU counted) and any exit not overlapped stays on the run's
    clock. Safe: every result is received (a payload in fresh shared memory is mapped when
    its item is unpickled) and nothing else touches the iterator until the join."""
    t = threading.Thread(target=shutdown, name="stallbench-loader-shutdown", daemon=True)
    t.start()
    return t


def pool_shape(plan: Plan) -> tuple[int, int, int] | None:
    """(partitions, slots per partition, slot bytes) of the pool a plan's workers can use, or
    None when their payloads cannot live in one (a format that is not poolable, compressed,
    or transfer ablated away)."""
    lc = plan.config.loader
    fmt = plan.transfer.format
    if not fmt.poolable or lc.compression != "none" or plan.ablation.transfer or not plan.items:
        return None
    per_item = max(ceil_div(s.rows, lc.batch_size) for s in plan.items)
    slot_bytes = fmt.slot_bytes(lc.batch_size)
    # Batches the trainer holds beyond the one it consumes: its receive (pin) thread's queue
    # and the one that thread is handing over, and the copies preloaded to the device (a
    # batch read from the pool in place holds its slot until its copy has completed).
    held = plan.transfer.receive_thread_depth + plan.transfer.device_prefetch + 1
    if lc.num_workers == 0:
        # The trainer packs for itself: recycling buffers still saves fresh pages per batch.
        # Room for the item being consumed, the next one and what the trainer holds.
        return 1, 2 * per_item + held, slot_bytes
    # A worker's items in flight (prefetch_factor), the one it is producing, and the trainer's
    # share of what it holds (the item it is consuming plus its receive queue and preload).
    slots = (lc.prefetch_factor + 2) * per_item + ceil_div(held, lc.num_workers)
    return lc.num_workers, slots, slot_bytes


@EXECUTORS.register("local")
class LocalExecutor(Executor):
    name = "local"
    scaling_knobs = ("loader.num_workers",)
    fetches_ahead = True
    keeps_workers = True

    def __init__(self, config: Any, scenario_file: str = "<scenario>") -> None:
        super().__init__(config, scenario_file)
        self._pool: BufferPool | None = None
        self._figures: dict[str, Any] = {}
        self._pin_error: str | None = None
        self._user_code: list[str] = []     # the user's code the loader workers run, by name
        # The largest batch of the last run that did not fit a slot (0: all fitted). A
        # format sizes its slots from the schema (``jagged``: sequences averaging up to
        # ``sequence_max_len`` ids); data with longer sequences overflows them, and every
        # overflowing batch then faults in fresh pages (measured: 0..99-id sequences made
        # packing 3x slower). The next run's pool is sized from the data instead, up to
        # ``POOL_MEMORY_SHARE`` of the machine's memory.
        self._slot_need = 0
        # ``loader.persistent_workers``: (key, plan, DataLoader) of the workers kept alive
        # between runs; the plan is held so the ids in the key stay its own.
        self._kept: tuple[tuple, Plan, DataLoader, BufferPool | None] | None = None
        self._reused: bool | None = None      # the last run's workers were kept (see base)

    POOL_MEMORY_SHARE = 0.125
    # Shut workers down as soon as the last work item has arrived (``_close_early``); False
    # only for an A/B of the old end of run (benchmarks/trainer_path.py).
    early_shutdown = True

    def _slot_bytes(self, shape: tuple[int, int, int]) -> int:
        need = max(shape[2], self._slot_need)
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return shape[2]
        cap = int(memory * self.POOL_MEMORY_SHARE) // max(shape[0] * shape[1], 1)
        return max(shape[2], min(need, cap))

    def _pool_for(self, plan: Plan) -> BufferPool | None:
        """One pool per executor (mapped once, reused by every run), rebuilt if the plan
        needs a different shape (or the last run's batches outgrew its slots); freed slots
        are reclaimed before workers start."""
        shape = pool_shape(plan)
        if shape is None:
            return None
        shape = (shape[0], shape[1], self._slot_bytes(shape))
        p = self._pool
        if p is None or (p.partitions, p.slots) != shape[:2] or p.slot_bytes < shape[2]:
            if p is not None:
                p.close()
            self._pool = p = BufferPool(*shape)
        api = plan.transfer.api
        if plan.transfer.pin and api is not None and not p.pinned and not self._pin_error:
            try:
                p.pin(api.register, api.unregister)
            except Exception as exc:  # noqa: BLE001 - e.g. the driver refuses to page-lock this much
                # Not fatal: the pin thread then stages batches in its pinned ring instead;
                # results say why (executor figures) and the H2D counts show the ring.
                self._pin_error = f"{type(exc).__name__}: {exc}"
        p.reclaim()
        return p

    def _stream(self, plan: Plan) -> Iterator[ShardOutput]:
        pool = self._pool_for(plan)
        counts = {"pooled": 0, "fresh": 0}
        outs = self._produce(plan, pool)
        try:
            for out in outs:
                tick()        # a row group produced: progress, in bulk mode too
                for p in out.payloads or ():
                    pooled = p.pooled
                    counts["pooled" if pooled else "fresh"] += 1
                    if not pooled and pool is not None and p.raw_bytes > pool.slot_bytes:
                        self._slot_need = max(self._slot_need, p.raw_bytes)
                yield out
        finally:
            outs.close()   # workers are shut down now, not whenever the generator is collected
            if pool is not None:
                # Said in results: how many batches reused a pool slot, how many needed new
                # memory (shared with workers) because every slot was held.
                self._figures["buffer_pool"] = {
                    "slots": pool.partitions * pool.slots, "slot_bytes": pool.slot_bytes,
                    "pinned": pool.pinned,
                    **({"pin_error": self._pin_error} if self._pin_error else {}),
                    "pooled_batches": counts["pooled"],
                    ("fresh_shared_batches" if self.config.loader.num_workers
                     else "fresh_batches"): counts["fresh"]}

    def _produce(self, plan: Plan, pool: BufferPool | None) -> Iterator[ShardOutput]:
        lc = self.config.loader
        if lc.num_workers == 0:
            alloc = pool.allocator(0, fallback_shared=False) if pool else False
            ahead = _FetchAhead(plan, lc.fetch_ahead) if lc.fetch_ahead else None
            try:
                for i in range(len(plan.items)):
                    yield plan.produce(i, shared=alloc, fetched=ahead.take(i) if ahead else None,
                                       local=True)
            finally:
                if ahead is not None:
                    ahead.close()
            return
        self._user_code = [f"transform {st.path!r}"
                           + (f" ({st.origin})" if getattr(st, "origin", None) else "")
                           for st in plan.preprocess.steps if st.name == "user"]
        keep = lc.persistent_workers
        it = self._kept_iterator(plan, pool) if keep else None
        self._reused = it is not None
        if it is None:
            _warm_record_function()
            loader = DataLoader(
                _Shards(plan, pool), batch_size=None, shuffle=False, num_workers=lc.num_workers,
                sampler=_AblationOrder(plan.ablation, True, len(plan.items)) if keep else None,
                prefetch_factor=lc.prefetch_factor, collate_fn=_identity, persistent_workers=keep,
                multiprocessing_context=_CheckedForkContext(),
                worker_init_fn=_WorkerInit(self.producer_threads()),
            )
            it = iter(loader)
            if keep:
                self._kept = (_kept_key(plan), plan, loader, pool)
        shutdown = getattr(it, "_shutdown_workers", None)
        closing: threading.Thread | None = None
        completed = False
        try:
            for got in range(len(plan.items)):
                try:
                    out = next(it)
                except StopIteration:
                    return
                except RuntimeError as exc:
                    died = self._worker_died(it, exc)
                    if died is None:
                        raise
                    raise died from None
                if isinstance(out, _Failed):
                    raise out.error
                if got == len(plan.items) - 1 and shutdown and self.early_shutdown and not keep:
                    closing = _close_early(shutdown)
                yield out
            completed = True
        finally:
            if not (keep and completed):   # kept: every item delivered, workers idle till next run
                self._kept = None
                self._end_workers(it, shutdown, closing)

    @staticmethod
    def _end_workers(it: Any, shutdown: Any, closing: threading.Thread | None) -> None:
        # Stop workers promptly when the trainer stops early (max_batches) or fails. A
        # stopped worker (kill -STOP: the progress watchdog's case) is continued first,
        # or the shutdown's SIGTERM would wait, pending, for its join timeouts.
        for w in getattr(it, "_workers", None) or ():
            try:
                os.kill(w.pid, signal.SIGCONT)
            except (OSError, TypeError):
                pass
        if closing is not None:
            closing.join()
        if shutdown:
            shutdown()     # a no-op after ``_close_early``'s

    def _kept_iterator(self, plan: Plan, pool: BufferPool | None) -> Any:
        """The kept workers' next iteration (``loader.persistent_workers``), or None when
        there are none or they were forked for another plan or pool (then they are shut down:
        a forked worker holds the plan and pool it was forked with)."""
        if self._kept is None:
            return None
        key, _, loader, kept_pool = self._kept
        if key == _kept_key(plan) and (pool is None or pool is kept_pool):
            loader.sampler.ablation = plan.ablation   # this run's (see ``_Shards``)
            loader.sampler.pooled = pool is not None
            return iter(loader)     # the DataLoader resets its workers for a new pass
        self._drop_kept()
        return None

    def _drop_kept(self) -> None:
        kept, self._kept = self._kept, None
        it = getattr(kept[2], "_iterator", None) if kept else None
        if it is not None:
            it._shutdown_workers()

    def _worker_died(self, it: Any, exc: RuntimeError) -> ProcessDied | None:
        """The DataLoader's "worker (pid(s) N) exited unexpectedly" / "is killed by signal",
        as one line naming the worker, its exit status and the user code it ran (None: some
        other RuntimeError, kept as it is)."""
        text = str(exc)
        if "DataLoader worker" not in text:
            return None
        dead = []
        for i, w in enumerate(getattr(it, "_workers", []) or []):
            try:
                w.join(timeout=1.0)
            except (AssertionError, OSError, ValueError):
                pass
            code = getattr(w, "exitcode", None)
            if code is not None:
                dead.append(f"loader worker {i} (pid {w.pid}) {exit_status(code)}")
        what = "; ".join(dead) or " ".join(text.split())[:200]
        user = f" while running {', '.join(self._user_code)}" if self._user_code else ""
        return ProcessDied(f"{self.scenario_file}: {what}{user}; no result written")

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        self._figures = {}
        self._reused = None
        if self.config.loader.execution == "bulk":
            done = list(self._stream(plan))   # the whole epoch, before the first batch
            yield from done
        else:
            yield from self._stream(plan)

    def run_figures(self) -> dict[str, Any]:
        return dict(self._figures)

    def workers_reused(self) -> bool | None:
        return self._reused

    def waiting_for(self) -> str:
        """What the trainer waits on (the progress watchdog's line)."""
        n = self.config.loader.num_workers
        if not n:
            return "its own batch production (no loader workers)"
        import psutil

        try:
            pids = ", ".join(str(c.pid) for c in psutil.Process().children())
        except psutil.Error:
            pids = ""
        return f"{n} loader worker(s)" + (f" (pids {pids})" if pids else "")

    @classmethod
    def producer_knob(cls, config: Config) -> ProducerKnob | None:
        return ProducerKnob("loader.num_workers", "worker(s)", elsewhere=(
            "executor ray / more nodes: nodes simulated on this machine share its {cores:g} "
            "cores (the what-if's cores bound), so they cannot beat local workers here; a real "
            "cluster needs executor.ray_address"))

    def producer_slots(self) -> int:
        """Loader worker processes (0: the trainer produces its own batches)."""
        return self.config.loader.num_workers

    def producer_cpu_s(self, plan: Plan) -> float | None:
        # Workers are forked per run (persistent_workers=False) and joined when it ends, so
        # the trainer's clock of waited-for children holds all their CPU once the run is over.
        if self.config.loader.num_workers == 0 or plan.ablation.compute_only:
            return None
        t = os.times()
        return t.children_user + t.children_system + self._kept_cpu_s()

    def _kept_cpu_s(self) -> float:
        """CPU of the kept workers, alive (``loader.persistent_workers``): not yet in the
        clock of reaped children; added to it when they are reaped, so the sum stays one
        cumulative clock."""
        it = getattr(self._kept[2], "_iterator", None) if self._kept else None
        return sum(_process_cpu_s(w.pid) for w in getattr(it, "_workers", None) or ())

    def stop(self) -> None:
        self._drop_kept()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
