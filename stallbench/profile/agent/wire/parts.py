"""The part files: what each process of the job writes of its figures, typed, versioned,
written and read here and nowhere else.

Each process of the job writes its own files into the run directory (the agent's
``writer``: the trainer's ``part-*.json``, its finished epochs in ``epochs-*-<seq>.json``, a
loader worker's ``stage-*.json``; the replay's ``replay-*.json``, ``replay.Replay``). The
launcher side reads a run's files once (``read``) into one ``Parts``: frozen records that
merge, ablate, session and tune take, so no module reads a key of another's dict, and a
field renamed here is renamed for both sides. ``VERSION`` is written into every file; a file
of another version (a job that ran another stallbench's agent, a stale directory) is not
read as this one: ``Parts.skipped`` counts it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List   # Dict, List: a helper may run Python 3.7

from .fields import VERSION, current, floats, ints, json_files, num, whole
from .header import Header
from .live import PREFIX as LIVE_PREFIX, WINDOWS_PREFIX, Live, WindowsPart
from .replay import Replay
from .settings import LoaderSettings


@dataclass(frozen=True)
class Epoch:
    """One pass of a loader stream: per batch the request time, wait and step (from the
    process's start, seconds), rows, size (the values it held: what a compute-only run scales
    its served batches' steps by); whether it ended (``StopIteration``, or exactly
    ``len(loader)`` batches) or was capped; its trainer CPU; the GPU's view where CUDA ran."""

    t_iter: float
    t_req: tuple[float, ...]
    wait: tuple[float, ...]
    step: tuple[float, ...]
    rows: tuple[int, ...]
    ended: bool
    capped: bool
    t_end: float
    cpu_s: float | None = None
    gpu_wait: tuple[float, ...] = ()
    gpu_step: tuple[float, ...] = ()
    gpu_error: str = ""
    size: tuple[int, ...] = ()      # values per batch (``rows.elements``; issue 57)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t_iter": self.t_iter, "t_req": list(self.t_req),
                               "wait": list(self.wait), "step": list(self.step),
                               "rows": list(self.rows), "ended": self.ended,
                               "capped": self.capped, "t_end": self.t_end, "cpu_s": self.cpu_s}
        if self.gpu_wait or self.gpu_step or self.gpu_error:
            out["gpu"] = ({"error": self.gpu_error} if self.gpu_error else
                          {"wait": list(self.gpu_wait), "step": list(self.gpu_step)})
        if self.size:
            out["size"] = list(self.size)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Epoch":
        gpu = d.get("gpu") or {}
        cpu = d.get("cpu_s")
        return cls(t_iter=num(d.get("t_iter")), t_req=floats(d.get("t_req")),
                   wait=floats(d.get("wait")), step=floats(d.get("step")),
                   rows=ints(d.get("rows")), ended=bool(d.get("ended")),
                   capped=bool(d.get("capped")), t_end=num(d.get("t_end")),
                   cpu_s=None if cpu is None else num(cpu),
                   gpu_wait=floats(gpu.get("wait")), gpu_step=floats(gpu.get("step")),
                   gpu_error=str(gpu.get("error") or ""), size=ints(d.get("size")))


@dataclass(frozen=True)
class Stream:
    """One loader of a process as its door made it (``streams.Stream``): kind, name (label and
    creation order), key (process image and order), settings it ran with, notes; why it was
    switched off (``unmeasured``); ``role`` "producer" for a loader thread feeding a queue,
    whose consumer stream is ``fed_by`` it."""

    kind: str
    name: str
    order: int
    key: str
    settings: LoaderSettings = field(default_factory=LoaderSettings)
    notes: tuple[str, ...] = ()
    unmeasured: str = ""
    role: str = ""
    fed_by: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.settings, LoaderSettings):   # a mapping as the door made it
            object.__setattr__(self, "settings", LoaderSettings(self.settings))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "order": self.order,
                               "key": self.key, "settings": dict(self.settings),
                               "notes": list(self.notes)}
        for k in ("unmeasured", "role", "fed_by"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Stream":
        return cls(kind=str(d.get("kind", "")), name=str(d.get("name", "")),
                   order=whole(d.get("order")), key=str(d.get("key", "")),
                   settings=LoaderSettings.from_json(d.get("settings")),
                   notes=tuple(str(n) for n in d.get("notes") or ()),
                   unmeasured=str(d.get("unmeasured") or ""), role=str(d.get("role") or ""),
                   fed_by=str(d.get("fed_by") or ""))


Stages = Dict[str, Dict[str, List[Any]]]    # stream key -> stage name -> record (stage_add)


@dataclass(frozen=True)
class Trainer:
    """A trainer process's part, rewritten at each flush: its streams, the stages it timed
    itself, and the epochs not yet in an epochs file (``open``: stream key -> (how many
    epochs the files hold, the rest as of this flush); a process killed without ``atexit``
    keeps them up to its last flush)."""

    header: Header
    streams: tuple[Stream, ...] = ()
    stages: Stages = field(default_factory=dict)
    exiting: bool = False
    open: dict[str, tuple[int, tuple[Epoch, ...]]] = field(default_factory=dict)

    PREFIX = "part"

    @staticmethod
    def file_name(host: str, pid: int, image: str) -> str:
        return f"{Trainer.PREFIX}-{host}-{pid}-{image}.json"

    @staticmethod
    def pid_of(file_name: str) -> int | None:
        """The writer's pid from a trainer part's name (a host may hold dashes: counted from
        the end); None for another file."""
        rest = file_name[len(Trainer.PREFIX) + 1:] if file_name.startswith(
            Trainer.PREFIX + "-") and file_name.endswith(".json") else ""
        try:
            return int(rest.rsplit("-", 2)[-2]) if rest.count("-") >= 2 else None
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "role": "trainer", **self.header.to_json(),
                "streams": [s.to_json() for s in self.streams], "stages": self.stages,
                "exiting": self.exiting,
                "open": {k: {"from": n, "epochs": [e.to_json() for e in eps]}
                         for k, (n, eps) in self.open.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Trainer":
        op = d.get("open") or {}
        return cls(header=Header.from_json(d),
                   streams=tuple(Stream.from_json(s) for s in d.get("streams") or ()),
                   stages=d.get("stages") or {}, exiting=bool(d.get("exiting")),
                   open={str(k): (whole(v.get("from"), -1),
                                  tuple(Epoch.from_json(e) for e in v.get("epochs") or ()))
                         for k, v in op.items() if isinstance(v, dict)})


@dataclass(frozen=True)
class Epochs:
    """Epochs a trainer process finished since its last epochs file (``seq``: the order of
    its files), per stream key."""

    host: str
    pid: int
    image: str
    seq: int
    streams: dict[str, tuple[Epoch, ...]] = field(default_factory=dict)

    PREFIX = "epochs"

    @staticmethod
    def file_name(host: str, pid: int, image: str, seq: int) -> str:
        return f"{Epochs.PREFIX}-{host}-{pid}-{image}-{seq:06d}.json"

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "host": self.host, "pid": self.pid, "image": self.image,
                "streams": {k: [e.to_json() for e in eps] for k, eps in self.streams.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any], seq: int = 0) -> "Epochs":
        return cls(host=str(d.get("host", "")), pid=whole(d.get("pid")),
                   image=str(d.get("image", "")), seq=seq,
                   streams={str(k): tuple(Epoch.from_json(e) for e in eps)
                            for k, eps in (d.get("streams") or {}).items()})

    @property
    def image_key(self) -> tuple[str, int, str]:
        return (self.host, self.pid, self.image)


@dataclass(frozen=True)
class Worker:
    """A loader worker's part: the stages it timed for the loader it serves (``loader``: that
    loader's stream key)."""

    header: Header
    loader: str
    stages: Stages = field(default_factory=dict)

    PREFIX = "stage"

    @staticmethod
    def file_name(host: str, pid: int, image: str) -> str:
        return f"{Worker.PREFIX}-{host}-{pid}-{image}.json"

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "role": "worker", **self.header.to_json(), "loader": self.loader,
                "stages": self.stages}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Worker":
        return cls(header=Header.from_json(d), loader=str(d.get("loader")),
                   stages=d.get("stages") or {})


@dataclass(frozen=True)
class Parts:
    """Every part of one run (or of several nodes' runs, ``+``), parsed once. ``cache``: what
    the launcher side derives from them (``merge.streams``), kept with them so a run's parts
    are merged once however many modules ask."""

    trainers: tuple[Trainer, ...] = ()
    epochs: tuple[Epochs, ...] = ()
    workers: tuple[Worker, ...] = ()
    replays: tuple[Replay, ...] = ()
    skipped: int = 0            # files of another VERSION, not read as this one's
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # ``--live`` (issue 60): each trainer process's totals and its closed windows
    lives: tuple[Live, ...] = ()
    windows: tuple[WindowsPart, ...] = ()

    def __add__(self, other: "Parts") -> "Parts":
        return Parts(self.trainers + other.trainers, self.epochs + other.epochs,
                     self.workers + other.workers, self.replays + other.replays,
                     self.skipped + other.skipped, lives=self.lives + other.lives,
                     windows=self.windows + other.windows)

    def __bool__(self) -> bool:
        return bool(self.trainers or self.epochs or self.workers or self.replays)

    def stream_epochs(self, p: "Trainer", key: str) -> List[Epoch]:
        """A trainer process's epochs of stream ``key``, in order: those in its epochs files,
        then the ones it had not finished (or written) at its last flush (``Trainer.open``:
        a process that ended without atexit, or one ``stallbench tune`` stopped mid-epoch),
        which end early. One rule for every reader (``merge``, ``ablate``)."""
        mine = list(self.epochs_by_image().get(p.header.image_key, {}).get(key, []))
        op = p.open.get(key)
        if op and op[0] == len(mine):
            mine += list(op[1])
        return mine

    def epochs_by_image(self) -> dict[tuple[str, int, str], dict[str, list[Epoch]]]:
        """(host, pid, image) -> stream key -> its epochs in order, from the epoch files."""
        got = self.cache.get("epochs_by_image")
        if got is None:
            got = {}
            for p in sorted(self.epochs, key=lambda p: p.seq):
                for key, eps in p.streams.items():
                    got.setdefault(p.image_key, {}).setdefault(key, []).extend(eps)
            self.cache["epochs_by_image"] = got
        return got


_KINDS = {c.PREFIX: c for c in (Trainer, Epochs, Worker, Replay)}
_KINDS[LIVE_PREFIX] = Live
_KINDS[WINDOWS_PREFIX] = WindowsPart


def parse(name: str, d: dict[str, Any]) -> Any:
    """One file's record by its name (``<prefix>-...json``); None for a file that is not a
    part of this version."""
    if not current(d):
        return None
    prefix = name.split("-", 1)[0]
    cls = _KINDS.get(prefix)
    if cls is Epochs:
        stem = name[:-5] if name.endswith(".json") else name
        return Epochs.from_json(d, whole(stem.rsplit("-", 1)[-1]))
    return cls.from_json(d) if cls is not None else None


def read(run_dir: str | os.PathLike[str]) -> Parts:
    """A run directory's part files, each parsed once. A file caught mid-write by a kill (it
    is written whole and renamed, so only a foreign one) is its process's loss."""
    got: dict[type, list[Any]] = {c: [] for c in _KINDS.values()}
    skipped = 0
    for name, d in json_files(run_dir, lambda n: n.endswith(".json")
                              and n.split("-", 1)[0] in _KINDS):
        rec = parse(name, d)
        if rec is None:
            skipped += 1
            continue
        got[type(rec)].append(rec)
    return Parts(tuple(got[Trainer]), tuple(got[Epochs]), tuple(got[Worker]),
                 tuple(got[Replay]), skipped, lives=tuple(got[Live]),
                 windows=tuple(got[WindowsPart]))
