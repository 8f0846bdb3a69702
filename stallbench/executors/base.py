"""The executor interface: how producers are scheduled, behind one small class.

An executor turns a ``Plan`` into an ordered stream of ``ShardOutput`` (work items in the plan's
order, so every executor delivers the same batches). It knows nothing of measurement: the
trainer loop times what it yields. ``start``/``stop`` bracket expensive runtimes (a Ray
cluster) so they are reported as start-up, not as epoch time; an executor that names its
runtime's shape (``runtime_key``) keeps it across the variants of a scenario that share it
(``executors.runtimes``), so it is paid once per shape, not once per variant.

An executor also owns what is known about it: which of its keys must agree (``validate``),
what its environment needs (``check``), how many producers it runs and where
(``producer_slots``, ``producer_nodes``), which of its figures are emulated. Nothing outside
an executor's module tests its kind by name. Implementations register in ``EXECUTORS``;
this module knows none of them (``stallbench.executors`` imports them all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from .. import threads
from ..pipeline import Plan, ShardOutput, StageCaches, StageTimes
from ..registry import Registry
from ..scenario import Config

EXECUTORS: Registry[type["Executor"]] = Registry("executor")


@dataclass(frozen=True)
class ProducerKnob:
    """The one key that sets how many producers run, as a search varies it (``run.tune``):
    each step of ``key`` adds ``slots_per_step`` producer slots, from ``lowest``. ``unit``
    names a step in sentences; ``elsewhere`` (with ``{cores}``) says why no other executor is
    worth trying from this one on this machine, or is empty."""

    key: str
    unit: str
    slots_per_step: int = 1
    lowest: int = 0
    elsewhere: str = ""


class Executor:
    name: ClassVar[str]
    # config keys that set how many producers run (variants differing only in these form one
    # scaling curve for the what-if)
    scaling_knobs: ClassVar[tuple[str, ...]] = ()
    # how this executor's data reaches data-parallel ranks (``trainers.ranks`` > 1): the name
    # of a ``stallbench.trainers`` launcher
    rank_launcher: ClassVar[str] = "processes"
    # the ranks read from the producers stallbench's own process started for the variant (one
    # pool for the whole job, e.g. Flight servers), not from producers each rank starts itself
    ranks_share_producers: ClassVar[bool] = False
    # how the ``processes`` launcher starts rank processes: None for its own choice (fork, or
    # spawn where a GPU exists); "spawn" where this executor's runtime does not survive a fork
    rank_start_method: ClassVar[str | None] = None
    # whether this executor honours ``loader.persistent_workers`` (loader workers it can keep
    # alive across runs)
    keeps_workers: ClassVar[bool] = False
    # whether this executor honours ``loader.fetch_ahead`` (its trainer-side producer
    # decodes the next work item in a background thread); the others note it as a no-op
    fetches_ahead: ClassVar[bool] = False

    def __init__(self, config: Config, scenario_file: str = "<scenario>") -> None:
        self.config = config
        self.scenario_file = scenario_file

    # ------------------------------------------------------------------ before anything runs
    @classmethod
    def validate(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        """Rules across this executor's keys (ScenarioError naming file and key). Pure: it
        reads the config only, so every variant of every scenario is checked up front."""

    @classmethod
    def check(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        """Fail fast (UserError) before anything runs if this executor cannot work here
        (e.g. a library it needs is not installed)."""

    @classmethod
    def runtime_key(cls, config: Config) -> Any:
        """The *cluster shape* of the runtime this config needs, when that runtime is worth
        keeping across variants (``executors.runtimes``): variants with equal keys share one
        runtime inside a scenario, and the runner runs them one after the other. None: the
        executor keeps nothing across variants."""
        return None

    @classmethod
    def emulated_keys(cls, config: Config) -> list[str]:
        """Keys of this executor whose figures come from an emulation (results label them)."""
        return []

    @classmethod
    def producer_knob(cls, config: Config) -> ProducerKnob | None:
        """The key a search may vary to change the producer count here; None where the count
        is not a knob (a real cluster's CPUs)."""
        return None

    @classmethod
    def workers_kept(cls, config: Config) -> bool | None:
        """Whether this config's loader workers live across a variant's runs
        (``loader.persistent_workers``): True kept, False forked for every run although this
        executor could keep them (what ``tune`` tries and the advice names: each run then pays
        their fork, start-up, first item's page faults and exit), None where there is nothing
        to keep (no loader workers, or an executor that forks none)."""
        lc = config.loader
        if not (cls.keeps_workers and lc.num_workers > 0):
            return None
        return bool(lc.persistent_workers)

    @classmethod
    def reserved_memory(cls, config: Config) -> tuple[int, str, str] | None:
        """Memory this executor reserves on this machine before anything runs, checked against
        it up front (``run.preflight``): (bytes, the key that sets it, what it is); None: none."""
        return None

    # ---------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Bring up whatever runtime the executor needs (timed as start-up)."""

    def prepare(self, plan: Plan, caches: StageCaches | None) -> None:
        """Called once per variant after ``start``, outside any timed region, with the caches
        its ablations will use (e.g. to place them where remote producers can reach them)."""

    def run(self, plan: Plan) -> Iterator[ShardOutput]:
        """One measured pass over ``plan.items``; must be closeable mid-way (generator close)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Release every process and runtime started; safe to call twice and after errors."""

    def rank_options(self) -> dict[str, Any]:
        """Keyword arguments of the executor each rank process of the ``processes`` launcher
        builds for its own shard (pickled to the rank; called after ``start`` and
        ``prepare``). {}: a fresh executor of the same config, with producers of its own."""
        return {}

    def __enter__(self) -> "Executor":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------------- its producers
    def producer_slots(self) -> int:
        """Producers that work in parallel outside the trainer (0: the trainer produces its
        own batches). What "workers" means for this executor, so analysis never derives it
        from config keys; exact once ``start`` has run (a cluster's CPUs are known then)."""
        raise NotImplementedError

    def has_producers(self) -> bool:
        """Whether any data work runs outside the trainer's thread of control."""
        return self.producer_slots() > 0

    def producer_nodes(self) -> int | None:
        """Machines (nodes) the producers may run on; None where the notion does not apply
        (producers on the trainer's machine)."""
        return None

    def local_producers(self) -> int:
        """Producer processes that share this machine's cores: what the default thread budget
        splits them between (``stallbench.threads``)."""
        return self.producer_slots()

    def producer_threads(self) -> int | None:
        """Threads each producer process runs with (pyarrow's CPU pool, torch intra-op,
        OMP/MKL): ``loader.producer_threads``, by default this machine's cores split between
        its ``local_producers``; None: no budget (library defaults)."""
        return threads.producer_budget(self.config.loader.producer_threads,
                                       self.local_producers())

    # ------------------------------------------------------------------------ its figures
    def worker_pids(self) -> list[int]:
        """Producer processes outside the trainer's tree whose memory counts (e.g. Ray)."""
        return []

    def producer_cpu_s(self, plan: Plan) -> float | None:
        """A cumulative CPU clock (user + system seconds) of every process that produces for
        ``plan`` outside the trainer, read before and after a run; None when it cannot be
        measured from here (no such processes, or they run on other machines). It sees what
        stage timers cannot: hand-off, serialisation, a runtime's own daemons."""
        return None

    def sample_object_store_mb(self) -> float | None:
        """One reading of the memory in the executor's own store (Ray's object store, MB);
        None if it has none. The resource sampler calls it every period during a run; an
        executor may keep the run's readings (Ray reports their peak in ``run_figures``)."""
        return None

    def nodes_simulated(self) -> bool:
        """The producer nodes are simulated on this machine (they share its cores)."""
        return False

    def producers_share_cores(self) -> bool:
        """The producers run on this machine's cores (what the what-if's core budget needs to
        know); False where each producer brings cores of its own (nodes on other machines)."""
        return True

    def late_stage_times(self) -> StageTimes | None:
        """Producer stage time an executor learns only when a run has ended, added to the
        run's totals after the last batch (Ray stock mode reads it from Ray Data's operator
        stats: its producers run Ray's code, not stallbench's timed stages). None: every
        stage time came with the ``ShardOutput``s."""
        return None

    def startup_figures(self) -> dict[str, Any]:
        """What ``start`` (and ``prepare``'s warm-up) spent, by part, and whether the runtime
        was ``"started"`` for this variant or ``"reused"`` from an earlier one; {} when there
        is nothing to say (the runner still times ``start`` as a whole)."""
        return {}

    def workers_reused(self) -> bool | None:
        """Whether the last run's loader workers were kept from an earlier run (True) or
        forked for it (False); None: it had no loader workers to keep. What a run of a
        ``loader.persistent_workers`` variant really got (``RepeatFigures.workers_reused``):
        its first run forks them, and another plan or pool forks them again."""
        return None

    def run_figures(self) -> dict[str, Any]:
        """Executor-specific figures of the last run (e.g. Ray operator stats, faults)."""
        return {}

    def notes(self, transfer_notes: dict[str, str]) -> dict[str, str]:
        """Knobs that had no effect with this executor, and why (results' ``notes``), given
        the transfer stage's own notes (an executor may correct or add to them)."""
        out = dict(transfer_notes)
        lc = self.config.loader
        if lc.fetch_ahead and not (self.fetches_ahead and lc.num_workers == 0):
            out["fetch_ahead"] = (f"no-op: the {self.name} executor's producers "
                                  + ("are loader workers, which overlap work items already"
                                     if self.fetches_ahead else "run elsewhere")
                                  + " (it applies to num_workers = 0 only)")
        if lc.persistent_workers and self.workers_kept(self.config) is None:
            out["persistent_workers"] = (f"no-op: the {self.name} executor "
                                         + ("has no loader workers at num_workers = 0"
                                            if self.keeps_workers else "forks no loader workers"))
        return out
