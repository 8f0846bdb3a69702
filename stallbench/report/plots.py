"""The report's figures: one function per figure, each returning a base64 PNG or None.

Figures of one part of a result take that part's typed object (``Timeline``, ``Resources``, the
what-if's points); figures the page assembles from several variants take plain lists. Either way
a figure can be drawn and tested without a whole ``Result``. A function returns None when there is
nothing to draw; the page then says so in one line. The codec guarantees types, not tidiness:
series may be NaN ("not measured") or of unequal lengths, and every function copes.
Figures are drawn on a bare ``matplotlib.figure.Figure`` (Agg canvas, no pyplot global state),
small and at ~100 dpi so a report with a dozen figures stays a few hundred KB.
"""

from __future__ import annotations

import base64
import io
import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

from ..analysis import figures
from ..results import Knee, RankSummary, Resources, Timeline, WhatIfCheck, WhatIfPoint

import matplotlib

matplotlib.use("Agg", force=False)  # never a GUI backend, even if pyplot is imported elsewhere

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402
from PIL import Image  # noqa: E402 - comes with matplotlib (a dependency of it)

DPI = 100
WIDTH_IN = 9.2

# One palette for the page and the figures (the CSS uses the same hex values): one colour per
# quantity across the page (issue 42: the compute-only run and the full runs' step timer, an
# attributed fetch stall and the trainer's wait for a batch each had one colour for two).
STAGE_COLORS = {
    "compute": "#3b6fb6",            # the model step in the measured (full) runs
    "compute-only": "#1d3f73",       # the compute-only ablation run's step
    "fetch": "#e0922f",              # attributed stalls, per stage
    "preprocess": "#c8463d",
    "transfer": "#7d5fb2",
    "trainer transfer": "#b7a5d8",   # the trainer's own host -> device copy time
    "wait": "#e8c547",               # the trainer's wait for a batch (exposed stall)
    "start-up": "#8d6e4c",           # start-up beyond the steady rate
    "other": "#9aa5b1",
    "loader": "#52606d",   # loader overhead: start-up and hand-off, no stage's fault
}


def series_color(label: str) -> str:
    """The colour of a series by its label ("fetch stall (attributed)", "wait for a batch"):
    ``STAGE_COLORS``' quantity, the one place a label picks its colour."""
    for prefix, key in (("compute (compute-only", "compute-only"), ("compute-only", "compute-only"),
                        ("transfer (trainer", "trainer transfer"), ("wait", "wait"),
                        ("exposed stall", "wait"), ("start-up", "start-up"),
                        # a profiled job's parts by its own stages (figures.JOB_PART_NAMES)
                        ("dataset", "fetch"), ("collate_fn", "preprocess"),
                        ("pin_memory", "transfer")):
        if label.startswith(prefix):
            return STAGE_COLORS[key]
    return STAGE_COLORS.get(label.split()[0], STAGE_COLORS["other"])
RUN_COLORS = ["#9aa5b1", "#3b6fb6", "#2a9d8f", "#e0922f", "#7d5fb2", "#c8463d"]
INK = "#1f2933"
MUTED = "#616e7c"
GRID = "#e4e7eb"

_RC = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.labelsize": 9,
    "axes.labelcolor": INK,
    "axes.edgecolor": "#cbd2d9",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": GRID,
    "grid.linewidth": 0.8,
    "xtick.color": MUTED,
    "ytick.color": MUTED,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "text.color": INK,
    # Every label is text: a variant named "$\\sqrt{...}$" is shown as typed, never parsed as
    # mathtext (which can crash on it; docs/reliability-rules.md "Escaped for each sink").
    "text.parse_math": False,
}


# ------------------------------------------------------------------------------- helpers

def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _floats(xs: Iterable[Any]) -> list[float]:
    return [float(x) for x in xs if _finite(x)]


def figure(height_in: float, width_in: float = WIDTH_IN) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    return fig


def png(fig: Figure) -> str:
    """The figure as a base64 PNG, drawn once on an Agg canvas.

    Why not ``fig.savefig``: with a layout engine, savefig draws the whole figure twice (a
    pass with rendering disabled for the layout, then the real one) and then zlib-encodes a
    PNG that Pillow decodes again right away to quantize it. One ``canvas.draw()`` runs the
    constrained layout and renders in the same pass, and Pillow reads the RGBA buffer
    directly: the same pixels (test_png_draws_the_pixels_savefig_draws; all 34 figures of
    results/examples were compared too), ~1.3 s less CPU for that report's 34 figures."""
    canvas = FigureCanvasAgg(fig)
    fig.set_facecolor("white")
    canvas.draw()
    width, height = canvas.get_width_height()
    rgb = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0,
                           1).convert("RGB")
    try:  # a 256-colour palette is visually lossless for line art and ~3x smaller
        img = rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    except Exception:  # pragma: no cover - keep the full-colour PNG
        img = rgb
    small = io.BytesIO()
    img.save(small, format="PNG", optimize=True)
    return base64.b64encode(small.getvalue()).decode("ascii")


def format_rate(x: float, _pos: Any = None) -> str:
    if abs(x) >= 1e6:
        return f"{x / 1e6:.1f}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.0f}k"
    return f"{x:.0f}"


def _human_rate(x: float) -> str:
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.2f}k"
    return f"{x:.0f}"


def style() -> Any:
    return matplotlib.rc_context(_RC)


def _mean_or_nan(xs: Iterable[Any]) -> float:
    vals = _floats(xs)
    return sum(vals) / len(vals) if vals else math.nan


# ------------------------------------------------------------------------- epoch breakdown

def epoch_breakdown(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Stacked horizontal bars of the epoch time per variant.

    ``rows``: ``[{"name": str, "segments": [(stage, seconds, (lo, hi) | None), ...],
    "total_range": (min, max) | None}]``. Stage names pick the colour (compute, fetch,
    preprocess, transfer, wait, other). Each segment with an interval gets a whisker at its end.
    """
    rows = [r for r in rows if any(_finite(s[1]) and s[1] > 0 for s in r.get("segments", []))]
    # A negative part (a difference of noisy means) is drawn back from the end of the stacked
    # positive parts, hatched over them: the solid bar ends at the signed sum, its label (the
    # bar's length equals its label; issue 42: a bar to ~17 s labelled 13.74 s).
    if not rows:
        return None
    with style():
        fig = figure(0.9 + 0.42 * len(rows))
        ax = fig.add_subplot()
        names = [r["name"] for r in rows]
        y = list(range(len(rows)))[::-1]
        seen: set[str] = set()
        xmax = 0.0
        ends: list[tuple[float, float, float]] = []
        for yi, row in zip(y, rows):
            left = 0.0
            reach = 0.0  # right end of the bar including its whiskers
            signed = sum(float(s[1]) for s in row["segments"] if _finite(s[1]))
            negative = [s for s in row["segments"] if _finite(s[1]) and s[1] < 0]
            for stage, sec, interval in row["segments"]:
                if not _finite(sec) or sec <= 0:
                    continue
                color = series_color(stage)
                label = None if stage in seen else stage
                seen.add(stage)
                ax.barh(yi, sec, left=left, height=0.62, color=color, label=label,
                        edgecolor="white", linewidth=0.8)
                if interval and len(interval) == 2 and all(_finite(v) for v in interval):
                    lo, hi = float(interval[0]), float(interval[1])
                    end = left + sec
                    ax.errorbar(end, yi, xerr=[[max(0.0, sec - lo)], [max(0.0, hi - sec)]],
                                fmt="none", ecolor=INK, elinewidth=0.9, capsize=2.5, alpha=0.75)
                    reach = max(reach, left + hi)
                left += sec
            reach = max(reach, left)      # the positive parts' end: the hatch starts back from it
            for stage, sec, _interval in negative:
                # back from the positive end: the part cancels what it overlaps
                label = f"{stage}, below 0 (cancels the hatched length)"
                ax.barh(yi, float(sec), left=left, height=0.62, color="white", alpha=0.85,
                        hatch="////", edgecolor=series_color(stage), linewidth=0.0,
                        label=None if label in seen else label)
                seen.add(label)
                left += float(sec)

            tr = row.get("total_range")
            if tr and all(_finite(v) for v in tr):
                lo, hi = float(tr[0]), float(tr[1])
                if hi > lo:  # spread of the measured epoch over repeats
                    ax.errorbar(left, yi, xerr=[[max(0.0, left - lo)], [max(0.0, hi - left)]],
                                fmt="none", ecolor=INK, elinewidth=0.9, capsize=2.5, alpha=0.75)
                reach = max(reach, hi)
            xmax = max(xmax, reach)
            ends.append((yi, signed, reach))
        for yi, total, reach in ends:
            ax.text(reach + xmax * 0.012, yi, figures.seconds(total), va="center", ha="left",
                    fontsize=8.5, color=INK)
        ax.set_yticks(y, names)
        ax.set_xlim(0, xmax * 1.13 if xmax else 1)
        ax.set_xlabel("seconds per measured run")
        ax.grid(axis="y", visible=False)
        # long labels ("fetch stall (attributed)") need two rows to fit the figure's width
        ncol = 6 if sum(len(x) for x in seen) <= 70 else 3
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, handlelength=1.2,
                  columnspacing=1.2)
        return png(fig)


# ------------------------------------------------------------------------------- throughput

def throughput(variants: Sequence[str], runs: Sequence[Mapping[str, Any]]) -> str | None:
    """Throughput per variant: median bar, min..max whisker, one dot per repeat.

    ``runs``: ``[{"label": str, "values": {variant: [samples/s per repeat]}}]`` oldest first;
    with several runs the bars of one variant sit side by side, one colour per run.
    """
    have = [v for v in variants
            if any(_floats(r.get("values", {}).get(v, [])) for r in runs)]
    if not have:
        return None
    nruns = len(runs)
    colors = [RUN_COLORS[1]] if nruns == 1 else [RUN_COLORS[i % len(RUN_COLORS)] for i in range(nruns)]
    with style():
        fig = figure(0.8 + max(0.42, 0.3 * nruns) * len(have) + (0.25 if nruns > 1 else 0))
        ax = fig.add_subplot()
        group_h = 0.72
        bar_h = group_h / nruns
        ymax = 0.0
        for ri, run in enumerate(runs):
            named = False     # the legend names every run: on its first bar, whichever variant
            for vi, name in enumerate(have):
                vals = _floats(run.get("values", {}).get(name, []))
                if not vals:
                    continue
                yc = (len(have) - 1 - vi) + group_h / 2 - bar_h * (ri + 0.5)
                med = statistics.median(vals)
                ax.barh(yc, med, height=bar_h * 0.82, color=colors[ri], alpha=0.9,
                        label=run.get("label") if not named and nruns > 1 else None)
                named = True
                if len(vals) > 1:
                    ax.plot([min(vals), max(vals)], [yc, yc], color=INK, lw=1.1, solid_capstyle="butt")
                    for end in (min(vals), max(vals)):
                        ax.plot([end, end], [yc - bar_h * 0.22, yc + bar_h * 0.22], color=INK, lw=1.1)
                n = len(vals)
                offs = [(-0.18 + 0.36 * i / (n - 1)) * bar_h if n > 1 else 0.0 for i in range(n)]
                ax.scatter(vals, [yc + o for o in offs], s=13, color="white", edgecolor=INK,
                           linewidth=0.8, zorder=3)
                ymax = max(ymax, max(vals))
                ax.text(max(vals) + 0.0, yc, f"  {_human_rate(med)}/s", va="center", ha="left",
                        fontsize=8.5, color=INK)
        ax.set_yticks(range(len(have))[::-1], have)
        ax.set_xlim(0, ymax * 1.18 if ymax else 1)
        ax.xaxis.set_major_formatter(FuncFormatter(format_rate))
        ax.set_xlabel("samples / s  (bar: median · whisker: min..max · dots: repeats)")
        ax.grid(axis="y", visible=False)
        if nruns > 1:
            ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(nruns, 4))
        return png(fig)


def tune_search(trials: Sequence[Any], ceiling: float | None, best: str | None) -> str | None:
    """``stallbench tune -- CMD``: each trial's measured steady rate in the order run, against
    the compute-only ceiling (a dashed line, measured by replay); the answer outlined. A
    trial the job failed under, or one it overrode, is a gap with its label."""
    rates = [(i, t) for i, t in enumerate(trials, 1)]
    vals = [t.steady_samples_s for _, t in rates
            if t.outcome == "measured" and _finite(t.steady_samples_s)]
    if not vals:
        return None
    with style():
        fig = figure(0.9 + 0.34 * len(rates))
        ax = fig.add_subplot()
        top = max(vals + ([ceiling] if ceiling and _finite(ceiling) else []))
        for k, (i, t) in enumerate(rates):
            y = len(rates) - 1 - k
            if t.outcome != "measured" or not _finite(t.steady_samples_s):
                ax.text(0, y, "  not applied (the job overrode it)" if t.outcome ==
                        "not_applied" else f"  failed (exit {t.exit_code})", va="center",
                        fontsize=8.5, color=INK)
                continue
            chosen = t.name == best
            ax.barh(y, t.steady_samples_s, height=0.62, color=RUN_COLORS[1 if k else 0],
                    alpha=0.9, edgecolor=INK if chosen else "none", linewidth=1.6 if chosen else 0)
            ax.text(t.steady_samples_s, y, f"  {_human_rate(t.steady_samples_s)}/s"
                    + ("  (answer)" if chosen else ""), va="center", ha="left", fontsize=8.5,
                    color=INK)
        if ceiling and _finite(ceiling):
            ax.axvline(ceiling, color=INK, lw=1.2, ls="--")
            ax.text(ceiling, len(rates) - 0.45, " compute-only ceiling", fontsize=8, color=INK,
                    ha="left", va="bottom")
        ax.set_yticks(range(len(rates))[::-1], [f"{i}. {t.name}" for i, t in rates])
        ax.set_xlim(0, top * 1.3)
        ax.xaxis.set_major_formatter(FuncFormatter(format_rate))
        ax.set_xlabel("steady samples / s, from the 2nd epoch on (measured; trials in order)")
        ax.grid(axis="y", visible=False)
        return png(fig)


# ---------------------------------------------------------------------------------- what-if

def whatif(points: Sequence[WhatIfPoint], measured: Sequence[WhatIfCheck] = (),
           knee: Knee | None = None, axis: str = "workers",
           band_label: str = "prediction interval (back-test)") -> str | None:
    """PREDICTED throughput against workers/nodes, its prediction interval as a band, measured
    points on top, knee marked. A point the back-test does not vouch for (``not_predicted``,
    issue 39) is not drawn: only the table says why."""
    pts = sorted((p for p in points if _finite(p.predicted_samples_s)
                  and not getattr(p, "not_predicted", "")), key=lambda p: p.n)
    if not pts:
        return None
    with style():
        fig = figure(3.3)
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "PREDICTED", transform=ax.transAxes, ha="center", va="center",
                fontsize=46, fontweight="bold", color="#eef0f3", zorder=0)
        xs = [p.n for p in pts]
        ys = [p.predicted_samples_s for p in pts]
        ax.plot(xs, ys, color=MUTED, lw=1.2, ls="--", zorder=2)
        banded = [p for p in pts if _finite(p.low_samples_s) and _finite(p.high_samples_s)]
        if banded:
            ax.fill_between([p.n for p in banded], [float(p.low_samples_s) for p in banded],
                            [float(p.high_samples_s) for p in banded], color=MUTED, alpha=0.18,
                            lw=0, zorder=1, label=band_label)
        seen: set[str] = set()
        for p in pts:
            b = p.bound_by or "unknown"
            color = STAGE_COLORS.get(b, STAGE_COLORS["other"])
            ax.scatter([p.n], [p.predicted_samples_s], s=26, color=color, zorder=3,
                       label=None if b in seen else f"predicted, {b}-bound")
            seen.add(b)
        mpts = [m for m in measured if _finite(m.measured_samples_s)]
        # The curve is a steady rate: compare it with the measured steady rate where the
        # result has one for every point (else the epoch rate).
        steady = bool(mpts) and all(_finite(m.measured_steady_samples_s) for m in mpts)
        kind = "measured, steady state" if steady else "measured"

        def y_of(m: WhatIfCheck) -> float:
            return float(m.measured_steady_samples_s if steady else m.measured_samples_s)

        labelled: set[bool] = set()
        replayed = False
        for m in mpts:
            ax.scatter([m.n], [y_of(m)], marker="D", s=34, zorder=4,
                       color="white" if m.is_fit else INK, edgecolor=INK, linewidth=1.2,
                       label=None if m.is_fit in labelled else
                       (f"{kind} (the model was fitted here)" if m.is_fit else kind))
            labelled.add(m.is_fit)
            # the same run replayed item by item (start-up, rounds of work items): what the
            # model predicts that run measured, where the result has it
            replay = m.predicted_steady_samples_s if steady else m.predicted_run_samples_s
            target = replay if _finite(replay) else m.predicted_samples_s
            if _finite(target):
                ax.plot([m.n, m.n], [y_of(m), target], color=INK, lw=0.8, alpha=0.5, zorder=3)
            if _finite(replay):
                ax.scatter([m.n], [replay], marker="_", s=90, color=INK, lw=1.4, zorder=4,
                           label=None if replayed else "predicted for that run (replayed)")
                replayed = True
        top = max(ys + [y_of(m) for m in mpts] + [float(p.high_samples_s) for p in banded])
        mark, what = (knee.n, "knee") if knee else (None, "knee")
        if mark is None and knee and knee.saturates_at is not None:
            mark, what = knee.saturates_at, "saturates at"
        if mark is not None:
            bound = knee.bound_by if knee else None
            ax.axvline(mark, color=STAGE_COLORS["preprocess"], lw=1, ls=":", zorder=1)
            ax.annotate(f"{what}: {mark:g} {axis}" + (f" ({bound}-bound beyond)" if bound else ""),
                        xy=(mark, top * 1.04), xytext=(6, 0), textcoords="offset points",
                        fontsize=8.5, color=STAGE_COLORS["preprocess"], va="center")
        ax.set_ylim(0, top * 1.14)
        ax.yaxis.set_major_formatter(FuncFormatter(format_rate))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(f"CPU {axis}")
        ax.set_ylabel("samples / s")
        ax.set_title(f"PREDICTED throughput vs {axis} (model, not measured)", color=INK)
        # beside the axes, never over the curve (issue 42); the constrained layout makes room
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return png(fig)


# --------------------------------------------------------------------------------- timeline

def _vbars(ax: Any, x: Sequence[float], heights: Sequence[float], bottoms: Sequence[float],
           width: float, color: str) -> None:
    """Many vertical bars as one PolyCollection: ``ax.bar`` makes one patch per bar, which is
    slow to lay out and draw for thousands of batches."""
    h = width / 2
    verts = [[(xi - h, b), (xi - h, b + hi), (xi + h, b + hi), (xi + h, b)]
             for xi, hi, b in zip(x, heights, bottoms) if hi > 0]
    ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none", linewidths=0))


def timeline(tl: Timeline) -> str | None:
    """Per-batch timeline of one run: when the trainer waited, unpacked and computed.

    Top: the run as one lane over wall time. Bottom: each batch's wait / transfer / compute.
    """
    starts = list(tl.t_start_s)
    n = len(starts)
    if n == 0:
        return None

    def col(vals: Sequence[float]) -> list[float]:
        return [float(v) if _finite(v) else 0.0 for v in (list(vals) + [0.0] * n)[:n]]

    wait, transfer, compute = col(tl.wait_s), col(tl.transfer_s), col(tl.compute_s)
    starts_f = [float(s) if _finite(s) else 0.0 for s in starts]
    if starts_f and min(starts_f) > 1e4:  # an absolute clock (time.time / perf_counter): from 0
        t0 = min(starts_f)
        starts_f = [s - t0 for s in starts_f]
    parts = (("wait", wait, STAGE_COLORS["wait"]), ("transfer", transfer, STAGE_COLORS["trainer transfer"]),
             ("compute", compute, STAGE_COLORS["compute"]))
    with style():
        fig = figure(3.4)
        gs = fig.add_gridspec(2, 1, height_ratios=[1, 2.6])
        lane = fig.add_subplot(gs[0])
        left = list(starts_f)
        for name, vals, color in parts:
            lane.broken_barh(list(zip(left, vals)), (0, 1), facecolors=color, label=name)
            left = [a + b for a, b in zip(left, vals)]
        lane.set_ylim(0, 1)
        lane.set_yticks([])
        lane.set_xlim(0, max(left) if left else 1)
        lane.set_xlabel("wall time in the run (s)")
        lane.grid(False)
        lane.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, handlelength=1.2)

        bars = fig.add_subplot(gs[1])
        idx = list(range(n))
        bottom = [0.0] * n
        width = 0.85 if n < 200 else 1.0
        for name, vals, color in parts:
            ms = [v * 1e3 for v in vals]
            _vbars(bars, idx, ms, bottom, width, color)
            bottom = [a + b for a, b in zip(bottom, ms)]
        bars.set_ylim(0, max(bottom) * 1.05 if max(bottom) > 0 else 1)
        bars.set_xlim(-0.8, n - 0.2)
        srt = sorted(bottom)
        p98 = srt[min(n - 1, int(0.98 * n))]
        if srt[-1] > 2.5 * max(p98, 1e-9):  # one huge first batch should not flatten the rest
            bars.set_ylim(0, p98 * 1.35)
            for i, b in enumerate(bottom):
                if b > p98 * 1.35:
                    bars.annotate(f"{b:.0f} ms ↑", xy=(i, p98 * 1.3), ha="left", va="top",
                                  fontsize=7.5, color=INK, xytext=(3, 0), textcoords="offset points")
        bars.set_xlabel("batch")
        bars.set_ylabel("ms per batch")
        bars.xaxis.set_major_locator(MaxNLocator(integer=True))
        bars.grid(axis="x", visible=False)
        return png(fig)


# -------------------------------------------------------------------------------- resources

def resources(res: Resources) -> str | None:
    """CPU per core, memory (PSS), object store, GPU utilisation and GPU memory over one run,
    sharing the time axis. GPU utilisation is one value per GPU per sample: drawn as the mean
    over GPUs; GPU memory as the sum over GPUs (NVML's used memory)."""
    t = _floats(res.t_s)
    if not t:
        return None
    n = len(t)
    if t[0] > 1e4:  # an absolute clock: show seconds since the first sample
        t = [x - t[0] for x in t]

    def series(vals: Sequence[float] | None) -> list[float] | None:
        if not vals:
            return None
        out = [float(v) if _finite(v) else math.nan for v in vals][:n]
        return out if len(out) == n and any(math.isfinite(v) for v in out) else None

    per_core: list[list[float]] = list(res.cpu_percent_per_core)
    if (len(per_core) == n and n > 1
            and len({len(c) for c in per_core}) == 1 and len(per_core[0]) != n):
        per_core = [list(col) for col in zip(*per_core)]  # given per sample, not per core
    cores = [s for s in (series(c) for c in per_core) if s]
    panels: list[tuple[str, Any]] = []
    if cores:
        panels.append(("cpu", cores))
    gpu = None
    if res.gpu_util_percent:
        gpu = [_mean_or_nan(sample) for sample in res.gpu_util_percent]
    gpu_mem = None
    if res.gpu_memory_mb:   # every GPU's used memory, summed (NVML)
        gpu_mem = [sum(float(x) for x in sample if _finite(x)) if sample else math.nan
                   for sample in res.gpu_memory_mb]
    for key, label, color, vals in (
            ("pss_mb", "memory, PSS (MB)", STAGE_COLORS["compute"], res.pss_mb),
            ("object_store_mb", "object store (MB)", "#2a9d8f", res.object_store_mb),
            ("gpu_util_percent", "GPU util (%)", "#76b041", gpu),
            ("gpu_memory_mb", "GPU memory (MB)", "#4d7c0f", gpu_mem)):
        s = series(vals)
        if s:
            panels.append((key, (label, color, s)))
    if not panels:
        return None
    with style():
        fig = figure(0.55 + 1.35 * len(panels))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (kind, data) in zip(axes, panels):
            if kind == "cpu":
                if len(data) <= 8:
                    palette = ["#3b6fb6", "#e0922f", "#2a9d8f", "#c8463d", "#7d5fb2", "#76b041",
                               "#9aa5b1", "#1f2933"]
                    for i, s in enumerate(data):
                        ax.plot(t, s, lw=1.1, color=palette[i % len(palette)], label=f"core {i}",
                                marker="o" if n < 30 else None, ms=3)
                    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), handlelength=1.2)
                else:  # many cores: mean with the min..max band
                    lo = [min(c[i] for c in data) for i in range(n)]
                    hi = [max(c[i] for c in data) for i in range(n)]
                    mean = [sum(c[i] for c in data) / len(data) for i in range(n)]
                    ax.fill_between(t, lo, hi, color="#3b6fb6", alpha=0.2, lw=0, label="min..max core")
                    ax.plot(t, mean, color="#3b6fb6", lw=1.2, label=f"mean of {len(data)} cores")
                    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
                ax.set_ylim(0, 105)
                ax.set_ylabel("CPU %")
            else:
                label, color, s = data
                ax.plot(t, s, color=color, lw=1.3, label="PSS sum" if kind == "pss_mb" else None,
                        marker="o" if n < 30 else None, ms=3)
                ax.fill_between(t, 0, [v if math.isfinite(v) else 0 for v in s], color=color,
                                alpha=0.12, lw=0)
                top = [v for v in s if math.isfinite(v)]
                extra = series(res.rss_sum_mb) if kind == "pss_mb" else None
                if extra:
                    ax.plot(t, extra, color=color, lw=1, ls="--", alpha=0.7,
                            label="RSS sum (shared pages\ncounted per process)")
                    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), handlelength=1.6)
                    top += [v for v in extra if math.isfinite(v)]
                if kind == "gpu_util_percent":
                    ax.set_ylim(0, 105)
                else:
                    ax.set_ylim(0, max(top) * 1.15 if top and max(top) > 0 else 1)
                ax.set_ylabel(label)
        axes[-1].set_xlabel("wall time in the run (s)")
        axes[-1].set_xlim(t[0], t[-1])
        return png(fig)


# --------------------------------------------------------------------------------- ranks

def ranks(summary: RankSummary) -> str | None:
    """Per rank of a data-parallel variant: its exposed stall (waiting for its batches plus
    its own unpacking), its model steps and its time in the step's all-reduce (waiting for the
    other ranks), stacked; the named straggler's bar is outlined and labelled."""
    rs = [r for r in summary.ranks if _finite(r.stall_s)]
    if not rs:
        return None
    with style():
        fig = figure(0.9 + 0.36 * len(rs))
        ax = fig.add_subplot()
        y = list(range(len(rs)))[::-1]
        parts = (("exposed stall", "stall_s", STAGE_COLORS["wait"]),
                 ("compute", "compute_s", STAGE_COLORS["compute"]),
                 ("all-reduce (waiting for other ranks)", "sync_s", STAGE_COLORS["other"]))
        xmax = 0.0
        for yi, r in zip(y, rs):
            left = 0.0
            straggler = r.rank == summary.straggler
            for i, (label, attr, color) in enumerate(parts):
                sec = float(getattr(r, attr))
                if not _finite(sec) or sec <= 0:
                    continue
                ax.barh(yi, sec, left=left, height=0.62, color=color,
                        label=label if yi == y[0] else None,
                        edgecolor=INK if straggler and i == 0 else "white",
                        linewidth=1.6 if straggler and i == 0 else 0.8)
                left += sec
            xmax = max(xmax, left)
            note = f"  {r.stall_s:.2f} s stalled"
            if straggler:
                note += "  ← straggler"
            ax.text(left, yi, note, va="center", ha="left", fontsize=8.5,
                    color=STAGE_COLORS["preprocess"] if straggler else INK,
                    fontweight="bold" if straggler else "normal")
        ax.set_yticks(y, [f"rank {r.rank}" for r in rs])
        ax.set_xlim(0, xmax * 1.3 if xmax else 1)
        ax.set_xlabel("seconds per measured run (median over repeats)")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, handlelength=1.2,
                  columnspacing=1.2)
        return png(fig)
