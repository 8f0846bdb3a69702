"""The executor interface: how producers are scheduled, behind one small class.

An executor turns a ``Plan`` into an ordered stream of ``ShardOutput`` (work items in the plan's
order, so every executor delivers the same batches). It knows nothing of measurement: the
trainer loop times what it yields. ``start``/``stop`` bracket expensive runtimes (a Ray
cluster) so they are paid once per variant and reported as start-up, not as epoch time.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

from ..pipeline import Plan, ShardOutput, StageCaches
from ..registry import Registry
from ..scenario import Config

EXECUTORS: Registry[type["Executor"]] = Registry("executor")


class Executor:
    name: ClassVar[str]
    # config keys that set how many producers run (variants differing only in these form one
    # scaling curve for the what-if)
    scaling_knobs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Config, scenario_file: str = "<scenario>") -> None:
        self.config = config
        self.scenario_file = scenario_file

    @classmethod
    def check(cls, config: Config, scenario_file: str = "<scenario>") -> None:
        """Fail fast (UserError) before anything runs if this executor cannot work here."""

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

    def worker_pids(self) -> list[int]:
        """Producer processes outside the trainer's tree whose memory counts (e.g. Ray)."""
        return []

    def producer_cpu_s(self, plan: Plan) -> float | None:
        """A cumulative CPU clock (user + system seconds) of every process that produces for
        ``plan`` outside the trainer, read before and after a run; None when it cannot be
        measured from here (no such processes, or they run on other machines). It sees what
        stage timers cannot: hand-off, serialisation, a runtime's own daemons."""
        return None

    def producer_slots(self) -> int:
        """Producers working in parallel outside the trainer (0: the trainer produces)."""
        return 0

    def has_producers(self) -> bool:
        return self.producer_slots() > 0

    def producer_nodes(self) -> int | None:
        """Nodes carrying producers, where that is a notion of this executor."""
        return None

    def nodes_simulated(self) -> bool:
        """The producer nodes are simulated on this machine (they share its cores)."""
        return False

    def object_store_mb(self) -> float | None:
        return None

    def run_figures(self) -> dict[str, Any]:
        """Executor-specific figures of the last run (e.g. Ray operator stats, faults)."""
        return {}

    def __enter__(self) -> "Executor":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def get(name: str) -> type[Executor]:
    # Import for registration side effects; each executor is one module.
    from . import local  # noqa: F401
    if name == "ray":
        from . import ray  # noqa: F401
    return EXECUTORS.get(name)
