"""``stallbench.watch(iterable)`` and ``stallbench.stage(name)``: the two lines a user adds
where the automatic hooks cannot see (a custom loader, ``torchdata.nodes``, a generator; a
stage inside the dataset's code).

Under ``stallbench profile`` they hand over to the agent (its entry module, which the
bootstrap loaded as ``_stallbench_profile_agent.install``: ``active``, ``watch``, ``stage``),
in the trainer, in DataLoader workers and in Ray tasks started under it alike. Without it
they cost next to nothing and change nothing: ``watch`` returns the iterable itself and
``stage`` times nothing. This module imports only
the standard library, so ``import stallbench`` in a training script stays cheap.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")
AGENT = "_stallbench_profile_agent.install"


def _hooks() -> Any:
    a = sys.modules.get(AGENT)
    return a if a is not None and a.active() else None


def watch(iterable: Iterable[T], name: str | None = None) -> Iterable[T]:
    """The same items, timed as a loader stream (wait per item, step between items) when the
    job runs under ``stallbench profile``; the iterable itself otherwise."""
    h = _hooks()
    return iterable if h is None else h.watch(iterable, name)


class _NoStage:
    """``stage`` outside ``stallbench profile``: a no-op context manager and decorator."""

    def __enter__(self) -> "_NoStage":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        return fn


_NO_STAGE = _NoStage()


def stage(name: str) -> Any:
    """Time a stage of the user's data code (wall and the calling thread's CPU), as a context
    manager (``with stallbench.stage("decode"): ...``) or a decorator
    (``@stallbench.stage("decode")``). Decorating decides once, at definition: a function
    decorated before the hooks were loaded stays untimed, which cannot happen in a job that
    ``stallbench profile`` started (the hooks load before the job's first line)."""
    h = _hooks()
    return _NO_STAGE if h is None else h.stage(name)
