"""What one process of the job holds while the agent runs in it: the settings it was sent,
its streams and stage records, which loader it serves, its process image, the doors loaded.

Why a module of its own: the agent's other modules read this state and some rebind it (an
install reads the settings, a fork gets a new image), so it lives in one place and is always
reached as ``state.NAME``, never copied by ``from .state import NAME`` (a later rebinding
would not reach the copy); only what is never rebound (the clocks, ``ACTIVE``, ``LOCK``) may
be kept in a module's own name where a batch's hot path reads it. The doors never reach it: they get the core's interface
(``core.Core``), whose accessors read it here at each call.
"""

from __future__ import annotations

import os
import threading
import time
import types
import weakref

from . import wire

LOADER_ENV = "STALLBENCH_PROFILE_LOADER"   # "trainer pid:loader order", for spawned workers
EPOCH_ENV = "STALLBENCH_PROFILE_EPOCH"     # the epoch spawned workers start for (replay)
HERE = os.path.dirname(os.path.abspath(__file__))    # the agent's folder (its frames: ours)

perf = time.perf_counter
tcpu = time.thread_time

SETTINGS = wire.Settings()      # as sent in (``install`` reads them): none until then
STREAMS: list = []              # this process's streams, in creation order
LOCK = threading.Lock()
ACTIVE = threading.local()      # the stream whose batch this thread is fetching (0 workers)
STAGE_RECORDS: dict = {}        # key -> name -> a record (``stages.stage_add``)
REPLAY = None                   # ``replay`` (issue 28), loaded only for an ablation run
SINK = None                     # where records go when not the run directory (``sink``)
NODE = [None]                   # this process's Ray node, read once Ray is up (``util.node``)
DOORS: list = []                # the door modules loaded (``install.load_doors``)
# which loader a process serves, set by the DataLoader door: in the trainer, ``serving`` (the
# loader whose workers start now); in a loader worker, ``worker_loader`` ("trainer pid:order")
# and ``serving_epoch`` (the epoch it was started for: replay)
MAIN = threading.main_thread().ident
PROC = types.SimpleNamespace(serving=None, worker_loader=None, serving_epoch=None)
IMAGE = os.urandom(4).hex()     # this process image: an exec'd image or a forked child gets
                                # its own, so its part files never overwrite the last image's
PID = os.getpid()
LOST = [0]                      # part writes that failed and were not written again since


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
ITERS = IdMap()               # a loader's iterator -> (Stream, Epoch) (``passes.begin_pass``)


def new_image() -> None:
    """In a forked child: a process image of its own (its part files are its own), and none
    of the parent's streams, stage records or tracked loaders."""
    global IMAGE, PID
    IMAGE, PID = os.urandom(4).hex(), os.getpid()
    STREAMS.clear()
    STAGE_RECORDS.clear()
    LOADERS.clear()
    ITERS.clear()
    LOST[0] = 0


def own_process() -> bool:
    """Whether this is the process the agent was installed in (not a fork that kept it)."""
    return os.getpid() == PID
