"""The live records (issue 60, ``stallbench profile --live``): each trainer process's figures
while the job runs, and its stall over time, bounded for a job of any length.

Two records, because they change at different rates:

- ``Live`` (``live-<host>-<pid>-<image>.json``): per stream its running totals (passes,
  batches, samples, exposed wait, step, the passes' start-up waits, time to first batch, the
  last batch's time) and its open window. Small, rewritten at each of the agent's flushes
  (about once a second while batches come): what the launcher's endpoint serves.
- ``WindowsPart`` (``windows-<host>-<pid>-<image>.json``): per stream its closed windows
  (``Windows``), rewritten only when one closed. What the result's stall over time is made
  of, and what a job killed on day 2 still leaves.

Why bounded: a window holds sums (batches, samples, wait, step, start-up wait) and the
longest single wait, never the batches themselves; a stream keeps at most
``LiveSettings.max_windows`` of them: past that, adjacent pairs merge and the width doubles
(``coarsen``), so a 3-day job keeps a few hundred windows of minutes each. Windows sit on a
grid of Unix time (window ``k`` covers ``[k * width, (k + 1) * width)``), widths are the base
width times a power of two, so windows of two ranks, or of one rank before and after a
coarsening, nest exactly (``rebin``). Per-batch records (``Epoch``) are kept for the first
``keep_batches`` batches of a stream under ``--live``; the batches past them are in the
windows and in ``LiveStream.rest`` only (a plain profile keeps every batch, as before).

Standard library only, Python 3.7 (the agent's rule: ``wire/__init__``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple    # Python 3.7

from .fields import VERSION, current, floats, ints, json_files, num, whole
from .header import Header

PREFIX = "live"
WINDOWS_PREFIX = "windows"
COLUMNS = ("batches", "rows", "wait", "step", "startup", "max_wait")


@dataclass(frozen=True)
class LiveSettings:
    """What ``--live`` sends in: the base window width (seconds), the most windows a stream
    keeps before they coarsen, and the batches per stream kept as per-batch records."""

    window_s: float = 10.0
    max_windows: int = 360
    keep_batches: int = 10000

    def to_json(self) -> Dict[str, Any]:
        return {"window_s": self.window_s, "max_windows": self.max_windows,
                "keep_batches": self.keep_batches}

    @classmethod
    def from_json(cls, d: Any) -> "LiveSettings":
        d = d if isinstance(d, dict) else {}
        base = cls()
        width = num(d.get("window_s"), base.window_s)
        return cls(window_s=width if width > 0 else base.window_s,
                   max_windows=max(whole(d.get("max_windows"), base.max_windows), 2),
                   keep_batches=max(whole(d.get("keep_batches"), base.keep_batches), 0))


@dataclass(frozen=True)
class Windows:
    """A stream's windows, columns of equal length: ``start`` (the window's index on the grid
    of ``width_s``: it covers ``[start * width_s, (start + 1) * width_s)``, Unix seconds),
    batches returned in it, their samples, the wait and step seconds that fell in it (a wait
    that spans windows is split by time), the wait of passes' first batches (start-up) and
    the longest wait of a batch returned in it. Windows with nothing in them are left out."""

    width_s: float = 10.0
    start: Tuple[int, ...] = ()
    batches: Tuple[int, ...] = ()
    rows: Tuple[int, ...] = ()
    wait: Tuple[float, ...] = ()
    step: Tuple[float, ...] = ()
    startup: Tuple[float, ...] = ()
    max_wait: Tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.start)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"width_s": self.width_s, "start": list(self.start)}
        for c in COLUMNS:
            out[c] = list(getattr(self, c))
        return out

    @classmethod
    def from_json(cls, d: Any) -> "Windows":
        d = d if isinstance(d, dict) else {}
        start = ints(d.get("start"))
        cols = {c: (ints if c in ("batches", "rows") else floats)(d.get(c)) for c in COLUMNS}
        if any(len(v) != len(start) for v in cols.values()):
            return cls(width_s=num(d.get("width_s"), 10.0))     # a torn record: none
        return cls(width_s=num(d.get("width_s"), 10.0), start=start, **cols)

    def rows_of(self) -> List[Tuple[int, list]]:
        """(start, [batches, rows, wait, step, startup, max_wait]) per window."""
        cols = [getattr(self, c) for c in COLUMNS]
        return [(k, [col[i] for col in cols]) for i, k in enumerate(self.start)]

    @classmethod
    def of_rows(cls, width_s: float, rows: List[Tuple[int, list]]) -> "Windows":
        rows = sorted(rows, key=lambda r: r[0])
        cols = {c: tuple(r[1][i] for r in rows) for i, c in enumerate(COLUMNS)}
        return cls(width_s=width_s, start=tuple(r[0] for r in rows), **cols)


def add_into(into: list, row: list) -> None:
    """One window's figures added into another's (the longest wait: the larger)."""
    for i in range(5):
        into[i] += row[i]
    into[5] = max(into[5], row[5])


def rebin(w: Windows, width_s: float) -> Windows:
    """``w`` on the grid of ``width_s``, a power-of-two multiple of its own width (nested
    grids: each window falls whole into one of the coarser)."""
    factor = max(int(round(width_s / w.width_s)), 1) if w.width_s > 0 else 1
    if factor == 1:
        return w
    got: Dict[int, list] = {}
    for k, row in w.rows_of():
        add_into(got.setdefault(k // factor, [0, 0, 0.0, 0.0, 0.0, 0.0]), row)
    return Windows.of_rows(w.width_s * factor, list(got.items()))


def coarsen(w: Windows, most: int) -> Windows:
    """``w`` with its width doubled until it holds at most ``most`` windows."""
    while len(w) > most:
        w = rebin(w, w.width_s * 2)
    return w


def join(parts: List[Windows], most: int = 0) -> Windows:
    """Windows of one stream from several records (its closed windows and its open one,
    several process images of one loader) on the coarsest grid among them, summed where
    they fall together; at most ``most`` (0: no bound)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return Windows()
    width = max(p.width_s for p in parts)
    got: Dict[int, list] = {}
    for p in parts:
        for k, row in rebin(p, width).rows_of():
            add_into(got.setdefault(k, [0, 0, 0.0, 0.0, 0.0, 0.0]), row)
    out = Windows.of_rows(width, list(got.items()))
    return coarsen(out, most) if most else out


@dataclass(frozen=True)
class Rest:
    """A stream's batches past ``keep_batches``: in no per-batch record, summed here (the
    passes that began past it too), so the result's totals stay whole."""

    passes: int = 0
    batches: int = 0
    rows: int = 0
    wait: float = 0.0
    step: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return {"passes": self.passes, "batches": self.batches, "rows": self.rows,
                "wait": self.wait, "step": self.step}

    @classmethod
    def from_json(cls, d: Any) -> "Rest":
        d = d if isinstance(d, dict) else {}
        return cls(passes=whole(d.get("passes")), batches=whole(d.get("batches")),
                   rows=whole(d.get("rows")), wait=num(d.get("wait")), step=num(d.get("step")))


@dataclass(frozen=True)
class LiveStream:
    """One stream's running totals as of its process's last flush: passes begun, batches,
    samples, exposed wait and step seconds, the wait of its passes' first batches (each
    pass's start-up: ``iter()`` to its first batch), its first pass's first wait (time to
    first batch; None before it), the Unix time of its last batch, its open window, the
    batches past the per-batch cap (``rest``) and whether its hooks were switched off."""

    key: str
    name: str
    kind: str = ""
    role: str = ""
    passes: int = 0
    batches: int = 0
    rows: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    startup_wait_s: float = 0.0
    first_wait_s: Optional[float] = None
    last_batch_unix: float = 0.0
    open: Windows = field(default_factory=Windows)
    rest: Rest = field(default_factory=Rest)
    unmeasured: str = ""

    def to_json(self) -> Dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "key", "name", "kind", "role", "passes", "batches", "rows", "wait_s", "step_s",
            "startup_wait_s", "first_wait_s", "last_batch_unix", "unmeasured")}
        out["open"] = self.open.to_json()
        out["rest"] = self.rest.to_json()
        return out

    @classmethod
    def from_json(cls, d: Any) -> "LiveStream":
        d = d if isinstance(d, dict) else {}
        first = d.get("first_wait_s")
        return cls(key=str(d.get("key", "")), name=str(d.get("name", "")),
                   kind=str(d.get("kind") or ""), role=str(d.get("role") or ""),
                   passes=whole(d.get("passes")), batches=whole(d.get("batches")),
                   rows=whole(d.get("rows")), wait_s=num(d.get("wait_s")),
                   step_s=num(d.get("step_s")), startup_wait_s=num(d.get("startup_wait_s")),
                   first_wait_s=None if first is None else num(first),
                   last_batch_unix=num(d.get("last_batch_unix")),
                   open=Windows.from_json(d.get("open")), rest=Rest.from_json(d.get("rest")),
                   unmeasured=str(d.get("unmeasured") or ""))


@dataclass(frozen=True)
class Live:
    """A trainer process's live figures: who (``Header``: rank, node, host, pid) and its
    streams; ``exiting``: written by its exit's flush (its figures are final)."""

    header: Header
    streams: Tuple[LiveStream, ...] = ()
    exiting: bool = False

    @staticmethod
    def file_name(host: str, pid: int, image: str) -> str:
        return f"{PREFIX}-{host}-{pid}-{image}.json"

    def to_json(self) -> Dict[str, Any]:
        return {"v": VERSION, **self.header.to_json(),
                "streams": [s.to_json() for s in self.streams], "exiting": self.exiting}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Live":
        return cls(header=Header.from_json(d),
                   streams=tuple(LiveStream.from_json(s) for s in d.get("streams") or ()),
                   exiting=bool(d.get("exiting")))


@dataclass(frozen=True)
class WindowsPart:
    """A trainer process's closed windows, per stream key."""

    host: str
    pid: int
    image: str
    streams: Dict[str, Windows] = field(default_factory=dict)

    @staticmethod
    def file_name(host: str, pid: int, image: str) -> str:
        return f"{WINDOWS_PREFIX}-{host}-{pid}-{image}.json"

    def to_json(self) -> Dict[str, Any]:
        return {"v": VERSION, "host": self.host, "pid": self.pid, "image": self.image,
                "streams": {k: w.to_json() for k, w in self.streams.items()}}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "WindowsPart":
        return cls(host=str(d.get("host", "")), pid=whole(d.get("pid")),
                   image=str(d.get("image", "")),
                   streams={str(k): Windows.from_json(w)
                            for k, w in (d.get("streams") or {}).items()})

    @property
    def image_key(self) -> Tuple[str, int, str]:
        return (self.host, self.pid, self.image)


def read_live(run_dir: Any) -> List[Live]:
    """The ``Live`` records of a run directory as they stand now (the launcher's endpoint
    reads them about once a second while the job runs: these small files only, never the
    epochs). A file replaced while it is read is read at the next poll."""
    return [Live.from_json(d) for _, d in json_files(
        run_dir, lambda n: n.startswith(PREFIX + "-") and n.endswith(".json")) if current(d)]
