"""Disaggregated execution on Ray Data: producers run as Ray tasks (or actors) on a Ray cluster.

Two modes (``executor.ray_mode``):

``"stallbench"``: fetch + preprocess + transfer.send (single buffer, collate, compression as the
loader knobs say) run inside one Ray Data operator, ``range(work items) -> map_batches(produce)``,
so Ray's streaming executor schedules them with its backpressure on whatever nodes carry the
producer resources. The trainer consumes with ``iter_batches(prefetch_batches=...)`` and only
unpacks (zero-copy views for a single buffer).

  *What is a block.* One input block is one work item (a Parquet row group of the plan, so
  epochs are items too); the map task turns it into one output block with **one row per
  trainer batch**: ``item, shard, part, parts, batches, rows, kind, batch_id, raw, wire``,
  the encoded batch as ``large_binary`` ``payload`` (a single buffer's bytes, a zstd frame, or a
  pickle for the other formats) and, on part 0, the producer's stage times as ``meta``. The
  payload column is built from one contiguous buffer (one copy), and the trainer reads each
  batch straight out of the object store as a tensor view (no copy on the same node).

  *Order and exactly-once.* ``DataContext.execution_options.preserve_order`` makes Ray Data
  emit blocks in input order, so batches are those of the local executor, in the same order.
  Ray retries a map task whose worker died (``max_retries=-1`` for Ray Data tasks), and a
  streaming generator replays deterministically, so the items come through again; on top of
  that the trainer side sequences every row by ``(item, part)``: a duplicate is dropped and
  counted (``faults.duplicates_dropped``), a gap is an error, and a stream that ends early is
  an error. Worker deaths and task retries seen during the run are read from Ray's GCS and
  reported in ``run_figures()["faults"]``.

  *Caches for ablations.* ``prepare`` puts each cached Arrow table into the object store once
  per variant (``ray.put`` per shard); the plan shipped to workers carries only the small
  ``ObjectRef`` maps, and a task ``ray.get``s the one table its shard needs (zero-copy on the
  same node, a pull elsewhere). The trainer-side ``final`` cache never leaves the trainer.

``"stock"``: what users write first, for the benchmark and as a variant:
``read_parquet -> map_batches(normalise + preprocess, pyarrow) -> iter_torch_batches(batch_size,
collate_fn=<numpy dict -> tensors, sequences padded in a Python loop>)``. The loader's format
knobs do not apply (Ray's iter_torch_batches is the format). Ablations that make fetch or
preprocess free replace ``read_parquet`` by the cached tables, one block per shard; an ablation
that makes transfer free runs the stallbench path with no payload (nothing left to hand over).
Storage emulation (``[storage]``) is not applied by ``read_parquet``: results note it.

``execution = "bulk"`` materialises the dataset (``materialize()``) before the first batch.
"""

from __future__ import annotations

import math
import os
import pickle
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import torch

from ..errors import UserError
from ..pipeline import Plan, ShardOutput, StageCaches, StageTimes
from ..scenario import Config
from ..stages.transfer import Payload
from .base import EXECUTORS, Executor
from .ray_cluster import RayRuntime, import_ray

KIND_BUFFER, KIND_COMPRESSED, KIND_PICKLED, KIND_NONE = 0, 1, 2, 3
STOCK_PREP_COL = "_stallbench_prep_s"   # per-row share of the preprocess time (stock mode)


# =============================================================================== worker side

@dataclass
class _Job:
    """What every producer task needs, shipped once per dataset execution: the plan without
    its caches, and ObjectRefs of the cached tables the ablation reads (per shard)."""

    token: str
    plan: Plan
    refs: dict[str, dict[int, Any]] = field(default_factory=dict)


_WORKER_PLANS: dict[str, Plan] = {}


def _worker_plan(job: _Job) -> Plan:
    """One plan per worker process and job, so per-process caches (Parquet footers) survive
    from one task to the next."""
    plan = _WORKER_PLANS.get(job.token)
    if plan is None:
        _WORKER_PLANS.clear()
        plan = _WORKER_PLANS[job.token] = job.plan
    return plan


def _cached_tables(job: _Job, shard_index: int) -> StageCaches | None:
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


def _detach(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _detach(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_detach(v) for v in obj]
    return obj


def _encode(out: ShardOutput, node: str) -> pa.Table:
    """A shard's output as one Arrow table, one row per batch (see the module docstring)."""
    meta = pickle.dumps((out.times, node), protocol=pickle.HIGHEST_PROTOCOL)
    if out.payloads is None:
        n, kinds, ids, rows, raw, wire = 1, [KIND_NONE], [""], [out.rows], [0], [0]
        chunks: list[Any] = [b""]
    else:
        n = len(out.payloads)
        kinds, ids, rows, raw, wire, chunks = [], [], [], [], [], []
        for p in out.payloads:
            d = p.data
            if p.compressed:
                kinds.append(KIND_COMPRESSED)
                chunks.append(memoryview(d).cast("B"))
            elif isinstance(d, torch.Tensor) and d.dtype == torch.uint8 and d.dim() == 1:
                kinds.append(KIND_BUFFER)
                chunks.append(memoryview(d.numpy()))
            else:
                kinds.append(KIND_PICKLED)
                chunks.append(memoryview(pickle.dumps(_detach(d), protocol=pickle.HIGHEST_PROTOCOL)))
            ids.append(p.batch_id)
            rows.append(p.rows)
            raw.append(p.raw_bytes)
            wire.append(p.wire_bytes)
    sizes = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for c, lo, hi in zip(chunks, offsets[:-1], offsets[1:]):
        if hi > lo:
            data[lo:hi] = np.frombuffer(c, dtype=np.uint8)
    payload = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(chunks), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pa.table({
        "item": pa.array([out.item] * n, pa.int64()),
        "shard": pa.array([out.shard] * n, pa.int64()),
        "part": pa.array(range(n), pa.int32()),
        "parts": pa.array([n] * n, pa.int32()),
        "batches": pa.array([out.batches] * n, pa.int32()),
        "rows": pa.array(rows, pa.int64()),
        "kind": pa.array(kinds, pa.int8()),
        "batch_id": pa.array(ids, pa.string()),
        "raw": pa.array(raw, pa.int64()),
        "wire": pa.array(wire, pa.int64()),
        "payload": payload,
        "meta": pa.array([meta] + [b""] * (n - 1), pa.binary()),
    })


def _produce_items(batch: dict[str, np.ndarray], job: _Job) -> pa.Table:
    """Ray Data UDF (task pool): work item indices -> encoded batches."""
    plan = _worker_plan(job)
    node = _node_id()
    tables = []
    for item in batch["id"]:
        item = int(item)
        p = plan
        caches = _cached_tables(job, plan.items[item].index)
        if caches is not None:
            p = plan.with_ablation(plan.ablation, caches)
        tables.append(_encode(p.produce(item, shared=False), node))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


class _Producer:
    """Ray Data UDF (actor pool): the same work, the plan kept by the actor."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        _worker_plan(job)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        return _produce_items(batch, self.job)


def _stock_preprocess(table: pa.Table, job: _Job) -> pa.Table:
    """Stock UDF after read_parquet: normalise types (the decode half of fetch) + preprocess."""
    from ..data.parquet import normalise

    plan = _worker_plan(job)
    table = normalise(table, plan.dataset.schema)
    t0 = time.perf_counter()
    out = plan.preprocess(table, -1)
    return _with_prep_time(out, time.perf_counter() - t0)


def _stock_shard(batch: dict[str, np.ndarray], job: _Job) -> pa.Table:
    """Stock mode under a fetch/preprocess ablation: one block per shard from the caches."""
    plan = _worker_plan(job)
    out = []
    for item in batch["id"]:
        shard = plan.items[int(item)]
        c = _cached_tables(job, shard.index)
        a = plan.ablation
        table = None
        if not a.fetch:
            table = plan.fetch(shard)     # real even when preprocess is ideal, as in produce()
        elif not a.preprocess:
            table = c.fetched[shard.index]
        t0 = time.perf_counter()
        table = c.prepped[shard.index] if a.preprocess else plan.preprocess(table, shard.index)
        out.append(_with_prep_time(table, time.perf_counter() - t0))
    return out[0] if len(out) == 1 else pa.concat_tables(out)


def _with_prep_time(table: pa.Table, seconds: float) -> pa.Table:
    share = seconds / table.num_rows if table.num_rows else 0.0
    table = table.select([c for c in table.column_names if c != STOCK_PREP_COL])
    return table.append_column(STOCK_PREP_COL, pa.array(np.full(table.num_rows, share)))


def _identity_batch(batch: Any) -> Any:
    return batch


def _warm_worker(delay_s: float) -> int:
    """Import what producers need, so the first measured batch does not pay for it."""
    import pyarrow.parquet  # noqa: F401
    import ray.data  # noqa: F401

    from .. import pipeline  # noqa: F401
    from ..data import parquet  # noqa: F401

    time.sleep(delay_s)
    return os.getpid()


# ============================================================================== trainer side

_STOCK_COLLATE: Any = None


def _stock_collate_class() -> Any:
    """The straightforward collate a user writes for iter_torch_batches (created lazily: this
    module must import without Ray installed)."""
    global _STOCK_COLLATE
    if _STOCK_COLLATE is not None:
        return _STOCK_COLLATE
    from ray.data.collate_fn import NumpyBatchCollateFn

    from ..stages.batch_format import PAD_ID

    class StockCollate(NumpyBatchCollateFn):
        def __init__(self, schema: Any) -> None:
            self.s = schema

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
            s = self.s
            n = len(batch[s.label])
            dense = (np.stack([np.asarray(batch[c], dtype=np.float32) for c in s.dense], axis=1)
                     if s.dense else np.empty((n, 0), np.float32))
            sparse = (np.stack([np.asarray(batch[c], dtype=np.int64) for c in s.sparse], axis=1)
                      if s.sparse else np.empty((n, 0), np.int64))
            seq = np.full((n, len(s.sequence), s.seq_len), PAD_ID, dtype=np.int64)
            for j, c in enumerate(s.sequence):
                for i, v in enumerate(batch[c]):
                    if v is None:
                        continue
                    v = v[:s.seq_len]
                    seq[i, j, :len(v)] = v
            out = {"dense": torch.from_numpy(dense), "sparse": torch.from_numpy(sparse),
                   "seq": torch.from_numpy(seq),
                   "label": torch.from_numpy(np.array(batch[s.label], dtype=np.float32))}
            if STOCK_PREP_COL in batch:
                out[STOCK_PREP_COL] = torch.tensor(float(np.sum(batch[STOCK_PREP_COL])))
            return out

    _STOCK_COLLATE = StockCollate
    return StockCollate


class _Sequencer:
    """Every (item, part) exactly once and in order; duplicates (a replayed task) dropped."""

    def __init__(self, n_items: int) -> None:
        self.n_items = n_items
        self.item = 0
        self.part = 0
        self.duplicates = 0

    def accept(self, item: int, part: int, parts: int) -> bool:
        if (item, part) < (self.item, self.part):
            self.duplicates += 1
            return False
        if (item, part) != (self.item, self.part):
            raise RuntimeError(f"Ray delivered batch {part} of work item {item} while batch "
                               f"{self.part} of item {self.item} was due: a batch was lost")
        self.part += 1
        if self.part >= parts:
            self.item += 1
            self.part = 0
        return True

    @property
    def complete(self) -> bool:
        return self.item >= self.n_items


def _payload_views(col: pa.ChunkedArray) -> list[tuple[pa.Buffer | None, int, int]]:
    """(data buffer, start, end) of every value of a large_binary column, without copies."""
    out = []
    for chunk in col.chunks:
        bufs = chunk.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int64)[chunk.offset:chunk.offset + len(chunk) + 1]
        data = bufs[2]
        for lo, hi in zip(offs[:-1], offs[1:]):
            out.append((data, int(lo), int(hi)))
    return out


def _tensor_view(data: pa.Buffer, lo: int, hi: int) -> torch.Tensor:
    if hi <= lo:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        # The object store's memory is read-only; the trainer only reads batches.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo))


@dataclass
class _RunState:
    t0: float = 0.0
    first_block_s: float | None = None
    blocks: int = 0
    batches: int = 0
    rows: int = 0
    nodes: set = field(default_factory=set)
    pids: set = field(default_factory=set)
    store_peak_mb: float | None = None
    fault_marker: float = 0.0
    duplicates: int = 0
    complete: bool = False
    notes: list[str] = field(default_factory=list)


@EXECUTORS.register("ray")
class RayExecutor(Executor):
    name = "ray"
    scaling_knobs = ("executor.simulated_nodes", "executor.cpus", "executor.concurrency")

    def producer_slots(self) -> int:
        return self.spec.concurrency or self.runtime.producer_cpus()

    def has_producers(self) -> bool:
        return True

    def producer_nodes(self) -> int | None:
        return self.spec.simulated_nodes or None

    def nodes_simulated(self) -> bool:
        return bool(self.spec.simulated_nodes)

    def __init__(self, config: Config, scenario_file: str = "<scenario>") -> None:
        super().__init__(config, scenario_file)
        self.spec = config.executor
        self.runtime = RayRuntime(self.spec, scenario_file)
        self._cluster_info: dict[str, Any] = {}
        self._startup: dict[str, float] = {}
        self._cache_refs: dict[str, dict[int, Any]] = {}
        self._caches_for: Any = None
        self._run: _RunState | None = None
        self._last: dict[str, Any] = {}
        self._default_reservation: bool | None = None

    # ------------------------------------------------------------------------- lifecycle
    @classmethod
    def check(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        import_ray(scenario_file)

    def start(self) -> None:
        t0 = time.perf_counter()
        self.runtime.open()
        t1 = time.perf_counter()
        self._warm()
        t2 = time.perf_counter()
        self._startup = {"ray_init_s": t1 - t0, "warm_workers_s": t2 - t1}
        self._cluster_info = self.runtime.describe()

    def _warm(self) -> None:
        import ray

        n = self.spec.concurrency or self.runtime.producer_cpus()
        opts: dict[str, Any] = {"num_cpus": 1}
        if self.runtime.producer_resources:
            opts["resources"] = dict(self.runtime.producer_resources)
        fn = ray.remote(_warm_worker)
        refs = [fn.options(**opts).remote(0.3) for _ in range(n)]
        try:
            ray.get(refs, timeout=180)
            # Ray Data starts its own helper actors (stats, autoscaling coordinator) on the
            # first execution, ~3 s of CPU each here: pay that now, as start-up.
            import ray.data

            self._context(stock=False)
            ray.data.from_items([{"id": i} for i in range(n)], override_num_blocks=n) \
                .map_batches(_identity_batch, **self._map_args()).take_all()
            _wait_for_named_actors(ray, timeout_s=60)
        except Exception as exc:  # noqa: BLE001 - a cluster that cannot run a task is unusable
            raise UserError(f"{self.scenario_file}: executor: the Ray cluster could not run a "
                            f"producer task ({type(exc).__name__}: {str(exc)[:200]})") from None

    def stop(self) -> None:
        self._cache_refs = {}
        self._caches_for = None
        _WORKER_PLANS.clear()
        self.runtime.close()

    def prepare(self, plan: Plan, caches: StageCaches | None) -> None:
        """Caches into the object store, then one untimed pass of the real producer code over
        one work item per producer slot. Ray keeps its workers between runs, so without this
        the first measured run alone pays each worker's first-use costs (Parquet footers,
        Arrow kernels, Ray Data's map path: ~2-3 s here), which would bias the differential
        attribution (the full run comes first). Timed and reported as ``startup.warm_plan_s``.
        """
        self._put_caches(caches)
        t0 = time.perf_counter()
        n = min(len(plan.items), self.spec.concurrency or self.runtime.producer_cpus())
        if n:
            warm = plan.with_ablation(plan.ablation, None)
            warm.items = plan.items[:n]
            warm.max_batches = math.inf
            stock = self.spec.ray_mode == "stock"
            gen = self.run(warm)
            try:
                for _ in gen:
                    if stock:        # read_parquet reads every file: stop after one batch
                        break
            finally:
                gen.close()
                self._last = {}
        self._startup["warm_plan_s"] = time.perf_counter() - t0

    def _put_caches(self, caches: StageCaches | None) -> None:
        if caches is self._caches_for:
            return
        import ray

        self._cache_refs = {}
        self._caches_for = caches
        if caches is None:
            return
        self._cache_refs = {
            "fetched": {k: ray.put(v) for k, v in caches.fetched.items()},
            "prepped": {k: ray.put(v) for k, v in caches.prepped.items()},
        }

    def _job(self, plan: Plan) -> _Job:
        a = plan.ablation
        if plan.caches is not None:
            self._put_caches(plan.caches)   # normally done by prepare(), untimed
        refs: dict[str, dict[int, Any]] = {}
        if a.fetch and not a.preprocess:
            refs["fetched"] = self._cache_refs["fetched"]
        if a.preprocess:
            refs["prepped"] = self._cache_refs["prepped"]
        return _Job(uuid.uuid4().hex, plan.with_ablation(a, None), refs)

    # -------------------------------------------------------------------------- figures
    def worker_pids(self) -> list[int]:
        return self.runtime.worker_pids()

    def producer_cpu_s(self, plan: Plan) -> float | None:
        return None if plan.ablation.compute_only else self.runtime.cluster_cpu_s()

    def object_store_mb(self) -> float | None:
        used = self.runtime.object_store_used_mb()
        r = self._run
        if r is not None and used is not None:
            r.store_peak_mb = used if r.store_peak_mb is None else max(r.store_peak_mb, used)
        return used

    def run_figures(self) -> dict[str, Any]:
        return self._last

    # ------------------------------------------------------------------------------ run
    def _context(self, stock: bool) -> None:
        """Ray Data settings of one run (DataContext is per process, so set every time).

        Both modes preserve order (same batches as the local executor). The stallbench path
        also turns off Ray Data's per-operator resource reservation: with it, half of a small
        cluster's CPUs are held back for the input operator, and with 2 CPUs the producer
        operator then runs one task at a time (measured: ~1.2 tasks in flight instead of 2).
        Stock mode keeps Ray's defaults: it is the baseline users get.
        """
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        if self._default_reservation is None:
            self._default_reservation = ctx.op_resource_reservation_enabled
        ctx.op_resource_reservation_enabled = self._default_reservation if stock else False

    def _map_args(self) -> dict[str, Any]:
        import ray.data

        n = self.spec.concurrency or self.runtime.producer_cpus()
        kw: dict[str, Any] = {"num_cpus": 1}
        if self.runtime.producer_resources:
            kw["resources"] = dict(self.runtime.producer_resources)
        if self.spec.ray_pool == "actors":
            kw["compute"] = ray.data.ActorPoolStrategy(size=n)
        else:
            kw["compute"] = ray.data.TaskPoolStrategy(size=n)
        return kw

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        stock = self.spec.ray_mode == "stock" and not plan.ablation.transfer
        self._context(stock)
        r = self._run = _RunState(t0=time.perf_counter(), fault_marker=self.runtime.fault_marker())
        self.object_store_mb()
        ds = None
        try:
            if stock:
                gen = self._run_stock(plan, r)
            else:
                if self.spec.ray_mode == "stock":
                    r.notes.append("transfer ablation runs the stallbench path without payloads")
                gen = self._run_stallbench(plan, r)
            for item in gen:
                if isinstance(item, _Dataset):
                    ds = item.ds
                    continue
                yield item
        finally:
            self._finish(plan, r, ds)

    def _finish(self, plan: Plan, r: _RunState, ds: Any) -> None:
        self.object_store_mb()
        faults = self.runtime.faults_since(r.fault_marker, task_name=None)
        faults["duplicates_dropped"] = r.duplicates
        stats = _operator_figures(ds) if ds is not None else {}
        elapsed = time.perf_counter() - r.t0
        first = r.first_block_s
        self._last = {
            "ray": {
                "ray_mode": self.spec.ray_mode,
                "pool": self.spec.ray_pool,
                "execution": plan.config.loader.execution,
                "cluster": self._cluster_info,
                "startup": self._startup,
                "nodes_used": len(r.nodes),
                "producer_nodes": sorted(r.nodes),
                "producer_processes": len(r.pids),
                "blocks": r.blocks,
                "first_block_s": first,
                "steady_rows_s": ((r.rows / max(elapsed - first, 1e-9)) if first is not None
                                  and r.blocks > 1 else None),
                "object_store_peak_mb": r.store_peak_mb,
                "complete": r.complete,
                **stats,
                **({"notes": r.notes} if r.notes else {}),
            },
            "faults": faults,
        }
        self._run = None

    # -------------------------------------------------------------- stallbench mode
    def _run_stallbench(self, plan: Plan, r: _RunState) -> Iterator[Any]:
        import ray.data

        job = self._job(plan)
        n = len(plan.items)
        ds = _work_items(n)
        kw = self._map_args()
        if self.spec.ray_pool == "actors":
            ds = ds.map_batches(_Producer, fn_constructor_args=(job,), batch_format="numpy", **kw)
        else:
            ds = ds.map_batches(_produce_items, fn_args=(job,), batch_format="numpy", **kw)
        if plan.config.loader.execution == "bulk":
            ds = ds.materialize()
        yield _Dataset(ds)
        seq = _Sequencer(n)
        prefetch = max(1, plan.config.loader.prefetch_factor)
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow",
                                     prefetch_batches=prefetch):
            if r.first_block_s is None:
                r.first_block_s = time.perf_counter() - r.t0
            r.blocks += 1
            # A shard whose output Ray split over two blocks arrives as two ShardOutputs of
            # the same item (the second without stage times): the trainer needs no more.
            yield from self._decode(block, plan, seq, r)
        r.duplicates = seq.duplicates
        r.complete = seq.complete
        if not seq.complete:
            raise RuntimeError(f"Ray ended the stream after {seq.item} of {n} work items")

    def _decode(self, block: pa.Table, plan: Plan, seq: _Sequencer,
                r: _RunState) -> Iterator[ShardOutput]:
        cols = {name: block.column(name).to_pylist()
                for name in ("item", "shard", "part", "parts", "batches", "rows", "kind",
                             "batch_id", "raw", "wire")}
        metas = block.column("meta").to_pylist()
        views = _payload_views(block.column("payload"))
        current: ShardOutput | None = None
        for k in range(block.num_rows):
            item, part, parts = cols["item"][k], cols["part"][k], cols["parts"][k]
            if not seq.accept(item, part, parts):
                r.duplicates = seq.duplicates
                continue
            times = StageTimes()
            if metas[k]:
                times, node = pickle.loads(metas[k])
                r.nodes.add(node)
                r.pids.add(times.worker)
            kind = cols["kind"][k]
            rows = cols["rows"][k]
            if kind == KIND_NONE:
                payloads = None
            else:
                data_buf, lo, hi = views[k]
                if kind == KIND_BUFFER:
                    data: Any = _tensor_view(data_buf, lo, hi)
                elif kind == KIND_COMPRESSED:
                    data = memoryview(data_buf)[lo:hi]
                else:
                    data = pickle.loads(memoryview(data_buf)[lo:hi])
                payloads = [Payload(cols["batch_id"][k], rows, data, kind == KIND_COMPRESSED,
                                    cols["wire"][k], cols["raw"][k])]
                r.batches += 1
            r.rows += rows
            if current is not None and current.item == item:
                current.payloads = (current.payloads or []) + (payloads or [])
                current.rows += rows
                continue
            if current is not None:
                yield current
            current = ShardOutput(item, cols["shard"][k], payloads, cols["batches"][k], rows, times)
        if current is not None:
            yield current

    # ------------------------------------------------------------------- stock mode
    def _run_stock(self, plan: Plan, r: _RunState) -> Iterator[Any]:
        import ray.data

        job = self._job(plan)
        a = plan.ablation
        schema = plan.dataset.schema
        if a.fetch or a.preprocess:
            n = len(plan.items)
            ds = _work_items(n).map_batches(
                _stock_shard, fn_args=(job,), batch_format="numpy", **self._map_args())
            epochs = 1                              # plan.items already spans the epochs
        else:
            ds = ray.data.read_parquet(list(plan.dataset.files), columns=list(schema.columns))
            ds = ds.map_batches(_stock_preprocess, fn_args=(job,), batch_format="pyarrow")
            shards = max(1, len(plan.dataset.shards))
            epochs = max(1, math.ceil(len(plan.items) / shards))
            if plan.config.storage.bandwidth_mb_s or plan.config.storage.latency_ms:
                r.notes.append("storage emulation is not applied by read_parquet (stock mode)")
        if plan.config.loader.execution == "bulk":
            ds = ds.materialize()
        yield _Dataset(ds)
        collate = _stock_collate_class()(plan.schema)
        prefetch = max(1, plan.config.loader.prefetch_factor)
        k = 0
        prep_s = 0.0
        for _ in range(epochs):
            for batch in ds.iter_torch_batches(batch_size=plan.config.loader.batch_size,
                                               collate_fn=collate, prefetch_batches=prefetch):
                if r.first_block_s is None:
                    r.first_block_s = time.perf_counter() - r.t0
                prep = batch.pop(STOCK_PREP_COL, None)
                if prep is not None:
                    prep_s += float(prep)
                rows = int(batch["label"].shape[0])
                r.blocks += 1
                r.batches += 1
                r.rows += rows
                nb = sum(v.numel() * v.element_size() for v in batch.values())
                times = StageTimes(rows_in=rows, rows_out=rows)
                yield ShardOutput(k, -1, [Payload(f"stock:{k}", rows, batch, False, nb, nb,
                                                  final=True)], 1, rows, times)
                k += 1
        r.complete = True
        # Producer stage times come from inside Ray (the UDF's own clock for preprocess, the
        # operators' wall time for the rest), delivered as a last, batch-free output.
        stats = _operator_figures(ds)
        wall = sum(op.get("wall_s") or 0.0 for op in stats.get("operators", []))
        yield ShardOutput(-1, -1, [], 0, 0, StageTimes(fetch_s=max(wall - prep_s, 0.0),
                                                       preprocess_s=prep_s))


def _wait_for_named_actors(ray: Any, timeout_s: float) -> None:
    """Ray Data's helper actors (stats, autoscaling coordinator) keep importing for seconds
    after the first execution returns; wait until they are ready, so that CPU is spent in
    start-up and not in the first measured run (measured: ~2 s of CPU otherwise)."""
    deadline = time.monotonic() + timeout_s
    try:
        named = ray.util.list_named_actors(all_namespaces=True)
    except Exception:  # noqa: BLE001
        return
    for a in named:
        try:
            h = ray.get_actor(a["name"], namespace=a["namespace"])
            ray.get(h.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - a figure of speed, never a failure
            continue


def _work_items(n: int) -> Any:
    """One input block per work item (made in the driver: no read tasks to schedule)."""
    import ray.data

    return ray.data.from_items([{"id": i} for i in range(n)], override_num_blocks=n)


@dataclass
class _Dataset:
    """Marker passed from a run's generator to ``run`` so stats can be read at the end."""

    ds: Any


def _operator_figures(ds: Any) -> dict[str, Any]:
    """Ray Data's own per-operator figures (wall / CPU seconds, rows, blocks, tasks, nodes)."""
    try:
        summ = ds.get_stats_summary()
    except Exception as exc:  # noqa: BLE001 - a figure, never a failure
        return {"stats_error": str(exc)[:200]}
    ops: list[dict[str, Any]] = []

    def walk(s: Any) -> None:
        for p in getattr(s, "parents", []) or []:
            walk(p)
        for op in s.operators_stats:
            rows = op.output_num_rows
            ops.append({
                "name": op.operator_name,
                "time_total_s": op.time_total_s,
                "wall_s": float(op.wall_time.sum) if op.wall_time else None,
                "cpu_s": float(op.cpu_time.sum) if op.cpu_time else None,
                "udf_s": float(op.function_body_time.sum) if op.function_body_time else None,
                "rows": int(rows.sum) if rows else None,
                "blocks": int(rows.count) if rows else None,
                "bytes": int(op.output_size_bytes.sum) if op.output_size_bytes else None,
                "tasks": int(op.task_rows.count) if op.task_rows else None,
                "nodes": int(op.node_count.count) if op.node_count else None,
                "rows_per_s": op.num_rows_per_s,
            })

    try:
        walk(summ)
    except Exception as exc:  # noqa: BLE001
        return {"stats_error": str(exc)[:200]}
    out: dict[str, Any] = {"operators": ops}
    it = getattr(summ, "iter_stats", None)
    if it is not None:
        try:
            fig = {"wait_s": it.wait_time.get(), "get_s": it.get_time.get(),
                   "format_s": it.format_time.get(), "collate_s": it.collate_time.get(),
                   "blocks_local": it.iter_blocks_local, "blocks_remote": it.iter_blocks_remote}
            if any(fig.values()):       # Ray fills these for some consumers only
                out["iterator"] = fig
        except Exception:  # noqa: BLE001
            pass
    return out
