"""Door: torchdata's ``StatefulDataLoader`` (torchtitan's loader).

Its ``__init__`` and ``__iter__`` do not call ``DataLoader``'s, so the DataLoader door's hooks
there never run; its iterators are ``_BaseDataLoaderIter`` subclasses whose ``__next__`` calls
torch's (hooked by the DataLoader door, which finds the pass this door tags). Hooked here:
``__iter__``, one stream per loader, one pass per ``iter()`` (also after ``state_dict()`` /
``load_state_dict()``). Its workers run torchdata's own worker loop: their stage times are not
attributed, and ``--set dataloader.*`` does not reach it.
"""

from __future__ import annotations

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("torchdata.StatefulDataLoader",)
PATCHES = {"torchdata.stateful_dataloader.stateful_dataloader": "patch_stateful"}
SET_KEYS: tuple = ()
SERVED = ""
STAGES = ""     # recorded where torch's fetchers run (0 workers); its workers' are not
WRITTEN_FOR = ("torchdata", "0.11", "StatefulDataLoader.__iter__")


def patch_stateful(mod) -> None:
    def make(loader):
        return H.loader_stream(loader, [], KINDS[0])
    H.hook_passes(mod.StatefulDataLoader, make, "StatefulDataLoader")
