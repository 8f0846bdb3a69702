"""What every record of the wire shares: the version written into every file, the names both
sides use for the wall itself, and one tolerant reading of a field.

Why tolerant: a field a record cannot read (a torn or hand-edited file, a value of another
type) becomes its default, so one odd value never loses a whole run's figures; a file of
another ``VERSION`` is not read at all (``current``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, Tuple     # Tuple: the agent may run Python 3.7

VERSION = 1
ENV = "STALLBENCH_PROFILE"      # the settings the launcher sends in, one JSON object
FLUSH_MARK = "flush-now"        # a file the launcher leaves: flush now, the job is ending
LOST_PREFIX = "lost"            # ``lost-<host>-<pid>-<image>``: a part could not be written


def current(d: Any) -> bool:
    """A JSON object of this ``VERSION`` (one without ``v`` predates it: read as this one)."""
    return isinstance(d, dict) and d.get("v", VERSION) == VERSION


def num(v: Any, default: float = 0.0) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def whole(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def floats(v: Any) -> Tuple[float, ...]:
    return tuple(float(x) for x in v) if isinstance(v, (list, tuple)) else ()


def ints(v: Any) -> Tuple[int, ...]:
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else ()


def lost_marker(host: str, pid: int, image: str) -> str:
    """The name of the marker a process leaves when a part could not be written."""
    return f"{LOST_PREFIX}-{host}-{pid}-{image}"


def json_files(run_dir: Any, wanted: Callable[[str], bool]) -> Iterator[Tuple[str, Any]]:
    """(name, parsed JSON) of each file of ``run_dir`` whose name ``wanted`` accepts, in name
    order; a file that cannot be read or parsed (caught mid-replace, foreign) is passed over.
    One reader for every kind of record the launcher reads from a run directory."""
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return
    for name in names:
        if not wanted(name):
            continue
        try:
            with open(os.path.join(run_dir, name)) as fh:
                yield name, json.load(fh)
        except (OSError, ValueError):
            continue
