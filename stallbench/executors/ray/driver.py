"""The Ray executor's driver (trainer) side: the runtime's lifecycle and the two run modes.

``"stallbench"`` mode: one Ray Data operator, ``range(work items) -> map_batches(produce)``
(``worker.produce_items``, or ``worker.Producer`` on an actor pool), so Ray's streaming
executor schedules fetch + preprocess + transfer.send with its backpressure on whatever nodes
carry the producer resources. The trainer consumes with ``iter_batches(prefetch_batches=...)``
and only unpacks (``codec.decode``; zero-copy views for a contiguous buffer).
``DataContext.execution_options.preserve_order`` makes Ray Data emit blocks in input order,
so batches are those of the local executor, in the same order. Ray retries a map task whose
worker died (``max_retries=-1`` for Ray Data tasks), and a streaming generator replays
deterministically, so items come through again; the codec's ``Sequencer`` drops duplicates
(``faults.duplicates_dropped``), a gap is an error, and a stream that ends early is an error.
Worker deaths and task retries seen during the run are read from Ray's GCS and reported in
``run_figures()["faults"]``.

``"stock"`` mode (``stock.py``): the loader's format knobs do not apply (Ray's
iter_torch_batches is the format), except that its collate builds the batch dict of the
loader's format: jagged (every id kept) unless the format pads. Ablations that make fetch or preprocess free replace
``read_parquet`` by the cached tables, one block per shard; an ablation that makes transfer
free runs the stallbench path with no payload (nothing left to hand over). Storage emulation
(``[storage]``) is not applied by ``read_parquet``: results note it. Its producer stage time
is known only from Ray Data's operator stats once the run has ended (``late_stage_times``).

*Caches for ablations.* ``prepare`` puts each cached Arrow table into the object store once
per variant (``ray.put`` per shard); the plan shipped to workers carries only the small
``ObjectRef`` maps (``worker.Job``). The trainer-side ``final`` cache never leaves the trainer.

``execution = "bulk"`` materialises the dataset (``materialize()``) before the first batch.

*The runtime* comes from ``executors.runtimes``: inside a scenario, variants with the same
cluster shape (``runtime_key``) share one ``RayRuntime``, started by the first of them and
closed when the scenario ends; ``startup_figures`` says which it was. *Through Ray Client*
(``ray://``) the dataset runs in a ``worker.BlockPump`` actor on the head node (Ray Data needs a
real driver) and the trainer pulls its blocks. *On a cluster by address* the trainer reads
blocks through a helper thread and, while it waits, checks that a producer node is still
alive: Ray Data would wait forever for a resource no live node has.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from ... import interrupts, threads
from ...errors import ScenarioError, UserCodeError, UserError, describe_exception
from ...measure.watchdog import excused, tick
from ...pipeline import Plan, ShardOutput, StageCaches, StageTimes
from ...scenario import Config
from ...stages.batch_format import SequenceCounts
from ...stages.transfer import Payload
from .. import runtimes
from ..base import EXECUTORS, Executor, ProducerKnob
from . import codec, stats, stock, worker
from .cluster import RayRuntime, import_ray
from .lost import GCS_GRACE_S


@dataclass
class _RunState:
    """What one run of the executor learns as it goes, read by ``_finish``."""

    t0: float = 0.0
    stock: bool = False
    ds: Any = None                       # the run's Ray dataset, for its stats at the end
    seq: codec.Sequencer | None = None
    first_block_s: float | None = None
    blocks: int = 0
    batches: int = 0
    rows: int = 0
    prep_s: float = 0.0                  # stock mode: the preprocess UDF's own clock
    nodes: set = field(default_factory=set)
    pids: set = field(default_factory=set)
    store_peak_mb: float | None = None
    fault_marker: float = 0.0
    nodes_at_start: dict = field(default_factory=dict)   # producer-capable nodes, by id
    pump_figures: dict | None = None     # Ray Client: Ray Data's figures from the pump actor
    items: int = 0                       # work items of the run (for the watchdog's line)
    pump_pid: int | None = None          # Ray Client: the pump actor's process
    pump: Any = None                     # Ray Client: the pump actor, once its stream ended,
    pump_figures_ref: Any = None         # with its figures asked for: read and killed at
                                         # ``_finish``, after the trainer's clock
    nodes_lost_before: set = field(default_factory=set)   # simulated nodes lost before it
    complete: bool = False
    notes: list[str] = field(default_factory=list)
    t_end: float | None = None           # when the stream ended: the run's clock stops here


@EXECUTORS.register("ray")
class RayExecutor(Executor):
    name = "ray"
    scaling_knobs = ("executor.simulated_nodes", "executor.cpus_per_node", "executor.cpus",
                     "executor.concurrency")
    rank_launcher = "ray_actors"     # executors.ray.ranks: one pipeline, streaming_split
    # producer slots already warmed per runtime (a reused runtime keeps its warm workers)
    _warmed: dict[int, int] = {}

    def __init__(self, config: Config, scenario_file: str = "<scenario>") -> None:
        super().__init__(config, scenario_file)
        self.spec = config.executor
        self.runtime = RayRuntime(self.spec, scenario_file)     # replaced in start()
        self._cluster_info: dict[str, Any] = {}
        self._startup: dict[str, float] = {}
        self._cache_refs: dict[str, dict[int, Any]] = {}
        self._caches_for: Any = None
        self._pool: int | None = None            # producer pool size, known after start()
        self._run: _RunState | None = None
        self._last: dict[str, Any] = {}
        self._late: StageTimes | None = None
        self._default_reservation: bool | None = None
        # A run's end-of-run checks (nodes, raylets, faults), done when its figures are first
        # asked for, i.e. after the trainer's clock has stopped (``_settle``).
        self._pending: tuple[Plan, _RunState] | None = None
        # Producer nodes and their state as last seen outside a run's clock (``prepare``, a
        # run's settling): the next run's ``nodes_at_start``. None: not read yet.
        self._nodes_state: dict[str, dict[str, Any]] | None = None

    # ------------------------------------------------------------------ before anything runs
    @classmethod
    def validate(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        ex = config.executor
        if ex.ray_address and ex.simulated_nodes:
            raise ScenarioError(scenario_file, "executor.simulated_nodes",
                                "a simulated cluster runs on this machine; unset it or ray_address")
        if config.trainers.ranks > 1 and ex.ray_mode == "stock":
            raise ScenarioError(scenario_file, "executor.ray_mode",
                                "data-parallel ranks (trainers.ranks > 1) run the \"stallbench\" "
                                "mode only; stock mode with ranks is not built yet")

    @classmethod
    def check(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        ray = import_ray(scenario_file)
        address = config.executor.ray_address or ""
        if address.startswith("ray://"):
            try:
                import grpc  # noqa: F401 - what Ray Client needs beyond ray[data]
            except ImportError:
                raise ScenarioError(scenario_file, "executor.ray_address",
                                    f"{address!r} is a Ray Client address, and Ray Client is "
                                    f"not installed here (cannot import grpc); install it with: "
                                    f"pip install \"ray[client]=={ray.__version__}\"") from None

    @classmethod
    def producer_knob(cls, config: Config) -> ProducerKnob | None:
        """Simulated nodes, each of ``cpus_per_node`` producer slots; a cluster's CPUs (at an
        address, or this machine's) are not a knob."""
        s = config.executor
        if not s.simulated_nodes:
            return None
        return ProducerKnob("executor.simulated_nodes", "simulated node(s)",
                            slots_per_step=s.cpus_per_node, lowest=1)

    @classmethod
    def reserved_memory(cls, config: Config) -> tuple[int, str, str] | None:
        """The object store of every node this machine starts (the head, plus each simulated
        node); none for a cluster at an address."""
        ex = config.executor
        if ex.ray_address:
            return None
        nodes = ex.simulated_nodes + 1 if ex.simulated_nodes else 1
        return (ex.object_store_mb * 2**20 * nodes, "executor.object_store_mb",
                f"{ex.object_store_mb:,} MB x {nodes} node(s) of object store")

    @classmethod
    def emulated_keys(cls, config: Config) -> list[str]:
        return ["executor.simulated_nodes"] if config.executor.simulated_nodes else []

    @classmethod
    def runtime_key(cls, config: Config) -> Any:
        """What makes one Ray runtime differ from another: where it is (an address, or one
        started here) and its shape. Pool, concurrency and mode are per run, not per runtime."""
        s = config.executor
        return ("ray", s.ray_address, s.simulated_nodes, s.cpus_per_node if s.simulated_nodes
                else None, s.cpus, s.object_store_mb)

    # ---------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        t0 = time.perf_counter()
        self.runtime, reused = runtimes.acquire(
            self.runtime_key(self.config), lambda: RayRuntime(
                self.spec, self.scenario_file,
                gcs_grace_s=min(GCS_GRACE_S, self.config.run.progress_timeout_s)),
            group="ray")
        if not reused:
            self.runtime.open()
        if self.runtime.client and self.spec.ray_mode == "stock":
            raise ScenarioError(self.scenario_file, "executor.ray_mode",
                                "\"stock\" runs Ray Data in the trainer, which needs a Ray driver "
                                "on the cluster; through Ray Client (ray://) only \"stallbench\" "
                                "works (or give the GCS address host:port)")
        self._pool = self.spec.concurrency or self.runtime.producer_cpus()
        t1 = time.perf_counter()
        if not reused or self._pool > self._warmed.get(id(self.runtime), 0):
            self._warm()
            RayExecutor._warmed[id(self.runtime)] = self._pool
        t2 = time.perf_counter()
        self._startup = {"runtime": "reused" if reused else "started",
                         "ray_init_s": 0.0 if reused else t1 - t0, "warm_workers_s": t2 - t1}
        self._cluster_info = self.runtime.describe()

    def _pool_size(self) -> int:
        """Producer tasks in flight (task pool) or actors (actor pool)."""
        if self._pool is None:
            raise RuntimeError("RayExecutor.start() has not run")
        return self._pool

    def _warm(self) -> None:
        """Every producer slot's worker process started and its imports done, and Ray Data's
        helper actors (stats, autoscaling coordinator: ~3 s of CPU each here) up, so the first
        measured run pays none of it. One Ray Data pass of ``n`` blocks does both: its UDF
        imports what producers need and holds each block briefly, so the ``n`` blocks land on
        ``n`` different workers. Through Ray Client, Ray Data runs elsewhere (the pump actor):
        plain tasks warm the workers."""
        import ray

        n = self._pool_size()
        try:
            if self.runtime.client:
                opts: dict[str, Any] = {"num_cpus": 1}
                if self.runtime.producer_resources:
                    opts["resources"] = dict(self.runtime.producer_resources)
                fn = ray.remote(worker.warm_worker)
                ray.get([fn.options(**opts).remote(0.3) for _ in range(n)], timeout=180)
                return
            import ray.data

            self._context(stock=False)
            udf = worker.WarmActor if self.spec.ray_pool == "actors" else worker.warm_batch
            ray.data.from_items([{"id": i} for i in range(n)], override_num_blocks=n) \
                .map_batches(udf, **self._map_args()).take_all()
            _wait_for_named_actors(ray, timeout_s=60)
        except Exception as exc:  # noqa: BLE001 - a cluster that cannot run a task is unusable
            raise UserError(f"{self.scenario_file}: executor: the Ray cluster could not run a "
                            f"producer task ({type(exc).__name__}: {str(exc)[:200]})") from None

    def stop(self) -> None:
        self._cache_refs = {}
        self._caches_for = None
        worker.PlanCache.clear()
        runtimes.release(self.runtime)    # kept for the next variant of the same shape, or closed

    def prepare(self, plan: Plan, caches: StageCaches | None) -> None:
        """Caches into the object store, then one untimed pass of the real producer code over
        one work item per producer slot. Ray keeps its workers between runs, so without this
        the first measured run alone pays each worker's first-use costs (Parquet footers,
        Arrow kernels, Ray Data's map path: ~2-3 s here), which would bias the differential
        attribution (the full run comes first). Timed and reported as ``startup.warm_plan_s``.
        """
        self._put_caches(caches)
        t0 = time.perf_counter()
        self._read_nodes_state()
        n = min(len(plan.items), self._pool_size())
        if n:
            warm = dataclasses.replace(plan, caches=None, items=plan.items[:n],
                                       max_batches=math.inf)
            stock_mode = self.spec.ray_mode == "stock"
            gen = self.run(warm)
            try:
                for _ in gen:
                    if stock_mode:   # read_parquet reads every file: stop after one batch
                        break
            finally:
                gen.close()
                self._drop_pending()          # the warm-up's figures are not kept
                self._last = {}
                self._late = None
            self._read_nodes_state()          # as the measured runs begin (untimed here)
        self._startup["warm_plan_s"] = time.perf_counter() - t0

    def _read_nodes_state(self) -> None:
        """The producer nodes' state before a run, read here and not inside ``run``: the
        first ``next()`` of a run is inside the trainer's clock (on a cluster by address
        ``ray.nodes()`` asks the GCS; its answer time is no part of the run)."""
        if self.runtime.mode == "address":
            self._nodes_state = self.runtime.producer_nodes_state()

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

    def _job(self, plan: Plan) -> worker.Job:
        a = plan.ablation
        if plan.caches is not None:
            self._put_caches(plan.caches)   # normally done by prepare(), untimed
        refs: dict[str, dict[int, Any]] = {}
        if a.fetch and not a.preprocess:
            refs["fetched"] = self._cache_refs["fetched"]
        if a.preprocess:
            refs["prepped"] = self._cache_refs["prepped"]
        return worker.Job(uuid.uuid4().hex, dataclasses.replace(plan, caches=None), refs,
                          threads=self.producer_threads())

    # ------------------------------------------------------------------------ its producers
    def producer_slots(self) -> int:
        """Producer tasks that run at once: the pool size (``concurrency``, default the
        cluster's producer CPUs), at most one per producer CPU (a task takes one CPU; more
        queue). Known after ``start``; before it, only from ``concurrency`` and a cluster this
        machine starts (simulated nodes x CPUs, or the local runtime's CPUs)."""
        if self._pool is not None:
            return max(1, min(self._pool, self.runtime.producer_cpus()))
        s = self.spec
        if s.ray_address:
            if s.concurrency:
                return s.concurrency
            raise RuntimeError("the producer slots of the cluster at executor.ray_address are "
                               "known after RayExecutor.start()")
        cpus = (s.simulated_nodes * s.cpus_per_node if s.simulated_nodes
                else s.cpus or os.cpu_count() or 1)
        return max(1, min(s.concurrency or cpus, cpus))

    def has_producers(self) -> bool:
        return True          # producers are always Ray workers, never the trainer

    def producer_threads(self) -> int | None:
        """A task reserves one CPU, so by default its worker gets one thread (as Ray sets
        OMP_NUM_THREADS to a task's CPUs); ``loader.producer_threads`` overrides it."""
        return threads.producer_budget(self.config.loader.producer_threads, 1, cores=1)

    def producer_nodes(self) -> int | None:
        """Simulated nodes, or the cluster's nodes with CPUs (after ``start``; else None)."""
        if self.spec.simulated_nodes:
            return self.spec.simulated_nodes
        return self._cluster_info.get("cpu_nodes")

    def nodes_simulated(self) -> bool:
        return bool(self.spec.simulated_nodes)

    def producers_share_cores(self) -> bool:
        """A local or simulated Ray runs on this machine; a cluster by address does too when
        all its producer nodes are on this host (a `ray start` cluster on loopback)."""
        if self.runtime.mode != "address":
            return True
        return bool(self._cluster_info.get("producer_nodes_on_this_host"))

    # ----------------------------------------------------------------------------- figures
    def worker_pids(self) -> list[int]:
        return self.runtime.worker_pids()

    def producer_cpu_s(self, plan: Plan) -> float | None:
        return None if plan.ablation.compute_only else self.runtime.cluster_cpu_s()

    def sample_object_store_mb(self) -> float | None:
        """A reading of the object store (the raylets' reports, cached 1 s), also kept in
        the current run's peak (``object_store_peak_mb``): read by the resource sampler
        every period, and here at a run's start and end."""
        used = self.runtime.object_store_used_mb()
        r = self._run
        if r is not None and used is not None:
            r.store_peak_mb = used if r.store_peak_mb is None else max(r.store_peak_mb, used)
        return used

    def late_stage_times(self) -> StageTimes | None:
        self._settle()
        return self._late

    @property
    def waiting_for(self) -> Any:
        """What the trainer waits on (the progress watchdog's line, ``measure.watchdog``).
        Progress is every task or output block that Ray Data's executor sees complete
        (``worker.progress_callback``), bulk materialisation included, and every block the
        trainer receives. The executor runs in this process, or through Ray Client in the
        pump actor, whose count of them the trainer asks for while it waits (``_pumped``)."""
        return self._waiting_for

    def _waiting_for(self, exclude: Any = ()) -> str:
        """``exclude``: pids of Ray workers that are not producers (Ray ranks' actors)."""
        r = self._run
        pool = (f"an actor pool of {self._pool}" if self.spec.ray_pool == "actors"
                else f"a task pool of {self._pool}")
        got = (f"; {r.blocks} of {r.items} work item(s) delivered" if r is not None and r.items
               else "")
        pids = ([p for p in self.runtime.worker_pids() if p not in set(exclude)]
                if self.runtime.mode in ("local", "simulated") else [])
        shown = ", ".join(str(p) for p in sorted(pids)[:8]) + (", ..." if len(pids) > 8 else "")
        pump = (f", run through Ray Client by the pump actor (pid {r.pump_pid} on the "
                f"cluster's head node)" if r is not None and r.pump_pid else "")
        return (f"Ray Data's producer tasks ({self.spec.ray_mode} mode, {pool}"
                f"{', Ray worker pids ' + shown if pids else ''}{pump}{got})")

    def startup_figures(self) -> dict[str, Any]:
        return dict(self._startup)

    def run_figures(self) -> dict[str, Any]:
        self._settle()
        return self._last

    def _settle(self) -> None:
        """The last run's end-of-run checks and figures (``_finish``), once. They ask Ray
        (``ray.nodes()``, a TCP connect per producer node's raylet, the state API's worker and
        task tables: up to seconds on a cluster) and so are not done in ``run``'s ``finally``:
        a generator's ``finally`` runs inside the trainer's last ``next()``, before its
        ``StopIteration``, i.e. inside the measured epoch. ``measured_run`` asks for
        ``late_stage_times()`` and ``run_figures()`` after it has stopped its clock."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._finish(*pending)

    def _drop_pending(self) -> None:
        """A run whose figures are not asked for: nothing of it is read, its pump ended."""
        pending, self._pending = self._pending, None
        if pending is not None:
            _kill_pump(pending[1])

    # --------------------------------------------------------------------------------- run
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
        # A UDF's exception comes back as itself (a stallbench UserCodeError or DataError
        # from the worker, with its message), not wrapped as "UDF failed to process a data
        # block" with the cause lost on the way (exceptions pickle without __cause__).
        ctx.raise_original_map_exception = True
        if self._default_reservation is None:
            self._default_reservation = ctx.op_resource_reservation_enabled
        ctx.op_resource_reservation_enabled = self._default_reservation if stock else False
        progress = worker.progress_callback()
        if progress is not None and progress not in ctx.custom_execution_callback_classes:
            ctx.custom_execution_callback_classes.append(progress)

    def _map_args(self) -> dict[str, Any]:
        import ray.data

        n = self._pool_size()
        kw: dict[str, Any] = {"num_cpus": 1}
        if self.runtime.producer_resources:
            kw["resources"] = dict(self.runtime.producer_resources)
        if self.spec.ray_pool == "actors":
            kw["compute"] = ray.data.ActorPoolStrategy(size=n)
        else:
            kw["compute"] = ray.data.TaskPoolStrategy(size=n)
        return kw

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        stock_mode = self.spec.ray_mode == "stock" and not plan.ablation.transfer
        self._context(stock_mode)
        self._late = None
        self._drop_pending()               # a run never settled: its figures are not asked for
        self._last = {}
        r = self._run = _RunState(t0=time.perf_counter(), stock=stock_mode,
                                  fault_marker=self.runtime.fault_marker(),
                                  items=len(plan.items))
        if self.runtime.mode == "address":
            if self._nodes_state is None:  # run without prepare: read now (inside the clock)
                self._read_nodes_state()
            r.nodes_at_start = dict(self._nodes_state or {})
        r.nodes_lost_before = set(self.runtime.vital.nodes_lost)
        self.sample_object_store_mb()
        try:
            if stock_mode:
                yield from self._run_stock(plan, r)
            else:
                if self.spec.ray_mode == "stock":
                    r.notes.append("transfer ablation runs the stallbench path without payloads")
                yield from self._run_stallbench(plan, r)
        except Exception as exc:  # noqa: BLE001 - sorted into a user error or one line
            err = self._explain(exc)
            if err is exc:
                raise
            raise err from None
        finally:
            # Only the end's time here; the end-of-run checks wait for ``_settle``.
            r.t_end = time.perf_counter()
            self._pending = (plan, r)

    def _explain(self, exc: Exception) -> BaseException:
        """What a failed Ray run tells the user: a stallbench user error raised in a Ray worker
        (a transform failing, an unreadable row group) as itself, as if raised here; Ray
        failing (a worker or actor killed beyond its retries, e.g. Ray Data's own readers in
        stock mode) as one line instead of Ray's multi-page traceback; anything else (a
        stallbench bug) unchanged."""
        found = user_error_in(exc)
        if found is not None:
            if isinstance(found, UserCodeError):
                found.located(f"a Ray worker, pid {found.pid}")
            return found
        if _from_ray(exc):
            return UserError(f"{self.scenario_file}: executor: Ray failed during the run "
                             f"({self.spec.ray_mode} mode): {describe_exception(exc)[:300]}")
        return exc

    def _finish(self, plan: Plan, r: _RunState) -> None:
        self.sample_object_store_mb()
        if r.pump_figures_ref is not None:
            try:
                import ray

                r.pump_figures = ray.get(r.pump_figures_ref, timeout=PUMP_FIGURES_S)
            except Exception:  # noqa: BLE001 - figures, never a failure of a completed run
                r.pump_figures = None
            _kill_pump(r)
        lost: list[dict[str, str]] = []
        if r.nodes_at_start:
            now = self.runtime.producer_nodes_state()
            if now:
                self._nodes_state = now    # the next run's start state
            for k, v in r.nodes_at_start.items():
                if not v["alive"]:
                    continue
                if not now.get(k, {}).get("alive", False):
                    lost.append({"node_id": k, "reason": now.get(k, {}).get("reason", "")})
                    continue
                gone = self.runtime.raylet_gone(now[k].get("raylet") or ("", 0))
                if gone:               # dead, though the GCS's health checks have not said so
                    lost.append({"node_id": k, "reason": gone})
        # A simulated node whose raylet died during the run (seen by PID at once; Ray's GCS
        # declares it dead only after its health checks fail).
        vital = self.runtime.vital
        for pid in sorted(set(vital.nodes_lost) - r.nodes_lost_before):
            lost.append({"node_id": vital.node_ids.get(pid, ""), "reason": vital.nodes_lost[pid]})
        faults = self.runtime.faults_since(r.fault_marker, task_name=None,
                                           nodes_lost=bool(lost))
        faults["duplicates_dropped"] = r.seq.duplicates if r.seq is not None else 0
        if r.nodes_at_start or lost:
            faults["nodes_lost"] = lost
        if r.nodes_lost_before:
            # a simulated node lost before this run began (start-up, an earlier run): the
            # run had fewer producer nodes than the scenario asks for, which its figures
            # show and the user is told (``report.tables.faults_lines``)
            faults["nodes_lost_before_run"] = [
                {"node_id": vital.node_ids.get(pid, ""), "reason": vital.nodes_lost[pid]}
                for pid in sorted(r.nodes_lost_before)]
        figures = (stats.operator_figures(r.ds) if r.ds is not None
                   else dict(r.pump_figures or {}))
        if r.stock and r.complete:
            # Producer stage times come from inside Ray: the UDF's own clock for preprocess,
            # the operators' wall time for the rest.
            self._late = StageTimes(fetch_s=max(stats.operators_wall_s(figures) - r.prep_s, 0.0),
                                    preprocess_s=r.prep_s)
        elapsed = (r.t_end if r.t_end is not None else time.perf_counter()) - r.t0
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
                **figures,
                **({"notes": r.notes} if r.notes else {}),
            },
            "faults": faults,
        }
        self._run = None

    # ------------------------------------------------------------------ stallbench mode
    def stallbench_dataset(self, plan: Plan) -> Any:
        """The stallbench-mode pipeline over ``plan.items`` (work items -> encoded batches),
        not yet executed: a run iterates it; data-parallel ranks split it (``ranks``)."""
        self._context(stock=False)
        job = self._job(plan)
        return worker.build_dataset(job, len(plan.items), self._map_args(),
                                    self.spec.ray_pool == "actors",
                                    plan.config.loader.execution == "bulk")

    def _run_stallbench(self, plan: Plan, r: _RunState) -> Iterator[ShardOutput]:
        job = self._job(plan)
        n = len(plan.items)
        actors = self.spec.ray_pool == "actors"
        bulk = plan.config.loader.execution == "bulk"
        r.seq = seq = codec.Sequencer(n)
        prefetch = max(1, plan.config.loader.prefetch_factor)
        blocks: Iterator[Any]
        if self.runtime.client:
            blocks = self._pumped(r, job, n, actors, bulk, prefetch)
        else:
            ds = r.ds = worker.build_dataset(job, n, self._map_args(), actors, bulk)
            blocks = ds.iter_batches(batch_size=None, batch_format="pyarrow",
                                     prefetch_batches=prefetch)
        if self.runtime.mode == "address":
            blocks = _watched(blocks, self._check_producer_nodes)
        for block in blocks:
            if r.first_block_s is None:
                r.first_block_s = time.perf_counter() - r.t0
            r.blocks += 1
            for out, node in codec.decode(block, seq):
                if node is not None:
                    r.nodes.add(node)
                    r.pids.add(out.times.worker)
                r.batches += len(out.payloads or ())
                r.rows += out.rows
                yield out
        r.complete = seq.complete
        if not seq.complete:
            raise RuntimeError(f"Ray ended the stream after {seq.item} of {n} work items")

    def _pumped(self, r: _RunState, job: worker.Job, n: int, actors: bool, bulk: bool,
                prefetch: int) -> Iterator[Any]:
        """Blocks of a dataset run by a ``worker.BlockPump`` actor on the head node (Ray
        Client); one request kept in flight ahead of the trainer."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts: dict[str, Any] = {"num_cpus": 0}
        head = self._cluster_info.get("head_node_id")
        if head:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(head, soft=True)
        pump = ray.remote(worker.BlockPump).options(max_concurrency=2, **opts).remote(
            self._context_settings())
        try:
            started = pump.start.remote(job, n, self._map_args(), actors, bulk, prefetch)
            # The pump's own start (a process on the head node importing Ray Data: seconds
            # on a loaded machine) is not a wait on producers; it is bounded on its own.
            deadline = time.monotonic() + PUMP_START_S
            with excused():
                while not ray.wait([started], timeout=PUMP_POLL_S)[0]:
                    if time.monotonic() > deadline:
                        raise UserError(f"{self.scenario_file}: executor.ray_address: the Ray "
                                        f"Client pump actor did not start within "
                                        f"{PUMP_START_S:g} s; no result written")
                r.pump_pid = ray.get(started)
            ahead = pump.next.remote(prefetch)
            seen = None
            while True:
                # While the next blocks are not there, the pump's progress is the trainer's
                # (the watchdog's clock); a pump that does not answer has made none.
                ready, _ = ray.wait([ahead], timeout=PUMP_POLL_S)
                if not ready:
                    try:
                        count = ray.get(pump.progress.remote(), timeout=PUMP_POLL_S)
                    except ray.exceptions.GetTimeoutError:
                        continue
                    if count != seen:
                        seen = count
                        tick()
                    continue
                got = ray.get(ahead)
                if not got:
                    break
                ahead = pump.next.remote(prefetch)
                yield from got
            # Its figures are read after the trainer's clock (``_finish``): asked for now,
            # the pump kept alive until they are read.
            r.pump_figures_ref = pump.figures.remote()
            r.pump = pump
        finally:
            if r.pump is None:
                ray.kill(pump)

    def _context_settings(self) -> dict[str, Any]:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        return {"preserve_order": ctx.execution_options.preserve_order,
                "enable_progress_bars": False,
                "op_resource_reservation_enabled": ctx.op_resource_reservation_enabled}

    def _check_producer_nodes(self) -> None:
        """While the trainer waits on a real cluster: if no node that can run producers is
        alive any more, Ray would wait forever; say so instead (one line, exit 2)."""
        state = self.runtime.producer_nodes_state()
        if not state or any(v["alive"] for v in state.values()):
            return
        lost = [f"{k[:8]} ({v['reason'] or 'dead'})" for k, v in state.items()]
        # The driver's core worker still holds connections to the lost nodes: ending the
        # process through C's exit handlers then crashed it once after this line (rc -11
        # instead of 2, a fresh-clone CI run of 2026-11-28; Ray's destructors, not ours), so
        # the command ends through ``interrupts.end_process`` once its clean-up has run.
        interrupts.runtime_left()
        raise UserError(f"{self.scenario_file}: executor.ray_address: the Ray cluster at "
                        f"{self.runtime.address} has no live producer node left (lost: "
                        f"{', '.join(lost)}); the run cannot finish and no result is written")

    # ----------------------------------------------------------------------- stock mode
    def _run_stock(self, plan: Plan, r: _RunState) -> Iterator[ShardOutput]:
        import ray.data

        job = self._job(plan)
        a = plan.ablation
        schema = plan.dataset.schema
        if a.fetch or a.preprocess:
            n = len(plan.items)
            ds = _work_items(n).map_batches(
                stock.stock_shard, fn_args=(job,), batch_format="numpy", **self._map_args())
            epochs = 1                              # plan.items already spans the epochs
        else:
            ds = ray.data.read_parquet(list(plan.dataset.files), columns=list(schema.columns))
            ds = ds.map_batches(stock.stock_preprocess, fn_args=(job,), batch_format="pyarrow")
            shards = max(1, len(plan.dataset.shards))
            epochs = max(1, math.ceil(len(plan.items) / shards))
            if plan.config.storage.bandwidth_mb_s or plan.config.storage.latency_ms:
                r.notes.append("storage emulation is not applied by read_parquet (stock mode)")
        if plan.config.loader.execution == "bulk":
            ds = ds.materialize()
        r.ds = ds
        collate = stock.collate_class()(plan.schema, not plan.transfer.format.pads_sequences)
        prefetch = max(1, plan.config.loader.prefetch_factor)
        k = 0
        for _ in range(epochs):
            for batch in ds.iter_torch_batches(batch_size=plan.config.loader.batch_size,
                                               collate_fn=collate, prefetch_batches=prefetch):
                if r.first_block_s is None:
                    r.first_block_s = time.perf_counter() - r.t0
                prep = batch.pop(stock.STOCK_PREP_COL, None)
                if prep is not None:
                    r.prep_s += float(prep)
                cut = batch.pop(stock.STOCK_CUT_KEY, None)
                rows = int(batch["label"].shape[0])
                r.blocks += 1
                r.batches += 1
                r.rows += rows
                nb = sum(v.numel() * v.element_size() for v in batch.values())
                times = StageTimes(rows_in=rows, rows_out=rows)
                if cut is not None:           # a padded format's collate: what it cut
                    c = [int(x) for x in cut.tolist()]
                    times.sequences = SequenceCounts(plan.schema.seq_len, *c)
                yield ShardOutput(k, -1, [Payload(f"stock:{k}", rows, batch, False, nb, nb,
                                                  final=True)], 1, rows, times)
                k += 1
        r.complete = True


def _kill_pump(r: _RunState) -> None:
    pump, r.pump, r.pump_figures_ref = r.pump, None, None
    if pump is not None:
        try:
            import ray

            ray.kill(pump)
        except Exception:  # noqa: BLE001 - gone with its job anyway
            pass


def _watched(blocks: Iterator[Any], check: Any, period_s: float = 1.0) -> Iterator[Any]:
    """``blocks``, read in a helper thread so that the trainer can run ``check`` while it
    waits: Ray Data waits silently forever for a resource no live node has (every producer
    node lost), and ``check`` turns that into an error. One block of read-ahead."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def pump() -> None:
        try:
            for b in blocks:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
            item: Any = end
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread
            item = exc
        finally:
            close = getattr(blocks, "close", None)
            if stop.is_set() and close is not None:
                close()
        if not stop.is_set():
            q.put(item)

    th = threading.Thread(target=pump, name="stallbench-ray-blocks", daemon=True)
    th.start()
    try:
        while True:
            try:
                b = q.get(timeout=period_s)
            except queue.Empty:
                check()
                continue
            if b is end:
                return
            if isinstance(b, BaseException):
                raise b
            yield b
    finally:
        stop.set()


PUMP_POLL_S = 0.5      # Ray Client: how often the trainer asks the pump for its progress
PUMP_START_S = 600.0   # Ray Client: the pump actor's start-up, bounded on its own
PUMP_FIGURES_S = 30.0  # Ray Client: reading the pump's figures after a run (never a failure)


def user_error_in(exc: BaseException) -> UserError | None:
    """A stallbench ``UserError`` inside what Ray raised: Ray wraps a worker's exception as
    ``RayTaskError.cause`` (or a class deriving from both), Ray Data adds its own
    ``UserCodeException`` with ``__cause__``."""
    stack: list[Any] = [exc]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        cause = getattr(e, "cause", None)
        if isinstance(cause, UserError):
            return cause
        if isinstance(e, UserError) and not _from_ray(e):
            return e
        stack.extend([cause, e.__cause__, e.__context__])
    return None


def _from_ray(exc: BaseException) -> bool:
    return any(c.__module__.split(".", 1)[0] == "ray" for c in type(exc).__mro__)


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
