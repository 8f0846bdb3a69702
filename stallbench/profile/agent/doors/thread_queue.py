"""Door: a loader iterated on a background thread that puts its batches into a ``queue.Queue``.

A loader iterated on one thread whose batches the training loop takes from a
``queue.Queue`` (MONAI's ThreadDataLoader, a hand-written prefetch thread): the time the
producer thread spends in the loader's ``__next__`` is production, not the loop's wait
(the traceml mistake: 98% "stalled" where the loop waited 15%). The hooks see a batch the
producer just took (the core's ``ACTIVE.produced``) being put into a queue (itself, or inside a
tuple/list: ``q.put((i, batch))``); that queue is then a feed: the loader's stream is
marked ``producer`` and the queue's ``get`` is timed as the consumer's wait, in a stream
of its own (kind ``thread.queue``, named ``<loader> (queue)``) whose epochs follow the
producer's. Only ``queue.Queue`` and its subclasses are seen (``SimpleQueue``, a deque
or a list are not: the loader's stream is then what its own thread waited, noted).
"""

from __future__ import annotations

import threading
import time

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("thread.queue",)
PATCHES = {"queue": "patch_queue"}
SET_KEYS: tuple = ()
SERVED = ""
STAGES = ""
KIND = KINDS[0]

_FEEDS = None                   # a queue.Queue a producer thread puts batches into -> _Feed
_ALL_FEEDS: list = []           # every feed (kept past its queue: closed at exit)


def bound() -> None:
    global _FEEDS
    _FEEDS = H.IdMap()


def at_fork() -> None:
    """In a forked child: the parent's feeds are not this process's."""
    _FEEDS.clear()
    _ALL_FEEDS.clear()


def at_exit() -> None:
    """Before the final flush: a consumer pass that took every batch of an ended producer
    pass ended at its last batch (``_Feed.close``)."""
    try:
        for feed in list(_ALL_FEEDS):
            feed.close()
    except Exception:  # noqa: BLE001
        pass


class _Feed:
    """One queue fed by one loader stream's producer thread, and its consumer's clocks."""

    __slots__ = ("producer", "consumer", "pending", "t_ask", "ep", "ep_of")

    def __init__(self, producer) -> None:
        self.producer = producer
        self.consumer: object = None
        self.pending: dict = {}         # id(item put) -> (producer epoch number, rows)
        self.t_ask: float | None = None     # the consumer's first get of the batch to come
        self.ep = None     # the consumer's open Epoch
        self.ep_of = 0

    def get(self, orig, q, a, k):
        """``q.get``: the wait runs from the consumer's first try (a ``get(timeout=)``
        that raised ``Empty`` and was tried again waited all along) to the item."""
        t0 = H.perf()
        if self.t_ask is None:
            self.t_ask = t0
        item = orig(q, *a, **k)
        t1 = H.perf()
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
            cons = self.consumer = H.Stream(KIND, p.label, dict(p.settings))
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
        H.count_batch(cons.name, len(cons.epochs), len(ep.wait))
        H.flush(force=False)     # the core's periodic flush (a clock read when not due)

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
    H.active.produced = None
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


def patch_queue(queue_mod) -> None:
    """``queue.Queue.put``/``get`` (standard library, patched at install): a put costs one
    thread-local read, a get one dict lookup, unless the queue is a feed."""
    import functools
    Q = queue_mod.Queue
    orig_put, orig_get = Q.put, Q.get

    @functools.wraps(orig_put)
    def put(self, item, *a, **k):
        tag = getattr(H.active, "produced", None)
        if tag is not None:
            try:
                _fed(self, item, tag)
            except Exception:  # noqa: BLE001 - the put goes on as the job's own
                pass
        return orig_put(self, item, *a, **k)

    @functools.wraps(orig_get)
    def get(self, *a, **k):
        feed = _FEEDS.get(self) if len(_FEEDS) else None
        if feed is not None:
            return feed.get(orig_get, self, a, k)
        if not H.has_streams():             # no loader in this process: nothing can feed a queue
            return orig_get(self, *a, **k)
        # the loop's first get may start before the producer's first put made the queue a
        # feed: its wait (the pipeline's start-up) runs from here, or from its first try
        # where it polls (``get(timeout=)`` tried again after ``Empty``)
        t0 = H.perf()
        asking = getattr(H.active, "asking", None)
        if asking is not None and asking[0] == id(self):
            t0 = asking[1]
        try:
            item = orig_get(self, *a, **k)
        except BaseException:
            H.active.asking = (id(self), t0)
            raise
        H.active.asking = None
        try:
            feed = _FEEDS.get(self)
            if feed is not None:
                if feed.t_ask is None:
                    feed.t_ask = t0
                feed.took(item, H.perf())
        except Exception:  # noqa: BLE001
            pass
        return item

    Q.put, Q.get = put, get


