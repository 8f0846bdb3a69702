"""Door: Ray Data's iterators (``iter_batches``, ``iter_torch_batches``, ``Dataset.iter_batches``).

The loop blocked on the iterator is the wait, one pass per call. A job usually makes a new
iterable each epoch (``for epoch ...: for b in ds.iter_torch_batches(...)``): each call on a
``Dataset`` goes through a new ``DataIterator``, so it is a stream of its own
(``PASS_PER_CALL``; the tune joins a loop's calls with the same settings).
``--set ray.prefetch_batches`` rewrites the call's argument. Ray's operators run in its
tasks, outside torch's fetchers: the stages are not recorded (unless ``stallbench.stage``
marks them in the loop's process).

Ray Train: ``get_dataset_shard(...)`` gives each worker a ``DataIterator`` (a
``StreamSplitDataIterator``), one object for the whole run, so a worker's per-epoch calls
are one stream's epochs, and its rank is the worker's world rank (Ray Train's torch backend
sets RANK and WORLD_SIZE in each worker before the training function runs). Ray ends each
worker with ``ray.kill`` (no ``atexit``) right after its ``shutdown`` call: the worker's
last epoch, whose end-of-epoch write the flush budget may have deferred, is written there
(``patch_ray_train_worker``).
"""

from __future__ import annotations

import sys
import threading

KINDS = ("ray.iter_batches", "ray.iter_torch_batches")
PATCHES = {"ray.data.iterator": "patch_ray", "ray.data.dataset": "patch_ray_dataset",
           "ray.train.v2._internal.execution.worker_group.worker": "patch_ray_train_worker"}
SET_KEYS = ("ray",)
SERVED = ""
STAGES = ("a Ray Data iterator: its stages run in Ray's tasks, outside torch's fetchers, so a "
          "recording run would record nothing; none is made (the split from Ray's own "
          "iterator stats is not built yet)")
PASS_PER_CALL = True
WRITTEN_FOR = ("ray", "2.60", "DataIterator.iter_batches/iter_torch_batches and Ray Train's "
               "RayTrainWorker.shutdown")

H = None                        # the hooks' core, once bound (``bind``)
_RAY_INSIDE = threading.local()     # set while Ray's own call runs: a nested one is not counted


def bind(core) -> None:
    global H
    H = core


def patch_ray(it_mod) -> None:
    """Ray Data's iterators: ``DataIterator.iter_batches`` / ``iter_torch_batches`` (what
    ``Dataset.iter_torch_batches`` and Ray Train's ``get_dataset_shard`` give) and
    ``Dataset.iter_batches`` (which goes around ``DataIterator.iter_batches``). One stream per
    iterator or dataset object, one epoch per call; a call made inside another's iteration
    is not counted twice."""
    ray = sys.modules.get("ray")
    H.version_check(WRITTEN_FOR, getattr(ray, "__version__", "?"))
    _patch_ray_class(it_mod.DataIterator, ("iter_batches", "iter_torch_batches"))


def patch_ray_dataset(ds_mod) -> None:
    _patch_ray_class(ds_mod.Dataset, ("iter_batches",))


def _patch_ray_class(cls, methods) -> None:
    import functools
    prefetch = H.SETTINGS.get("overrides", {}).get("ray", {}).get("prefetch_batches")
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
                    st = H.LOADERS.get(self)
                    if st is None:
                        st = H.Stream(f"ray.{meth}", type(self).__name__,
                                      {"batch_size": k.get("batch_size", 256),
                                       "prefetch_batches": k.get("prefetch_batches", 1)})
                        H.LOADERS.set(self, st)
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


def patch_ray_train_worker(worker_mod) -> None:
    """Ray Train (v2, the default since 2.51) ends each worker actor with ``ray.kill`` once
    its ``RayTrainWorker.shutdown`` returned (``worker_group.state._shutdown_workers``, 5 s
    patience): the process gets no ``atexit``. An epoch's end writes its part only within the
    flush budget (``hooks.Stream.end_epoch``): a mid-epoch write less than about a second
    before the loop's last ``StopIteration`` defers it, and the kill then lost the worker's
    last batches (a 2-worker job read 14 of each rank's 16). So ``shutdown`` writes this
    process's figures as its exit would, after Ray's own shutdown callbacks ran. Nothing is
    written into Ray's objects; a failed write is said by ``flush`` and never raised."""
    cls = getattr(worker_mod, "RayTrainWorker", None)
    orig = getattr(cls, "__dict__", {}).get("shutdown")
    if orig is None:
        H.say("Ray Train's RayTrainWorker.shutdown was not found: a Ray Train worker's last "
              "epoch may be cut short in its figures")
        return
    import functools

    @functools.wraps(orig)
    def shutdown(self, *a, **k):
        try:
            return orig(self, *a, **k)
        finally:
            if H.own_process():
                H.flush(force=True)      # never raises (``hooks.flush``)
    cls.shutdown = shutdown
