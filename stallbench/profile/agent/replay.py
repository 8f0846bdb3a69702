"""Record and serve a loader's work inside the user's processes (issue 28; loaded by the
agent's ``install`` only when the settings carry a replay plan, so a plain profile never runs
a line of it). Standard library only, like the rest of the agent: torch is reached through
the objects the doors hand over. The recording's files are ``recording``'s.

Three modes, one per kind of ablation run ``ablate.py`` plans:

- ``compute_only``: in the trainer, each hooked stream keeps its first ``keep`` batches of the
  run in memory (references to the batches the loop got; at most ``budget_mb`` of tensor
  bytes) and from then on serves them again, round robin, instead of asking the loader, for
  as many batches as the full run's epoch had. The loop runs ingestion-free; what it does
  with a batch (``.to(device)`` included) is its own step, as in the full run.
- ``record``: a warm run that computes everything and writes, per fetch call, the indices it
  asked for, the dataset's items and ``collate_fn``'s batch (pickled, appended to one file per
  process and epoch, at most ``budget_mb`` per process). Tensors that are small views of a
  big storage (rows sliced out of one batch tensor) are recorded as compact copies of what
  they reference (``recording.compact``), not as that whole storage once per call.
- ``serve``: the same fetch calls answered from that file, matched by (loader order, worker
  id, epoch, call number): ``items`` serves the dataset's items (collate still runs on them),
  ``batch`` serves collate's output (neither runs). After each served call the job's global
  generators are set to the state the recorded call left them in (``generators``), so a
  random augmentation skipped by serving does not move the next epoch's shuffle. A call whose
  indices are not the recording's (a shuffle seeded from the clock) is still served as
  recorded: the served run consumes the recording run's batches in the recording's order,
  and ``reordered`` counts such calls. A call the record does not hold (an epoch longer than
  the recorded one) is computed for real and counted, so the launcher can refuse the
  ablation instead of reporting a mixed run.

Each process says what it did in ``replay-<host>-<pid>.json`` (role ``replay``) beside its
part: served/computed calls, the first mismatch, the budget stop, and per stream and epoch
the index of the first batch served from memory (compute-only).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from . import generators, recording, state, util, wire
from .recording import STATS

_SERVED_FROM: dict = {}       # stream name -> [first served batch index per epoch]
_KEPT: dict = {}              # stream key -> [batches kept for compute-only]
_KEPT_BYTES: dict = {}
_CALLS: dict = {}             # (order, worker, epoch) -> calls so far in this process
_LOCK = recording.LOCK


def setup(plan: wire.ReplayPlan) -> None:
    recording.configure(plan)


def nbytes(batch, depth: int = 0) -> int:
    """Tensor/array bytes of a batch (dicts, lists, tuples looked into). Only the builtin
    containers' own methods and a C-level ``nbytes`` (torch's, numpy's) are read: no code
    of a batch's class runs (a lookup ``__getattr__`` raising KeyError, issue 38)."""
    if depth > 4:
        return 0
    try:
        t = type(batch)
        if issubclass(t, dict):
            return sum(nbytes(v, depth + 1) for v in dict.values(batch))
        if issubclass(t, (list, tuple)):
            seq = list if issubclass(t, list) else tuple      # a namedtuple too
            return sum(nbytes(v, depth + 1) for v in seq.__iter__(batch))
        for klass in t.__mro__:
            desc = klass.__dict__.get("nbytes")
            if desc is not None:
                if type(desc).__name__ not in ("getset_descriptor", "member_descriptor"):
                    break
                n = desc.__get__(batch, t)
                return n if type(n) is int else 0
        return len(batch) if t is bytes or t is str else 0
    except Exception:  # noqa: BLE001 - not a tensor: counted as nothing
        return 0


# ------------------------------------------------------------------ compute-only (trainer)

def _expected(stream, it, epoch: int) -> int | None:
    counts = recording.PLAN.counts.get(stream.name)
    if counts:
        return int(counts[epoch]) if epoch < len(counts) else int(counts[-1])
    try:
        return len(it)
    except TypeError:
        return None


def _not_served(kind: str) -> bool:
    """Whether a stream's door says its batches are not served from memory (``SERVED``)."""
    door = util.door_of(kind)
    return door is None or bool(getattr(door, "SERVED", ""))


_SOURCES: dict = {}      # id(epoch) -> (epoch, source fn given, its serving fn)


def source(stream, ep, source_fn, it):
    """``Stream.next_batch``'s seam in a compute-only run: the real loader for the first
    batches of the run (kept), the kept batches afterwards, StopIteration where the full
    run's epoch ended. One serving function per epoch, made at its first batch: made per
    batch (a closure and the door's lookup), it was a cost inside every served batch's wait,
    a floor above the job's own step (issue 57)."""
    if recording.MODE != "compute_only":
        return source_fn
    got = _SOURCES.get(id(ep))
    if got is not None and got[0] is ep and got[1] is source_fn:
        return got[2]
    fn = source_fn if _not_served(stream.kind) else _serving(stream, ep, source_fn, it)
    _SOURCES[id(ep)] = (ep, source_fn, fn)      # the stream keeps its epochs: no more held
    return fn


def _serving(stream, ep, source_fn, it):
    """The serving function of one epoch (``source``)."""
    kept = _KEPT.setdefault(stream.key, [])
    epoch = len(stream.epochs) - 1
    keep = recording.PLAN.keep

    def serve(i):
        done = len(ep.wait)
        want = _expected(stream, i, epoch)
        full = len(kept) >= keep or _KEPT_BYTES.get(stream.key, 0) >= recording.budget()
        if not full or not kept:
            batch = source_fn(i)            # StopIteration passes through: the real end
            if not full:
                kept.append(batch)
                _KEPT_BYTES[stream.key] = _KEPT_BYTES.get(stream.key, 0) + nbytes(batch)
            return batch
        if want is None:
            with _LOCK:
                STATS.unserved_batches += 1
            return source_fn(i)
        if done >= want:
            raise StopIteration
        marks = _SERVED_FROM.setdefault(stream.name, [])
        while len(marks) <= epoch:
            marks.append(None)
        if marks[epoch] is None:
            marks[epoch] = done
        with _LOCK:
            STATS.served += 1
        return kept[done % len(kept)]
    return serve


# ------------------------------------------------------------- record / serve (fetchers)

def _where() -> tuple[int, int, int]:
    """(loader order, worker id or -1, epoch) of the fetch running in this thread."""
    proc = state.PROC
    if proc.worker_loader is not None:
        order = proc.worker_loader.rsplit(":", 1)[-1]
        torch = sys.modules.get("torch")
        info = torch.utils.data.get_worker_info() if torch is not None else None
        wid = info.id if info is not None else 0
        epoch = int(os.environ.get(state.EPOCH_ENV, "0") if proc.serving_epoch is None
                    else proc.serving_epoch)
        try:
            return int(order), wid, epoch
        except ValueError:
            return -1, wid, epoch
    st = getattr(state.ACTIVE, "stream", None)
    if st is None:
        return -1, -1, 0
    return st.order, -1, max(len(st.epochs) - 1, 0)


def _next_call(where) -> int:
    with _LOCK:
        n = _CALLS.get(where, 0)
        _CALLS[where] = n + 1
    return n


def _index_key(index):
    try:
        return list(index)
    except TypeError:
        return index


def fetch(fetcher, index, orig, col):
    """A fetcher's ``fetch`` under ``record`` or ``serve`` (the DataLoader door's
    ``_patch_fetch`` calls this inside its timers; ``col``: the fetcher's timed collate)."""
    mode, serve = recording.MODE, recording.PLAN.serve
    if mode not in ("record", "serve") or (mode == "serve" and
                                           serve not in ("items", "batch")):
        return orig(fetcher, index)
    where = _where()
    n = _next_call(where)
    idx = _index_key(index) if getattr(fetcher, "auto_collation", True) else index
    if mode == "record":
        return _record_call(fetcher, index, orig, col, where, (n, idx))
    recs = recording.load(where)
    if n >= len(recs):
        with _LOCK:
            STATS.computed += 1
            if STATS.missing is None:
                STATS.missing = wire.Missing(where=tuple(where), call=n, recorded=len(recs))
        return orig(fetcher, index)
    rec = recs[n]
    _, r_idx, items, batch, flag = rec[:5]
    with _LOCK:
        STATS.served += 1
        if not _same(r_idx, idx):
            # the sampler's order is not the recording's (a shuffle seeded from the clock, a
            # generator of the job's own): the call is served as recorded, so the run gets the
            # recording run's batches in the recording's order, and the count says so
            STATS.reordered += 1
            if STATS.mismatch is None:
                STATS.mismatch = wire.Mismatch(where=tuple(where), call=n,
                                               recorded=_short(r_idx), asked=_short(idx))
    try:
        if flag == "stop":
            raise StopIteration
        if serve == "batch" or items is None:
            return batch
        return col(items)
    finally:
        generators.restore(rec[5] if len(rec) > 5 else None)


def _record_call(fetcher, index, orig, col, where, key):
    """One fetch call computed and recorded: its indices, the dataset's items (tapped from
    the collate call), collate's batch, and the global generators' states where the call
    moved them (``generators``: a served run sets them again after serving the call)."""
    n, idx = key
    inner = col.fn
    items_box: list = []

    def tap(data):
        items_box.append(data)
        return inner(data)
    col.fn = tap
    before = generators.taken()
    try:
        out = orig(fetcher, index)
    except StopIteration:
        recording.record(where, (n, idx, None, None, "stop",
                                 generators.moved(before, generators.taken())))
        raise
    finally:
        col.fn = inner
    recording.record(where, (n, idx, items_box[0] if items_box else None, out, "",
                             generators.moved(before, generators.taken())))
    return out


def before_workers(order: int, context) -> None:
    """A DataLoader's workers start now (the door calls this in the loop's process): in a
    serving run whose workers fork, every worker's recording of the loader is read first
    (``recording.preload``), so the workers forked for later epochs never read theirs inside
    the measured window. Spawned workers cannot inherit it (they read their own, timed)."""
    if recording.MODE != "serve" or recording.PLAN.serve not in ("items", "batch"):
        return
    try:
        import multiprocessing
        method = (context.get_start_method() if context is not None
                  else multiprocessing.get_start_method())
    except Exception:  # noqa: BLE001 - unknown: the workers read their own, as before
        return
    if method == "fork":
        recording.preload(order)


def _same(a, b) -> bool:
    try:
        return a == b
    except Exception:  # noqa: BLE001 - uncomparable indices do not match
        return False


def _short(x):
    s = repr(x)
    return s if len(s) <= 120 else s[:117] + "..."


# ----------------------------------------------------------------------------- report

def flush() -> None:
    """This process's replay part (written where the agent writes its parts)."""
    run_dir = state.SETTINGS.run_dir
    if not run_dir:
        return
    recording.flush_files()
    with _LOCK:         # a copy under the lock: fetches count while this runs
        rec = wire.Replay(
            pid=os.getpid(), mode=recording.MODE, serve=recording.PLAN.serve,
            worker=state.PROC.worker_loader is not None, served=STATS.served,
            computed=STATS.computed, reordered=STATS.reordered, recorded=STATS.recorded,
            recorded_bytes=STATS.recorded_bytes, unserved_batches=STATS.unserved_batches,
            late_read_s=STATS.late_read_s, unreadable=STATS.unreadable,
            budget_stop=STATS.budget_stop, mismatch=STATS.mismatch, missing=STATS.missing,
            served_from={k: list(v) for k, v in _SERVED_FROM.items()},
            kept={k: len(v) for k, v in _KEPT.items()}, kept_bytes=dict(_KEPT_BYTES),
            stages={k: wire.StageServe(**v) for k, v in STATS.stages.items()})
    if not (rec.served or rec.computed or rec.recorded or rec.stages or rec.budget_stop
            or rec.unserved_batches):
        return
    path = os.path.join(run_dir, rec.file_name(socket.gethostname(), os.getpid()))
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(rec.to_json(), fh, default=str)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - a lost replay part must never fail the job
        util.say(f"cannot write its replay figures ({type(exc).__name__}: {exc})")


# ------------------------------------------------------ stallbench.stage (the decorator)

_PRIMITIVE = (int, float, str, bytes, bool, type(None))


def arg_key(a: tuple, k: dict) -> str | None:
    """The call's hashable arguments (numbers, strings, tuples of them), in order; other
    arguments (``self``, arrays) stand as their type. None when no argument is hashable:
    then calls cannot be told apart and the stage is not served."""
    def one(x, depth=0):
        if isinstance(x, _PRIMITIVE):
            return x, True
        if isinstance(x, tuple) and depth < 2:
            parts = [one(y, depth + 1) for y in x]
            return tuple(p for p, _ in parts), all(ok for _, ok in parts)
        return f"<{type(x).__qualname__}>", False
    keyed = [one(x) for x in a] + [(n, True) for n in sorted(k)] + [one(v) for _, v in
                                                                   sorted(k.items())]
    if not any(ok for _, ok in keyed):
        return None
    return repr(tuple(p for p, _ in keyed))


def stage_call(name: str, fn, a: tuple, k: dict):
    """A ``@stallbench.stage(name)`` function's call in a recording run (output kept by its
    arguments) or in the run that serves ``name`` (output returned, ``fn`` not called)."""
    if recording.MODE == "record":
        out = fn(*a, **k)
        key = arg_key(a, k)
        if key is None:
            STATS.stage(name, "unkeyed")
            return out
        recording.record_stage(name, key, out)
        return out
    if recording.MODE == "serve" and recording.PLAN.serve == f"stage:{name}":
        recs = recording.stage_records(name)
        key = arg_key(a, k)
        if key is not None and key in recs:
            STATS.stage(name, "served")
            return recs[key]
        STATS.stage(name, "computed")
        with _LOCK:
            if STATS.missing is None:
                STATS.missing = wire.Missing(where=(name,), call=key, recorded=len(recs))
    return fn(*a, **k)
