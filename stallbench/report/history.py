"""The report's history section: a scenario's throughput over its results, oldest to newest,
one line per variant, with the change points ``stallbench history`` finds (same function,
same defaults) marked where the new level starts. Shown when a scenario has enough results
to split (two segments of ``history.DEFAULT_MIN_SIZE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..analysis import figures
from ..gate import history
from ..results import Result
from . import plots


def plot(series: Sequence[history.Series]) -> str | None:
    """Throughput per result (median of its repeats) per variant; dashed verticals at change
    points, labelled with the commit of the first result of the new level."""
    if not series:
        return None
    from matplotlib.ticker import FuncFormatter

    with plots.style():
        fig = plots.figure(3.2)
        ax = fig.add_subplot()
        for i, s in enumerate(series):
            color = plots.RUN_COLORS[i % len(plots.RUN_COLORS)]
            xs = list(range(1, len(s.values) + 1))
            ax.plot(xs, s.values, marker="o", ms=3.5, lw=1.2, color=color, label=s.variant)
            for cp in s.points:
                x = cp.index + 0.5
                ax.axvline(x, color=color, ls="--", lw=1.0, alpha=0.8)
                commit = (s.commits[cp.index] or "?")[:8]
                ax.annotate(f"{commit} {figures.signed_percent(cp.change, 0)}", (x, 1.0),
                            xycoords=("data", "axes fraction"), rotation=90, va="top",
                            ha="right", fontsize=7.5, color=color)
        ax.yaxis.set_major_formatter(FuncFormatter(plots.format_rate))
        ax.set_xlabel("result, oldest → newest")
        ax.set_ylabel("samples / s (median)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the series, not over them
        return plots.png(fig)


def view(loaded: Sequence[tuple[Path, Result]], draw: Callable[..., Any]) -> dict[str, Any] | None:
    """The section's data, or None when there are too few results of the scenario. ``draw`` is
    the renderer's figure wrapper (odd data never takes the report down)."""
    results = [r for _, r in loaded]
    if len(results) < 2 * history.DEFAULT_MIN_SIZE:
        return None
    series = history.analyze(history.series_of(results, ("throughput",)))
    rows = []
    for s in series:
        for cp in s.points:
            rows.append({"variant": s.variant, "index": cp.index + 1,
                         "created": s.created[cp.index],
                         "commit": (s.commits[cp.index] or "unknown")[:12],
                         "before": cp.before, "after": cp.after, "change": cp.change,
                         "p": cp.p_value})
    fig = draw(plot, series, alt="throughput history with change points",
                missing="no throughput to plot")
    return {"n": len(results), "fig": fig, "rows": rows, "max_p": history.DEFAULT_MAX_P,
            "permutations": history.DEFAULT_PERMUTATIONS, "min_size": history.DEFAULT_MIN_SIZE}
