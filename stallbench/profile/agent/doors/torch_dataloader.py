"""Door: ``torch.utils.data.DataLoader`` and the subclasses that call its ``__iter__``.

The trainer's clocks sit at ``_BaseDataLoaderIter.__next__`` (the wait: inside it; the step:
between its return and the next call), the producers' at the fetchers (``dataset[i]`` for a
whole batch of indices, ``collate_fn``) and at ``pin_memory``: two clock pairs per batch, so
no sampling is needed to stay inside the overhead target. Workers learn which loader they
serve from the core's ``PROC`` (fork) or the environment (spawn). ``--set dataloader.*``
rewrites the loader's arguments at ``__init__``; ``--set torch.num_threads`` is set while
the job imports torch (this door's patch runs then).
"""

from __future__ import annotations

import os
import sys
import threading

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("torch.DataLoader",)
PATCHES = {"torch.utils.data.dataloader": "patch_torch"}
SET_KEYS = ("dataloader", "torch")
SERVED = ""
STAGES = ""
OWN_STAGES = ("dataset.__getitem__", "dataset.__iter__", "collate_fn", "pin_memory")
WRITTEN_FOR = ("torch", "2.13", "DataLoader.__init__/__iter__, _BaseDataLoaderIter.__next__, "
               "the map/iterable fetchers, the worker loop and pin_memory")
VERSION_FROM = ("torch.__version__",)
KIND = KINDS[0]


def _set_threads(torch) -> None:
    """``--set torch.num_threads=N`` (a tune trial, issue 41): the trainer's intra-op threads,
    set while the job imports torch, before its first op. A job that sets its own later
    (``torch.set_num_threads(k)``) keeps its choice: the part records the threads it ran with
    (read at each flush), and the launcher side says the value was not applied
    (``analysis.loader_search.not_applied``). torch's own functions are never replaced: torch
    is still importing here (its docstrings are added to them after this runs). A loader
    worker sets its own (torch sets 1 in each)."""
    n = H.settings.override("torch", "num_threads")
    if not n or not H.own_process():
        return
    try:
        torch.set_num_threads(int(n))
    except Exception as exc:  # noqa: BLE001 - the job runs with its own threads, said
        H.say(f"torch.num_threads={n} not applied ({type(exc).__name__}: {exc})")


def _hide_frames(torch) -> None:
    """A loader worker's exception reaches the loop as text (torch's ``ExceptionWrapper``
    formats its traceback in the worker): formatted without the agent's frames, as the
    loop's own tracebacks are (``frames``)."""
    wrapper = getattr(getattr(torch, "_utils", None), "ExceptionWrapper", None)
    orig = getattr(wrapper, "__init__", None)
    if orig is None or getattr(orig, "_stallbench", False):
        return
    import functools

    @functools.wraps(orig)
    def __init__(self, exc_info=None, where="in background"):
        if exc_info is None:
            exc_info = sys.exc_info()
        if exc_info[2] is not None:
            exc_info = (exc_info[0], exc_info[1], H.without_agent(exc_info[2]))
        orig(self, exc_info, where)

    __init__._stallbench = True
    wrapper.__init__ = __init__


def patch_torch(dl_mod) -> None:
    import functools
    import inspect
    torch = sys.modules["torch"]
    utils = sys.modules["torch.utils.data._utils"]
    DataLoader = dl_mod.DataLoader
    BaseIter = dl_mod._BaseDataLoaderIter
    MultiIter = dl_mod._MultiProcessingDataLoaderIter
    overrides = H.settings.group("dataloader")
    _set_threads(torch)

    orig_init = DataLoader.__init__
    sig = inspect.signature(orig_init)

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        if H.loaders.get(self) is not None:      # a subclass's second init
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
        H.loader_stream(self, notes, KIND)
        own = type(self).__iter__
        if own is not DataLoader.__iter__ and getattr(own, "__wrapped__", None) is None:
            # a subclass's own __iter__ (not another door's hook: torchdata's
            # StatefulDataLoader) may never call ours: said if no batch comes
            H.own_iter(type(self).__qualname__)

    DataLoader.__init__ = __init__

    orig_iter = DataLoader.__iter__

    @functools.wraps(orig_iter)
    def __iter__(self):
        # a loader made without our __init__ (a deepcopy, an unpickled one) gets its stream
        # at its first iter(): it is counted like any other
        st = H.loaders.get(self) or H.loader_stream(self, [], KIND)
        return H.begin_pass(st, orig_iter, self, "")

    DataLoader.__iter__ = __iter__

    BaseIter.__next__ = H.tagged_next(BaseIter.__next__)

    orig_multi_init = MultiIter.__init__

    @functools.wraps(orig_multi_init)
    def multi_init(self, loader, *a, **k):
        # Workers start in here: they learn which loader they serve from a global (fork) or
        # the environment (spawn copies os.environ when it starts them).
        st = H.loaders.get(loader)
        prev, prev_env = H.proc.serving, os.environ.get(H.LOADER_ENV)
        if st is not None:
            H.proc.serving = st.key
            os.environ[H.LOADER_ENV] = st.key
            H.proc.serving_epoch = len(st.epochs)   # the epoch these workers start for
            os.environ[H.EPOCH_ENV] = str(H.proc.serving_epoch)
        # the pin thread starts in here too: its target, looked up on the module now, is
        # tagged with this loader's key, so its pin_memory time goes to this loader only
        pin_loop = pin_mod._pin_memory_loop
        replay = H.replay
        if st is not None and replay is not None:
            # a serving run: the workers about to fork find the recording in memory
            replay.before_workers(st.order, getattr(loader, "multiprocessing_context", None))
        if st is not None:
            pin_mod._pin_memory_loop = functools.partial(_keyed_pin_loop, pin_loop, st.key)
        try:
            orig_multi_init(self, loader, *a, **k)
        finally:
            pin_mod._pin_memory_loop = pin_loop
            H.proc.serving = prev
            if prev_env is None:
                os.environ.pop(H.LOADER_ENV, None)
            else:
                os.environ[H.LOADER_ENV] = prev_env

    MultiIter.__init__ = multi_init
    _hide_frames(torch)
    pin_mod = utils.pin_memory

    worker_mod = utils.worker
    orig_loop = worker_mod._worker_loop

    @functools.wraps(orig_loop)
    def _worker_loop(*a, **k):
        H.proc.worker_loader = (H.proc.serving or os.environ.get(H.LOADER_ENV)
                                or f"{os.getppid()}:?")
        H.forget_streams()          # forked: the trainer's streams are not this process's
        _fetches[0] = 0             # this worker's first fetch is its own cold one
        try:
            return orig_loop(*a, **k)
        finally:
            H.flush_worker()

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
        w, c = H.perf(), H.tcpu()
        try:
            return orig_pin(data, *a, **k)
        finally:
            depth.n = 0
            H.stage_add("pin_memory", H.perf() - w, H.tcpu() - c, where="trainer")

    pin_mod.pin_memory = pin_memory


def _keyed_pin_loop(loop, key: str, *a, **k):
    """A loader's pin thread: its ``stage_add`` calls go to that loader's bucket."""
    H.active.pin_key = key
    return loop(*a, **k)


class _TimedCollate:
    """A fetcher's ``collate_fn``, timed (wall and thread CPU of its last call kept)."""

    __slots__ = ("fn", "wall", "cpu", "sample")

    def __init__(self, fn) -> None:
        self.fn, self.wall, self.cpu, self.sample = fn, 0.0, 0.0, True

    def __call__(self, data):
        if not self.sample:
            w = H.perf()
            try:
                return self.fn(data)
            finally:
                self.wall += H.perf() - w
        w, c = H.perf(), H.tcpu()
        try:
            return self.fn(data)
        finally:
            self.wall += H.perf() - w
            self.cpu += H.tcpu() - c


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
        w = H.perf()
        c = H.tcpu() if sample else 0.0
        try:
            replay = H.replay
            if replay is not None:
                return replay.fetch(self, index, orig, col)
            return orig(self, index)
        finally:
            wall = H.perf() - w
            cpu = H.tcpu() - c if sample else None
            cw, cc = col.wall - cw0, col.cpu - cc0
            n = len(index) if self.auto_collation else 1
            H.stages_add(((item, wall - cw, None if cpu is None else cpu - cc, n),
                          ("collate_fn", cw, None if cpu is None else cc, 1)), cold=cold)

    cls.fetch = fetch


