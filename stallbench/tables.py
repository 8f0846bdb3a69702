"""Plain-text tables for the terminal: what a person reads after a run."""

from __future__ import annotations

import math
from typing import Sequence

from .results import Result, Summary


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def num(x: float | None, fmt: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


def spread(s: Summary, fmt: str = ",.0f") -> str:
    if len(s.values) <= 1:
        return num(s.median, fmt)
    return f"{num(s.median, fmt)} ({num(s.min, fmt)}..{num(s.max, fmt)})"


def pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.0%}"


def run_table(result: Result) -> str:
    rows = []
    for v in result.variants:
        rows.append([v.name, spread(v.throughput_samples_s), num(v.epoch_s.median, ".2f"),
                     num(v.stall_s.median, ".2f"), pct(v.stall_share.median),
                     num(v.time_to_first_batch_s.median, ".2f"), num(v.peak_rss_mb.median, ",.0f")])
    head = ["variant", "samples/s median (min..max)", "epoch s", "stall s", "stall %",
            "1st batch s", "peak RSS MB"]
    return table(head, rows)


def attribution_table(result: Result) -> str | None:
    rows = []
    for v in result.variants:
        a = v.analysis
        if "compute_s" not in a:
            continue

        def part(key: str) -> str:
            lo, hi = a["intervals"].get(key, [None, None])
            if lo is None or hi is None or abs(hi - lo) < 1e-9:
                return num(a[key], ".2f")
            return f"{num(a[key], '.2f')} [{num(lo, '.2f')},{num(hi, '.2f')}]"

        rows.append([v.name, part("compute_s"), part("fetch_stall_s"), part("preprocess_stall_s"),
                     part("transfer_stall_s"), part("overhead_s"), pct(a["stall_share"]),
                     a["bound_by"] + ("?" if a.get("conclusive") is False else "")])
    if not rows:
        return None
    head = ["variant", "compute s", "fetch stall s", "preprocess stall s", "transfer stall s",
            "loader overhead s", "stall %", "bound by"]
    return table(head, rows, right={1, 2, 3, 4, 5, 6})


def verdicts(result: Result) -> list[str]:
    return [f"{v.name}: {v.analysis['verdict']}" for v in result.variants if v.analysis.get("verdict")]


def emulated_note(result: Result) -> str | None:
    keys = sorted({k for v in result.variants for k in v.emulated})
    if not keys:
        return None
    return "EMULATED figures in this run (by construction, not real hardware): " + ", ".join(keys)
