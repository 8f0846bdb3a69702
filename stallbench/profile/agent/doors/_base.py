"""What every door gets the same way: its binding to the core and its version check.

Why here and not in each door: every door repeated ``H = None; def bind(core): global H``
and called the version check in its first patch. The agent's loader (``install.load_doors``)
now does both for every door module:

- ``bind(door, core)`` sets the door's ``H`` to the core's interface (``core.Core``) and runs
  the door's ``bound()`` where it has one (tables of its own, made once the core is there);
- ``routes(door)`` is what the post-import finder calls for each of the door's ``PATCHES``;
  the first carries the version check: one line on the job's stderr where the job's library
  is not the version the door's ``WRITTEN_FOR`` names, said when the job imported it.
  The version is the distribution's (``WRITTEN_FOR[0]``), or what ``VERSION_FROM`` names:
  distributions tried in order, or ``"<module>.__version__"``.

Standard library only: the launcher imports the doors for their declarations, and this
module with them; nothing of it runs there.
"""

from __future__ import annotations

import sys
from typing import Any


class _Unbound:
    """A door's ``H`` until the agent's loader binds it: a door's hook never runs unbound."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"H.{name}: a door runs only once the agent's loader bound it")


H: Any = _Unbound()


def bind(door, core) -> None:
    """``door``'s ``H`` is the core's interface from now on; then its ``bound()``, if any."""
    door.H = core
    bound = getattr(door, "bound", None)
    if bound is not None:
        bound()


def dist_version(dist: str) -> str:
    """An installed distribution's version ("?" when its metadata cannot be read)."""
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001 - no metadata: nothing to compare
        return "?"


def version_of(door) -> str:
    """The job's version of the library the door was written for ("?": not read)."""
    lib = door.WRITTEN_FOR[0]
    for source in getattr(door, "VERSION_FROM", (lib,)):
        if source.endswith(".__version__"):
            v = getattr(sys.modules.get(source[:-len(".__version__")]), "__version__", "?")
        else:
            v = dist_version(source)
        if v != "?":
            return v
    return "?"


def version_check(door) -> None:
    """One line on stderr where the job's library is not the version the door was written
    for (``WRITTEN_FOR``: ``(library, version, what it patches)``)."""
    lib, want, what = door.WRITTEN_FOR
    version = version_of(door)
    if version != "?" and not version.startswith(want + ".") and version != want:
        door.H.say(f"hooks written for {lib} {want}, this job has {lib} {version}: they patch "
                   f"{what}, which this version may have changed")


def routes(door) -> dict:
    """``{module the job imports: the function that patches it}`` for one door; the first
    of its ``PATCHES`` checks the library's version before it patches (see above)."""
    out = {}
    for i, (target, name) in enumerate(dict(getattr(door, "PATCHES", {})).items()):
        patch = getattr(door, name)
        if i == 0 and getattr(door, "WRITTEN_FOR", None):
            patch = _checked(door, patch)
        out[target] = patch
    return out


def _checked(door, patch):
    def checked(module) -> None:
        version_check(door)
        patch(module)
    return checked
