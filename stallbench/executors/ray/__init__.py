"""Disaggregated execution on Ray Data: producers run as Ray tasks (or actors) on a Ray cluster.

Split by concern, each module with its own docstring:

- ``driver``: ``RayExecutor``, the trainer's side (lifecycle, both run modes, figures);
- ``worker``: what runs in Ray workers in stallbench mode (producer UDFs, per-worker plan);
- ``codec``: the wire format between them (a ``ShardOutput`` <-> rows of an Arrow block);
- ``stock``: stock mode's UDFs and collate (what users write first, as a baseline variant);
- ``stats``: Ray Data's own figures of a run;
- ``cluster``: the Ray runtime (which cluster, how it is reached, and that it ends);
- ``ranks``: data-parallel trainer ranks fed by one pipeline through ``streaming_split``.

Ray itself is imported only where it is used, so this package imports without Ray.
"""

from . import ranks  # noqa: F401 - registers the "ray_actors" rank launcher
from .driver import RayExecutor

__all__ = ["RayExecutor"]
