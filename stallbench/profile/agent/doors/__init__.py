"""The loaders ``stallbench profile`` sees, one module per loader kind (a *door*), and the one
table the launcher side reads about them.

Why one module per kind: each door patches a different library (torch's DataLoader, torchdata,
Ray Data, a ``queue.Queue`` a loader thread fills, ``stallbench.watch``) and answers different
questions (which ``--set`` keys reach its loaders, whether compute-only can serve its batches
from memory, whether its stages are recorded). Spread over the hooks, the launcher, the
ablation and the tune, a kind was spelled in five files; here a new kind is one new module in
this folder and its tests, and nothing else names it (``tests/profile/test_doors.py`` checks).

A door module is loaded two ways, so it imports only the standard library and ``_base`` at
its top:

- inside the user's processes, as a module of the agent's package (``install.load_doors``):
  its ``patch_*`` functions get the job's module once the job imported it, and the core's
  interface (``core.Core``: ``Stream``, ``begin_pass``, ``Passes``, ...) as its ``H``, set
  by ``_base.bind`` with its version check (``WRITTEN_FOR``), the same for every door;
- on the launcher side, as ``stallbench.profile.agent.doors.<name>``, for its declarations
  only (``table``): nothing of it runs there.

A door without knobs is one module here and its test; its ``H`` is all it reaches of the
agent (``tests/profile/test_doors.py`` checks both).

What a door module declares (module-level constants; ``Door`` below holds them):

``KINDS``          the stream kinds it makes (a result's ``loaders[].kind``)
``PATCHES``        ``{module the job imports: name of this module's function}``; the function
                   runs right after the job's own import of that module executed
``SET_KEYS``       the ``--set`` groups that reach its loaders (``dataloader``, ``ray``, ``torch``)
``SERVED``         "" when a compute-only run can serve its batches from memory, else why not
``STAGES``         "" when the stages behind its batches are recorded, else why not
``PASS_PER_CALL``  True when the job makes a new iterable per epoch (Ray's ``iter_batches(...)``
                   each epoch): one loop's epochs are then several streams, joined by the tune
``WRITTEN_FOR``    ``(library, version, what is patched)``: a job with another version gets one
                   line on stderr saying what may have changed (``VERSION_FROM``: where the
                   job's version is read, when not the ``library`` distribution's metadata)
``LISTS_ARE_SAMPLES`` True when a batch that is a list holds the samples (SPDL's ``aggregate``):
                   counted by its length, never as columns (read in the job, ``rows.rows``)
``OWN_STAGES``     the stage names its hooks record themselves (``collate_fn``, Ray's
                   ``ray production_wait``): figures of the door, never a ``stallbench.stage``
                   mark the job made, so never ablated as one
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

HERE = os.path.dirname(os.path.abspath(__file__))


@lru_cache(maxsize=None)
def names(folder: str = HERE) -> tuple[str, ...]:
    """The door modules of a folder (every ``*.py`` but ``__init__`` and ``_base``), in a
    fixed order, listed once: the agent loads them from this list, the table imports them
    from it."""
    return tuple(sorted(f[:-3] for f in os.listdir(folder)
                        if f.endswith(".py") and not f.startswith("_")))


@dataclass(frozen=True)
class Door:
    """One loader kind as its module declares it (see the module docstring)."""

    module: str
    kinds: tuple[str, ...]
    patches: tuple[tuple[str, str], ...]
    set_keys: tuple[str, ...]
    served: str
    stages: str
    pass_per_call: bool
    written_for: tuple[str, str, str] | None
    own_stages: tuple[str, ...] = ()

    def reaches(self, group: str) -> bool:
        """Whether ``--set GROUP.key=...`` reaches this door's loaders."""
        return group in self.set_keys


@lru_cache(maxsize=1)
def table() -> dict[str, Door]:
    """Kind -> its door, for every door module here."""
    out: dict[str, Door] = {}
    for name in names():
        mod = importlib.import_module(f"{__name__}.{name}")
        door = Door(module=name, kinds=tuple(mod.KINDS),
                    patches=tuple(dict(getattr(mod, "PATCHES", {})).items()),
                    set_keys=tuple(getattr(mod, "SET_KEYS", ())),
                    served=str(getattr(mod, "SERVED", "")),
                    stages=str(getattr(mod, "STAGES", "")),
                    pass_per_call=bool(getattr(mod, "PASS_PER_CALL", False)),
                    written_for=getattr(mod, "WRITTEN_FOR", None),
                    own_stages=tuple(getattr(mod, "OWN_STAGES", ())))
        for kind in door.kinds:
            if kind in out:
                raise ValueError(f"loader kind {kind!r} declared by doors {out[kind].module} "
                                 f"and {name}")
            out[kind] = door
    return out


UNKNOWN = Door(module="", kinds=(), patches=(), set_keys=(),
               served="a loader of a kind this stallbench does not know (a newer part file)",
               stages="a loader of a kind this stallbench does not know", pass_per_call=False,
               written_for=None)


def of(kind: str) -> Door:
    """The door of a stream's kind; ``UNKNOWN`` (nothing reaches it, nothing served) for a
    kind no door here declares."""
    return table().get(str(kind), UNKNOWN)


def written_for() -> dict[str, str]:
    """Library -> the version its doors were written for (a result's ``hooks_written_for``)."""
    return {d.written_for[0]: d.written_for[1] for d in table().values() if d.written_for}


def own_stages() -> frozenset[str]:
    """Every stage name a door records itself (``OWN_STAGES``): the rest a job's stages
    carry are its ``stallbench.stage`` marks."""
    return frozenset(n for d in table().values() for n in d.own_stages)
