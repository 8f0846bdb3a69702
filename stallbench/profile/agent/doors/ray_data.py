"""Door: Ray Data's iterators (``iter_batches``, ``iter_torch_batches``, ``Dataset.iter_batches``).

The loop blocked on the iterator is the wait, one pass per call. A job usually makes a new
iterable each epoch (``for epoch ...: for b in ds.iter_torch_batches(...)``): each call on a
``Dataset`` goes through a new ``DataIterator``, so it is a stream of its own
(``PASS_PER_CALL``; the tune joins a loop's calls with the same settings).
``--set ray.prefetch_batches`` rewrites the call's argument. Ray's operators run in its
tasks, outside torch's fetchers: the stages are not recorded (unless ``stallbench.stage``
marks them in the loop's process).

The stages come from Ray's own iterator stats instead (issue 39): Ray Data times, for each
batch the loop waited on, how much of that blocked window each stage of its iterator was
active (``BatchIterator._attribute_blocked_time``: production wait, data transfer, batching,
format, collate, finalize; ``DatasetStats.iter_blocked_*_s``). The door reads those timers
around each batch's attribution, on the loop's thread, and adds the increments to the
stream's stages as ``ray <stage>`` (where ``ray``): Ray's figures, parts of the loop's wait,
not the stages' whole time. Ray counts only the yielded batch's own spans, so the parts may
sum to less than the wait; they never double count.

Ray Train: ``get_dataset_shard(...)`` gives each worker a ``DataIterator`` (a
``StreamSplitDataIterator``), one object for the whole run, so a worker's per-epoch calls
are one stream's epochs, and its rank is the worker's world rank (Ray Train's torch backend
sets RANK and WORLD_SIZE in each worker before the training function runs). Ray ends each
worker with ``ray.kill`` (no ``atexit``) right after its ``shutdown`` call: the worker's
last epoch, whose end-of-epoch write the flush budget may have deferred, is written there
(``patch_ray_train_worker``).
"""

from __future__ import annotations

import threading

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("ray.iter_batches", "ray.iter_torch_batches")
PATCHES = {"ray.data.iterator": "patch_ray", "ray.data.dataset": "patch_ray_dataset",
           "ray.data._internal.block_batching.iter_batches": "patch_ray_blocked",
           "ray.train.v2._internal.execution.worker_group.worker": "patch_ray_train_worker"}
SET_KEYS = ("ray",)
SERVED = ""
STAGES = ("a Ray Data iterator: its stages run in Ray's tasks, outside torch's fetchers, so a "
          "recording run would record nothing; none is made: its wait is split by Ray's own "
          "iterator stats instead (the `ray <stage>` rows)")
# Ray's stages of the blocked time (ray.data._internal.stats.IterationStage) and their timers
BLOCKED = (("production_wait", "iter_blocked_production_wait_s"),
           ("data_transfer", "iter_blocked_data_transfer_s"),
           ("batching", "iter_blocked_batching_s"), ("format", "iter_blocked_format_s"),
           ("collate", "iter_blocked_collate_s"), ("finalize", "iter_blocked_finalize_s"))
OWN_STAGES = tuple(f"ray {label}" for label, _ in BLOCKED)
PASS_PER_CALL = True
WRITTEN_FOR = ("ray", "2.60", "DataIterator.iter_batches/iter_torch_batches and Ray Train's "
               "RayTrainWorker.shutdown")
VERSION_FROM = ("ray.__version__",)

_RAY_INSIDE = threading.local()     # set while Ray's own call runs: a nested one is not counted


def patch_ray(it_mod) -> None:
    """Ray Data's iterators: ``DataIterator.iter_batches`` / ``iter_torch_batches`` (what
    ``Dataset.iter_torch_batches`` and Ray Train's ``get_dataset_shard`` give) and
    ``Dataset.iter_batches`` (which goes around ``DataIterator.iter_batches``). One stream per
    iterator or dataset object, one epoch per call; a call made inside another's iteration
    is not counted twice."""
    _patch_ray_class(it_mod.DataIterator, ("iter_batches", "iter_torch_batches"))


def patch_ray_dataset(ds_mod) -> None:
    _patch_ray_class(ds_mod.Dataset, ("iter_batches",))


def _patch_ray_class(cls, methods) -> None:
    import functools
    prefetch = H.settings.override("ray", "prefetch_batches")
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
                    st = H.loaders.get(self)
                    if st is None:
                        st = H.Stream(f"ray.{meth}", type(self).__name__,
                                      {"batch_size": k.get("batch_size", 256),
                                       "prefetch_batches": k.get("prefetch_batches", 1)})
                        H.loaders.set(self, st)
                    if st.unmeasured:
                        return inner
                    # what Ray returns is re-iterable (made once, looped every epoch): so
                    # is what the hook returns, one measured epoch per pass
                    return H.Passes(st, inner, inside)
                except Exception:  # noqa: BLE001 - Ray's own iterable, unmeasured
                    H.unmeasured(f"ray.{meth}", "its batches could not be timed")
                    return inner
            return wrapped
        setattr(cls, meth, make(orig, meth))


def _own_method(mod, cls_name: str, meth: str, lost: str):
    """(class, its own ``meth``) of ``mod``, or (class, None) with one stderr line saying
    what is lost where this Ray version moved it."""
    cls = getattr(mod, cls_name, None)
    orig = getattr(cls, "__dict__", {}).get(meth)
    if orig is None:
        H.say(f"Ray's {cls_name}.{meth} was not found: {lost}")
    return cls, orig


def patch_ray_blocked(mod) -> None:
    """Ray's split of the loop's blocked time, batch by batch, into the stream's stages.

    Wraps ``BatchIterator._attribute_blocked_time`` (Ray calls it on the loop's thread right
    after each ``next()`` it timed, before the batch is yielded): the ``iter_blocked_*``
    timers are read before and after, and each increment is one call of stage
    ``ray <stage>``. Only while a hooked stream is fetching on this thread (a Ray iteration
    the hooks do not measure adds nothing). Ray's own result is returned untouched; a read
    that fails is skipped, never raised."""
    cls, orig = _own_method(mod, "BatchIterator", "_attribute_blocked_time",
                            "a Ray loop's wait is not split by Ray's stages")
    if orig is None:
        return
    import functools

    @functools.wraps(orig)
    def attributed(self, *a, **k):
        before = _blocked(self)
        try:
            return orig(self, *a, **k)
        finally:
            if before is not None:
                _add(before, _blocked(self))
    cls._attribute_blocked_time = attributed


def _add(before: tuple[float, ...], after: tuple[float, ...] | None) -> None:
    """Each timer's increment as one call of its ``ray <stage>``; never raises."""
    if after is None:
        return
    try:
        for (label, _), b, x in zip(BLOCKED, before, after):
            if x > b:
                H.stage_add(f"ray {label}", x - b, None, where="ray")
    except Exception:  # noqa: BLE001 - a lost split must never fail the job's loop
        pass


def _blocked(batch_iter) -> tuple[float, ...] | None:
    """The ``iter_blocked_*`` timers of a ``BatchIterator``'s stats, or None where there is
    nothing to read (no stats, no hooked stream fetching on this thread, another Ray)."""
    try:
        if getattr(H.active, "stream", None) is None:
            return None
        stats = getattr(batch_iter, "_stats", None)
        if stats is None:
            return None
        return tuple(float(getattr(stats, attr).get()) for _, attr in BLOCKED)
    except Exception:  # noqa: BLE001 - Ray's stats changed shape: not split, never raised
        return None


def patch_ray_train_worker(worker_mod) -> None:
    """Ray Train (v2, the default since 2.51) ends each worker actor with ``ray.kill`` once
    its ``RayTrainWorker.shutdown`` returned (``worker_group.state._shutdown_workers``, 5 s
    patience): the process gets no ``atexit``. An epoch's end writes its part only within the
    flush budget (``streams.Stream.end_epoch``): a mid-epoch write less than about a second
    before the loop's last ``StopIteration`` defers it, and the kill then lost the worker's
    last batches (a 2-worker job read 14 of each rank's 16). So ``shutdown`` writes this
    process's figures as its exit would, after Ray's own shutdown callbacks ran. Nothing is
    written into Ray's objects; a failed write is said by ``flush`` and never raised."""
    cls, orig = _own_method(worker_mod, "RayTrainWorker", "shutdown",
                            "a Ray Train worker's last epoch may be cut short in its figures")
    if orig is None:
        return
    import functools

    @functools.wraps(orig)
    def shutdown(self, *a, **k):
        try:
            return orig(self, *a, **k)
        finally:
            if H.own_process():
                H.flush(force=True)      # never raises (``writer.flush``)
    cls.shutdown = shutdown
