"""The rank launcher interface: between the executor and the probe when ``trainers.ranks`` > 1.

A data-parallel job runs N trainer *ranks*, each a process with torch.distributed's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), its own shard of
the data and a synchronous step. A launcher owns those processes: it starts them once per
variant (``start``), runs one measured run on all of them together (``run``: every rank runs
``measure.probe.measured_run`` over its shard at the same time) and stops them (``stop``: also
on errors, Ctrl-C and SIGTERM; every rank process and what it started ends).

How a rank gets its shard is the executor's business, so the executor names its launcher
(``Executor.rank_launcher``): the local executor's ranks each run their own DataLoader over a
disjoint share of the row groups (``trainers.processes``); the Ray executor feeds all ranks
from one pipeline through ``streaming_split`` (``executors.ray.ranks``). Launchers register in
``LAUNCHERS``; this module knows none of them.
"""

from __future__ import annotations

import dataclasses
import math
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ..measure import watchdog
from ..pipeline import Ablation, Plan
from ..registry import Registry
from ..results import RepeatFigures, Resources, Timeline

LAUNCHERS: Registry[type["RankLauncher"]] = Registry("rank launcher")

# What a rank is doing, in words, from the state it publishes (``measure.watchdog.state``).
DOING = {watchdog.SETUP: "setting up (its process group, caches, warm-up pass)",
         watchdog.WAITING: "waiting for its next batch",
         watchdog.COLLECTIVE: "waiting for the other ranks (all-reduce)",
         watchdog.BUSY: "in its model step", watchdog.IDLE: ""}


class RankError(RuntimeError):
    """A rank failed; the message names it and carries its traceback."""


def free_port() -> int:
    """A free TCP port on loopback for the process group's store (bound, read, released:
    another process could take it in between, as with torchrun's own choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RankContext:
    """Who a rank is and where its peers meet: torch.distributed's environment."""

    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    straggler_rank: int | None = None
    straggler_delay_s: float = 0.0

    def environ(self) -> dict[str, str]:
        """The variables a rank process carries (its loader workers inherit them, so a
        user's transform can tell which rank it serves)."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world),
                "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.world),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}

    @property
    def delay_s(self) -> float:
        """The EMULATED latency this rank adds per work item it receives (0: none)."""
        return self.straggler_delay_s if self.straggler_rank == self.rank else 0.0


@dataclass
class Delivery:
    """One unit a rank received: a work item of the job's list (or the part of it an equal
    split gave this rank), identified by the job's item index and the batches' ids."""

    item: int
    shard: int
    batch_ids: list[str]
    rows: int
    item_batches: int                   # batches of the whole work item (this may be a part)
    item_rows: int = 0                  # rows of the whole item, when this part says (0: not)


@dataclass
class RankRun:
    """What one rank sends back after one measured run."""

    rank: int
    pid: int
    figures: RepeatFigures              # measured_run's figures, with compute/stall/sync split
    sync_s: float
    arrivals: list[float]               # per step: when its batch arrived (CLOCK_MONOTONIC)
    step_stall_s: list[float]           # per step: wait + trainer-side transfer
    step_compute_s: list[float] = field(default_factory=list)   # per step: the model step alone
    step_sync_s: list[float] = field(default_factory=list)      # per step: time in the all-reduce
    deliveries: list[Delivery] = field(default_factory=list)
    producer_pids: list[int] = field(default_factory=list)
    straggler_delay_s: float = 0.0      # EMULATED latency injected, as measured
    timeline: Timeline | None = None    # only when asked (first full run)
    resources: Resources | None = None
    row_hashes: list[int] | None = None  # only when asked (exactly-once tests)
    model_digest: float | None = None    # sum of the model's parameters, when hashes are asked


# A rank waiting for its own batch watches itself (``watchdog``) and names what it waits on
# (its loader workers' pids); the launcher blames such a rank only this long after the
# timeout, so that the rank's own line, not the launcher's vaguer one, ends the job (on a
# loaded machine the two fired together and either won). Stopped ranks and ranks stuck in
# their set-up cannot report themselves: blamed at the timeout.
SELF_REPORT_S = 2.0


def stalled(scenario_file: str, slots: Any, pending: list[int] | set[int],
            pid_of: Callable[[int], int | None], since: float, timeout_s: float,
            source: Callable[[], str]) -> str | None:
    """The launcher's progress watchdog (``run.progress_timeout_s``), one rule for every
    launcher: the line that ends the job, or None. The job is stuck when no rank has made
    progress (a batch, a producer's work item, a row group of its caches, a completed
    all-reduce: the CLOCK_MONOTONIC times ranks, and shared producers after them, publish in
    ``slots``) for ``timeout_s`` since ``since`` and a rank still due is stopped (``kill -STOP``), waits for its own
    batch or is stuck in its set-up. Ranks in the all-reduce wait for the others, and a
    model step is not a wait: neither is blamed (the line names only the ranks that are)."""
    import time

    import psutil

    if slots is None or not math.isfinite(timeout_s):
        return None
    now = time.monotonic()
    last = max([since] + [slots[2 * r] for r in range(len(slots) // 2)])
    if now - last < timeout_s:
        return None
    # (verb for one rank, for several, what) -> the ranks it holds
    blamed: dict[tuple[str, str, str], list[str]] = {}
    for r in sorted(pending):
        pid = pid_of(r)
        what = DOING.get(slots[2 * r + 1])
        try:
            stopped = pid is not None and psutil.Process(pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            stopped = False
        if what == DOING[watchdog.WAITING]:
            what += f" from {source()}"
        who = f"{r}" + (f" (pid {pid})" if pid is not None else "")
        if stopped:
            key = ("is", "are", "stopped (SIGSTOP)" + (f" while {what}" if what else ""))
            blamed.setdefault(key, []).append(who)
        elif slots[2 * r + 1] == watchdog.SETUP or (
                slots[2 * r + 1] == watchdog.WAITING and now - last >= timeout_s + SELF_REPORT_S):
            blamed.setdefault(("was", "were", str(what)), []).append(who)
    if not blamed:
        return None
    said = [f"trainer rank {who[0]} {one} {what}" if len(who) == 1 else
            f"trainer ranks {', '.join(who[:-1])} and {who[-1]} {many} "
            f"{what.replace(' its ', ' their ', 1)}"
            for (one, many, what), who in blamed.items()]
    return (f"{scenario_file}: run.progress_timeout_s: no trainer rank made progress for "
            f"{timeout_s:g} s: {'; '.join(said)}; no result written")


def rank_plan(plan: Plan, rank: int, world: int) -> Plan:
    """A rank's disjoint share of the job's work list: items ``rank, rank + world, ...``
    (interleaved, as torch's DistributedSampler deals indices), and its share of the job's
    batch cap (``loader.max_batches`` caps the job: each rank takes at most
    ceil(max_batches / world) steps)."""
    cap = plan.max_batches if math.isinf(plan.max_batches) else math.ceil(plan.max_batches / world)
    return dataclasses.replace(plan, items=plan.items[rank::world], max_batches=cap)


class RankLauncher:
    """Starts the ranks of one variant, runs measured runs on all of them, stops them."""

    name: ClassVar[str]
    sharding: str = ""          # how ranks get their data, in words (results say it)
    producers_per_rank: bool = True     # (an instance may say otherwise: shared producers)
    # stallbench's process must build the stage caches for ablation runs and hand them to
    # the executor (``Executor.prepare``): the producers are not in the ranks (Ray)
    driver_caches: ClassVar[bool] = False

    def __init__(self, executor: Any, plan: Plan, world: int, *, ablations: bool,
                 sample_interval_s: float = 0.1) -> None:
        self.executor = executor
        self.plan = plan
        self.world = world
        self.ablations = ablations            # the ranks must hold caches for ablation runs
        self.sample_interval_s = sample_interval_s
        self.backend = "gloo"

    def start(self) -> None:
        """Start every rank and its process group; return once all are ready."""
        raise NotImplementedError

    def run(self, ablation: Ablation, *, keep_timeline: bool = False,
            row_hashes: bool = False) -> list[RankRun]:
        """One measured run on every rank at once, in rank order. ``keep_timeline``: send
        back per-batch timelines and resource series; ``row_hashes``: a hash of every row
        each rank trained on (tests of exactly-once delivery)."""
        raise NotImplementedError

    def job_figures(self) -> dict[str, Any]:
        """What the launcher's side saw of the last run (e.g. Ray's pipeline figures)."""
        return {}

    def producer_cpu_s(self) -> float | None:
        """CPU seconds of the producers over the last run, where only the launcher's side
        can measure them (one shared pool); None: the ranks measured their own."""
        return None

    def stop(self) -> None:
        """Stop every rank process (and anything it started); safe to call twice."""

    def __enter__(self) -> "RankLauncher":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
