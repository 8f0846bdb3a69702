"""``--live``'s terminal view (issue 60): a progress line for the job and one updating line
per rank, drawn by ``tqdm`` (what training scripts already show) on stderr, only when stderr
is a terminal; nothing at all otherwise (a log, a pipe, CI), so a redirected profile's
output is exactly a plain profile's.

Bounded: at most ``MAX_RANKS`` rank lines (a line says how many more), redrawn from the
board's snapshot at each poll; the figures are the endpoint's (``live.Board``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

MAX_RANKS = 16


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.0%}"


def headline(got: dict) -> str | None:
    """The loader with the most batches over its ranks (the result's headline rule)."""
    totals: dict[str, int] = {}
    for s in got.values():
        totals[s.loader] = totals.get(s.loader, 0) + s.batches
    return max(totals, key=lambda n: totals[n], default=None)


def rank_line(s: Any) -> str:
    """``rank 0  Items#0  steps 1,234  waited 12.3 s (8%)  last 60 s: 5% waiting``."""
    total = s.wait_s + s.step_s
    share = s.wait_s / total if total > 0 else math.nan
    mark = "  <- waits most (straggler candidate)" if s.candidate else ""
    node = f" [{s.node}]" if s.node else ""
    return (f"rank {s.rank}{node}  {s.loader}  steps {s.batches:,}  waited {s.wait_s:,.1f} s "
            f"({_pct(share)})  last 60 s: {_pct(s.steady_wait_share)} waiting{mark}")


class View:
    """The bars; ``show`` redraws them from a board, ``close`` removes them."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bars: list[Any] = []
        self.top: Any = None

    @classmethod
    def for_terminal(cls) -> "View | None":
        """A view where stderr is a terminal, else None (quiet)."""
        try:
            return cls() if sys.stderr.isatty() else None
        except (AttributeError, ValueError):
            return None

    def _bar(self, position: int) -> Any:
        from tqdm import tqdm
        return tqdm(total=None, position=position, leave=False, file=self.stream,
                    bar_format="{desc}", dynamic_ncols=True)

    def show(self, board: Any) -> None:
        got, running = board.snapshot()
        name = headline(got)
        ranks = sorted((s for s in got.values() if s.loader == name),
                       key=lambda s: (int(s.rank) if s.rank.isdigit() else 0, s.node))
        lines = [rank_line(s) for s in ranks[:MAX_RANKS]]
        if len(ranks) > MAX_RANKS:
            lines.append(f"... {len(ranks) - MAX_RANKS} more ranks (the endpoint has them all)")
        steps = sum(s.batches for s in ranks)
        wait = sum(s.wait_s for s in ranks)
        state = "running" if running else "ended"
        top = (f"stallbench live: {name or 'no loader yet'}  {steps:,} steps over "
               f"{len(ranks)} rank(s), waited {wait:,.1f} s  [{state}]")
        while len(self.bars) < len(lines) + 1:
            self.bars.append(self._bar(len(self.bars)))
        for bar, text in zip(self.bars, [top, *lines]):
            bar.set_description_str(text, refresh=True)

    def close(self) -> None:
        for bar in reversed(self.bars):
            bar.close()
        self.bars = []
