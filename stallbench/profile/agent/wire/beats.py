"""Beats: the small file each process of the job keeps rewriting (the agent's ``beats``), which
the launcher reads while the job runs and when no figures came back.

Why a record of its own: ``--progress-timeout`` ("no batch for S seconds: the last was ..."),
the lines for a run that brought back nothing ("exited before its first batch", "an empty
loader", "figures lost") and ``tune``'s stop rule all read it; read by key in three modules,
a renamed count would have read as zero. ``beat-<host>-<pid>`` (no ``.json``: not a part):
the writer's pid is its name's, not a field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple    # the agent may run Python 3.7

from .fields import VERSION, current, whole

PREFIX = "beat"


@dataclass(frozen=True)
class Beat:
    """One process's beat: the names of the first loaders it made (a few), its batches so
    far, the last one (stream name, epoch, batch index), its passes that yielded nothing, and
    whether it ended through its exit handlers; its host (from the file's name) and the Ray
    node it ran on (``Header.node``; "" outside Ray): what names a process whose figures never
    came home."""

    pid: int
    loaders: Tuple[str, ...] = ()
    batches: int = 0
    last: Optional[Tuple[str, int, int]] = None
    empty: int = 0
    exited: bool = False
    host: str = ""
    node: str = ""
    exec_lost: str = ""     # what its last exec's environment dropped of the agent's start
    own_iter: Tuple[str, ...] = ()  # its loaders' classes that define their own __iter__

    @staticmethod
    def file_name(host: str, pid: int) -> str:
        return f"{PREFIX}-{host}-{pid}"

    def to_json(self) -> Dict[str, Any]:
        return {"v": VERSION, "loaders": list(self.loaders), "batches": self.batches,
                "last": None if self.last is None else list(self.last),
                "empty": self.empty, "exited": self.exited, "node": self.node,
                "exec_lost": self.exec_lost, "own_iter": list(self.own_iter)}

    @classmethod
    def from_json(cls, d: Any, pid: int, host: str = "") -> Optional["Beat"]:
        """The beat of process ``pid`` on ``host``; None for a file that is not one of this
        version."""
        if not current(d):
            return None
        last = d.get("last")
        names = d.get("loaders")
        return cls(pid=pid, loaders=tuple(str(n) for n in names)
                   if isinstance(names, list) else (),
                   batches=whole(d.get("batches")),
                   last=(str(last[0]), whole(last[1]), whole(last[2]))
                   if isinstance(last, list) and len(last) == 3 else None,
                   empty=whole(d.get("empty")), exited=bool(d.get("exited")), host=host,
                   node=str(d.get("node") or ""), exec_lost=str(d.get("exec_lost") or ""),
                   own_iter=tuple(str(c) for c in d.get("own_iter") or ()
                                  if isinstance(d.get("own_iter"), list)))


def read_beats(run_dir: Any) -> List[Beat]:
    """Every process's beat in ``run_dir`` (a file caught mid-write is its temporary's: never
    read; one rewritten in place, ``sink.Files``, and caught mid-write does not parse and is
    skipped, as is a file that is not a beat)."""
    out: List[Beat] = []
    try:
        names = os.listdir(run_dir)
    except OSError:
        return out
    for name in names:
        if not name.startswith(PREFIX + "-") or name.endswith(".tmp"):
            continue
        try:
            host, pid = name[len(PREFIX) + 1:].rsplit("-", 1)
            with open(os.path.join(run_dir, name)) as fh:
                beat = Beat.from_json(json.load(fh), int(pid), host)
        except (OSError, ValueError, IndexError, TypeError):
            continue
        if beat is not None:
            out.append(beat)
    return out
