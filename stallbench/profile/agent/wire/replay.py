"""The replay of an ablation run across the wall, both ways (issue 28): the plan the launcher
sends in (``ReplayPlan``) and the part each process writes back (``Replay``), with the
problems that make a run no ablation (``Mismatch``, ``Missing``, ``BudgetStop``) and what
happened to each ``stallbench.stage``'s calls (``StageServe``).

Why typed: the launcher refuses an ablation by these records and says why in the result
(``ablate``); read by key, a renamed field would have turned a refusal into a silent "no
problem". The JSON is what replay wrote before they were typed (``VERSION`` unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple   # the agent may run Python 3.7

from .fields import VERSION, num, whole

MODES = ("compute_only", "record", "serve")


@dataclass(frozen=True)
class ReplayPlan:
    """The ablation run the launcher asks for (``ablate``, ``tune``'s ceiling): ``mode`` one
    of ``MODES``; compute-only keeps ``keep`` batches per loader within ``budget_mb`` and serves
    as many as the full run's epochs had (``counts``: stream name -> batches per epoch); a
    recording is kept in ``dir``; ``serve`` says what a serving run serves (``items``,
    ``batch``, ``stage:<name>``)."""

    mode: str
    keep: int = 8
    budget_mb: float = 512.0
    counts: Dict[str, List[int]] = field(default_factory=dict)
    dir: str = ""
    serve: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Any) -> "ReplayPlan":
        d = d if isinstance(d, dict) else {}
        counts = d.get("counts") if isinstance(d.get("counts"), dict) else {}
        serve = d.get("serve")
        return cls(mode=str(d.get("mode") or ""), keep=whole(d.get("keep"), 8),
                   budget_mb=num(d.get("budget_mb"), 512.0),
                   counts={str(k): [whole(n) for n in v] for k, v in counts.items()
                           if isinstance(v, list)},
                   dir=str(d.get("dir") or ""), serve=None if serve is None else str(serve))


@dataclass(frozen=True)
class Problem:
    """A call replay could not serve as planned: ``where`` (loader order, worker, epoch; or
    a ``stallbench.stage``'s name) and ``call`` (its number, or the stage call's arguments)."""

    where: Tuple[Any, ...] = ()
    call: Any = None

    @property
    def worker(self) -> Any:
        return self.where[1] if len(self.where) > 1 else None

    @property
    def epoch(self) -> Any:
        return self.where[2] if len(self.where) > 2 else None

    def to_json(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["where"] = list(self.where)
        return out

    @classmethod
    def from_json(cls, d: Any) -> Any:
        """The record, or None where the part holds none (an empty or odd value)."""
        if not isinstance(d, dict) or not d:
            return None
        kw: Dict[str, Any] = {}
        for f in fields(cls):
            v = d.get(f.name)
            if f.name == "where":
                kw["where"] = tuple(v) if isinstance(v, list) else ()
            elif f.name in d:       # a count as a number, a text as text, ``call`` as written
                kw[f.name] = (whole(v) if type(f.default) is int else
                              str(v) if type(f.default) is str else v)
        return cls(**kw)


@dataclass(frozen=True)
class Mismatch(Problem):
    """The first served call whose indices were not the recording's (a sampler that shuffles
    without a seed): both, shortened. Not a problem since issue 57 (the call is served as
    recorded: the run follows the recording's order); said in a note."""

    recorded: str = ""
    asked: str = ""


@dataclass(frozen=True)
class Missing(Problem):
    """The first call the recording did not hold (the budget ended it, or the calls differ
    between runs): how many calls it held (``recorded``)."""

    recorded: int = 0


@dataclass(frozen=True)
class BudgetStop(Problem):
    """Why the recording stopped: the budget was full at ``bytes``, or ``error`` (an output
    that cannot be pickled, a disk that refused it)."""

    bytes: int = 0
    error: str = ""

    def to_json(self) -> Dict[str, Any]:
        out = super().to_json()
        if not self.error:
            out.pop("error")
        return out


@dataclass(frozen=True)
class StageServe:
    """What happened to one ``stallbench.stage``'s calls in a replay run: kept by their
    arguments, served, computed (arguments the recording never saw), and why not kept."""

    recorded: int = 0
    served: int = 0
    computed: int = 0
    unkeyed: int = 0
    unpicklable: int = 0
    unwritable: int = 0

    def __add__(self, other: "StageServe") -> "StageServe":
        return StageServe(*(getattr(self, f.name) + getattr(other, f.name)
                            for f in fields(self)))

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def to_json(self) -> Dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_json(cls, d: Any) -> "StageServe":
        d = d if isinstance(d, dict) else {}
        return cls(**{f.name: whole(d.get(f.name)) for f in fields(cls)})


@dataclass(frozen=True)
class Replay:
    """An ablation run's replay part (the agent's ``replay``): what it recorded, served or
    computed, and why it stopped or could not serve; ``reordered``: served calls whose
    indices the sampler asked for differently (served in the recording's order);
    ``late_read_s``: seconds a spawned loader worker spent reading its recording after the
    first epoch (inside the measured window: a forked one never does); ``unreadable``: why a
    recording file could not be read back (its calls were computed)."""

    pid: int
    mode: str = ""
    serve: Optional[str] = None
    worker: bool = False
    served: int = 0
    computed: int = 0
    reordered: int = 0
    recorded: int = 0
    recorded_bytes: int = 0
    unserved_batches: int = 0
    late_read_s: float = 0.0
    unreadable: str = ""
    budget_stop: Optional[BudgetStop] = None
    mismatch: Optional[Mismatch] = None
    missing: Optional[Missing] = None
    served_from: Dict[str, List[Optional[int]]] = field(default_factory=dict)
    kept: Dict[str, int] = field(default_factory=dict)
    kept_bytes: Dict[str, int] = field(default_factory=dict)
    stages: Dict[str, StageServe] = field(default_factory=dict)

    PREFIX = "replay"

    @staticmethod
    def file_name(host: str, pid: int) -> str:
        return f"{Replay.PREFIX}-{host}-{pid}.json"

    def stage(self, name: str) -> StageServe:
        """What happened to ``name``'s calls here (nothing: all zero)."""
        return self.stages.get(name) or StageServe()

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"v": VERSION, "role": "replay"}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_json() if isinstance(v, Problem) else v
        out["stages"] = {k: v.to_json() for k, v in self.stages.items()}
        return out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Replay":
        def dct(k: str) -> Optional[Dict[str, Any]]:
            v = d.get(k)
            return v if isinstance(v, dict) and v else None
        serve = d.get("serve")
        return cls(pid=whole(d.get("pid"), -1), mode=str(d.get("mode") or ""),
                   serve=None if serve is None else str(serve), worker=bool(d.get("worker")),
                   served=whole(d.get("served")), computed=whole(d.get("computed")),
                   reordered=whole(d.get("reordered")),
                   recorded=whole(d.get("recorded")),
                   recorded_bytes=whole(d.get("recorded_bytes")),
                   unserved_batches=whole(d.get("unserved_batches")),
                   late_read_s=num(d.get("late_read_s")),
                   unreadable=str(d.get("unreadable") or ""),
                   budget_stop=BudgetStop.from_json(d.get("budget_stop")),
                   mismatch=Mismatch.from_json(d.get("mismatch")),
                   missing=Missing.from_json(d.get("missing")),
                   served_from=dct("served_from") or {},
                   kept=dct("kept") or {}, kept_bytes=dct("kept_bytes") or {},
                   stages={str(k): StageServe.from_json(v)
                           for k, v in (dct("stages") or {}).items()})
