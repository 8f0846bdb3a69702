"""Record and serve a loader's work inside the user's processes (issue 28; loaded by
``hooks.py`` by file path, only when ``STALLBENCH_PROFILE`` carries a ``replay`` object, so a
plain profile never runs a line of it). Standard library only, like the hooks: torch is
reached through the objects the hooks hand over.

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
  they reference (``_compact``), not as that whole storage once per call.
- ``serve``: the same fetch calls answered from that file, matched by (loader order, worker
  id, epoch, call number) and checked against the indices asked for: ``items`` serves the
  dataset's items (collate still runs on them), ``batch`` serves collate's output (neither
  runs). A call that does not match (a sampler that shuffles without a seed), or that the
  record does not hold (the budget ran out), is computed for real and counted, so the
  launcher can refuse the ablation instead of reporting a mixed run.

Each process says what it did in ``replay-<host>-<pid>.json`` (role ``replay``) beside its
part: served/computed calls, the first mismatch, the budget stop, and per stream and epoch
the index of the first batch served from memory (compute-only).
"""

from __future__ import annotations

import gc
import glob
import json
import os
import pickle
import re
import socket
import sys
import threading

H = sys.modules.get("_stallbench_profile_hooks")
CFG: dict = {}
MODE = ""
_LOCK = threading.Lock()
_STAT = {"served": 0, "computed": 0, "recorded": 0, "recorded_bytes": 0, "budget_stop": None,
         "mismatch": None, "missing": None, "unserved_batches": 0}
_SERVED_FROM: dict = {}       # stream name -> [first served batch index per epoch]
_KEPT: dict = {}              # stream key -> [batches kept for compute-only]
_KEPT_BYTES: dict = {}
_CALLS: dict = {}             # (order, worker, epoch) -> calls so far in this process
_REC_FILES: dict = {}
_RECORDS: dict = {}           # (order, worker, epoch) -> list of entries (serve)
_READ: set = set()            # (order, worker) whose recordings were read (serve)
_FULL = threading.local()


def setup(cfg: dict) -> None:
    global CFG, MODE, H
    CFG = cfg
    MODE = str(cfg.get("mode", ""))
    H = sys.modules.get("_stallbench_profile_hooks")


def _budget() -> int:
    return int(float(CFG.get("budget_mb", 512)) * 1024 * 1024)


def _nbytes(batch, depth: int = 0) -> int:
    """Tensor/array bytes of a batch (dicts, lists, tuples looked into). Only the builtin
    containers' own methods and a C-level ``nbytes`` (torch's, numpy's) are read: no code
    of a batch's class runs (a lookup ``__getattr__`` raising KeyError, issue 38)."""
    if depth > 4:
        return 0
    try:
        t = type(batch)
        if issubclass(t, dict):
            return sum(_nbytes(v, depth + 1) for v in dict.values(batch))
        if issubclass(t, (list, tuple)):
            seq = list if issubclass(t, list) else tuple      # a namedtuple too
            return sum(_nbytes(v, depth + 1) for v in seq.__iter__(batch))
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
    counts = (CFG.get("counts") or {}).get(stream.name)
    if counts:
        return int(counts[epoch]) if epoch < len(counts) else int(counts[-1])
    try:
        return len(it)
    except TypeError:
        return None


def _not_served(kind: str) -> bool:
    """Whether a stream's door says its batches are not served from memory (``SERVED``)."""
    door = H.door_of(kind)
    return door is None or bool(getattr(door, "SERVED", ""))


def source(stream, ep, source_fn, it):
    """``Stream.next_batch``'s seam in a compute-only run: the real loader for the first
    batches of the run (kept), the kept batches afterwards, StopIteration where the full
    run's epoch ended."""
    if MODE != "compute_only" or _not_served(stream.kind):
        return source_fn
    kept = _KEPT.setdefault(stream.key, [])
    epoch = len(stream.epochs) - 1
    keep = int(CFG.get("keep", 8))

    def serve(i):
        done = len(ep.wait)
        want = _expected(stream, i, epoch)
        full = len(kept) >= keep or _KEPT_BYTES.get(stream.key, 0) >= _budget()
        if not full or not kept:
            batch = source_fn(i)            # StopIteration passes through: the real end
            if not full:
                kept.append(batch)
                _KEPT_BYTES[stream.key] = _KEPT_BYTES.get(stream.key, 0) + _nbytes(batch)
            return batch
        if want is None:
            with _LOCK:
                _STAT["unserved_batches"] += 1
            return source_fn(i)
        if done >= want:
            raise StopIteration
        marks = _SERVED_FROM.setdefault(stream.name, [])
        while len(marks) <= epoch:
            marks.append(None)
        if marks[epoch] is None:
            marks[epoch] = done
        with _LOCK:
            _STAT["served"] += 1
        return kept[done % len(kept)]
    return serve


# ------------------------------------------------------------- record / serve (fetchers)

def _where() -> tuple[int, int, int]:
    """(loader order, worker id or -1, epoch) of the fetch running in this thread."""
    if H.PROC.worker_loader is not None:
        order = H.PROC.worker_loader.rsplit(":", 1)[-1]
        torch = sys.modules.get("torch")
        info = torch.utils.data.get_worker_info() if torch is not None else None
        wid = info.id if info is not None else 0
        epoch = int(os.environ.get(EPOCH_ENV, "0") if H.PROC.serving_epoch is None
                    else H.PROC.serving_epoch)
        try:
            return int(order), wid, epoch
        except ValueError:
            return -1, wid, epoch
    st = getattr(H.ACTIVE, "stream", None)
    if st is None:
        return -1, -1, 0
    return st.order, -1, max(len(st.epochs) - 1, 0)


EPOCH_ENV = "STALLBENCH_PROFILE_EPOCH"


def _rec_path(where: tuple[int, int, int], pid: int | None = None) -> str:
    o, w, e = where
    tail = f"-p{pid}" if pid is not None else "-p*"
    rank = H.rank()["rank"]        # torchrun: each rank has its own loader and sampler shard
    return os.path.join(CFG["dir"], f"rec-r{rank}-o{o}-w{w}-e{e}{tail}.pkl")


def _next_call(where) -> int:
    with _LOCK:
        n = _CALLS.get(where, 0)
        _CALLS[where] = n + 1
    return n


# a tensor is recorded as a compact copy when the storage it views holds more than this many
# times the bytes its call's views of it reference (and at least ``_VIEW_MIN`` more)
_VIEW_RATIO = 2
_VIEW_MIN = 64 * 1024


def _tensors(obj, tensor_type, out: list, depth: int = 0) -> None:
    """The tensors in a call's outputs (builtin dicts, lists, tuples looked into, as
    ``_nbytes`` does: no code of the user's classes runs)."""
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


def _compact(obj):
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


def _record(where, entry) -> None:
    if _STAT["budget_stop"] is not None:
        return
    try:
        blob = pickle.dumps(_compact(entry), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an unpicklable item: no recording, job goes on
        _STAT["budget_stop"] = {"where": list(where), "call": entry[0], "bytes": 0,
                                "error": f"cannot pickle the outputs ({type(exc).__name__})"}
        return
    with _LOCK:
        if _STAT["recorded_bytes"] + len(blob) > _budget():
            _STAT["budget_stop"] = {"where": list(where), "call": entry[0],
                                    "bytes": _STAT["recorded_bytes"]}
            return
        try:
            fh = _REC_FILES.get(where)
            if fh is None:
                fh = _REC_FILES[where] = open(_rec_path(where, os.getpid()), "ab")
            fh.write(blob)
            fh.flush()
        except OSError as exc:      # the job goes on; the recording is void and says why
            _STAT["budget_stop"] = {"where": list(where), "call": entry[0],
                                    "bytes": _STAT["recorded_bytes"], "error": str(exc)}
            return
        _STAT["recorded"] += 1
        _STAT["recorded_bytes"] += len(blob)


def _loaded(files: list, keep, collect: bool = True) -> None:
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
            H.say(f"cannot read the recording {os.path.basename(f)} "
                  f"({type(exc).__name__}: {exc}); its calls are computed")
    if collect:
        gc.collect()


def _load(where) -> list:
    """The recorded calls of ``where`` (loader order, worker, epoch). At this loader's and
    worker's first serving call, every epoch's recording is read at once: read per epoch,
    the second and later epochs paid their read (and its collection) inside the steady
    window, a cost the full run never had that the attribution charged to the loader's
    hand-off (0.8 s of a 3-epoch job's 4.3 s wait). The loop's own process does so; a loader
    worker reads its epoch's file alone, as a worker forked again each epoch (not persistent)
    would otherwise read every epoch's at every fork."""
    recs = _RECORDS.get(where)
    o, w, _ = where
    if recs is None and w >= 0:
        recs = _RECORDS[where] = []
        _loaded(sorted(glob.glob(_rec_path(where)))[:1], recs.append)
    elif recs is None and (o, w) not in _READ:
        _READ.add((o, w))
        files: dict[int, str] = {}
        for f in sorted(glob.glob(_rec_path((o, w, "*")))):     # type: ignore[arg-type]
            m = re.search(r"-e(\d+)-p\d+\.pkl$", f)
            if m is not None:
                files.setdefault(int(m.group(1)), f)            # one process's file per epoch
        for ep in sorted(files):
            _RECORDS[(o, w, ep)] = []
            _loaded([files[ep]], _RECORDS[(o, w, ep)].append, collect=False)
        gc.collect()      # once, for every epoch read (``_loaded``: why)
    return _RECORDS.setdefault(where, []) if recs is None else recs


def _index_key(index):
    try:
        return list(index)
    except TypeError:
        return index


def fetch(fetcher, index, orig, col):
    """A fetcher's ``fetch`` under ``record`` or ``serve`` (the DataLoader door's
    ``_patch_fetch`` calls this inside its timers; ``col`` is the fetcher's timed ``collate_fn``)."""
    if MODE not in ("record", "serve") or (MODE == "serve" and
                                           CFG.get("serve") not in ("items", "batch")):
        return orig(fetcher, index)
    where = _where()
    n = _next_call(where)
    idx = _index_key(index) if getattr(fetcher, "auto_collation", True) else index
    if MODE == "record":
        inner = col.fn
        items_box: list = []

        def tap(data):
            items_box.append(data)
            return inner(data)
        col.fn = tap
        try:
            out = orig(fetcher, index)
        except StopIteration:
            _record(where, (n, idx, None, None, "stop"))
            raise
        finally:
            col.fn = inner
        _record(where, (n, idx, items_box[0] if items_box else None, out, ""))
        return out
    recs = _load(where)
    stage = CFG.get("serve", "items")
    if n >= len(recs):
        with _LOCK:
            _STAT["computed"] += 1
            if _STAT["missing"] is None:
                _STAT["missing"] = {"where": list(where), "call": n, "recorded": len(recs)}
        return orig(fetcher, index)
    _, r_idx, items, batch, flag = recs[n]
    if not _same(r_idx, idx):
        with _LOCK:
            _STAT["computed"] += 1
            if _STAT["mismatch"] is None:
                _STAT["mismatch"] = {"where": list(where), "call": n,
                                     "recorded": _short(r_idx), "asked": _short(idx)}
        return orig(fetcher, index)
    with _LOCK:
        _STAT["served"] += 1
    if flag == "stop":
        raise StopIteration
    if stage == "batch" or items is None:
        return batch
    return col(items)


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
    """This process's replay part (written where the hooks write their parts)."""
    run_dir = H.SETTINGS.get("run_dir") if H is not None else None
    if not run_dir:
        return
    for fh in list(_REC_FILES.values()):
        try:
            fh.flush()
        except (OSError, ValueError):
            pass
    with _LOCK:
        stat = json.loads(json.dumps(_STAT, default=str))     # deep, under the lock
        rec = H.PARTS.Replay(
            pid=os.getpid(), mode=MODE, serve=CFG.get("serve"),
            worker=H.PROC.worker_loader is not None, **stat,
            served_from=json.loads(json.dumps(_SERVED_FROM, default=str)),
            kept={k: len(v) for k, v in _KEPT.items()}, kept_bytes=dict(_KEPT_BYTES))
    if not (rec.served or rec.computed or rec.recorded or rec.stages or rec.budget_stop
            or rec.unserved_batches):
        return
    path = os.path.join(run_dir, f"{rec.PREFIX}-{socket.gethostname()}-{os.getpid()}.json")
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(rec.to_json(), fh, default=str)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - a lost replay part must never fail the job
        H.say(f"cannot write its replay figures ({type(exc).__name__}: {exc})")


# ------------------------------------------------------ stallbench.stage (the decorator)

_PRIMITIVE = (int, float, str, bytes, bool, type(None))
_STAGE_REC: dict = {}         # name -> {key: output} (serve)
_STAGE_FILE = []


def _arg_key(a: tuple, k: dict) -> str | None:
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
    if MODE == "record":
        out = fn(*a, **k)
        key = _arg_key(a, k)
        if key is None:
            _note_stage(name, "unkeyed")
            return out
        if _STAT["budget_stop"] is None:
            try:
                blob = pickle.dumps(_compact((name, key, out)), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - an output that cannot be kept: not served
                _note_stage(name, "unpicklable")
                return out
            with _LOCK:
                if _STAT["recorded_bytes"] + len(blob) > _budget():
                    _STAT["budget_stop"] = {"where": [name], "call": 0,
                                            "bytes": _STAT["recorded_bytes"]}
                    return out
                try:
                    if not _STAGE_FILE:
                        _STAGE_FILE.append(open(os.path.join(
                            CFG["dir"], f"stage-rec-{socket.gethostname()}-{os.getpid()}.pkl"),
                            "ab"))
                    _STAGE_FILE[0].write(blob)
                    _STAGE_FILE[0].flush()
                except OSError:
                    _note_stage(name, "unwritable")
                    return out
                _STAT["recorded_bytes"] += len(blob)
            _note_stage(name, "recorded")
        return out
    if MODE == "serve" and CFG.get("serve") == f"stage:{name}":
        recs = _stage_records(name)
        key = _arg_key(a, k)
        if key is not None and key in recs:
            _note_stage(name, "served")
            return recs[key]
        _note_stage(name, "computed")
        with _LOCK:
            if _STAT["missing"] is None:
                _STAT["missing"] = {"where": [name], "call": key, "recorded": len(recs)}
    return fn(*a, **k)


def _note_stage(name: str, what: str) -> None:
    with _LOCK:
        d = _STAT.setdefault("stages", {}).setdefault(name, {})
        d[what] = d.get(what, 0) + 1


def _stage_records(name: str) -> dict:
    recs = _STAGE_REC.get(name)
    if recs is None:
        recs = {}

        def keep(rec) -> None:
            n, key, out = rec
            if n == name:
                recs.setdefault(key, out)
        _loaded(sorted(glob.glob(os.path.join(CFG["dir"], "stage-rec-*.pkl"))), keep)
        _STAGE_REC[name] = recs
    return recs
