"""Data-parallel ranks on Ray: one pipeline feeding all ranks through ``streaming_split``.

As Ray Train does it: the ranks are Ray actors on the trainer's node (``num_cpus = 0``, pinned
to the driver's node: they are trainers, not producers), each with torch.distributed's
environment in its ``runtime_env`` and a gloo (or nccl) process group on loopback. For every
measured run the driver builds the variant's stallbench-mode pipeline once
(``RayExecutor.stallbench_dataset``) and splits it with ``streaming_split(N, equal=True)``;
rank ``r`` iterates split ``r`` (``iter_batches``, blocks as they come) and runs the measured
trainer loop on it. One producer pool serves every rank: the coordinator hands each block to
the rank with the fewest rows so far.

*What equal=True does to exactly-once.* In stallbench mode a Ray row is one trainer batch. To
give every rank the same number of rows (so every rank takes the same number of steps), the
splitter cuts blocks at row boundaries (a work item's batches may then go to two ranks) and
drops the last ``batches mod N`` batches of the run. Every other batch reaches exactly one
rank; the result counts the dropped ones (``ranks.exactly_once``). When transfer is ablated a
row is a whole work item, so up to N - 1 work items are dropped in that ablation run.

A rank accepts each (work item, batch) once (duplicates from a replayed task are dropped and
counted per rank); a batch delivered to two different ranks would show in ``exactly_once``.
The compute-only run uses no pipeline: rank ``r`` trains on the cached batches of work items
``r, r + N, ...``. Before an ablation's first measured run its pipeline gets one untimed pass
(``RayRankLauncher._splits_for`` says why). Stopping: every rank actor is killed
(``ray.kill``) at the end, on errors and on interrupts; a runtime stallbench started is shut
down after that as usual.

*No wait without an end.* ``[run] progress_timeout_s`` watches the ranks as it watches the
``processes`` launcher's (``trainers.base.stalled``, one rule): the actors run on this
process's node, so each maps a small file of this node's memory (``/dev/shm``) that the
launcher made, and publishes there the CLOCK_MONOTONIC time of its last progress (a batch, a
block of its warm-up pass, a row group of its caches, a completed all-reduce) and what it is
doing (``measure.watchdog.publish``). The launcher reads it while it waits for the ranks
(``_get``). The producers are Ray Data's tasks run by the split coordinator (an actor on
this node too): its execution callback publishes every task it sees finish into the slot
after the ranks' (``worker.PROGRESS_KEY`` in the dataset's context names the file), so a
slow producer is progress and a frozen one leaves the ranks waiting for their batches. The
coordinator's own start (its first execution, 5-11 s measured under load) is not a wait; the
ranks' start-up limit bounds it. An actor that cannot map the file (another machine: a Ray
Client driver) leaves the job unwatched by the launcher.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Iterator

from ... import interrupts
from ...errors import NoProgress, ProcessDied
from ...measure import watchdog
from ...measure.watchdog import SharedSlots, map_slots
from ...pipeline import Ablation, Plan, ShardOutput
from ...trainers.base import (LAUNCHERS, RankContext, RankError, RankLauncher, RankRun, free_port,
                              rank_plan, stalled)
from . import codec
from .worker import PROGRESS_KEY

READY_TIMEOUT_S = 600.0


class RankSequencer:
    """Each (work item, batch) at most once per rank; gaps are other ranks' batches and no
    order is promised (Ray's splitter keeps none)."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.duplicates = 0

    def accept(self, item: int, part: int, parts: int) -> bool:
        if (item, part) in self.seen:
            self.duplicates += 1
            return False
        self.seen.add((item, part))
        return True


class SplitSource:
    """One rank's split of the job's pipeline, as the executor ``measured_run`` iterates."""

    def __init__(self, split: Any, prefetch: int) -> None:
        self.split = split
        self.prefetch = prefetch
        self.figures: dict[str, Any] = {}

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        seq = RankSequencer()
        blocks = 0
        t0 = time.perf_counter()
        first = None
        try:
            for block in self.split.iter_batches(batch_size=None, batch_format="pyarrow",
                                                 prefetch_batches=self.prefetch):
                if first is None:
                    first = time.perf_counter() - t0
                blocks += 1
                for out, _node in codec.decode(block, seq):
                    yield out
        finally:
            self.figures = {"blocks": blocks, "first_block_s": first,
                            "duplicates_dropped": seq.duplicates}

    def worker_pids(self) -> list[int]:
        return []

    def producer_slots(self) -> int:
        """For this rank's start-up/steady split (``measure.phases``): one pool serves every
        rank and hands each block to the rank with the fewest rows, so a rank receives its
        items one at a time and its steady state starts after its first. The pool's own
        size is the job's figure (the driver's ``producer_slots``); rank runs are attributed
        on whole runs at the job level."""
        return 1

    def producer_cpu_s(self, plan: Plan) -> float | None:
        return None      # one pool for all ranks: the launcher measures it

    def sample_object_store_mb(self) -> float | None:
        return None

    def late_stage_times(self) -> None:
        return None

    def run_figures(self) -> dict[str, Any]:
        return dict(self.figures)


class RankActor:
    """A rank: a Ray actor running ``trainers.rank.RankWorker`` (made remote at start)."""

    def __init__(self, ctx: RankContext, plan: Plan, with_caches: bool,
                 slots_path: str | None = None) -> None:
        os.environ.update(ctx.environ())
        self.watched = _attach(slots_path, ctx)
        from ...trainers.rank import RankWorker

        cap = plan.max_batches if math.isinf(plan.max_batches) else math.ceil(
            plan.max_batches / ctx.world)
        loop_plan = dataclasses.replace(plan, max_batches=cap)
        prefetch = max(1, plan.config.loader.prefetch_factor)
        self.worker = RankWorker(ctx, loop_plan, lambda split: SplitSource(split, prefetch),
                                 plan if with_caches else None, job_item=lambda i: i,
                                 compute_plan=rank_plan(plan, ctx.rank, ctx.world), warm=False)

    def pid(self) -> int:
        return os.getpid()

    def setup(self) -> dict[str, Any]:
        info = self.worker.setup()
        watchdog.state(watchdog.IDLE)
        return {**info, "watched": self.watched}

    def warm(self, split: Any) -> int:
        """One untimed pass over the split (every rank at once: the split's start is a
        barrier). A pass stopped after its first block was not enough: the next, measured
        execution still waited 5-10 s here (its first blocks, then again a few steps in).
        The rank waits on the producers here too: each block is progress."""
        n = 0
        before = watchdog.state(watchdog.WAITING)
        try:
            for _ in split.iter_batches(batch_size=None, batch_format="pyarrow",
                                        prefetch_batches=1):
                watchdog.tick()
                n += 1
        finally:
            watchdog.state(before)
        return n

    def run(self, ablation: Ablation, split: Any, keep_timeline: bool,
            row_hashes: bool) -> RankRun:
        watchdog.state(watchdog.BUSY)      # its waits for batches say so themselves
        try:
            return self.worker.run(ablation, split, keep_timeline=keep_timeline,
                                   hash_rows=row_hashes)
        finally:
            watchdog.state(watchdog.IDLE)

    def close(self) -> None:
        self.worker.close()


def _attach(path: str | None, ctx: RankContext) -> bool:
    """In a rank actor: publish progress into the launcher's file (see the module docstring);
    False where it cannot be mapped here (the actor runs on another machine)."""
    slots = map_slots(path, slot_count(ctx.world)) if path else None
    if slots is None:
        return False
    watchdog.publish(slots, ctx.rank)
    watchdog.state(watchdog.SETUP)
    return True


def slot_count(world: int) -> int:
    """Two per rank (its last progress, its state), and two for the split coordinator's
    producers (``worker.PROGRESS_KEY``: their last completed task)."""
    return 2 * (world + 1)


PEER_GRACE_S = 5.0      # how long a rank's failed collective waits for a peer's death


def actor_died(rank: int, exc: BaseException) -> str:
    """A rank actor's death in one line: its pid and how it ended as far as Ray knows. The
    actor is Ray's worker, a child of the raylet, so its exit status reaches stallbench only
    through Ray, which has it for a Python-level exit (``sys.exit(3)``: "exit code 3") and
    not for ``os._exit``, a signal or the OOM killer (its connection just closed)."""
    import re

    text = " ".join(str(exc).split())
    pid = re.search(r"\bpid: (\d+)", text)
    code = re.search(r"exits? with an exit code (-?\d+)", text)
    how = (f"exited with status {code.group(1)}" if code else
           "ended abruptly (os._exit, a signal or the OOM killer; Ray does not report its "
           "exit status)" if "connection error" in text or "End of file" in text else
           f"died ({text[:200]})")
    return (f"trainer rank {rank} (Ray actor{', pid ' + pid.group(1) if pid else ''}) {how} "
            f"before it finished; no result written")


def _cpu_s(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


@LAUNCHERS.register("ray_actors")
class RayRankLauncher(RankLauncher):
    name = "ray_actors"
    sharding = ("one Ray Data pipeline for all ranks, split by streaming_split(N, equal=True); "
                "one producer pool serves every rank")
    producers_per_rank = False
    driver_caches = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self._splits: dict[str, list[Any]] = {}
        self._warm_s: dict[str, float] = {}
        self._cpu: float | None = None
        self._figures: dict[str, Any] = {}
        self._shared: SharedSlots | None = None   # each rank's progress and state (``watchdog``)
        self._watched = False

    PORT_ATTEMPTS = 3

    def start(self) -> None:
        """The rank actors, set up; their store's port chosen again when another process took
        it between ``free_port`` and rank 0's bind (EADDRINUSE, seen once in a full CI run
        beside Ray's own servers), at most ``PORT_ATTEMPTS`` times."""
        for attempt in range(self.PORT_ATTEMPTS):
            try:
                self._start(free_port())
                return
            except BaseException as exc:
                taken = "EADDRINUSE" in str(exc) or "address already in use" in str(exc)
                if not taken or attempt == self.PORT_ATTEMPTS - 1:
                    raise

    def _start(self, port: int) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        tr = self.plan.config.trainers
        remote = ray.remote(RankActor)
        plan = dataclasses.replace(self.plan, caches=None)
        # Watched where the executor reports what its producers do, and a timeout is set.
        watch = (callable(getattr(self.executor, "waiting_for", None))
                 and math.isfinite(self.plan.config.run.progress_timeout_s))
        try:
            if watch:
                self._shared = SharedSlots(slot_count(self.world))
                self._watched = True      # until an actor says it cannot publish
            for r in range(self.world):
                ctx = RankContext(r, self.world, r, "127.0.0.1", port, tr.straggler_rank,
                                  tr.straggler_delay_ms / 1000.0)
                self.actors.append(remote.options(
                    num_cpus=0, max_restarts=0, max_concurrency=1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                    runtime_env={"env_vars": ctx.environ()},
                ).remote(ctx, plan, self.ablations, self._shared and self._shared.path))
            self.pids = self._get([a.pid.remote() for a in self.actors], READY_TIMEOUT_S)
            infos = self._get([a.setup.remote() for a in self.actors], READY_TIMEOUT_S)
            self._watched = self._watched and all(i.get("watched") for i in infos)
            self.backend = infos[0].get("backend", "gloo") if infos else "gloo"
        except BaseException:
            self.stop()
            raise

    def run(self, ablation: Ablation, *, keep_timeline: bool = False,
            row_hashes: bool = False) -> list[RankRun]:
        ex = self.executor
        splits: list[Any] = [None] * self.world
        if not ablation.compute_only:
            splits = self._splits_for(ablation)
        marker = ex.runtime.fault_marker()
        cluster0 = ex.runtime.cluster_cpu_s()
        ranks0 = _cpu_s(self.pids)
        refs = [a.run.remote(ablation, s, keep_timeline, row_hashes)
                for a, s in zip(self.actors, splits)]
        runs = self._get(refs, None)
        cluster1 = ex.runtime.cluster_cpu_s()
        # the cluster's processes (workers, raylets, the split coordinator) minus the ranks
        self._cpu = (None if cluster0 is None or cluster1 is None or ablation.compute_only
                     else max((cluster1 - cluster0) - (_cpu_s(self.pids) - ranks0), 0.0))
        self._figures = {"ray": {"launcher": self.name, "splits": self.world, "equal": True,
                                 "warm_split_s": self._warm_s.get(ablation.name),
                                 "cluster": ex.runtime.describe() if keep_timeline else {}},
                         "faults": ex.runtime.faults_since(marker)}
        return runs

    def _splits_for(self, ablation: Ablation) -> list[Any]:
        """The ablation's pipeline and its N split iterators, made once per variant and
        re-iterated by every repeat (each iteration is a new execution of the pipeline), and
        warmed by one untimed pass before the first measured run: the split coordinator is an
        actor of its own, and its first executions import and start Ray Data's executor in it
        (measured here: a first run of 10-22 s instead of 1 s without the pass, 4-6 s of
        time to first batch when a new split was made for every run). The pass is timed
        and reported (``ray.warm_split_s``), never part of an epoch."""
        splits = self._splits.get(ablation.name)
        if splits is None:
            t0 = time.perf_counter()
            p = self.plan.with_ablation(ablation, None)
            ds = self.executor.stallbench_dataset(p)
            if self._watched and self._shared is not None:   # its producers publish too
                ds.context.set_config(PROGRESS_KEY, (self._shared.path, self.world,
                                                     slot_count(self.world), os.getpid()))
                self._shared.slots[2 * self.world] = 0.0       # this split's: not started
            splits = ds.streaming_split(self.world, equal=True)
            self._get([a.warm.remote(s) for a, s in zip(self.actors, splits)], READY_TIMEOUT_S,
                      coordinator=True)
            self._splits[ablation.name] = splits
            self._warm_s[ablation.name] = time.perf_counter() - t0
        return splits

    def _get(self, refs: list[Any], timeout_s: float | None,
             coordinator: bool = False) -> list[Any]:
        """All results; the first rank that fails fails the run (the caller stops the rest).
        ``coordinator``: the ranks' first pass over new splits, which waits for the split
        coordinator (an actor of its own) to start and import Ray Data's executor (5-11 s
        measured here under load): it is watched from its first execution step on (its
        slot set), and bounded by ``timeout_s`` before that."""
        import ray

        since = time.monotonic()
        deadline = None if timeout_s is None else since + timeout_s
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=min(
                1.0, self.plan.config.run.progress_timeout_s / 4))
            if self._watched and not done and self._shared is not None:
                if coordinator and not self._shared.slots[2 * self.world]:
                    since = time.monotonic()    # not started: its start-up is not a wait
                    continue
                self._check_progress([refs.index(p) for p in pending], since)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - named and re-raised
                    r = refs.index(ref)
                    if isinstance(exc, ray.exceptions.RayActorError):   # the actor died
                        interrupts.check()
                        raise ProcessDied(actor_died(r, exc)) from None
                    dead = self._dead_peer(refs, r)
                    if dead is not None:            # its collective failed for a dead peer
                        interrupts.check()
                        raise ProcessDied(actor_died(*dead)) from None
                    raise RankError(f"trainer rank {r} (Ray actor) failed: "
                                    f"{type(exc).__name__}: {exc}") from None
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"trainer ranks did not answer within {timeout_s:g} s")
        return ray.get(refs)

    def _dead_peer(self, refs: list[Any], failed: int) -> tuple[int, BaseException] | None:
        """The rank whose death made rank ``failed``'s collective fail, if one died: its
        gloo all-reduce raises ("... a remote worker hanging or bugs in the application")
        as soon as the peer's socket closes, and on a busy machine that error can reach the
        launcher before Ray reports the peer's actor dead (a fresh-clone CI run beside a busy
        core, 2026-11-28: a traceback and exit 1 instead of the one line naming the dead
        rank). The other ranks' results are awaited up to ``PEER_GRACE_S``; the first that
        is an actor's death is the cause. None: no peer died within it (rank ``failed``'s
        own error is the cause)."""
        import ray

        others = [x for i, x in enumerate(refs) if i != failed]
        deadline = time.monotonic() + PEER_GRACE_S
        while others:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            done, others = ray.wait(others, num_returns=1, timeout=left)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    return refs.index(ref), exc
                except Exception:  # noqa: BLE001 - another consequence, not a death
                    pass
        return None

    def _check_progress(self, pending: list[int], since: float) -> None:
        """The job's progress watchdog (``trainers.base.stalled``): ranks waiting for their
        batches, or stuck in their set-up, while none has progressed for that long."""
        line = stalled(self.executor.scenario_file, self._shared and self._shared.slots, pending,
                       lambda r: self.pids[r] if r < len(self.pids) else None, since,
                       self.plan.config.run.progress_timeout_s, self._source)
        if line is not None:
            raise NoProgress(line)

    def _source(self) -> str:
        what = getattr(self.executor, "_waiting_for", None)
        return (f"the {self.executor.name} executor's pipeline shared by every rank: "
                f"{what(exclude=self.pids) if callable(what) else 'its producers'}")

    def producer_cpu_s(self) -> float | None:
        return self._cpu

    def job_figures(self) -> dict[str, Any]:
        return dict(self._figures)

    def stop(self) -> None:
        import ray

        actors, self.actors = self.actors, []
        self._splits = {}              # the split coordinators go with their last reference
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._watched = False
        if self._shared is not None:
            self._shared.close()
            self._shared = None
