"""What runs inside one rank process: the process group, the synchronous step, the rank's view
of its executor, and one measured run (``measure.probe.measured_run``, unchanged) on its shard.

*Synchronous step.* ``SyncedStep`` wraps the model step. After every step the ranks all-reduce:
a torch model's gradients (dense ones flattened into one buffer, sparse embedding gradients as
sparse tensors, averaged over the ranks that stepped), between ``backward`` and the optimizer
step as DDP would; the emulated step a one-element tensor. Either way a rank cannot start its
next step before every rank finished this one, so a rank that waits for data holds up all, as
in real data-parallel training. The time a rank spends in that all-reduce (mostly waiting for
the slowest rank) is its ``sync_s``; it is taken out of the measured step time, so
``compute_s`` is the model step alone and ``stall_s = epoch - compute - sync`` is what the
rank spent getting its own batches. DDP overlaps the all-reduce with ``backward``; here it
follows it, so it can be timed on its own.

*Uneven ends.* Ranks may have different numbers of batches (a shard with one row group more).
Every all-reduce also carries a 0/1 "still stepping" flag; a rank that has run out keeps
joining the all-reduces with zeros (what ``torch.distributed.algorithms.Join`` does for DDP)
until the flag sums to 0, in a thread started the moment its last step is done, so the others
do not wait for it to shut its loader down.

*Arrival times.* The step records when each batch reached it (``time.perf_counter``,
CLOCK_MONOTONIC on Linux: one clock for every process on this machine, which is where the
launchers start ranks), so the job can tell, per step, which rank received its batch last.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from ..measure import watchdog
from ..measure.probe import measured_run
from ..pipeline import Ablation, Plan, ShardOutput, StageCaches
from ..stages.batch_format import TensorBatch
from ..stages.compute import Compute, TorchCompute
from ..stages.costs import precise_wait
from .base import Delivery, RankContext, RankRun

DIST_TIMEOUT_S = 600.0


def choose_backend(ctx: RankContext) -> tuple[str, torch.device]:
    """gloo on CPU; where GPUs exist each rank takes ``LOCAL_RANK`` modulo their count, with
    nccl when every rank has a GPU of its own and gloo when ranks share one (nccl cannot
    run two ranks on one device)."""
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        torch.cuda.set_device(ctx.local_rank % n)
        return ("nccl" if n >= ctx.world else "gloo"), torch.device("cuda", ctx.local_rank % n)
    return "gloo", torch.device("cpu")


def init_process_group(ctx: RankContext) -> tuple[str, torch.device]:
    """Join the job's process group; the environment is torch.distributed's ``env://``."""
    os.environ.update(ctx.environ())
    backend, device = choose_backend(ctx)
    from datetime import timedelta

    with collective():
        dist.init_process_group(backend, init_method="env://", rank=ctx.rank,
                                world_size=ctx.world, timeout=timedelta(seconds=DIST_TIMEOUT_S))
    return backend, device


class collective:
    """Around a wait for the other ranks (the rendezvous, a barrier, an all-reduce): the
    launcher's watchdog never blames a rank for waiting there; its completion is progress."""

    def __enter__(self) -> None:
        self.before = watchdog.state(watchdog.COLLECTIVE)

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            watchdog.tick()
        watchdog.state(self.before)


def row_hashes(batch: TensorBatch) -> list[int]:
    """A 64-bit hash of every row of a batch (all its features and the label): the identity
    of a row for exactly-once checks. Deterministic across processes (not Python's hash)."""
    n = int(batch["label"].shape[0])
    parts = [t.detach().cpu().contiguous().numpy().reshape(n, -1).view(np.uint8)
             for t in (batch[k] for k in ("dense", "sparse", "seq", "label") if k in batch)]
    rows = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), np.uint8)
    jagged = _jagged_rows(batch, n) if "seq_offsets" in batch else None
    return [int.from_bytes(hashlib.blake2b(r.tobytes() + (jagged[i] if jagged else b""),
                                           digest_size=8).digest(), "little")
            for i, r in enumerate(rows)]


def _jagged_rows(batch: TensorBatch, n: int) -> list[bytes]:
    """Each row's ids of a ``jagged`` batch (sequence ``j`` of row ``i`` is
    ``seq_values[seq_offsets[j*n+i] : seq_offsets[j*n+i+1]]``), each sequence followed by its
    length so that where one ends is part of the identity."""
    off = batch["seq_offsets"].detach().cpu().numpy()
    vals = batch["seq_values"].detach().cpu().numpy()
    q = (off.size - 1) // n if n else 0
    out = []
    for i in range(n):
        b = bytearray()
        for j in range(q):
            lo, hi = int(off[j * n + i]), int(off[j * n + i + 1])
            b += vals[lo:hi].tobytes() + (hi - lo).to_bytes(8, "little")
        out.append(bytes(b))
    return out


class SyncedStep:
    """The model step of one rank followed by the job's all-reduce (see the module docstring).
    Implements what ``measured_run`` needs of a ``Compute``."""

    def __init__(self, inner: Compute, backend: str, device: torch.device) -> None:
        self.inner = inner
        self.backend = backend
        # nccl all-reduces device tensors; gloo reduces on the host (grads are copied there)
        self.comm = device if backend == "nccl" else torch.device("cpu")
        self._lock = threading.Lock()
        self._idle: threading.Thread | None = None
        self._idle_error: BaseException | None = None
        self.hash_rows = False
        self._idling = False
        self.begin_run(None)
        self._params: list[torch.nn.Parameter] = []
        self._sparse: set[int] = set()
        if isinstance(inner, TorchCompute):
            self._params = [p for p in inner.model.parameters() if p.requires_grad]
            # which gradients are sparse is known from the modules, not from the last step
            # (a rank with no batch yet has no gradients, and must still reduce like the rest)
            self._sparse = {id(m.weight) for m in inner.model.modules()
                            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                            and m.sparse}
        if self._params:
            inner.opt.register_step_pre_hook(self._before_optimizer_step)

    # ------------------------------------------------------------------------- one run
    def begin_run(self, limit: int | None) -> None:
        """Reset per-run records; ``limit``: steps after which this rank is known to be done."""
        self.arrivals: list[float] = []
        self.sync_per_step: list[float] = []
        self.hashes: list[int] = []
        self.steps = 0
        self._limit = limit
        self._idle = None
        self._idle_error = None

    def set_limit(self, n: int) -> None:
        """The source has delivered all it will (``n`` batches): once that many steps are
        done, join the others' remaining steps in the background."""
        with self._lock:
            self._limit = n if self._limit is None else min(self._limit, n)
            self._maybe_go_idle()

    def done(self) -> None:
        """The trainer loop has ended (early stop or error): go idle now."""
        with self._lock:
            self._limit = self.steps
            self._maybe_go_idle()

    def _maybe_go_idle(self) -> None:
        if self._idle is None and self._limit is not None and self.steps >= self._limit:
            self._idle = threading.Thread(target=self._idle_loop, name="stallbench-rank-join",
                                          daemon=True)
            self._idle.start()

    def finish(self) -> None:
        """After the run: make sure this rank joined until every rank was done."""
        self.done()
        assert self._idle is not None
        self._idle.join()
        if self._idle_error is not None:
            raise self._idle_error

    # ------------------------------------------------------------------------ the step
    def step(self, batch: TensorBatch) -> None:
        self.arrivals.append(time.perf_counter())
        if self.hash_rows:
            self.hashes.extend(row_hashes(batch))
        self.inner.step(batch)          # a torch model all-reduces in the optimizer pre-hook
        if not self._params:
            self._all_reduce(active=True)
        with self._lock:
            self.steps += 1
            self._maybe_go_idle()

    def sync(self) -> None:
        self.inner.sync()

    @property
    def kind(self) -> str:
        """The inner step's kind (``measure.device_clock``: CUDA events around a GPU step)."""
        return getattr(self.inner, "kind", "cpu")

    def digest(self) -> float | None:
        """Sum of the model's parameters: equal on every rank when the gradients were
        all-reduced (the ranks start from the same seed)."""
        if not self._params:
            return None
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self._params))

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._idling:
            self._all_reduce(active=True)

    # -------------------------------------------------------------------- the all-reduce
    def _all_reduce(self, active: bool) -> int:
        """Flag, then gradients; returns how many ranks stepped. Timed when active."""
        t0 = time.perf_counter()
        flag = torch.tensor([1.0 if active else 0.0], device=self.comm)
        with collective():
            dist.all_reduce(flag)
            n = int(round(float(flag.item())))
            if n and self._params:
                self._reduce_grads(n, active)
        if active:
            self.sync_per_step.append(time.perf_counter() - t0)
        return n

    def _reduce_grads(self, n: int, active: bool) -> None:
        dense = [p for p in self._params if id(p) not in self._sparse]
        sparse = [p for p in self._params if id(p) in self._sparse]
        # A rank that has run out contributes zeros and still applies the averaged gradients
        # (``_idle_loop``), so every rank's model stays the same.
        grads = [p.grad if active and p.grad is not None else torch.zeros_like(p)
                 for p in dense]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads]).to(self.comm)
            dist.all_reduce(flat)
            flat.div_(n)
            off = 0
            for p, g in zip(dense, grads):
                k = g.numel()
                g.copy_(flat[off:off + k].view_as(g))
                off += k
                p.grad = g
        for p in sparse:
            g = p.grad if active and p.grad is not None else torch.sparse_coo_tensor(
                torch.empty(1, 0, dtype=torch.long), torch.empty(0, *p.shape[1:]), p.shape)
            if self.backend == "nccl":     # nccl has no sparse all-reduce: densify
                d = g.to_dense().to(self.comm)
                dist.all_reduce(d)
                p.grad = d.div_(n)
                continue
            h = g.cpu().coalesce()
            dist.all_reduce(h)
            p.grad = h.div_(n).to(p.device)

    def _idle_loop(self) -> None:
        try:
            self._idling = True
            while self._all_reduce(active=False) > 0:
                if self._params:
                    self.inner.opt.step()       # the same averaged update as the others
                    self.inner.opt.zero_grad(set_to_none=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self._idle_error = exc
        finally:
            self._idling = False


class RankSource:
    """The executor as one rank's trainer loop sees it: the inner executor's deliveries, with
    the EMULATED straggler latency injected on arrival (``trainers.straggler_delay_ms``, only
    on the straggler rank, only for deliveries carrying payloads: when transfer is ablated the
    trainer takes its batches from memory and nothing arrives), each delivery recorded, and
    the step told when no more batches will come."""

    def __init__(self, inner: Any, ctx: RankContext, step: SyncedStep,
                 job_item: Callable[[int], int]) -> None:
        self.inner = inner
        self.ctx = ctx
        self.step = step
        self.job_item = job_item
        self.deliveries: list[Delivery] = []
        self.pids: set[int] = set()
        self.injected_s = 0.0

    def __getattr__(self, name: str) -> Any:     # worker_pids, producer_cpu_s, run_figures...
        found = getattr(self.inner, name)
        if name == "waiting_for" and callable(found):   # the watchdog's line names the rank
            return lambda: f"{found()} for trainer rank {self.ctx.rank} (pid {os.getpid()})"
        return found

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        delay = self.ctx.delay_s
        batches = 0
        gen = self.inner.run(plan)
        ended = False
        try:
            for out in gen:
                if out.payloads is not None and delay > 0:
                    t0 = time.perf_counter()
                    precise_wait(delay)
                    self.injected_s += time.perf_counter() - t0
                if out.payloads is not None:
                    ids = [p.batch_id for p in out.payloads]
                else:
                    ids = [f"{out.shard}:{i}" for i in range(len(plan.caches.final[out.shard]))]
                batches += len(ids)
                self.deliveries.append(Delivery(self.job_item(out.item), out.shard, ids, out.rows,
                                                max(out.batches, len(ids)), out.times.rows_out))
                if out.times.worker:
                    self.pids.add(out.times.worker)
                yield out
            ended = True
            self.step.set_limit(batches)
        finally:
            if not ended:
                self.step.done()
            gen.close()


class RankWorker:
    """One rank's state across the runs of a variant: its plan, caches, step and executor."""

    def __init__(self, ctx: RankContext, plan: Plan, make_source: Callable[..., Any],
                 cache_plan: Plan | None, job_item: Callable[[int], int], *,
                 compute_plan: Plan | None = None, warm: bool = True) -> None:
        """``plan``: what the rank's trainer loop runs (its items are what its source
        delivers); ``compute_plan``: the rank's share for the compute-only run (default
        ``plan``); ``cache_plan``: the shards whose stage outputs it must hold for ablations;
        ``job_item``: a delivered item's index in the job's work list; ``warm``: the rank's
        own process produces (local loaders), so warm it up."""
        self.ctx = ctx
        self.plan = plan
        self.compute_plan = compute_plan or plan
        self.make_source = make_source
        self.cache_plan = cache_plan
        self.job_item = job_item
        self.warm = warm
        self.caches: StageCaches | None = None
        self.step: SyncedStep | None = None
        self.backend = "gloo"

    def setup(self) -> dict[str, Any]:
        watchdog.state(watchdog.SETUP)
        self.backend, device = init_process_group(self.ctx)
        if self.cache_plan is not None:   # untimed, like the runner's; each row group progress
            self.caches = StageCaches.build(self.cache_plan, on_item=watchdog.tick)
        elif self.warm and self.plan.items:
            # One untimed pass of the producer code in this process (Parquet footers, Arrow
            # kernels, first-use allocations), so that the first measured run is not the only
            # one paying first-use costs, and not more on one rank than on another. Loader
            # workers are forked from here and inherit it. (Building caches does the same.)
            self.plan.produce(0)
            watchdog.tick()
        self.step = SyncedStep(self.plan.build_compute(), self.backend, device)
        watchdog.tick()
        with collective():
            dist.barrier()
        return {"pid": os.getpid(), "backend": self.backend, "device": str(device)}

    def run(self, ablation: Ablation, source_arg: Any = None, *, keep_timeline: bool = False,
            hash_rows: bool = False) -> RankRun:
        step = self.step
        assert step is not None
        p = (self.compute_plan if ablation.compute_only else self.plan).with_ablation(
            ablation, self.caches)
        cap = None if p.max_batches == float("inf") else int(p.max_batches)
        step.begin_run(cap)
        step.hash_rows = hash_rows
        inner = self.make_source(source_arg)
        src = RankSource(inner, self.ctx, step, self.job_item)
        cfg = p.config

        def start_together() -> None:
            """Every rank starts its clock together, after its own set-up of the run."""
            with collective():
                dist.barrier()
            if ablation.compute_only:      # (after the barrier: going idle is a collective)
                n = sum(len(p.caches.final[s.index]) for s in p.items)  # what _cached yields
                step.set_limit(min(n, cap) if cap is not None else n)

        # On an error the rank does not wait for the others: the launcher stops them all.
        fig, tl, res = measured_run(p, src, step, warmup_batches=cfg.run.warmup_batches,
                                    sample_interval_s=cfg.run.sample_interval_s,
                                    start_together=start_together)
        step.finish()
        sync = step.sync_per_step[:fig.batches]
        sync_s = sum(sync)
        fig.compute_s = max(fig.compute_s - sync_s, 0.0)
        fig.stall_s = fig.epoch_s - fig.compute_s - sync_s
        if fig.device is not None:
            # AU's step time leaves out the all-reduce too, as compute_s does. The all-reduce
            # is timed by the host clock; on a GPU the step is timed by CUDA events, so this
            # is the GPU's step time less the host's all-reduce time (an approximation).
            d = fig.device
            d.compute_s = max(d.compute_s - sync_s, 0.0)
            d.au = d.compute_s / fig.epoch_s if fig.epoch_s > 0 else 0.0
            ph = fig.phases
            if d.steady_compute_s is not None and ph is not None and ph.steady_s > 0:
                d.steady_compute_s = max(d.steady_compute_s - sum(sync[ph.startup_batches:]),
                                         0.0)
                d.steady_au = d.steady_compute_s / ph.steady_s
        tl.compute_s = [round(max(c - s, 0.0), 6) for c, s in zip(tl.compute_s, sync)]
        return RankRun(
            rank=self.ctx.rank, pid=os.getpid(), figures=fig, sync_s=sync_s,
            arrivals=list(step.arrivals[:fig.batches]),
            step_stall_s=[w + t for w, t in zip(tl.wait_s, tl.transfer_s)],
            step_compute_s=list(tl.compute_s), step_sync_s=[round(s, 6) for s in sync],
            deliveries=src.deliveries, producer_pids=sorted(src.pids),
            straggler_delay_s=src.injected_s,
            timeline=tl if keep_timeline else None, resources=res if keep_timeline else None,
            row_hashes=list(step.hashes) if hash_rows else None,
            model_digest=step.digest() if hash_rows else None)

    def close(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
