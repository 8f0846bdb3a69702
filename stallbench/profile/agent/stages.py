"""Stage records: the time a loader's producers spend in each stage (the fetchers' dataset
calls, ``collate_fn``, ``pin_memory``, Ray's own split of a wait, a job's ``stallbench.stage``).

Why per loader: a record goes to the bucket of the loader being served (in a loader worker,
the loader it works for; in the trainer, the stream fetching now), so two loaders of one
process are never charged each other's work. A record is a short list, added to under the
lock: the pin thread and the user's threads add while a flush copies.
"""

from __future__ import annotations

import os

from . import state, writer


def stage_add(name: str, wall: float, cpu: float | None, calls: int = 1, where: str = "",
              cold: bool = False) -> None:
    """Add one timed stage call to the bucket of the loader being served (in a worker: the
    loader it works for; in the trainer: the stream fetching now, else "trainer"). A record
    is [calls, wall, cpu, where, calls whose CPU was read, cold cpu, cold calls]; ``cpu``
    None: not read. ``cold``: the process's first fetch, whose CPU (a lazy open, imports)
    is kept apart: the merge scales it to the unread calls only when no warm call was read."""
    stages_add(((name, wall, cpu, calls),), where, cold)


def stages_add(calls: tuple, where: str = "", cold: bool = False) -> None:
    """``stage_add`` of several (name, wall, cpu, calls) at once: one bucket lookup and one
    lock for a fetch's dataset call and its ``collate_fn`` (per batch: issue 60's budget)."""
    proc = state.PROC
    if proc.worker_loader is not None:
        key = proc.worker_loader
        where = where or "workers"
    else:
        st = getattr(state.ACTIVE, "stream", None)
        key = (st.key if st is not None else
               getattr(state.ACTIVE, "pin_key", None) or f"{os.getpid()}:trainer")
        where = where or "trainer"
    # under the lock: the pin thread and the user's threads add here while a flush copies
    # (an unlocked += loses updates; a dict changing size under json.dump raises)
    records = state.STAGE_RECORDS
    cpu_at, calls_at = (5, 6) if cold else (2, 4)
    with state.LOCK:
        bucket = records.get(key)
        if bucket is None:
            bucket = records[key] = {}
        for name, wall, cpu, n in calls:
            rec = bucket.get(name)
            if rec is None:
                rec = bucket[name] = [0, 0.0, 0.0, where, 0, 0.0, 0]
            rec[0] += n
            rec[1] += wall
            if cpu is not None:
                rec[cpu_at] += cpu
                rec[calls_at] += n
    if proc.worker_loader is not None and writer.worker_flush_due():
        writer.flush_worker()


class Stage:
    """``stallbench.stage(name)``: a context manager and a decorator timing wall and this
    thread's CPU (the CPU clock of the calling thread: a worker's other threads are not it)."""

    __slots__ = ("name", "_w", "_c")

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> "Stage":
        self._w, self._c = state.perf(), state.tcpu()
        return self

    def __exit__(self, *exc: object) -> None:
        stage_add(self.name, state.perf() - self._w, state.tcpu() - self._c)

    def __call__(self, fn):
        import functools
        name = self.name
        perf, tcpu = state.perf, state.tcpu

        @functools.wraps(fn)
        def timed(*a, **k):
            w, c = perf(), tcpu()
            try:
                replay = state.REPLAY
                if replay is not None:      # an ablation run: recorded, or served (replay)
                    return replay.stage_call(name, fn, a, k)
                return fn(*a, **k)
            finally:
                stage_add(name, perf() - w, tcpu() - c)
        return timed
