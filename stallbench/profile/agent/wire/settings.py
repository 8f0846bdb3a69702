"""What the launcher sends into the job (``Settings``, the ``STALLBENCH_PROFILE`` variable) and
what a loader ran with as its door read it (``LoaderSettings``, back out in every part).

Why typed: the agent read the settings by key in 27 places and the launcher read a loader's
settings by key in 8; a key spelled twice is a key that can drift. The launcher builds a
``Settings`` and writes ``to_env``; the agent reads ``from_env`` once, at install.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional    # the agent may run Python 3.7

from .fields import ENV, VERSION, current, whole
from .live import LiveSettings
from .replay import ReplayPlan


class LoaderSettings(Mapping):
    """A loader's settings as its door read them (``num_workers``, ``batch_size``, Ray's
    ``prefetch_batches``, SPDL's ``num_threads``...): a read-only mapping, kept whole because
    a result records them as they are (``ProfileLoader.settings``); the few the launcher
    decides on are read through the properties below, never by key."""

    __slots__ = ("_values",)
    # the keys read through the properties below (``tests/profile/test_wire.py``: the
    # launcher side reads none of them by name)
    TYPED = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
             "prefetch_batches", "batch_size")

    def __init__(self, values: Optional[Mapping] = None) -> None:
        self._values: Dict[str, Any] = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"LoaderSettings({self._values!r})"

    @property
    def num_workers(self) -> int:
        """Worker processes (0: the loop's own process makes the batches)."""
        return int(self._values.get("num_workers") or 0)

    @property
    def pin_memory(self) -> bool:
        return bool(self._values.get("pin_memory"))

    @property
    def persistent_workers(self) -> bool:
        return bool(self._values.get("persistent_workers"))

    @property
    def prefetch_factor(self) -> Optional[int]:
        """torch's batches in flight per worker, where the loader had a number for it."""
        v = self._values.get("prefetch_factor")
        return v if isinstance(v, int) else None

    @property
    def prefetch_batches(self) -> int:
        """Ray's batches prefetched (1, Ray's default, where unset)."""
        return int(self._values.get("prefetch_batches") or 1)

    @property
    def batch_rows(self) -> int:
        """``batch_size``: the samples of a batch nothing else counts (1 where unset)."""
        return int(self._values.get("batch_size") or 1)

    def to_json(self) -> Dict[str, Any]:
        return dict(self._values)

    @classmethod
    def from_json(cls, d: Any) -> "LoaderSettings":
        return cls(d if isinstance(d, dict) else {})


@dataclass(frozen=True)
class Settings:
    """The job's settings, sent in: the run directory the parts go to (none: the agent stays
    out of the job), the ``--set`` overrides by group (``{"dataloader": {"num_workers": 4}}``),
    ``--max-batches``, and the replay plan of an ablation run.

    A Ray cluster's workers get them through the job's ``runtime_env`` (the agent's
    ``raycluster``): no run directory there (the launcher's path is not on their machine),
    ``collector`` instead, the name of the actor their parts and beats go to, and ``hook``,
    the job's own ``worker_process_setup_hook`` (a ``module.function`` string) that the
    agent's hook runs after installing itself.

    ``live``: ``--live`` (issue 60): the windows and the per-batch cap (``LiveSettings``);
    None in a plain profile, whose records are exactly what they were."""

    run_dir: str = ""
    overrides: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    max_batches: Optional[int] = None
    replay: Optional[ReplayPlan] = None
    collector: str = ""
    hook: str = ""
    live: Optional[LiveSettings] = None

    @property
    def active(self) -> bool:
        """Whether the agent measures: figures go to a run directory or to a collector."""
        return bool(self.run_dir or self.collector)

    def group(self, name: str) -> Dict[str, Any]:
        """The overrides of one ``--set`` group (``dataloader``), as ``{key: value}``."""
        return self.overrides.get(name) or {}

    def override(self, group: str, key: str) -> Any:
        """One override (``torch``, ``num_threads``), None where not set."""
        return self.group(group).get(key)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"v": VERSION, "run_dir": self.run_dir,
                               "overrides": self.overrides, "max_batches": self.max_batches}
        if self.replay is not None:
            out["replay"] = self.replay.to_json()
        for k in ("collector", "hook"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        if self.live is not None:
            out["live"] = self.live.to_json()
        return out

    @classmethod
    def from_json(cls, d: Any) -> "Settings":
        """Tolerant, as the parts are read; settings of another ``VERSION`` are none."""
        if not current(d):
            return cls()
        over = d.get("overrides")
        cap = d.get("max_batches")
        plan = d.get("replay")
        live = d.get("live")
        return cls(run_dir=str(d.get("run_dir") or ""),
                   overrides={str(g): dict(kv) for g, kv in over.items()
                              if isinstance(kv, dict)} if isinstance(over, dict) else {},
                   max_batches=None if cap is None else whole(cap) or None,
                   replay=ReplayPlan.from_json(plan) if isinstance(plan, dict) and plan
                   else None,
                   collector=str(d.get("collector") or ""), hook=str(d.get("hook") or ""),
                   live=LiveSettings.from_json(live) if isinstance(live, dict) else None)

    def to_env(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_env(cls, environ: Mapping) -> "Settings":
        """The settings in ``environ[ENV]``; none where it is unset or not JSON."""
        try:
            return cls.from_json(json.loads(environ.get(ENV, "{}")))
        except ValueError:
            return cls()
