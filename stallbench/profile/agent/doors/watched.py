"""Door: ``stallbench.watch(iterable)``, for a loader the automatic doors cannot see (a
custom loader, a generator).

The loop's time in ``next()`` on the watched iterable is the wait; nothing behind it is
seen unless ``stallbench.stage`` marks it. Its items are the job's own objects, not a loader
whose batches a compute-only run can keep and serve: it is never served from memory.
"""

from __future__ import annotations

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("stallbench.watch",)
PATCHES: dict = {}
SET_KEYS: tuple = ()
SERVED = ("the headline loader is a stallbench.watch'ed iterable, which is not served from "
          "memory (only the loaders the hooks find are)")
STAGES = ""

_WATCHED = None                 # a watched iterable -> its stream (one per object)


def bound() -> None:
    global _WATCHED
    _WATCHED = H.IdMap()


def at_fork() -> None:
    """In a forked child: the parent's watched objects are not this process's."""
    _WATCHED.clear()


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
            st = H.Stream(KINDS[0], label)
            _WATCHED.set(iterable, st)
        return H.Passes(st, iterable)
    except Exception:  # noqa: BLE001 - the job goes on with its own iterable
        H.unmeasured(str(name or KINDS[0]), "the watched iterable could not be hooked")
        return iterable


