"""Door: Ray Data's iterators (``iter_batches``, ``iter_torch_batches``, ``Dataset.iter_batches``).

The loop blocked on the iterator is the wait, one pass per call; Ray Train's
``get_dataset_shard(...)`` gives a ``DataIterator`` too, so a Ray Train worker's loop is seen
here, per rank. A job usually makes a new iterable each epoch (``for epoch ...: for b in
it.iter_torch_batches(...)``): each call is a stream of its own (``PASS_PER_CALL``; the tune
joins a loop's calls with the same settings). ``--set ray.prefetch_batches`` rewrites the
call's argument. Ray's operators run in its tasks, outside torch's fetchers: the stages are
not recorded (unless ``stallbench.stage`` marks them in the loop's process).
"""

from __future__ import annotations

import sys
import threading

KINDS = ("ray.iter_batches", "ray.iter_torch_batches")
PATCHES = {"ray.data.iterator": "patch_ray", "ray.data.dataset": "patch_ray_dataset"}
SET_KEYS = ("ray",)
SERVED = ""
STAGES = ("a Ray Data iterator: its stages run in Ray's tasks, outside torch's fetchers, so a "
          "recording run would record nothing; none is made (the split from Ray's own "
          "iterator stats is not built yet)")
PASS_PER_CALL = True
WRITTEN_FOR = ("ray", "2.60", "DataIterator.iter_batches/iter_torch_batches")

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


