"""The code ``stallbench profile`` runs inside the user's processes (loaded by the bootstrap's
``sitecustomize``; never imported by stallbench itself).

Rules it keeps, and why:

- **Standard library only** at import, torch only once the job imported torch's DataLoader,
  Ray only once the job imported Ray Data: a hook that imported torch first would change what
  the job measures (its start-up) and what it can run (a CPU-only job importing CUDA).
  ``_PostImport`` is a ``sys.meta_path`` finder that patches a module right after the job's
  own import of it executed.
- **Per batch, not per item**: the trainer's clocks sit at ``_BaseDataLoaderIter.__next__``
  (wait = inside it, step = between its return and the next call) and the producers' at the
  fetchers (``dataset[i]`` for a whole batch of indices, ``collate_fn``) and ``pin_memory``:
  two clock pairs per batch, so no sampling is needed to stay inside the 2% overhead target.
- **Files, not pipes**: each process writes its own part (JSON, atomically replaced) into the
  run directory the launcher named in ``STALLBENCH_PROFILE``: the trainer at each epoch end
  (at most every ``FLUSH_S``) and at exit, loader workers at most every ``FLUSH_S`` and when
  their loop ends (multiprocessing children leave through ``os._exit``: no ``atexit``).
  Nothing is sent through the job's own queues, so its batches are exactly its own.
- **Per-batch records are a seam**: every batch of a stream goes through ``Stream.next_batch``
  (``source`` = the loader's own ``__next__``), so a later replay (issue 28) can serve
  recorded batches from memory by swapping the source, and the records (epoch, index,
  request time, wait, step, rows) say which batch to serve.

Doors beyond torch's DataLoader and Ray Data (issue 40): torchdata's ``StatefulDataLoader``
and ``nodes.Loader`` (``patch_stateful``, ``patch_nodes``), and a loader thread feeding the
loop through a ``queue.Queue`` (``_Feed``: the loop's ``get`` is the exposed wait).

Written for torch 2.13, Ray 2.60 and torchdata 0.11 (``WRITTEN_FOR``); with another version the job's stderr
gets one line saying what the hooks patch and that it may have changed.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import threading
import time
import types
import weakref

WRITTEN_FOR = {"torch": "2.13", "ray": "2.60", "torchdata": "0.11"}
ENV = "STALLBENCH_PROFILE"
LOADER_ENV = "STALLBENCH_PROFILE_LOADER"   # "trainer pid:loader order", for spawned workers
EPOCH_ENV = "STALLBENCH_PROFILE_EPOCH"     # the epoch spawned workers start for (replay)
FLUSH_S = 1.0

_perf = time.perf_counter
_tcpu = time.thread_time

SETTINGS: dict = {}
STREAMS: list = []              # this process's streams, in creation order
_LOCK = threading.Lock()
_ACTIVE = threading.local()     # the stream whose batch this thread is fetching (0 workers)
_WORKER_LOADER: str | None = None   # in a loader worker: "trainer pid:order" it works for
_STAGES: dict = {}              # key -> name -> a record (stage_add)
_next_flush = 0.0
_said: set = set()
_REPLAY = None                  # replay.py (issue 28), loaded only for an ablation run
_SERVING_EPOCH: int | None = None   # in a loader worker: the epoch it was started for
_IMAGE = os.urandom(4).hex()    # this process image: an exec'd image or a forked child gets
                                # its own, so its part files never overwrite the last image's
_PID = os.getpid()
_LOST = [0]                     # part writes that failed and were not written again since


class _IdMap:
    """Object -> value, never stored in the object (issue 38, class 2): keyed by ``id`` with a
    weak reference that drops the entry when the object goes. Not a ``WeakKeyDictionary``:
    that hashes and compares the key, which runs a user's ``__hash__``/``__eq__``; nothing
    here calls the object's code, and a loader the job pickles or copies carries nothing of
    stallbench's (a copy is a new object: it gets its own stream when iterated)."""

    def __init__(self) -> None:
        self._d: dict = {}

    def get(self, obj):
        e = self._d.get(id(obj))
        if e is not None and e[0]() is obj:
            return e[1]
        return None

    def set(self, obj, value) -> bool:
        key, d = id(obj), self._d

        def gone(ref, key=key, d=d):
            e = d.get(key)
            if e is not None and e[0] is ref:
                d.pop(key, None)
        try:
            ref = weakref.ref(obj, gone)
        except TypeError:           # not weak-referenceable: not measured (never kept alive)
            return False
        d[key] = (ref, value)
        return True

    def clear(self) -> None:
        self._d.clear()


_LOADERS = _IdMap()             # a DataLoader / Ray iterator -> its Stream
_ITERS = _IdMap()               # a torch loader iterator -> (Stream, Epoch)


def _own(obj, name: str, default=None):
    """An attribute from the object's own ``__dict__``: no ``getattr``, so no property,
    ``__getattr__`` or ``__getattribute__`` of the user's runs from hook code (a loader
    subclass whose ``__getattr__`` forwards to its dataset recursed before its ``__init__``)."""
    try:
        d = object.__getattribute__(obj, "__dict__")
        return dict.get(d, name, default)
    except Exception:  # noqa: BLE001 - no __dict__ (slots): nothing of ours to read
        return default


def _unmeasured(label: str, what: str) -> None:
    """The last resort for an exception inside hook code: one line naming the loader and
    what was not done (never the exception's class: the user did nothing wrong)."""
    line = f"stallbench: {label}: not measured ({what})"
    if line not in _said:
        _said.add(line)
        try:
            print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a closed stderr: nothing to say it on
            pass


def _say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(f"stallbench profile: {line}", file=sys.stderr, flush=True)


def _rank() -> dict:
    env = os.environ

    def num(name: str, default: int) -> int:
        try:
            return int(env.get(name, default))
        except ValueError:
            return default
    out = {"rank": num("RANK", 0), "local_rank": num("LOCAL_RANK", 0),
           "world_size": num("WORLD_SIZE", 1), "node_rank": num("GROUP_RANK", 0)}
    dist = _dist()
    if dist is not None and "RANK" not in env:      # mp.spawn + init_process_group(rank=)
        out["rank"], out["world_size"] = dist.get_rank(), dist.get_world_size()
    return out


def _dist():
    """torch.distributed when the job initialised a process group (a rank however it was
    started: torchrun, Ray Train, ``mp.spawn`` with ``init_process_group(rank=...)``)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist if dist is not None and dist.is_available() and dist.is_initialized() \
            else None
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------ stage records

def stage_add(name: str, wall: float, cpu: float | None, calls: int = 1, where: str = "",
              cold: bool = False) -> None:
    """Add one timed stage call to the bucket of the loader being served (in a worker: the
    loader it works for; in the trainer: the stream fetching now, else "trainer"). A record
    is [calls, wall, cpu, where, calls whose CPU was read, cold cpu, cold calls]; ``cpu``
    None: not read. ``cold``: the process's first fetch, whose CPU (a lazy open, imports)
    is kept apart: the merge scales it to the unread calls only when no warm call was read."""
    if _WORKER_LOADER is not None:
        key = _WORKER_LOADER
        where = where or "workers"
    else:
        st = getattr(_ACTIVE, "stream", None)
        key = (st.key if st is not None else
               getattr(_ACTIVE, "pin_key", None) or f"{os.getpid()}:trainer")
        where = where or "trainer"
    # under the lock: the pin thread and the user's threads add here while a flush copies
    # (an unlocked += loses updates; a dict changing size under json.dump raises)
    with _LOCK:
        rec = _STAGES.setdefault(key, {}).get(name)
        if rec is None:
            rec = _STAGES[key][name] = [0, 0.0, 0.0, where, 0, 0.0, 0]
        rec[0] += calls
        rec[1] += wall
        if cpu is not None:
            cpu_at, calls_at = (5, 6) if cold else (2, 4)
            rec[cpu_at] += cpu
            rec[calls_at] += calls
    if _WORKER_LOADER is not None and _perf() >= _next_flush:
        flush_worker()


class Stage:
    """``stallbench.stage(name)``: a context manager and a decorator timing wall and this
    thread's CPU (the CPU clock of the calling thread: a worker's other threads are not it)."""

    __slots__ = ("name", "_w", "_c")

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> "Stage":
        self._w, self._c = _perf(), _tcpu()
        return self

    def __exit__(self, *exc: object) -> None:
        stage_add(self.name, _perf() - self._w, _tcpu() - self._c)

    def __call__(self, fn):
        import functools
        name = self.name

        @functools.wraps(fn)
        def timed(*a, **k):
            w, c = _perf(), _tcpu()
            try:
                if _REPLAY is not None:     # an ablation run: recorded, or served (replay.py)
                    return _REPLAY.stage_call(name, fn, a, k)
                return fn(*a, **k)
            finally:
                stage_add(name, _perf() - w, _tcpu() - c)
        return timed


# ----------------------------------------------------------------------------- streams

def _rows(batch, default: int) -> int:
    """Samples in a batch, from its structure, one rule for every door (DataLoader, Ray,
    ``watch``, a queue fed by a loader thread, torchdata): the leading dimension of a
    tensor/array; the length of a sequence of values (``[path, path, ...]``, a list of
    ints); a dict counts by its first value that is a tensor or a sequence (a batch
    ``{"path": [...], "image": tensor}`` by its paths, not as one sample); a tuple/list of
    columns by its first column. A list whose items are dicts or tuples (its first and last
    read) is the list of the samples (an identity ``collate_fn``; torch's default collate
    turns dict samples into one dict and tuple samples into a list of columns): its length.
    Nothing countable (a scalar, a string, an object): the loader's batch size.
    Only the builtin containers' own methods and C-level ``shape`` descriptors (torch,
    numpy) are used: a batch class's ``__getattr__`` (a lookup that raises ``KeyError``),
    properties or overridden ``values()`` never run from here."""
    try:
        n = _count(batch, 4)
        if n is not None:
            return n
    except Exception:  # noqa: BLE001 - an odd batch is counted as a batch_size one
        pass
    return default


def _count(b, depth: int) -> int | None:
    """``_rows`` of one value; None where it holds nothing countable."""
    t = type(b)
    shape = _shape(b)
    if shape is not None:
        return int(tuple.__getitem__(shape, 0)) if tuple.__len__(shape) > 0 else None
    if depth <= 0:
        return None
    if issubclass(t, dict):
        for i, v in enumerate(dict.values(b)):
            if i >= 8:
                break
            n = _count(v, depth - 1)
            if n is not None:
                return n
        return None
    if issubclass(t, (list, tuple)):
        seq = list if issubclass(t, list) else tuple
        size = seq.__len__(b)
        if not size:
            return None
        first, last = seq.__getitem__(b, 0), seq.__getitem__(b, -1)
        if seq is list and (all(issubclass(type(x), dict) for x in (first, last))
                            or all(type(x) is tuple for x in (first, last))):
            return size             # a list of samples (identity collate)
        if _shape(first) is not None or issubclass(type(first), (list, tuple, dict)):
            return _count(first, depth - 1)     # columns: the first one's length
        return size                 # a column of plain values (paths, ids)
    return None


_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _shape(b) -> tuple | None:
    """``b.shape`` where the type defines it in C (a tensor's or an array's), as a tuple;
    None for anything else (no Python code of the batch's class runs)."""
    for klass in type(b).__mro__:
        desc = klass.__dict__.get("shape")
        if desc is not None:
            if type(desc) not in _C_DESCRIPTORS:
                return None
            shape = desc.__get__(b, type(b))
            return shape if issubclass(type(shape), tuple) else None
    return None


class Epoch:
    """One pass over a stream (one ``iter()``): per-batch request time, wait and step."""

    __slots__ = ("t_iter", "t_req", "wait", "step", "rows", "t_last", "t_end", "capped",
                 "cuda", "cpu0", "cpu1", "abandoned", "past_cap", "expected")

    def __init__(self, t: float) -> None:
        self.t_iter = t
        self.expected: int | None = None    # len(loader) at iter(): the batches a pass yields
        self.abandoned = False      # closed because a later pass began
        self.past_cap = False       # capped inside a next(it) loop: served unmeasured after
        self.t_req: list = []
        self.wait: list = []
        self.step: list = []
        self.rows: list = []
        self.t_last = t
        self.t_end: float | None = None
        self.capped = False
        self.cuda: list | None = None   # [(start event, end event)] per batch on a GPU
        # the trainer process's CPU over this epoch (not its start-up: imports, data set-up),
        # as the what-if's t_cpu wants it
        self.cpu0 = time.process_time()
        self.cpu1: float | None = None

    def to_json(self, t0: float) -> dict:
        steps = list(self.step)
        if self.t_end is not None and self.t_req:
            steps.append(self.t_end - self.t_last)   # the last batch's step ends at the end call
        out = {"t_iter": self.t_iter - t0, "t_req": [t - t0 for t in self.t_req],
               "wait": self.wait, "step": steps,
               "rows": self.rows, "ended": self.t_end is not None, "capped": self.capped,
               "t_end": (self.t_end if self.t_end is not None else self.t_last) - t0,
               "cpu_s": (self.cpu1 if self.cpu1 is not None else time.process_time())
               - self.cpu0}
        if self.cuda:
            out["gpu"] = _cuda_times(self.cuda)
        return out


def _cuda_times(events: list) -> dict:
    """GPU-side wait and step per batch from CUDA events recorded on the current stream when
    the loop asked for a batch (``a``) and when it got it (``b``): wait_i = a_i -> b_i on the
    GPU's clock (the GPU idled that long only if it had finished the previous step's work),
    step_i = b_i -> a_{i+1} (what the GPU spent on the loop's kernels)."""
    try:
        events[-1][1].synchronize()
        wait = [a.elapsed_time(b) / 1e3 for a, b in events]
        step = [events[i][1].elapsed_time(events[i + 1][0]) / 1e3 for i in range(len(events) - 1)]
        return {"wait": wait, "step": step}
    except Exception as exc:  # noqa: BLE001 - a failed GPU read must not fail the job
        return {"error": str(exc)[:200]}


class Stream:
    """One loader (a DataLoader, a Ray Data iterator, a watched iterable) in this process.

    ``unmeasured``: why its figures are not kept (its hooks switched off after an exception
    inside hook code, or two passes or threads over it at once, whose waits and steps are
    not one loop's); the merge leaves such a stream out and the launcher says why."""

    def __init__(self, kind: str, label: str, settings: dict | None = None) -> None:
        settings = settings or {}
        rows = settings.get("batch_size")
        self.default_rows = int(rows) if type(rows) is int and rows > 0 else 1
        with _LOCK:
            self.order = len(STREAMS)
            STREAMS.append(self)
        self.kind = kind
        self.label = label
        self.name = f"{label}#{self.order}"
        self.key = f"{os.getpid()}-{_IMAGE}:{self.order}"
        self.settings = settings
        self.notes: list = []
        self.epochs: list = []
        self.written = 0            # epochs already in an epochs-*.json file
        self.default_rows = int(self.settings.get("batch_size") or 1)
        self.unmeasured = ""
        self.busy = 0               # the thread inside next_batch now (0: none)
        self.role = ""              # "producer": a thread that feeds the loop a queue
        self.fed_by = ""            # a queue's stream: the name of the stream feeding it
        self.length = _UNREAD       # len(loader) read at its first pass (``_length``)
        if len(_BEAT["loaders"]) < 8:     # names for the launcher's lines, a few
            _BEAT["loaders"].append(self.name)
        beat(force=True)

    def switch_off(self, what: str) -> None:
        """Hooks off for this loader: it runs on exactly as without stallbench."""
        if not self.unmeasured:
            self.unmeasured = what
            _unmeasured(self.name, what)

    def new_epoch(self, t: float) -> Epoch:
        """A new pass; a previous pass the loop left with ``break`` (never ended) is closed
        at its last batch first: left open, its CPU would run to process exit and overlap
        every later epoch's, and the run would read as one that exited mid-epoch."""
        if self.epochs:
            self.close_abandoned(self.epochs[-1])
        ep = Epoch(t)
        self.epochs.append(ep)
        return ep

    def close_abandoned(self, ep: Epoch) -> None:
        """End an epoch the loop stopped asking from, at its last batch (its last step is
        not timed: nothing marks where it ended). Its CPU ends now: the trainer's CPU
        between the ``break`` and now is in it (no per-batch CPU clock read: overhead)."""
        if ep.t_end is None:
            ep.abandoned = True
            self.end_epoch(ep, ep.t_last)

    def next_batch(self, ep: Epoch, source, it):
        """One batch through the stream's clocks; ``source(it)`` makes it (the seam a replay
        swaps, see the module docstring). StopIteration ends the epoch and flushes the part.

        Whatever fails in the clocks switches this loader's hooks off (``switch_off``); the
        batch itself is always ``source(it)``'s, and its exceptions are the job's own."""
        if self.unmeasured or ep.past_cap:
            return source(it)
        measured = False            # decided inside the guard; the batch is made outside it,
        try:                        # so the job's own exceptions are never taken for ours
            t0 = _perf()
            me = threading.get_ident()
            if self.busy or ep.abandoned:
                # another thread inside now, or a pass resumed after a later one began: two
                # loops over one loader (two threads), whose figures would be half of each
                self.switch_off("it was iterated from two threads or by two passes at once, "
                                "so its waits and steps are not one loop's")
            elif cap_reached(ep, SETTINGS.get("max_batches")):
                if not ep.capped:
                    ep.capped = True
                    self.end_epoch(ep, t0)
                if _in_for_loop():
                    raise StopIteration
                # a next(it) loop: StopIteration would fail the job; the measured part is
                # kept and the rest of the pass is served unmeasured
                ep.past_cap = True
            else:
                cuda = _cuda_event() if ep.cuda is not None or _cuda_on() else None
                if _REPLAY is not None:
                    source = _REPLAY.source(self, ep, source, it)
                prev = getattr(_ACTIVE, "stream", None)
                measured = True
        except StopIteration:
            raise
        except Exception:  # noqa: BLE001 - hook code failed: this loader runs unmeasured
            self.switch_off("its batches could not be timed")
        if not measured:
            return source(it)
        _ACTIVE.stream = self
        self.busy = me
        try:
            batch = source(it)
        except StopIteration:
            self.busy = 0
            if not ep.t_req:        # a pass that yielded nothing: an empty loader
                _BEAT["empty"] += 1
                beat(force=True)
            self.end_epoch(ep, t0)
            raise
        finally:
            self.busy = 0
            _ACTIVE.stream = prev
        try:
            t1 = _perf()
            if ep.t_req:
                ep.step.append(t0 - ep.t_last)
                ep.t_req.append(t0)
                ep.wait.append(t1 - t0)
            else:                   # the first batch waits from iter(): worker start-up is in it
                ep.t_req.append(ep.t_iter)
                ep.wait.append(t1 - ep.t_iter)
            ep.t_last = t1
            ep.rows.append(_rows(batch, self.default_rows))
            if me != _MAIN:         # a put of it into a queue.Queue: a feed (_fed); the
                _ACTIVE.produced = (self, id(batch), ep.rows[-1])   # main thread never feeds
            if cuda is not None:
                if ep.cuda is None:
                    ep.cuda = []
                ep.cuda.append((cuda, _cuda_event()))
            _BEAT["batches"] += 1
            _BEAT["last"] = (self.name, len(self.epochs), len(ep.wait))
            if t1 >= _next_beat or _BEAT["batches"] == 1:
                beat(force=True)
            if t1 >= _next_periodic:
                flush(force=False)
        except Exception:  # noqa: BLE001
            self.switch_off("its batches could not be timed")
        return batch

    def end_epoch(self, ep: Epoch, t: float) -> None:
        """An epoch ends: its part is written now (not only at exit: a Ray Train worker that
        Ray ends never runs ``atexit``), unless this same stream's last epoch end was written
        so recently that writing again would cost more than ``FLUSH_BUDGET`` of the time
        since (``next(iter(loader))`` every step ends an epoch per batch); then the next
        periodic flush or the exit writes it."""
        if ep.t_end is None:
            ep.t_end = t
            ep.cpu1 = time.process_time()
            flush(force=False, epoch_end=self.key)

    def to_json(self) -> dict:
        out = {"kind": self.kind, "name": self.name, "order": self.order, "key": self.key,
               "settings": dict(self.settings), "notes": list(self.notes)}
        if self.unmeasured:
            out["unmeasured"] = self.unmeasured
        if self.role:
            out["role"] = self.role
        if self.fed_by:
            out["fed_by"] = self.fed_by
        return out

    def pending_epochs(self, t0: float, all_: bool) -> tuple[list, int]:
        """The epochs not written yet: the finished ones (every one at exit), in order, and
        how far ``written`` moves once they are (``take``: only after the write succeeded, so
        a failed write is tried again at the next flush instead of losing them)."""
        out = []
        n = self.written
        while n < len(self.epochs):
            ep = self.epochs[n]
            if ep.t_end is None and not all_:
                break
            if ep.t_req:
                out.append(ep.to_json(t0))
            n += 1
        return out, n


def cap_reached(ep: Epoch, cap) -> bool:
    """``--max-batches`` reached in this pass."""
    return bool(cap) and len(ep.wait) >= cap


def _in_for_loop() -> bool:
    """Whether StopIteration at ``--max-batches`` ends a loop rather than fails the job: the
    code asking for the batch is a ``for`` loop (its frame stands at ``FOR_ITER``; a
    comprehension, ``zip`` inside a ``for`` too), or a library's (a trainer framework's
    ``next(iterator)`` handles the end of an epoch: it meets one every epoch). A ``next(it)``
    in the user's own code gets no StopIteration: it would fail the job. Frames of this file
    (the torch ``__next__`` wrapper, a watched pass's generator) are skipped. Not CPython, or
    no frame to read: taken as a loop (the behaviour before issue 38)."""
    try:
        import dis
        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename == __file__:
            f = f.f_back
        if f is None:
            return True
        code = f.f_code.co_code
        i = f.f_lasti
        if not (0 <= i < len(code)) or dis.opname[code[i]].startswith("FOR_ITER"):
            return True
        return _library_file(f.f_code.co_filename)
    except Exception:  # noqa: BLE001
        return True


def _library_file(path: str) -> bool:
    """An installed package's or the standard library's file (not the user's code)."""
    import sysconfig
    if "site-packages" in path or "dist-packages" in path:
        return True
    paths = sysconfig.get_paths()
    return any(path.startswith(paths[k] + os.sep) for k in ("stdlib", "platstdlib")
               if paths.get(k))


def _cuda_on() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _cuda_event():
    import torch
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


class Passes:
    """What ``stallbench.watch(x)`` and a hooked Ray Data iterator method return: an iterable
    that, like the object it wraps, starts a new pass at every ``iter()`` (Ray's
    ``iter_torch_batches(...)`` made once and looped every epoch; a watched loader made once).
    Each pass is one measured epoch. A generator here was one-shot: epochs 2+ got nothing.
    ``next(x)`` on it continues one pass, as it would on a wrapped iterator."""

    __slots__ = ("_stream", "_inner", "_inside", "_it", "__weakref__")

    def __init__(self, stream: "Stream", inner, inside=None) -> None:
        self._stream, self._inner, self._inside, self._it = stream, inner, inside, None

    def __iter__(self):
        return _pass(self._stream, self._inner, self._inside)

    def __next__(self):
        if self._it is None:
            self._it = _pass(self._stream, self._inner, self._inside)
        return next(self._it)

    def __len__(self) -> int:
        return len(self._inner)


def _pass(st: "Stream", inner, inside):
    """One pass over ``inner`` through the stream's clocks (``inside``: Ray's flag that a
    nested iteration is not counted twice)."""
    ep = st.new_epoch(_perf())
    if inside is not None:
        inside.on = True
    try:
        it = iter(inner)
    finally:
        if inside is not None:
            inside.on = False
    nxt = type(it).__next__
    if inside is None:
        source = nxt
    else:
        def source(i):
            inside.on = True
            try:
                return nxt(i)
            finally:
                inside.on = False
    try:
        while True:
            try:
                batch = st.next_batch(ep, source, it)
            except StopIteration:
                return
            yield batch
    finally:                        # a loop that broke out: the generator is closed
        st.close_abandoned(ep)


# ------------------------------------------------------------------------ thread loaders
# A loader iterated on one thread whose batches the training loop takes from a
# ``queue.Queue`` (MONAI's ThreadDataLoader, a hand-written prefetch thread): the time the
# producer thread spends in the loader's ``__next__`` is production, not the loop's wait
# (the traceml mistake: 98% "stalled" where the loop waited 15%). The hooks see a batch the
# producer just took (``_ACTIVE.produced``) being put into a queue (itself, or inside a
# tuple/list: ``q.put((i, batch))``); that queue is then a feed: the loader's stream is
# marked ``producer`` and the queue's ``get`` is timed as the consumer's wait, in a stream
# of its own (kind ``thread.queue``, named ``<loader> (queue)``) whose epochs follow the
# producer's. Only ``queue.Queue`` and its subclasses are seen (``SimpleQueue``, a deque
# or a list are not: the loader's stream is then what its own thread waited, noted).

QUEUE_KIND = "thread.queue"
_MAIN = threading.main_thread().ident
_FEEDS = _IdMap()               # a queue.Queue a producer thread puts batches into -> _Feed
_ALL_FEEDS: list = []           # every feed (kept past its queue: closed at exit)


class _Feed:
    """One queue fed by one loader stream's producer thread, and its consumer's clocks."""

    __slots__ = ("producer", "consumer", "pending", "t_ask", "ep", "ep_of")

    def __init__(self, producer: "Stream") -> None:
        self.producer = producer
        self.consumer: Stream | None = None
        self.pending: dict = {}         # id(item put) -> (producer epoch number, rows)
        self.t_ask: float | None = None     # the consumer's first get of the batch to come
        self.ep: Epoch | None = None
        self.ep_of = 0

    def get(self, orig, q, a, k):
        """``q.get``: the wait runs from the consumer's first try (a ``get(timeout=)``
        that raised ``Empty`` and was tried again waited all along) to the item."""
        t0 = _perf()
        if self.t_ask is None:
            self.t_ask = t0
        item = orig(q, *a, **k)
        t1 = _perf()
        try:
            self.took(item, t1)
        except Exception:  # noqa: BLE001 - hook code failed: the consumer runs unmeasured
            if self.consumer is not None:
                self.consumer.switch_off("its queue's waits could not be timed")
        return item

    def took(self, item, t1: float) -> None:
        t_ask, self.t_ask = self.t_ask, None
        got = self.pending.pop(id(item), None)
        cons = self.consumer
        if cons is None:
            p = self.producer
            cons = self.consumer = Stream(QUEUE_KIND, p.label, dict(p.settings))
            cons.name, cons.fed_by = f"{p.name} (queue)", p.name
            cons.notes.append(f"the training loop's waits on the queue.Queue that {p.name}'s "
                              "producer thread fills: the exposed wait")
        if cons.unmeasured:
            return
        if got is None:             # not a batch (an end marker): the pass ended at the ask
            if self.ep is not None:
                cons.end_epoch(self.ep, t_ask)
                self.ep = None
            return
        ep_of, rows = got
        if self.ep is None or self.ep_of != ep_of:
            if self.ep is not None:
                cons.end_epoch(self.ep, t_ask)
            self.ep, self.ep_of = cons.new_epoch(t_ask), ep_of
        ep = self.ep
        if ep.t_req:
            ep.step.append(t_ask - ep.t_last)
        ep.t_req.append(t_ask)
        ep.wait.append(t1 - t_ask)
        ep.t_last = t1
        ep.rows.append(rows)
        _BEAT["batches"] += 1
        _BEAT["last"] = (cons.name, len(cons.epochs), len(ep.wait))
        if t1 >= _next_periodic:
            flush(force=False)

    def close(self) -> None:
        """At exit: a consumer pass that took every batch of an ended producer pass (a loop
        that counts its batches and sends no end marker) ended at its last batch."""
        ep, p = self.ep, self.producer
        if ep is None or ep.t_end is not None or self.consumer is None:
            return
        if 0 < self.ep_of <= len(p.epochs):
            pe = p.epochs[self.ep_of - 1]
            if pe.t_end is not None and not pe.capped and len(pe.wait) == len(ep.wait):
                ep.t_end = ep.t_last
                ep.cpu1 = time.process_time()


def _fed(q, item, tag) -> None:
    """``q.put(item)`` on a thread that just took a batch: a feed when the item is that
    batch (or holds it in a tuple/list); never raises (``_put``)."""
    st, bid, rows = tag
    t = type(item)
    if id(item) != bid and not ((t is tuple or t is list) and
                                any(id(x) == bid for x in item[:4])):
        return
    _ACTIVE.produced = None
    feed = _FEEDS.get(q)
    if feed is None:
        feed = _Feed(st)
        if not _FEEDS.set(q, feed):
            return
        _ALL_FEEDS.append(feed)
        if st.role != "producer":
            st.role = "producer"
            st.notes.append(
                f"iterated on a background thread ({threading.current_thread().name}) that "
                "puts its batches into a queue.Queue: its waits are the producer's, not the "
                "training loop's (no wait share: see its '(queue)' loader for the loop's)")
    feed.pending[id(item)] = (len(st.epochs), rows)


def patch_queue() -> None:
    """``queue.Queue.put``/``get`` (standard library, patched at install): a put costs one
    thread-local read, a get one dict lookup, unless the queue is a feed."""
    import functools
    import queue as queue_mod
    Q = queue_mod.Queue
    orig_put, orig_get = Q.put, Q.get

    @functools.wraps(orig_put)
    def put(self, item, *a, **k):
        tag = getattr(_ACTIVE, "produced", None)
        if tag is not None:
            try:
                _fed(self, item, tag)
            except Exception:  # noqa: BLE001 - the put goes on as the job's own
                pass
        return orig_put(self, item, *a, **k)

    @functools.wraps(orig_get)
    def get(self, *a, **k):
        feed = _FEEDS.get(self) if _FEEDS._d else None
        if feed is not None:
            return feed.get(orig_get, self, a, k)
        if not STREAMS:             # no loader in this process: nothing can feed a queue
            return orig_get(self, *a, **k)
        # the loop's first get may start before the producer's first put made the queue a
        # feed: its wait (the pipeline's start-up) runs from here, or from its first try
        # where it polls (``get(timeout=)`` tried again after ``Empty``)
        t0 = _perf()
        asking = getattr(_ACTIVE, "asking", None)
        if asking is not None and asking[0] == id(self):
            t0 = asking[1]
        try:
            item = orig_get(self, *a, **k)
        except BaseException:
            _ACTIVE.asking = (id(self), t0)
            raise
        _ACTIVE.asking = None
        try:
            feed = _FEEDS.get(self)
            if feed is not None:
                if feed.t_ask is None:
                    feed.t_ask = t0
                feed.took(item, _perf())
        except Exception:  # noqa: BLE001
            pass
        return item

    Q.put, Q.get = put, get


_UNREAD = object()


def _length(loader) -> int | None:
    """``len(loader)`` of a DataLoader over a map-style dataset (the batches one pass yields,
    its sampler and ``drop_last`` counted), None for anything else (an IterableDataset's
    length is a hint) or when it cannot be read; never raises."""
    try:
        data = sys.modules.get("torch.utils.data")
        ds = getattr(loader, "dataset", None)
        if data is None or ds is None or isinstance(ds, data.IterableDataset):
            return None
        n = len(loader)
        return n if type(n) is int and n > 0 else None
    except Exception:  # noqa: BLE001 - unsized: the pass ends when the loop says
        return None


def _close_complete() -> None:
    """At exit: a pass that yielded exactly ``len(loader)`` batches ended, though the loop
    never asked for the final StopIteration (Lightning reads ``len(loader)`` batches and
    stops): it ended at its last batch, and the job did not exit mid-epoch (issue 40)."""
    try:
        with _LOCK:
            streams = list(STREAMS)
        for st in streams:
            if not st.epochs:
                continue
            ep = st.epochs[-1]
            if ep.t_end is None and not ep.capped and ep.expected is not None \
                    and len(ep.wait) == ep.expected:
                ep.t_end = ep.t_last
                ep.cpu1 = time.process_time()
    except Exception:  # noqa: BLE001 - the pass stays open, as the job left it
        pass


def _close_feeds() -> None:
    try:
        for feed in list(_ALL_FEEDS):
            feed.close()
    except Exception:  # noqa: BLE001
        pass


# ------------------------------------------------------------------------------ beats
# What the launcher reads while the job runs and when no figures came back (``--progress-
# timeout``; "exited before its first batch", "an empty loader", "figures lost"): one small
# file per process, ``beat-<host>-<pid>`` (no ``.json``: it is not a part), rewritten when
# the process starts, makes a loader, has an empty pass, at most every ``BEAT_S`` while
# batches come, and at exit. Counts only: the names are the streams' own.

BEAT_S = 0.5
_BEAT: dict = {"loaders": [], "batches": 0, "last": None, "empty": 0, "exited": False}
_next_beat = 0.0


FLUSH_MARK = "flush-now"       # the launcher asks for a flush before it ends the job (tune)
_flush_asked = False


def beat(force: bool = False) -> None:
    """Rewrite this process's beat file; never raises (a lost beat is a lost hint). Also
    where a launcher's ``FLUSH_MARK`` is seen (one stat per beat): the next batch then
    flushes its part, the open epoch with it, so a trial that ``stallbench tune`` ends keeps
    its batches up to now (``launcher.run_once``'s ``stop``)."""
    global _next_beat, _next_periodic, _flush_asked
    now = _perf()
    if not force and now < _next_beat:
        return
    _next_beat = now + BEAT_S
    run_dir = SETTINGS.get("run_dir")
    if not run_dir:
        return
    try:
        if not _flush_asked and os.path.exists(os.path.join(run_dir, FLUSH_MARK)):
            _flush_asked = True
            _next_periodic = 0.0
    except Exception:  # noqa: BLE001 - a hint
        pass
    try:
        path = os.path.join(run_dir, f"beat-{socket.gethostname()}-{os.getpid()}")
        with open(path + ".tmp", "w") as fh:
            fh.write(json.dumps(_BEAT))
        os.replace(path + ".tmp", path)
    except Exception:  # noqa: BLE001 - never fail the job for a hint
        pass


def _beat_exit() -> None:
    _BEAT["exited"] = True
    beat(force=True)


_WATCHED = _IdMap()             # a watched iterable -> its stream (one per object)


def watch(iterable, name: str | None = None):
    """``stallbench.watch``: the same items, through a stream's clocks (one epoch per pass).
    One stream per object: ``watch(loader)`` called again each epoch (inside the epoch loop,
    as the docs show it) adds an epoch to the same stream, not a new loader per epoch (the
    headline was the first epoch alone). A new object (a generator made each epoch) is a
    new stream."""
    try:
        label = str(name or type(iterable).__name__)
        st = _WATCHED.get(iterable)
        if st is None or st.label != label or st.unmeasured:
            st = Stream("watch", label)
            _WATCHED.set(iterable, st)
        return Passes(st, iterable)
    except Exception:  # noqa: BLE001 - the job goes on with its own iterable
        _unmeasured(str(name or "watch"), "the watched iterable could not be hooked")
        return iterable


# ------------------------------------------------------------------------------- parts

_T0_PERF = _perf()
_T0_WALL = time.time()
FLUSH_BUDGET = 0.02         # at most this share of the job's time goes to writing parts
_next_periodic = 0.0        # the next mid-epoch flush (FLUSH_S, or more if writes are slow)
_next_epoch_flush = 0.0     # the earliest epoch-end flush of the same stream again
_last_end_key = ""          # the stream whose epoch end was flushed last


def _write(name: str, payload: dict) -> bool:
    """One part file, atomically replaced; False (and ``_LOST`` counted, a ``lost-*`` marker
    left: an empty file, which a full disk still takes) when it could not be written."""
    run_dir = SETTINGS.get("run_dir")
    if not run_dir:
        return True
    path = os.path.join(run_dir, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(payload, fh, default=_plain)
        os.replace(tmp, path)
        return True
    except Exception as exc:  # noqa: BLE001 - a lost part must never fail the user's job
        _say(f"cannot write its figures to {run_dir} ({type(exc).__name__}: {exc})")
        try:
            os.unlink(tmp)
        except OSError:
            pass
        _LOST[0] += 1
        try:
            os.close(os.open(_lost_marker(), os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError:
            pass                    # the launcher also finds a run directory it cannot write
        return False


def _lost_marker() -> str:
    return os.path.join(SETTINGS.get("run_dir") or ".",
                        f"lost-{socket.gethostname()}-{os.getpid()}-{_IMAGE}")


def _recovered() -> None:
    """Every figure written after earlier writes failed: nothing is lost any more."""
    if _LOST[0]:
        _LOST[0] = 0
        try:
            os.unlink(_lost_marker())
        except OSError:
            pass


def _plain(o: object) -> object:
    """What JSON cannot write (a numpy int in a loader's settings): its Python scalar
    (numpy's ``.item()``), else a name of its type; a part is never lost to a type, and no
    method of a user's class runs here."""
    t = type(o)
    if t.__module__ == "numpy":
        try:
            return o.item()
        except Exception:  # noqa: BLE001
            pass
    return f"<{t.__module__}.{t.__qualname__}>"


def _stages_copy() -> dict:
    """``_STAGES`` copied under the lock (other threads add to it while a flush dumps)."""
    with _LOCK:
        return {k: {n: list(r) for n, r in v.items()} for k, v in _STAGES.items()}


def _launched() -> bool:
    """A rank of a launcher: torchrun and Ray Train set both RANK and WORLD_SIZE; a process
    in an initialised torch.distributed group is one too. Any other process that iterates a
    loader (a helper the job spawned) is not a rank."""
    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ) or _dist() is not None


def _torch_threads(torch) -> int | None:
    """torch's intra-op threads in this process as it runs now (``OMP_NUM_THREADS``, the
    job's ``torch.set_num_threads``, 1 in a DataLoader worker): the budget that explains a
    10x difference between two runs of one job (issue 42). Read, never set; None where torch
    is not (or not yet fully) imported: the hooks never import it."""
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001 - a half-imported or torn-down torch: not read
        return None


def _header() -> dict:
    torch = sys.modules.get("torch")
    ray = sys.modules.get("ray")
    return {"host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid(),
            "image": _IMAGE, "launched": _launched(),
            "t0_wall": _T0_WALL, "t0_perf": _T0_PERF, **_rank(),
            "torch": getattr(torch, "__version__", None), "ray": getattr(ray, "__version__", None),
            "torch_threads": _torch_threads(torch), "cpu_s": time.process_time()}


_seq = 0


def flush(force: bool = True, epoch_end: str = "") -> None:
    """The trainer's part (its streams and the stages it timed itself, small: rewritten each
    time) and, in a file of their own, the epochs finished since the last flush (at exit,
    every epoch left): a flush costs what is new, not the whole history. It runs inside the
    job's ``__next__``, at epoch ends, before an ``exec`` and at exit: whatever fails in it
    is said once on stderr, never raised."""
    try:
        _flush(force, epoch_end)
    except Exception as exc:  # noqa: BLE001 - the user's job must not fail for a lost flush
        _say(f"a flush of its figures failed ({type(exc).__name__}: {exc}); "
             "this process's figures may be incomplete")


def _flush(force: bool, epoch_end: str) -> None:
    """When: always when ``force``; at an epoch end unless the last flush was so recent that
    this one would take more than ``FLUSH_BUDGET`` of the time since; mid-epoch every
    ``FLUSH_S`` (or longer, by the same budget). A pending epoch end is written by the next
    periodic flush."""
    global _seq, _next_periodic, _next_epoch_flush, _last_end_key
    now = _perf()
    if not force:
        if epoch_end:
            if epoch_end == _last_end_key and now < _next_epoch_flush:
                return
        elif now < _next_periodic:
            return
    if os.getpid() != _PID:         # a forked child that kept the parent's streams
        return
    if not STREAMS and not _STAGES:
        return
    with _LOCK:
        streams = list(STREAMS)
    pending = {s.key: (s, *s.pending_epochs(_T0_PERF, force)) for s in streams}
    new = {k: v[1] for k, v in pending.items() if v[1]}
    host, pid = socket.gethostname(), os.getpid()
    ok = True
    if new:
        ok = _write(f"epochs-{host}-{pid}-{_IMAGE}-{_seq:06d}.json",
                    {"pid": pid, "host": host, "image": _IMAGE, "streams": new})
        if ok:
            _seq += 1
    if ok:
        for s, _, n in pending.values():
            s.written = n
    # the epochs not in an epochs file yet (the open one), as of now: a process that ends
    # without atexit (killed, os._exit) keeps them up to its last flush. ``from``: how many
    # epochs the files hold, so the merge adds them only to exactly those
    open_ = {}
    for s in streams:
        eps = [ep.to_json(_T0_PERF) for ep in s.epochs[s.written:] if ep.t_req]
        if eps:
            open_[s.key] = {"from": s.written, "epochs": eps}
    part = {"role": "trainer", **_header(), "streams": [s.to_json() for s in streams],
            "stages": _stages_copy(), "exiting": force, "open": open_}
    ok = _write(f"part-{host}-{pid}-{_IMAGE}.json", part) and ok
    if ok:
        _recovered()
    if _REPLAY is not None:
        _REPLAY.flush()
    done = _perf()
    cost = done - now
    if epoch_end:
        _last_end_key = epoch_end
    _next_epoch_flush = done + cost / FLUSH_BUDGET
    _next_periodic = done + max(FLUSH_S, cost / FLUSH_BUDGET)


def flush_worker() -> None:
    """A loader worker's part; runs in a fetch's ``finally``: never raises (see ``flush``)."""
    global _next_flush
    _next_flush = _perf() + FLUSH_S
    try:
        part = {"role": "worker", **_header(), "loader": _WORKER_LOADER,
                "stages": _stages_copy()}
        if _write(f"stage-{socket.gethostname()}-{os.getpid()}-{_IMAGE}.json", part):
            _recovered()
        if _REPLAY is not None:
            _REPLAY.flush()
    except Exception as exc:  # noqa: BLE001
        _say(f"a flush of its figures failed ({type(exc).__name__}: {exc}); "
             "this process's figures may be incomplete")


def _forked() -> None:
    """In a forked child: the parent's streams are not this process's (a loader worker
    clears them again in ``_worker_loop``); a new image, so its files are its own."""
    global _IMAGE, _PID, _seq
    _IMAGE, _PID, _seq = os.urandom(4).hex(), os.getpid(), 0
    STREAMS.clear()
    _STAGES.clear()
    _LOADERS.clear()
    _ITERS.clear()
    _FEEDS.clear()
    _ALL_FEEDS.clear()
    _WATCHED.clear()
    _LOST[0] = 0


def _patch_exec() -> None:
    """``os.execv``/``os.execve`` (``execl*``/``execvp*`` go through them) write the figures
    first: the new image replaces this one without ``atexit``, and its own parts have a new
    image name, so an exec'd second training adds to the figures instead of overwriting."""
    import functools
    for name in ("execv", "execve"):
        orig = getattr(os, name, None)
        if orig is None:
            continue

        def make(orig):
            @functools.wraps(orig)
            def exec_(*a, **k):
                flush(force=True)
                return orig(*a, **k)
            return exec_
        setattr(os, name, make(orig))


# ----------------------------------------------------------------------- torch patches

OVERRIDABLE = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


def _version_check(lib: str, version: str) -> None:
    want = WRITTEN_FOR[lib]
    if not version.startswith(want + ".") and version != want:
        what = ("DataLoader.__init__/__iter__, _BaseDataLoaderIter.__next__, the map/iterable "
                "fetchers, the worker loop and pin_memory" if lib == "torch" else
                "StatefulDataLoader.__iter__, nodes.Loader.__iter__ and LoaderIterator.__next__"
                if lib == "torchdata" else "DataIterator.iter_batches/iter_torch_batches")
        _say(f"hooks written for {lib} {want}, this job has {lib} {version}: they patch {what}, "
             "which this version may have changed")


def _set_threads(torch) -> None:
    """``--set torch.num_threads=N`` (a tune trial, issue 41): the trainer's intra-op threads,
    set while the job imports torch, before its first op. A job that sets its own later
    (``torch.set_num_threads(k)``) keeps its choice: the part records the threads it ran with
    (``_torch_threads`` at each flush), and the launcher side says the value was not applied
    (``analysis.loader_search.not_applied``). torch's own functions are never replaced: torch
    is still importing here (its docstrings are added to them after this runs). A loader
    worker sets its own (torch sets 1 in each)."""
    n = SETTINGS.get("overrides", {}).get("torch", {}).get("num_threads")
    if not n or os.getpid() != _PID:
        return
    try:
        torch.set_num_threads(int(n))
    except Exception as exc:  # noqa: BLE001 - the job runs with its own threads, said
        _say(f"torch.num_threads={n} not applied ({type(exc).__name__}: {exc})")


def patch_torch(dl_mod) -> None:
    import functools
    import inspect
    torch = sys.modules["torch"]
    _version_check("torch", torch.__version__)
    utils = sys.modules["torch.utils.data._utils"]
    DataLoader = dl_mod.DataLoader
    BaseIter = dl_mod._BaseDataLoaderIter
    MultiIter = dl_mod._MultiProcessingDataLoaderIter
    overrides = SETTINGS.get("overrides", {}).get("dataloader", {})
    _set_threads(torch)

    orig_init = DataLoader.__init__
    sig = inspect.signature(orig_init)

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        if _LOADERS.get(self) is not None:      # a subclass's second init
            return orig_init(self, *args, **kwargs)
        notes: list = []
        if overrides:
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError:
                bound = None        # torch raises its own error below
            if bound is not None:
                bound.apply_defaults()
                a = bound.arguments
                for k, v in overrides.items():
                    a[k] = v
                if not a.get("num_workers"):
                    if a.get("prefetch_factor") is not None:
                        notes.append("prefetch_factor not applied: torch refuses it with "
                                     "num_workers=0")
                        a["prefetch_factor"] = None
                    if a.get("persistent_workers"):
                        notes.append("persistent_workers not applied: torch refuses it with "
                                     "num_workers=0")
                        a["persistent_workers"] = False
                args, kwargs = bound.args[1:], bound.kwargs
        orig_init(self, *args, **kwargs)
        _loader_stream(self, notes)

    DataLoader.__init__ = __init__

    orig_iter = DataLoader.__iter__

    @functools.wraps(orig_iter)
    def __iter__(self):
        # a loader made without our __init__ (a deepcopy, an unpickled one) gets its stream
        # at its first iter(): it is counted like any other
        st = _LOADERS.get(self) or _loader_stream(self, [])
        return _begin_pass(st, orig_iter, self, "")

    DataLoader.__iter__ = __iter__

    orig_next = BaseIter.__next__

    @functools.wraps(orig_next)
    def __next__(self):
        tag = _ITERS.get(self)
        if tag is None:
            return orig_next(self)
        return tag[0].next_batch(tag[1], orig_next, self)

    BaseIter.__next__ = __next__

    orig_multi_init = MultiIter.__init__

    @functools.wraps(orig_multi_init)
    def multi_init(self, loader, *a, **k):
        # Workers start in here: they learn which loader they serve from a global (fork) or
        # the environment (spawn copies os.environ when it starts them).
        global _SERVING, _SERVING_EPOCH
        st = _LOADERS.get(loader)
        prev, prev_env = _SERVING, os.environ.get(LOADER_ENV)
        if st is not None:
            _SERVING = st.key
            os.environ[LOADER_ENV] = st.key
            _SERVING_EPOCH = len(st.epochs)     # the epoch these workers start for (replay)
            os.environ[EPOCH_ENV] = str(_SERVING_EPOCH)
        # the pin thread starts in here too: its target, looked up on the module now, is
        # tagged with this loader's key, so its pin_memory time goes to this loader only
        pin_loop = pin_mod._pin_memory_loop
        if st is not None:
            pin_mod._pin_memory_loop = functools.partial(_keyed_pin_loop, pin_loop, st.key)
        try:
            orig_multi_init(self, loader, *a, **k)
        finally:
            pin_mod._pin_memory_loop = pin_loop
            _SERVING = prev
            if prev_env is None:
                os.environ.pop(LOADER_ENV, None)
            else:
                os.environ[LOADER_ENV] = prev_env

    MultiIter.__init__ = multi_init
    pin_mod = utils.pin_memory

    worker_mod = utils.worker
    orig_loop = worker_mod._worker_loop

    @functools.wraps(orig_loop)
    def _worker_loop(*a, **k):
        global _WORKER_LOADER
        _WORKER_LOADER = _SERVING or os.environ.get(LOADER_ENV) or f"{os.getppid()}:?"
        STREAMS.clear()             # forked: the trainer's streams are not this process's
        _STAGES.clear()
        _fetches[0] = 0             # this worker's first fetch is its own cold one
        try:
            return orig_loop(*a, **k)
        finally:
            flush_worker()

    worker_mod._worker_loop = _worker_loop

    fetch_mod = utils.fetch
    for cls in (fetch_mod._MapDatasetFetcher, fetch_mod._IterableDatasetFetcher):
        _patch_fetch(cls, functools)

    pin_mod = utils.pin_memory
    orig_pin = pin_mod.pin_memory
    depth = threading.local()

    @functools.wraps(orig_pin)
    def pin_memory(data, *a, **k):
        if getattr(depth, "n", 0):
            return orig_pin(data, *a, **k)
        depth.n = 1
        w, c = _perf(), _tcpu()
        try:
            return orig_pin(data, *a, **k)
        finally:
            depth.n = 0
            stage_add("pin_memory", _perf() - w, _tcpu() - c, where="trainer")

    pin_mod.pin_memory = pin_memory


_SERVING = None                 # in the trainer: the loader whose workers start now


def _loader_stream(loader, notes: list, kind: str = "torch.DataLoader"):
    """The stream of a DataLoader, from its own ``__dict__`` (``_own``: no attribute access
    that reaches the user's class), kept in ``_LOADERS``, never in the loader. None, with the
    one line ``_unmeasured`` says, if that fails: the loader runs as without stallbench."""
    try:
        ds = _own(loader, "dataset")
        t = type(ds)
        pf = _own(loader, "prefetch_factor")
        settings = {"num_workers": _own(loader, "num_workers", 0),
                    "pin_memory": _own(loader, "pin_memory", False) is True,
                    "prefetch_factor": pf,
                    "persistent_workers": _own(loader, "persistent_workers", False) is True,
                    "batch_size": _own(loader, "batch_size"),
                    "dataset": str(t.__module__) + "." + str(t.__qualname__)}
        st = Stream(kind, str(t.__name__), settings)
        st.notes.extend(notes)
        if not _LOADERS.set(loader, st):
            st.switch_off("it cannot be tracked without storing into it")
        return st
    except Exception:  # noqa: BLE001 - the loader runs unhooked, said once
        _unmeasured(f"DataLoader of {type(_own(loader, 'dataset')).__name__}",
                    "its settings could not be read")
        return None


def _keyed_pin_loop(loop, key: str, *a, **k):
    """A loader's pin thread: its ``stage_add`` calls go to that loader's bucket."""
    _ACTIVE.pin_key = key
    return loop(*a, **k)


class _TimedCollate:
    """A fetcher's ``collate_fn``, timed (wall and thread CPU of its last call kept)."""

    __slots__ = ("fn", "wall", "cpu", "sample")

    def __init__(self, fn) -> None:
        self.fn, self.wall, self.cpu, self.sample = fn, 0.0, 0.0, True

    def __call__(self, data):
        if not self.sample:
            w = _perf()
            try:
                return self.fn(data)
            finally:
                self.wall += _perf() - w
        w, c = _perf(), _tcpu()
        try:
            return self.fn(data)
        finally:
            self.wall += _perf() - w
            self.cpu += _tcpu() - c


CPU_EVERY = 8       # fetches per thread-CPU reading (see _patch_fetch)
_fetches = [0]


def _patch_fetch(cls, functools) -> None:
    """Wall time of every fetch; the thread's CPU clock on one fetch in ``CPU_EVERY``: a
    CPU-clock read is a system call (several us where the VM has no vDSO for it), four per
    batch would cost more than the overhead target at a 1 ms step. The merge scales the
    sampled CPU by calls / sampled calls (``cpu_calls`` says how many were read). The
    process's first fetch is read but kept apart (``cold``): it pays one-off costs (a
    dataset that opens its files lazily, imports, first page faults) that, scaled by
    ``CPU_EVERY``, were counted for every unread fetch: 8x a 300 ms open made a thread's
    CPU 8x its wall and refused a real steady rate as faster than the cores allow."""
    orig = cls.fetch
    item = "dataset.__getitem__" if "Map" in cls.__name__ else "dataset.__iter__"

    @functools.wraps(orig)
    def fetch(self, index):
        col = self.collate_fn
        if type(col) is not _TimedCollate:
            col = self.collate_fn = _TimedCollate(col)
        _fetches[0] += 1
        cold = _fetches[0] == 1
        sample = cold or _fetches[0] % CPU_EVERY == 2
        col.sample = sample
        cw0, cc0 = col.wall, col.cpu
        w = _perf()
        c = _tcpu() if sample else 0.0
        try:
            if _REPLAY is not None:
                return _REPLAY.fetch(self, index, orig, col)
            return orig(self, index)
        finally:
            wall = _perf() - w
            cpu = _tcpu() - c if sample else None
            cw, cc = col.wall - cw0, col.cpu - cc0
            n = len(index) if self.auto_collation else 1
            stage_add(item, wall - cw, None if cpu is None else cpu - cc, n, cold=cold)
            stage_add("collate_fn", cw, None if cpu is None else cc, cold=cold)

    cls.fetch = fetch


def _begin_pass(st, orig_iter, loader, what: str):
    """``iter(loader)`` through the loader's own ``__iter__``, as a measured pass of stream
    ``st``: the pass's clock starts before the call (creating the iterator, forking workers,
    is the pass's start-up), and the iterator is tagged in ``_ITERS`` so the hooked
    ``__next__`` finds its stream and epoch. One rule for every door that starts passes at
    ``iter()``: a stream that cannot tag its iterator, or time its pass, is switched off with
    its reason (``what`` names the door), and the job's iterator is returned untouched."""
    if st is None or st.unmeasured:
        return orig_iter(loader)
    t = _perf()
    it = orig_iter(loader)
    try:
        ep = st.new_epoch(t)
        if st.length is _UNREAD:        # read once per loader: len() may run user code
            st.length = _length(loader)
        ep.expected = st.length
        if not _ITERS.set(it, (st, ep)):
            st.switch_off("its iterator cannot be tracked")
    except Exception:  # noqa: BLE001
        st.switch_off(f"its passes could not be timed ({what})" if what
                      else "its passes could not be timed")
    return it


# -------------------------------------------------------------------- torchdata patches

def _hook_passes(cls, make_stream, what: str) -> None:
    """``cls.__iter__`` (a loader whose ``__iter__`` does not call ``DataLoader.__iter__``)
    starts a measured pass on the iterator it returns (tagged in ``_ITERS``); the hooked
    ``__next__`` that finds the tag (torch's ``_BaseDataLoaderIter.__next__``, or
    ``LoaderIterator.__next__`` in ``patch_nodes``) runs the batch through the stream's
    clocks. One stream per loader object; an iterator reused across epochs (a persistent
    one) gets a new pass at each ``iter()``."""
    import functools
    orig_iter = cls.__dict__["__iter__"]

    @functools.wraps(orig_iter)
    def __iter__(self):
        st = _LOADERS.get(self)
        if st is None:
            st = make_stream(self)
            if st is not None and not _LOADERS.set(self, st):
                st.switch_off("it cannot be tracked without storing into it")
        return _begin_pass(st, orig_iter, self, what)

    cls.__iter__ = __iter__


def _torchdata_version() -> None:
    try:
        from importlib.metadata import version
        _version_check("torchdata", version("torchdata"))
    except Exception:  # noqa: BLE001 - no metadata: nothing said
        pass


def patch_stateful(mod) -> None:
    """torchdata's ``StatefulDataLoader`` (torchtitan's loader): its ``__init__`` and
    ``__iter__`` do not call ``DataLoader``'s, so neither hook runs; its iterators are
    ``_BaseDataLoaderIter`` subclasses whose ``__next__`` calls torch's (hooked in
    ``patch_torch``). Hooked here: ``__iter__``. Its workers run torchdata's own worker
    loop: their stage times are not attributed, and ``--set dataloader.*`` does not reach
    it (kind ``torchdata.StatefulDataLoader``)."""
    _torchdata_version()

    def make(loader):
        return _loader_stream(loader, [], "torchdata.StatefulDataLoader")
    _hook_passes(mod.StatefulDataLoader, make, "StatefulDataLoader")


def patch_nodes(mod) -> None:
    """torchdata.nodes' ``Loader`` (no DataLoader at all): ``Loader.__iter__`` starts a pass,
    ``LoaderIterator.__next__`` is the loop's wait; named by its root node's class. The
    nodes' own threads (``ParallelMapper``, ``Prefetcher``) are not timed as stages."""
    import functools
    _torchdata_version()
    LoaderIterator = mod.LoaderIterator
    orig_next = LoaderIterator.__next__

    def make(loader):
        try:
            root = _own(loader, "root")
            return Stream("torchdata.nodes.Loader", str(type(root).__name__), {})
        except Exception:  # noqa: BLE001
            _unmeasured("torchdata.nodes.Loader", "its root could not be read")
            return None

    @functools.wraps(orig_next)
    def __next__(self):
        tag = _ITERS.get(self)
        if tag is None:
            return orig_next(self)
        return tag[0].next_batch(tag[1], orig_next, self)

    LoaderIterator.__next__ = __next__
    _hook_passes(mod.Loader, make, "torchdata.nodes.Loader")


# ------------------------------------------------------------------------- Ray patches

_RAY_INSIDE = threading.local()


def patch_ray(it_mod) -> None:
    """Ray Data's iterators: ``DataIterator.iter_batches`` / ``iter_torch_batches`` (what
    ``Dataset.iter_torch_batches`` and Ray Train's ``get_dataset_shard`` give) and
    ``Dataset.iter_batches`` (which goes around ``DataIterator.iter_batches``). One stream per
    iterator or dataset object, one epoch per call; a call made inside another's iteration
    is not counted twice."""
    ray = sys.modules.get("ray")
    _version_check("ray", getattr(ray, "__version__", "?"))
    _patch_ray_class(it_mod.DataIterator, ("iter_batches", "iter_torch_batches"))


def patch_ray_dataset(ds_mod) -> None:
    _patch_ray_class(ds_mod.Dataset, ("iter_batches",))


def _patch_ray_class(cls, methods) -> None:
    import functools
    prefetch = SETTINGS.get("overrides", {}).get("ray", {}).get("prefetch_batches")
    inside = _RAY_INSIDE
    for meth in methods:
        orig = cls.__dict__.get(meth)
        if orig is None:
            continue

        def make(orig, meth):
            @functools.wraps(orig)
            def wrapped(self, *a, **k):
                if getattr(inside, "on", False):
                    return orig(self, *a, **k)
                if prefetch is not None:
                    k["prefetch_batches"] = prefetch
                inside.on = True
                try:
                    inner = orig(self, *a, **k)
                finally:
                    inside.on = False
                try:
                    st = _LOADERS.get(self)
                    if st is None:
                        st = Stream(f"ray.{meth}", type(self).__name__,
                                    {"batch_size": k.get("batch_size", 256),
                                     "prefetch_batches": k.get("prefetch_batches", 1)})
                        _LOADERS.set(self, st)
                    if st.unmeasured:
                        return inner
                    # what Ray returns is re-iterable (made once, looped every epoch): so
                    # is what the hook returns, one measured epoch per pass
                    return Passes(st, inner, inside)
                except Exception:  # noqa: BLE001 - Ray's own iterable, unmeasured
                    _unmeasured(f"ray.{meth}", "its batches could not be timed")
                    return inner
            return wrapped
        setattr(cls, meth, make(orig, meth))


# ---------------------------------------------------------------------- post-import hook

TARGETS = {"torch.utils.data.dataloader": patch_torch, "ray.data.iterator": patch_ray,
           "ray.data.dataset": patch_ray_dataset,
           "torchdata.stateful_dataloader.stateful_dataloader": patch_stateful,
           "torchdata.nodes.loader": patch_nodes}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, then) -> None:
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        try:
            self.then(module)
        except Exception as exc:  # noqa: BLE001 - a hook that fails leaves the job unhooked
            _say(f"could not hook {module.__name__} ({type(exc).__name__}: {exc}); "
                 "the job runs unmeasured there")


class _PostImport(importlib.abc.MetaPathFinder):
    """Patches a target module right after the job's own import of it executed."""

    def __init__(self) -> None:
        self.busy: set = set()

    def find_spec(self, name, path, target=None):
        if name not in TARGETS or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, TARGETS[name])
        return spec


def _load_replay(cfg: dict) -> None:
    """replay.py beside this file, by path (as the bootstrap loads this one)."""
    global _REPLAY
    try:
        spec = importlib.util.spec_from_file_location(
            "_stallbench_profile_replay", os.path.join(os.path.dirname(__file__), "replay.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mod.setup(cfg)
        _REPLAY = mod
    except Exception as exc:  # noqa: BLE001 - the run goes on unablated, and says so
        _say(f"replay not loaded ({type(exc).__name__}: {exc}); this ablation run is void")


def install() -> None:
    """Read the settings, hook the targets (now if already imported), flush at exit."""
    global SETTINGS
    try:
        SETTINGS = json.loads(os.environ.get(ENV, "{}"))
    except ValueError:
        SETTINGS = {}
    if not SETTINGS.get("run_dir"):
        return
    if SETTINGS.get("replay"):
        _load_replay(SETTINGS["replay"])
    for name, patch in TARGETS.items():
        mod = sys.modules.get(name)
        if mod is not None:
            patch(mod)
    sys.meta_path.insert(0, _PostImport())
    atexit.register(_beat_exit)     # atexit runs last-in first: after the final flush
    atexit.register(flush)
    atexit.register(_close_feeds)   # before the final flush (atexit runs last-in first)
    atexit.register(_close_complete)
    try:
        patch_queue()
    except Exception as exc:  # noqa: BLE001 - thread loaders go unseen, said once
        _say(f"could not hook queue.Queue ({type(exc).__name__}: {exc}); a loader thread's "
             "queue is not seen")
    beat(force=True)                # the launcher's sign that the hooks run in this process
    os.register_at_fork(after_in_child=_forked)
    _patch_exec()
