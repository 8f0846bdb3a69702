"""Who wrote a part (``Header``): its own module because every record a trainer process
writes names its writer, the parts (``parts``) and the live records (``live``) alike, and
neither of those may import the other (one way across the wall, no import cycle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import num, whole


@dataclass(frozen=True)
class Header:
    """Who wrote a part: the process (host, pid, parent, image: an exec'd image or a fork has
    its own), its rank as its launcher set it, its clocks' origin, the libraries and torch
    threads it ran with, its CPU so far; ``node``: the Ray node it ran on
    (``<ip>/<node id, 8 hex>``: two nodes of one host differ), "" outside Ray."""

    host: str
    pid: int
    image: str
    ppid: int = 0
    launched: bool = False
    t0_wall: float = 0.0
    t0_perf: float = 0.0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    torch: str | None = None
    ray: str | None = None
    torch_threads: int | None = None
    cpu_s: float = 0.0
    node: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Header":
        tt = d.get("torch_threads")
        world = whole(d.get("world_size"), 1)
        return cls(host=str(d.get("host", "")), pid=whole(d.get("pid")),
                   image=str(d.get("image", "")), ppid=whole(d.get("ppid")),
                   launched=bool(d.get("launched", world > 1)),
                   t0_wall=num(d.get("t0_wall")), t0_perf=num(d.get("t0_perf")),
                   rank=whole(d.get("rank")), local_rank=whole(d.get("local_rank")),
                   world_size=world, node_rank=whole(d.get("node_rank")),
                   torch=d.get("torch") if isinstance(d.get("torch"), str) else None,
                   ray=d.get("ray") if isinstance(d.get("ray"), str) else None,
                   torch_threads=tt if isinstance(tt, int) and not isinstance(tt, bool)
                   and tt > 0 else None,
                   cpu_s=num(d.get("cpu_s")), node=str(d.get("node") or ""))

    @property
    def image_key(self) -> tuple[str, int, str]:
        """(host, pid, image): an exec'd image keeps its pid and has a new image."""
        return (self.host, self.pid, self.image)
