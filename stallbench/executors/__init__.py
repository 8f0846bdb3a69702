"""Executors: how producers are scheduled. ``EXECUTORS.get(kind)`` is the lookup.

Importing this package registers every executor (each module registers itself in
``base.EXECUTORS``); a new executor is one new module here plus one import line below.
None of them imports Ray at module level, so this stays cheap without a Ray runtime.
"""

from . import flight, local, ray  # noqa: F401 - registration
from .base import EXECUTORS, Executor, ProducerKnob

__all__ = ["EXECUTORS", "Executor", "ProducerKnob"]
