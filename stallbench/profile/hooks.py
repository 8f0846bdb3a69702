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

- **One module per loader kind** (issue 40): what each loader library needs patched lives in
  its door under ``doors/`` (``load_doors`` loads them by path; each declares the modules it
  patches and gets this core through ``bind``). This file is the core every door uses: the
  stream and epoch clocks, the part files, the beats, the post-import finder. It names no
  loader kind. The doors use its public names only (``Stream``, ``begin_pass``, ``Passes``,
  ``LOADERS``, ``PROC``, ...); nothing of theirs is read from here but their declarations.

Each door says which library version it was written for; with another version the job's
stderr gets one line saying what that door patches and that it may have changed.
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

ENV = "STALLBENCH_PROFILE"
LOADER_ENV = "STALLBENCH_PROFILE_LOADER"   # "trainer pid:loader order", for spawned workers
EPOCH_ENV = "STALLBENCH_PROFILE_EPOCH"     # the epoch spawned workers start for (replay)
FLUSH_S = 1.0

perf = time.perf_counter
tcpu = time.thread_time

SETTINGS: dict = {}
STREAMS: list = []              # this process's streams, in creation order
_LOCK = threading.Lock()


def _sibling(name: str):
    """A module beside this file, loaded by path as ``_stallbench_profile_<name>`` (the job's
    Python may not have stallbench installed): ``parts`` (the part files' records)."""
    import importlib.util as iu
    full = f"_stallbench_profile_{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = iu.spec_from_file_location(full, os.path.join(os.path.dirname(__file__), name + ".py"))
    mod = iu.module_from_spec(spec)
    sys.modules[full] = mod
    spec.loader.exec_module(mod)
    return mod


PARTS = _sibling("parts")       # what crosses the process wall: written with its records
ACTIVE = threading.local()     # the stream whose batch this thread is fetching (0 workers)
STAGE_RECORDS: dict = {}              # key -> name -> a record (stage_add)
_next_flush = 0.0
_said: set = set()
REPLAY = None                   # replay.py (issue 28), loaded only for an ablation run
# which loader a process serves, set by the DataLoader door: in the trainer, ``serving`` (the
# loader whose workers start now); in a loader worker, ``worker_loader`` ("trainer pid:order")
# and ``serving_epoch`` (the epoch it was started for: replay)
MAIN = threading.main_thread().ident
PROC = types.SimpleNamespace(serving=None, worker_loader=None, serving_epoch=None)
_IMAGE = os.urandom(4).hex()    # this process image: an exec'd image or a forked child gets
                                # its own, so its part files never overwrite the last image's
_PID = os.getpid()
_LOST = [0]                     # part writes that failed and were not written again since


class IdMap:
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

    def __len__(self) -> int:
        return len(self._d)


LOADERS = IdMap()             # a DataLoader / Ray iterator -> its Stream
ITERS = IdMap()               # a torch loader iterator -> (Stream, Epoch)


def own(obj, name: str, default=None):
    """An attribute from the object's own ``__dict__``: no ``getattr``, so no property,
    ``__getattr__`` or ``__getattribute__`` of the user's runs from hook code (a loader
    subclass whose ``__getattr__`` forwards to its dataset recursed before its ``__init__``)."""
    try:
        d = object.__getattribute__(obj, "__dict__")
        return dict.get(d, name, default)
    except Exception:  # noqa: BLE001 - no __dict__ (slots): nothing of ours to read
        return default


def unmeasured(label: str, what: str) -> None:
    """The last resort for an exception inside hook code: one line naming the loader and
    what was not done (never the exception's class: the user did nothing wrong)."""
    line = f"stallbench: {label}: not measured ({what})"
    if line not in _said:
        _said.add(line)
        try:
            print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a closed stderr: nothing to say it on
            pass


def say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(f"stallbench profile: {line}", file=sys.stderr, flush=True)


def rank() -> dict:
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
    if PROC.worker_loader is not None:
        key = PROC.worker_loader
        where = where or "workers"
    else:
        st = getattr(ACTIVE, "stream", None)
        key = (st.key if st is not None else
               getattr(ACTIVE, "pin_key", None) or f"{os.getpid()}:trainer")
        where = where or "trainer"
    # under the lock: the pin thread and the user's threads add here while a flush copies
    # (an unlocked += loses updates; a dict changing size under json.dump raises)
    with _LOCK:
        rec = STAGE_RECORDS.setdefault(key, {}).get(name)
        if rec is None:
            rec = STAGE_RECORDS[key][name] = [0, 0.0, 0.0, where, 0, 0.0, 0]
        rec[0] += calls
        rec[1] += wall
        if cpu is not None:
            cpu_at, calls_at = (5, 6) if cold else (2, 4)
            rec[cpu_at] += cpu
            rec[calls_at] += calls
    if PROC.worker_loader is not None and perf() >= _next_flush:
        flush_worker()


class Stage:
    """``stallbench.stage(name)``: a context manager and a decorator timing wall and this
    thread's CPU (the CPU clock of the calling thread: a worker's other threads are not it)."""

    __slots__ = ("name", "_w", "_c")

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> "Stage":
        self._w, self._c = perf(), tcpu()
        return self

    def __exit__(self, *exc: object) -> None:
        stage_add(self.name, perf() - self._w, tcpu() - self._c)

    def __call__(self, fn):
        import functools
        name = self.name

        @functools.wraps(fn)
        def timed(*a, **k):
            w, c = perf(), tcpu()
            try:
                if REPLAY is not None:     # an ablation run: recorded, or served (replay.py)
                    return REPLAY.stage_call(name, fn, a, k)
                return fn(*a, **k)
            finally:
                stage_add(name, perf() - w, tcpu() - c)
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

    def record(self, t0: float):
        """This pass as the part files carry it (``parts.Epoch``), times from ``t0``."""
        steps = list(self.step)
        if self.t_end is not None and self.t_req:
            steps.append(self.t_end - self.t_last)   # the last batch's step ends at the end call
        gpu = _cuda_times(self.cuda) if self.cuda else {}
        return PARTS.Epoch(
            t_iter=self.t_iter - t0, t_req=tuple(t - t0 for t in self.t_req),
            wait=tuple(self.wait), step=tuple(steps), rows=tuple(self.rows),
            ended=self.t_end is not None, capped=self.capped,
            t_end=(self.t_end if self.t_end is not None else self.t_last) - t0,
            cpu_s=(self.cpu1 if self.cpu1 is not None else time.process_time()) - self.cpu0,
            gpu_wait=tuple(gpu.get("wait", ())), gpu_step=tuple(gpu.get("step", ())),
            gpu_error=str(gpu.get("error", "")))


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

    def __init__(self, kind: str, label: str, settings: dict | None = None,
                 named: str = "") -> None:
        """``named``: what the job's framework calls the loader (``framework_name``): the
        stream's name as it stands (``val_dataloader``), ``#order`` added only where another
        stream of this process that was iterated has that name (decided at the first pass:
        a Hugging Face ``Trainer`` makes a DataLoader it never iterates and the prepared copy
        it does, both in ``get_train_dataloader``); else ``<label>#<order>``."""
        settings = settings or {}
        rows = settings.get("batch_size")
        self.default_rows = int(rows) if type(rows) is int and rows > 0 else 1
        with _LOCK:
            self.order = len(STREAMS)
            STREAMS.append(self)
        self.kind = kind
        self.label = label
        self.name = named or f"{label}#{self.order}"
        self.named = named
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
        self.length = _UNREAD       # len(loader) read at its first pass (``length``)
        if len(BEAT["loaders"]) < 8:     # names for the launcher's lines, a few
            BEAT["loaders"].append(self.name)
        beat(force=True)

    def switch_off(self, what: str) -> None:
        """Hooks off for this loader: it runs on exactly as without stallbench."""
        if not self.unmeasured:
            self.unmeasured = what
            unmeasured(self.name, what)

    def new_epoch(self, t: float) -> Epoch:
        """A new pass; a previous pass the loop left with ``break`` (never ended) is closed
        at its last batch first: left open, its CPU would run to process exit and overlap
        every later epoch's, and the run would read as one that exited mid-epoch."""
        if self.epochs:
            self.close_abandoned(self.epochs[-1])
        elif self.named:
            with _LOCK:
                taken = any(s.name == self.named and s.epochs for s in STREAMS if s is not self)
            if taken:
                self.name = f"{self.named}#{self.order}"
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
            t0 = perf()
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
                if REPLAY is not None:
                    source = REPLAY.source(self, ep, source, it)
                prev = getattr(ACTIVE, "stream", None)
                measured = True
        except StopIteration:
            raise
        except Exception:  # noqa: BLE001 - hook code failed: this loader runs unmeasured
            self.switch_off("its batches could not be timed")
        if not measured:
            return source(it)
        ACTIVE.stream = self
        self.busy = me
        try:
            batch = source(it)
        except StopIteration:
            self.busy = 0
            if not ep.t_req:        # a pass that yielded nothing: an empty loader
                BEAT["empty"] += 1
                beat(force=True)
            self.end_epoch(ep, t0)
            raise
        finally:
            self.busy = 0
            ACTIVE.stream = prev
        try:
            t1 = perf()
            if ep.t_req:
                ep.step.append(t0 - ep.t_last)
                ep.t_req.append(t0)
                ep.wait.append(t1 - t0)
            else:                   # the first batch waits from iter(): worker start-up is in it
                ep.t_req.append(ep.t_iter)
                ep.wait.append(t1 - ep.t_iter)
            ep.t_last = t1
            ep.rows.append(_rows(batch, self.default_rows))
            if me != MAIN:         # a put of it into a queue.Queue: a feed (_fed); the
                ACTIVE.produced = (self, id(batch), ep.rows[-1])   # main thread never feeds
            if cuda is not None:
                if ep.cuda is None:
                    ep.cuda = []
                ep.cuda.append((cuda, _cuda_event()))
            BEAT["batches"] += 1
            BEAT["last"] = (self.name, len(self.epochs), len(ep.wait))
            if t1 >= _next_beat or BEAT["batches"] == 1:
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

    def record(self):
        """This stream as the part files carry it (``parts.Stream``)."""
        return PARTS.Stream(kind=self.kind, name=self.name, order=self.order, key=self.key,
                            settings=dict(self.settings), notes=tuple(self.notes),
                            unmeasured=self.unmeasured, role=self.role, fed_by=self.fed_by)

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
                out.append(ep.record(t0))
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
    (a watched pass's generator) and of the door modules (the torch ``__next__`` wrapper, any
    door's hooked method: loaded by path from ``DOOR_DIR``) are skipped. Not CPython, or
    no frame to read: taken as a loop (the behaviour before issue 38)."""
    try:
        import dis
        f = sys._getframe(2)
        doors = DOOR_DIR + os.sep
        while f is not None and (f.f_code.co_filename == __file__
                                 or f.f_code.co_filename.startswith(doors)):
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
    ep = st.new_epoch(perf())
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


_UNREAD = object()


def length(loader) -> int | None:
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


# ------------------------------------------------------------------------------ beats
# What the launcher reads while the job runs and when no figures came back (``--progress-
# timeout``; "exited before its first batch", "an empty loader", "figures lost"): one small
# file per process, ``beat-<host>-<pid>`` (no ``.json``: it is not a part), rewritten when
# the process starts, makes a loader, has an empty pass, at most every ``BEAT_S`` while
# batches come, and at exit. Counts only: the names are the streams' own.

BEAT_S = 0.5
BEAT: dict = {"loaders": [], "batches": 0, "last": None, "empty": 0, "exited": False}
_next_beat = 0.0


FLUSH_MARK = "flush-now"       # the launcher asks for a flush before it ends the job (tune)
_flush_asked = False


def beat(force: bool = False) -> None:
    """Rewrite this process's beat file; never raises (a lost beat is a lost hint). Also
    where a launcher's ``FLUSH_MARK`` is seen (one stat per beat): the next batch then
    flushes its part, the open epoch with it, so a trial that ``stallbench tune`` ends keeps
    its batches up to now (``launcher.run_once``'s ``stop``)."""
    global _next_beat, _next_periodic, _flush_asked
    now = perf()
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
            fh.write(json.dumps(BEAT))
        os.replace(path + ".tmp", path)
    except Exception:  # noqa: BLE001 - never fail the job for a hint
        pass


def _beat_exit() -> None:
    BEAT["exited"] = True
    beat(force=True)


# ------------------------------------------------------------------------------- parts

_T0_PERF = perf()
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
        say(f"cannot write its figures to {run_dir} ({type(exc).__name__}: {exc})")
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
    """``STAGE_RECORDS`` copied under the lock (other threads add to it while a flush dumps)."""
    with _LOCK:
        return {k: {n: list(r) for n, r in v.items()} for k, v in STAGE_RECORDS.items()}


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


def _header():
    """Who writes this part, as ``parts.Header``."""
    torch = sys.modules.get("torch")
    ray = sys.modules.get("ray")
    return PARTS.Header(host=socket.gethostname(), pid=os.getpid(), ppid=os.getppid(),
                        image=_IMAGE, launched=_launched(), t0_wall=_T0_WALL,
                        t0_perf=_T0_PERF, **rank(),
                        torch=getattr(torch, "__version__", None),
                        ray=getattr(ray, "__version__", None),
                        torch_threads=_torch_threads(torch), cpu_s=time.process_time())


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
        say(f"a flush of its figures failed ({type(exc).__name__}: {exc}); "
             "this process's figures may be incomplete")


def _flush(force: bool, epoch_end: str) -> None:
    """When: always when ``force``; at an epoch end unless the last flush was so recent that
    this one would take more than ``FLUSH_BUDGET`` of the time since; mid-epoch every
    ``FLUSH_S`` (or longer, by the same budget). A pending epoch end is written by the next
    periodic flush."""
    global _seq, _next_periodic, _next_epoch_flush, _last_end_key
    now = perf()
    if not force:
        if epoch_end:
            if epoch_end == _last_end_key and now < _next_epoch_flush:
                return
        elif now < _next_periodic:
            return
    if os.getpid() != _PID:         # a forked child that kept the parent's streams
        return
    if not STREAMS and not STAGE_RECORDS:
        return
    with _LOCK:
        streams = list(STREAMS)
    pending = {s.key: (s, *s.pending_epochs(_T0_PERF, force)) for s in streams}
    new = {k: tuple(v[1]) for k, v in pending.items() if v[1]}
    host, pid = socket.gethostname(), os.getpid()
    ok = True
    if new:
        rec = PARTS.Epochs(host=host, pid=pid, image=_IMAGE, seq=_seq, streams=new)
        ok = _write(f"{rec.PREFIX}-{host}-{pid}-{_IMAGE}-{_seq:06d}.json", rec.to_json())
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
        eps = tuple(ep.record(_T0_PERF) for ep in s.epochs[s.written:] if ep.t_req)
        if eps:
            open_[s.key] = (s.written, eps)
    part = PARTS.Trainer(header=_header(), streams=tuple(s.record() for s in streams),
                         stages=_stages_copy(), exiting=force, open=open_)
    ok = _write(f"{part.PREFIX}-{host}-{pid}-{_IMAGE}.json", part.to_json()) and ok
    if ok:
        _recovered()
    if REPLAY is not None:
        REPLAY.flush()
    done = perf()
    cost = done - now
    if epoch_end:
        _last_end_key = epoch_end
    _next_epoch_flush = done + cost / FLUSH_BUDGET
    _next_periodic = done + max(FLUSH_S, cost / FLUSH_BUDGET)


def flush_worker() -> None:
    """A loader worker's part; runs in a fetch's ``finally``: never raises (see ``flush``)."""
    global _next_flush
    _next_flush = perf() + FLUSH_S
    try:
        part = PARTS.Worker(header=_header(), loader=str(PROC.worker_loader),
                            stages=_stages_copy())
        if _write(f"{part.PREFIX}-{socket.gethostname()}-{os.getpid()}-{_IMAGE}.json",
                  part.to_json()):
            _recovered()
        if REPLAY is not None:
            REPLAY.flush()
    except Exception as exc:  # noqa: BLE001
        say(f"a flush of its figures failed ({type(exc).__name__}: {exc}); "
             "this process's figures may be incomplete")


def _forked() -> None:
    """In a forked child: the parent's streams are not this process's (a loader worker
    clears them again in ``_worker_loop``); a new image, so its files are its own."""
    global _IMAGE, _PID, _seq
    _IMAGE, _PID, _seq = os.urandom(4).hex(), os.getpid(), 0
    STREAMS.clear()
    STAGE_RECORDS.clear()
    LOADERS.clear()
    ITERS.clear()
    _LOST[0] = 0
    _each_door("at_fork")           # the doors' own tables (a queue's feed, a watched object)


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


# ------------------------------------------------------------------- for the doors

def own_process() -> bool:
    """Whether this is the process the hooks were installed in (not a fork that kept them)."""
    return os.getpid() == _PID


def dist_version(dist: str) -> str:
    """An installed distribution's version ("?" when its metadata cannot be read)."""
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001 - no metadata: nothing to compare
        return "?"


def version_check(written_for, version: str) -> None:
    """One line on stderr where the job's library is not the version a door was written for
    (``written_for``: the door's ``(library, version, what it patches)``)."""
    lib, want, what = written_for
    if version != "?" and not version.startswith(want + ".") and version != want:
        say(f"hooks written for {lib} {want}, this job has {lib} {version}: they patch {what}, "
            "which this version may have changed")


NAMING_FRAMES = 40      # how far up the stack ``framework_name`` looks


def framework_name() -> str:
    """What the job's framework calls the loader being made: the name of the nearest
    function of the job's own code (not a library's, not stallbench's) on the stack whose
    name ends with ``dataloader`` (Lightning's ``train_dataloader`` / ``val_dataloader`` hooks,
    a data module's ``test_dataloader``): the validation loader is ``val_dataloader``, not
    ``Items#1``. Where the job's code has none, a library's public function of that form
    names it, ``get_`` dropped (Hugging Face ``Trainer.get_train_dataloader`` /
    ``get_eval_dataloader``: ``train_dataloader``, ``eval_dataloader``); the job's own name
    wins over a library helper it calls. "" where none is (a loader made in a plain script
    keeps its dataset class's name). Read once per loader, at its creation; never raises."""
    try:
        f = sys._getframe(1)
        here = os.path.dirname(os.path.abspath(__file__))
        lib = ""
        for _ in range(NAMING_FRAMES):
            if f is None:
                break
            name, path = f.f_code.co_name, f.f_code.co_filename
            if name.endswith("dataloader") and name.isidentifier() and not path.startswith(here):
                if not _library_file(path):
                    return name
                if not lib and not name.startswith("_"):
                    lib = name[len("get_"):] if name.startswith("get_") else name
            f = f.f_back
        return lib
    except Exception:  # noqa: BLE001 - unnamed: the dataset class names it
        return ""


def loader_stream(loader, notes: list, kind: str):
    """The stream of a DataLoader (or a loader with its attributes: torchdata's
    ``StatefulDataLoader``) of kind ``kind``, from its own ``__dict__`` (``own``: no attribute
    access that reaches the user's class), kept in ``LOADERS``, never in the loader. None, with the
    one line ``unmeasured`` says, if that fails: the loader runs as without stallbench."""
    try:
        ds = own(loader, "dataset")
        t = type(ds)
        pf = own(loader, "prefetch_factor")
        settings = {"num_workers": own(loader, "num_workers", 0),
                    "pin_memory": own(loader, "pin_memory", False) is True,
                    "prefetch_factor": pf,
                    "persistent_workers": own(loader, "persistent_workers", False) is True,
                    "batch_size": own(loader, "batch_size"),
                    "dataset": str(t.__module__) + "." + str(t.__qualname__)}
        st = Stream(kind, str(t.__name__), settings, named=framework_name())
        st.notes.extend(notes)
        if not LOADERS.set(loader, st):
            st.switch_off("it cannot be tracked without storing into it")
        return st
    except Exception:  # noqa: BLE001 - the loader runs unhooked, said once
        unmeasured(f"DataLoader of {type(own(loader, 'dataset')).__name__}",
                    "its settings could not be read")
        return None


def begin_pass(st, orig_iter, loader, what: str):
    """``iter(loader)`` through the loader's own ``__iter__``, as a measured pass of stream
    ``st``: the pass's clock starts before the call (creating the iterator, forking workers,
    is the pass's start-up), and the iterator is tagged in ``ITERS`` so the hooked
    ``__next__`` finds its stream and epoch. One rule for every door that starts passes at
    ``iter()``: a stream that cannot tag its iterator, or time its pass, is switched off with
    its reason (``what`` names the door), and the job's iterator is returned untouched."""
    if st is None or st.unmeasured:
        return orig_iter(loader)
    t = perf()
    it = orig_iter(loader)
    try:
        ep = st.new_epoch(t)
        if st.length is _UNREAD:        # read once per loader: len() may run user code
            st.length = length(loader)
        ep.expected = st.length
        if not ITERS.set(it, (st, ep)):
            st.switch_off("its iterator cannot be tracked")
    except Exception:  # noqa: BLE001
        st.switch_off(f"its passes could not be timed ({what})" if what
                      else "its passes could not be timed")
    return it


def hook_passes(cls, make_stream, what: str) -> None:
    """``cls.__iter__`` (a loader whose ``__iter__`` does not call ``DataLoader.__iter__``)
    starts a measured pass on the iterator it returns (tagged in ``ITERS``); the door's
    hooked ``__next__`` that finds the tag runs the batch through the stream's clocks. One
    stream per loader object; an iterator reused across epochs (a persistent
    one) gets a new pass at each ``iter()``."""
    import functools
    orig_iter = cls.__dict__["__iter__"]

    @functools.wraps(orig_iter)
    def __iter__(self):
        st = LOADERS.get(self)
        if st is None:
            st = make_stream(self)
            if st is not None and not LOADERS.set(self, st):
                st.switch_off("it cannot be tracked without storing into it")
        return begin_pass(st, orig_iter, self, what)

    cls.__iter__ = __iter__


# ---------------------------------------------------------------------- post-import hook

DOORS: list = []        # the door modules, loaded by path (``load_doors``)
TARGETS: dict = {}      # a module the job imports -> the door function patching it
DOOR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doors")


def load_doors() -> list:
    """Every door module of ``doors/`` (the order of ``doors.names``: sorted file names),
    loaded by path as ``_stallbench_profile_door_<name>`` (the job's Python may not have
    stallbench installed), bound to this core, its ``PATCHES`` added to ``TARGETS``. Once per
    process; a door that fails to load is said once and left out (its loaders go unseen)."""
    if DOORS:
        return DOORS
    try:
        files = sorted(f[:-3] for f in os.listdir(DOOR_DIR)
                       if f.endswith(".py") and not f.startswith("_"))
    except OSError as exc:
        say(f"no loader doors ({exc}); nothing is hooked")
        return DOORS
    me = sys.modules.get(__name__)     # the bootstrap registers this module before install
    if me is None:
        say("the hooks' module is not registered: no loader doors")
        return DOORS
    for name in files:
        try:
            spec = importlib.util.spec_from_file_location(
                f"_stallbench_profile_door_{name}", os.path.join(DOOR_DIR, name + ".py"))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            mod.bind(me)
            for target, fn in dict(getattr(mod, "PATCHES", {})).items():
                TARGETS[target] = getattr(mod, fn)
            DOORS.append(mod)
        except Exception as exc:  # noqa: BLE001 - that door's loaders go unseen, said
            say(f"the {name} door did not load ({type(exc).__name__}: {exc}); its loaders "
                "are not seen")
    return DOORS


def door_of(kind: str):
    """The loaded door module that makes streams of ``kind`` (None: none does)."""
    for mod in load_doors():
        if kind in getattr(mod, "KINDS", ()):
            return mod
    return None


def watch(iterable, name: str | None = None):
    """``stallbench.watch`` (``markers.watch`` calls this): the door that defines ``watch``
    wraps the iterable; the iterable itself where none does."""
    for mod in load_doors():
        fn = getattr(mod, "watch", None)
        if fn is not None:
            return fn(iterable, name)
    return iterable


def _each_door(hook: str) -> None:
    """Each loaded door's ``hook`` (``at_fork``, ``at_exit``), where it has one; one that
    fails is left: the others still run, and nothing reaches the job."""
    for mod in DOORS:
        fn = getattr(mod, hook, None)
        if fn is not None:
            try:
                fn()
            except Exception:  # noqa: BLE001
                pass


def _at_exit() -> None:
    """Each door's ``at_exit`` (before the final flush: atexit runs last-in first)."""
    _each_door("at_exit")


def tagged_next(orig_next):
    """An iterator class's ``__next__`` for a door that tags its iterators in ``ITERS`` at
    ``iter()`` (``begin_pass``): a tagged iterator's batch goes through its stream's clocks,
    any other iterator of the class runs as it would."""
    import functools

    @functools.wraps(orig_next)
    def __next__(self):
        tag = ITERS.get(self)
        if tag is None:
            return orig_next(self)
        return tag[0].next_batch(tag[1], orig_next, self)
    return __next__


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
            say(f"could not hook {module.__name__} ({type(exc).__name__}: {exc}); "
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
    global REPLAY
    try:
        spec = importlib.util.spec_from_file_location(
            "_stallbench_profile_replay", os.path.join(os.path.dirname(__file__), "replay.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mod.setup(cfg)
        REPLAY = mod
    except Exception as exc:  # noqa: BLE001 - the run goes on unablated, and says so
        say(f"replay not loaded ({type(exc).__name__}: {exc}); this ablation run is void")


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
    load_doors()
    for name, patch in TARGETS.items():
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                patch(mod)
            except Exception as exc:  # noqa: BLE001 - as ``_Loader.exec_module`` says it
                say(f"could not hook {name} ({type(exc).__name__}: {exc}); "
                    "the job runs unmeasured there")
    sys.meta_path.insert(0, _PostImport())
    atexit.register(_beat_exit)     # atexit runs last-in first: after the final flush
    atexit.register(flush)
    atexit.register(_at_exit)       # before the final flush (atexit runs last-in first)
    atexit.register(_close_complete)
    beat(force=True)                # the launcher's sign that the hooks run in this process
    os.register_at_fork(after_in_child=_forked)
    _patch_exec()
