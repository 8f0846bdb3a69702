"""stallbench: find out why ML training waits for data, and prove it.

``stallbench.watch`` and ``stallbench.stage`` (``stallbench.profile.markers``) are loaded on
first use, so a training script's ``import stallbench`` imports nothing else.
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("watch", "stage"):
        from .profile import markers

        return getattr(markers, name)
    raise AttributeError(f"module 'stallbench' has no attribute {name!r}")
