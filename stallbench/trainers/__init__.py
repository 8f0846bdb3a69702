"""Data-parallel trainers (``[trainers] ranks = N``): a rank launcher between the executor and
the probe. ``base`` holds the interface and the rank's identity, ``rank`` what runs inside a
rank process (process group, synchronous step, one measured run), ``processes`` the launcher
that starts ranks as local processes, ``job`` the variant's runs on all ranks and the job's
figures. The Ray executor's launcher lives with it (``executors.ray.ranks``)."""

from . import processes  # noqa: F401 - registration
from .base import LAUNCHERS, RankContext, RankLauncher, RankRun

__all__ = ["LAUNCHERS", "RankContext", "RankLauncher", "RankRun"]
