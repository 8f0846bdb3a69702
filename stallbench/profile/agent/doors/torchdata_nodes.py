"""Door: torchdata.nodes' ``Loader`` (no DataLoader at all).

``Loader.__iter__`` starts a pass (a nodes ``iter()`` starts its threads: that is waited),
``LoaderIterator.__next__`` is the loop's wait; a loader is named by its root node's class
(``Batcher#0``). The nodes' own threads (``ParallelMapper``, ``Prefetcher``) are not timed as
stages, and no ``--set`` key reaches them.
"""

from __future__ import annotations

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("torchdata.nodes.Loader",)
PATCHES = {"torchdata.nodes.loader": "patch_nodes"}
SET_KEYS: tuple = ()
SERVED = ""
STAGES = ""     # the nodes' threads are not timed: only stallbench.stage marks are recorded
WRITTEN_FOR = ("torchdata", "0.11", "nodes.Loader.__iter__ and LoaderIterator.__next__")


def patch_nodes(mod) -> None:
    LoaderIterator = mod.LoaderIterator
    orig_next = LoaderIterator.__next__

    def make(loader):
        try:
            root = H.own(loader, "root")
            return H.Stream(KINDS[0], str(type(root).__name__), {})
        except Exception:  # noqa: BLE001
            H.unmeasured(KINDS[0], "its root could not be read")
            return None

    LoaderIterator.__next__ = H.tagged_next(orig_next)
    H.hook_passes(mod.Loader, make, KINDS[0])
