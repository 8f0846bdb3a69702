"""The recording of an ablation run: what a ``record`` run keeps of each call and a ``serve``
run reads back (issue 28), and the figures both report (``Stats``).

Why apart from ``replay``: replay decides per call what to serve; this module owns the files
(one per process, loader, worker and epoch, appended to under the memory budget) and what is
in them: a call's outputs, with small views of a big tensor kept as compact copies
(``compact``, issue 39), read back whole at a serving run's first call (``load``).
"""

from __future__ import annotations

import gc
import glob
import os
import pickle
import re
import socket
import sys
import threading
import time

from . import util, wire

PLAN = wire.ReplayPlan(mode="")     # as sent in (``configure``)
MODE = ""
LOCK = threading.Lock()
_REC_FILES: dict = {}
_RECORDS: dict = {}           # (order, worker, epoch) -> list of entries (serve)
_READ: set = set()            # (order, worker) whose recordings were read (serve)
_STAGE_REC: dict = {}         # name -> {key: output} (serve)
_STAGE_FILE: list = []


class Stats:
    """What this process's replay did: calls served (``reordered``: of them, those served
    in the recording's order where the sampler asked for other indices), computed, recorded
    (bytes), batches not served; the first call that did not match the recording, the first it did not hold, why
    the recording stopped; per ``stallbench.stage`` name, what happened to its calls."""

    def __init__(self) -> None:
        self.served = 0
        self.computed = 0
        self.reordered = 0          # served though the sampler asked for other indices
        self.recorded = 0
        self.recorded_bytes = 0
        self.unserved_batches = 0
        self.late_read_s = 0.0      # a worker's own reads of its recording after epoch 0
        self.unreadable = ""        # why a recording file could not be read back (serve)
        self.budget_stop: wire.BudgetStop | None = None
        self.mismatch: wire.Mismatch | None = None
        self.missing: wire.Missing | None = None
        self.stages: dict = {}          # name -> {what: calls} (``wire.StageServe``'s)

    def stage(self, name: str, what: str) -> None:
        with LOCK:
            d = self.stages.setdefault(name, {})
            d[what] = d.get(what, 0) + 1


STATS = Stats()


def configure(plan: wire.ReplayPlan) -> None:
    global PLAN, MODE
    PLAN = plan
    MODE = plan.mode


def budget() -> int:
    return int(float(PLAN.budget_mb) * 1024 * 1024)


def rec_path(where: tuple, pid: int | None = None) -> str:
    o, w, e = where
    tail = f"-p{pid}" if pid is not None else "-p*"
    rank = util.rank()["rank"]     # torchrun: each rank has its own loader and sampler shard
    return os.path.join(PLAN.dir, f"rec-r{rank}-o{o}-w{w}-e{e}{tail}.pkl")


# a tensor is recorded as a compact copy when the storage it views holds more than this many
# times the bytes its call's views of it reference (and at least ``_VIEW_MIN`` more)
_VIEW_RATIO = 2
_VIEW_MIN = 64 * 1024


def _tensors(obj, tensor_type, out: list, depth: int = 0) -> None:
    """The tensors in a call's outputs (builtin dicts, lists, tuples looked into, as
    ``replay.nbytes`` does: no code of the user's classes runs)."""
    if depth > 4:
        return
    t = type(obj)
    if issubclass(t, tensor_type):
        out.append(obj)
    elif issubclass(t, dict):
        for v in dict.values(obj):
            _tensors(v, tensor_type, out, depth + 1)
    elif issubclass(t, (list, tuple)):
        seq = list if issubclass(t, list) else tuple
        for v in seq.__iter__(obj):
            _tensors(v, tensor_type, out, depth + 1)


def _rebuilt(obj, swap: dict, depth: int = 0):
    """``obj`` with the tensors whose ids are in ``swap`` replaced; only exact builtin
    containers (and namedtuples) are rebuilt, anything else is kept as it is."""
    if id(obj) in swap:
        return swap[id(obj)]
    if depth > 4:
        return obj
    t = type(obj)
    if t is dict:
        return {k: _rebuilt(v, swap, depth + 1) for k, v in obj.items()}
    if t is list:
        return [_rebuilt(v, swap, depth + 1) for v in obj]
    if t is tuple:
        return tuple(_rebuilt(v, swap, depth + 1) for v in obj)
    if issubclass(t, tuple) and hasattr(t, "_make"):       # a namedtuple
        return t._make(_rebuilt(v, swap, depth + 1) for v in tuple.__iter__(obj))
    return obj


def compact(obj):
    """A call's outputs with tensors that are small views of one big storage replaced by
    compact copies, so the record holds what they reference, once (issue 39): pickling a
    torch view pickles its whole storage (a ``datasets`` row sliced out of its batch tensor
    pickled 17.7 MB per call against 69 KB of rows). Views of one storage are grouped: where
    together they reference at least half of it, the storage is pickled once as before
    (pickle keeps one copy per call). Never raises: on any doubt, ``obj`` as it was."""
    torch = sys.modules.get("torch")
    if torch is None:
        return obj
    try:
        found: list = []
        _tensors(obj, torch.Tensor, found)
        groups: dict = {}
        for x in found:
            try:
                st = x.untyped_storage()
                key = (x.device.type, x.device.index, st.data_ptr())
                g = groups.setdefault(key, [st.nbytes(), 0, []])
                g[1] += x.numel() * x.element_size()
                g[2].append(x)
            except Exception:  # noqa: BLE001 - sparse, meta, nested: left as they are
                continue
        swap = {}
        for storage, viewed, xs in groups.values():
            if storage > _VIEW_RATIO * viewed and storage - viewed >= _VIEW_MIN:
                for x in xs:
                    swap[id(x)] = x.clone()     # dense: its own storage, its own bytes
        return _rebuilt(obj, swap) if swap else obj
    except Exception:  # noqa: BLE001 - recording as before is always allowed
        return obj


def record(where, entry) -> None:
    """One fetch call's entry (call number, indices, items, batch, flag) appended to the
    recording of ``where``, within the budget; the first stop says why."""
    if STATS.budget_stop is not None:
        return
    try:
        blob = pickle.dumps(compact(entry), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an unpicklable item: no recording, job goes on
        STATS.budget_stop = wire.BudgetStop(
            where=tuple(where), call=entry[0], bytes=0,
            error=f"cannot pickle the outputs ({type(exc).__name__})")
        return
    if not STATS.recorded:
        why = _unreadable(blob)
        if why:
            STATS.budget_stop = wire.BudgetStop(where=tuple(where), call=entry[0], bytes=0,
                                                error=why)
            return
    with LOCK:
        if STATS.recorded_bytes + len(blob) > budget():
            STATS.budget_stop = wire.BudgetStop(where=tuple(where), call=entry[0],
                                                bytes=STATS.recorded_bytes)
            return
        try:
            fh = _REC_FILES.get(where)
            if fh is None:
                fh = _REC_FILES[where] = open(rec_path(where, os.getpid()), "ab")
            fh.write(blob)
            fh.flush()
        except OSError as exc:      # the job goes on; the recording is void and says why
            STATS.budget_stop = wire.BudgetStop(where=tuple(where), call=entry[0],
                                                bytes=STATS.recorded_bytes, error=str(exc))
            return
        STATS.recorded += 1
        STATS.recorded_bytes += len(blob)


def _unreadable(blob: bytes) -> str:
    """Why a recorded call cannot be read back ("" when it can): the first call of each
    process is unpickled once, in the recording run. A batch class that pickles but does not
    unpickle (a ``UserDict`` whose ``__getattr__`` reads ``self.data``, without the
    ``__setstate__`` that ``transformers.BatchEncoding`` has, recurses) was found only by the
    served runs, and said as an epoch the recording did not hold (issue 57)."""
    try:
        pickle.loads(blob)
        return ""
    except BaseException as exc:  # noqa: BLE001 - RecursionError included: said, not raised
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return (f"the outputs pickle but cannot be read back ({type(exc).__name__}: "
                f"{str(exc)[:80]}); give the batch's class a __setstate__")


def record_stage(name: str, key: str, out) -> None:
    """A ``stallbench.stage`` call's output kept by its arguments' key (``replay.stage_call``),
    within the budget; what happened is counted per stage name."""
    if STATS.budget_stop is not None:
        return
    try:
        blob = pickle.dumps(compact((name, key, out)), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - an output that cannot be kept: not served
        STATS.stage(name, "unpicklable")
        return
    with LOCK:
        if STATS.recorded_bytes + len(blob) > budget():
            STATS.budget_stop = wire.BudgetStop(where=(name,), call=0,
                                                bytes=STATS.recorded_bytes)
            return
        try:
            if not _STAGE_FILE:
                _STAGE_FILE.append(open(os.path.join(
                    PLAN.dir, f"stage-rec-{socket.gethostname()}-{os.getpid()}.pkl"), "ab"))
            _STAGE_FILE[0].write(blob)
            _STAGE_FILE[0].flush()
            STATS.recorded_bytes += len(blob)
            what = "recorded"
        except OSError:
            what = "unwritable"
    STATS.stage(name, what)     # outside the lock: ``stage`` takes it


def flush_files() -> None:
    for fh in list(_REC_FILES.values()):
        try:
            fh.flush()
        except (OSError, ValueError):
            pass


def loaded(files: list, keep, collect: bool = True) -> None:
    """Each record in ``files`` handed to ``keep``, then the collector run once.

    The records are read at the serving run's first call, a cost of its start-up (outside the
    steady figures), and held for the run. Thousands of objects allocated at once and kept
    (a tensor each, unpickled) count toward the collector's next full collection: left alone,
    it fell inside the served epoch, a pause the full run never had (73 ms with torch's heap,
    a served stage of 0.53 s reading -13%). Collected here, that debt is paid in start-up too.
    A file that ends short or cannot be unpickled keeps the records read before it: the calls
    it held are computed for real and counted as missing, never raised into the job."""
    for f in files:
        try:
            with open(f, "rb") as fh:
                while True:
                    try:
                        keep(pickle.load(fh))
                    except EOFError:
                        break
        except Exception as exc:  # noqa: BLE001 - the job goes on; the ablation says why
            util.say(f"cannot read the recording {os.path.basename(f)} "
                     f"({type(exc).__name__}: {exc}); its calls are computed")
            with LOCK:
                STATS.unreadable = STATS.unreadable or f"{type(exc).__name__}: {str(exc)[:80]}"
    if collect:
        gc.collect()


def _by_epoch(pattern: str) -> dict:
    """The recording files matching ``pattern`` by (worker, epoch): one process's file for
    each (a loader's workers for one epoch are one process each)."""
    files: dict = {}
    for f in sorted(glob.glob(pattern)):
        m = re.search(r"-w(-?\d+)-e(\d+)-p\d+\.pkl$", f)
        if m is not None:
            files.setdefault((int(m.group(1)), int(m.group(2))), f)
    return files


def _read_all(order: int, workers: bool) -> None:
    """Every epoch's recording of loader ``order`` read into ``_RECORDS`` (its workers' or
    the loop's process's), then the collector once (``loaded``: why)."""
    pattern = rec_path((order, "*", "*"))       # type: ignore[arg-type]
    for (w, ep), f in sorted(_by_epoch(pattern).items()):
        if (w >= 0) == workers and (order, w, ep) not in _RECORDS:
            _RECORDS[(order, w, ep)] = []
            loaded([f], _RECORDS[(order, w, ep)].append, collect=False)
    gc.collect()


def preload(order: int) -> None:
    """Every worker's recording of loader ``order``, read in the loop's process before its
    workers fork (issue 57): torch's default workers are not persistent, so each epoch forks
    new ones, and each read its epoch's recording at its first call, inside the measured
    window (a 'loader hand-off' of 5.01 s against a 3.15 s stall). Forked after this, they
    find their records in memory, and the read is paid once, in the first epoch's start-up."""
    if ("workers", order) in _READ:
        return
    _READ.add(("workers", order))
    _read_all(order, workers=True)


def load(where) -> list:
    """The recorded calls of ``where`` (loader order, worker, epoch). At this loader's first
    serving call in the loop's process, every epoch's recording is read at once: read per
    epoch, the second and later epochs paid their read (and its collection) inside the steady
    window, a cost the full run never had that the attribution charged to the loader's
    hand-off (0.8 s of a 3-epoch job's 4.3 s wait). A loader worker finds its records read
    before it forked (``preload``); one that did not fork (spawned) reads its epoch's file
    alone at its first call, and the seconds that took after the first epoch are counted
    (``Stats.late_read_s``: inside the measured window, said by the launcher)."""
    recs = _RECORDS.get(where)
    o, w, ep = where
    if recs is None and w >= 0:
        t = time.perf_counter()
        recs = _RECORDS[where] = []
        loaded(sorted(glob.glob(rec_path(where)))[:1], recs.append)
        if ep > 0:
            with LOCK:
                STATS.late_read_s += time.perf_counter() - t
    elif recs is None and (o, w) not in _READ:
        _READ.add((o, w))
        _read_all(o, workers=False)
    return _RECORDS.setdefault(where, []) if recs is None else recs


def stage_records(name: str) -> dict:
    """``stallbench.stage(name)``'s recorded outputs by their arguments' key (read once)."""
    recs = _STAGE_REC.get(name)
    if recs is None:
        recs = {}

        def keep(rec) -> None:
            n, key, out = rec
            if n == name:
                recs.setdefault(key, out)
        loaded(sorted(glob.glob(os.path.join(PLAN.dir, "stage-rec-*.pkl"))), keep)
        _STAGE_REC[name] = recs
    return recs
