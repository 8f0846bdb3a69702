"""Passes: how a loader's ``iter()`` becomes a measured epoch of its stream, one rule for every
door (``begin_pass`` for a loader whose iterator the door tags, ``Passes`` for an iterable
the agent wraps: a Ray iterator, a watched one).

Why one rule: a pass starts before the loader's own ``iter()`` runs (creating the iterator,
forking workers, is the pass's start-up), a loader that cannot be tracked without storing
into it is switched off with its reason, and the job always gets its own iterator (or, for
a wrapped iterable, an object that starts a new pass at every ``iter()`` as the wrapped one
does). Each door says only where its passes start and where its batches are asked for.
"""

from __future__ import annotations

import sys
import time

from . import state, streams, util


class Passes:
    """What ``stallbench.watch(x)`` and a hooked Ray Data iterator method return: an iterable
    that, like the object it wraps, starts a new pass at every ``iter()`` (Ray's
    ``iter_torch_batches(...)`` made once and looped every epoch; a watched loader made once).
    Each pass is one measured epoch. A generator here was one-shot: epochs 2+ got nothing.
    ``next(x)`` on it continues one pass, as it would on a wrapped iterator."""

    __slots__ = ("_stream", "_inner", "_inside", "_it", "__weakref__")

    def __init__(self, stream: "streams.Stream", inner, inside=None) -> None:
        self._stream, self._inner, self._inside, self._it = stream, inner, inside, None

    def __iter__(self):
        return _pass(self._stream, self._inner, self._inside)

    def __next__(self):
        if self._it is None:
            self._it = _pass(self._stream, self._inner, self._inside)
        return next(self._it)

    def __len__(self) -> int:
        return len(self._inner)


def _pass(st: "streams.Stream", inner, inside):
    """One pass over ``inner`` through the stream's clocks (``inside``: Ray's flag that a
    nested iteration is not counted twice)."""
    ep = st.new_epoch(state.perf())
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


def close_complete() -> None:
    """At exit: a pass that yielded exactly ``len(loader)`` batches ended, though the loop
    never asked for the final StopIteration (Lightning reads ``len(loader)`` batches and
    stops): it ended at its last batch, and the job did not exit mid-epoch (issue 40)."""
    try:
        with state.LOCK:
            made = list(state.STREAMS)
        for st in made:
            if not st.epochs:
                continue
            ep = st.epochs[-1]
            if ep.t_end is None and not ep.capped and ep.expected is not None \
                    and len(ep.wait) + ep.more == ep.expected:
                ep.t_end = ep.t_last
                ep.cpu1 = time.process_time()
    except Exception:  # noqa: BLE001 - the pass stays open, as the job left it
        pass


def loader_stream(loader, notes: list, kind: str):
    """The stream of a DataLoader (or a loader with its attributes: torchdata's
    ``StatefulDataLoader``) of kind ``kind``, from its own ``__dict__`` (``own``: no attribute
    access that reaches the user's class), kept in ``LOADERS``, never in the loader. None, with the
    one line ``unmeasured`` says, if that fails: the loader runs as without stallbench."""
    try:
        own = util.own
        ds = own(loader, "dataset")
        t = type(ds)
        pf = own(loader, "prefetch_factor")
        settings = {"num_workers": own(loader, "num_workers", 0),
                    "pin_memory": own(loader, "pin_memory", False) is True,
                    "prefetch_factor": pf,
                    "persistent_workers": own(loader, "persistent_workers", False) is True,
                    "batch_size": own(loader, "batch_size"),
                    "dataset": str(t.__module__) + "." + str(t.__qualname__)}
        st = streams.Stream(kind, str(t.__name__), settings, named=util.framework_name())
        st.notes.extend(notes)
        if not state.LOADERS.set(loader, st):
            st.switch_off("it cannot be tracked without storing into it")
        return st
    except Exception:  # noqa: BLE001 - the loader runs unhooked, said once
        util.unmeasured(f"DataLoader of {type(util.own(loader, 'dataset')).__name__}",
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
    t = state.perf()
    it = orig_iter(loader)
    try:
        ep = st.new_epoch(t)
        if st.length is streams.UNREAD:     # read once per loader: len() may run user code
            st.length = length(loader)
        ep.expected = st.length
        if not state.ITERS.set(it, (st, ep)):
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
        st = state.LOADERS.get(self)
        if st is None:
            st = make_stream(self)
            if st is not None and not state.LOADERS.set(self, st):
                st.switch_off("it cannot be tracked without storing into it")
        return begin_pass(st, orig_iter, self, what)

    cls.__iter__ = __iter__


def tagged_next(orig_next):
    """An iterator class's ``__next__`` for a door that tags its iterators in ``ITERS`` at
    ``iter()`` (``begin_pass``): a tagged iterator's batch goes through its stream's clocks,
    any other iterator of the class runs as it would."""
    import functools

    @functools.wraps(orig_next)
    def __next__(self):
        tag = state.ITERS.get(self)
        if tag is None:
            return orig_next(self)
        return tag[0].next_batch(tag[1], orig_next, self)
    return __next__
