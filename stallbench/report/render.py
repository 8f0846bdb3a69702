"""Render result files into one self-contained HTML page.

``render(paths, out)`` loads every result (a bad file raises ``ResultError``), groups them by
scenario name, draws the figures (``plots``) and fills ``templates/report.html``. The page has
no external reference at all: figures are base64 data URIs, the CSS is inlined, fonts are the
system's. Sections whose data a result does not carry (no analysis, no what-if, no timeline...)
render as one muted line instead of failing.

The page reads the typed result (``stallbench.results``; v1 files arrive migrated), never dicts,
and uses the result's names for its figures: "trainer stalled" is a variant's ``stall_share``
(the run table's stall), "attributed stall" is the attribution's ``attributed_stall_*`` (epoch
time above the compute-only run), "wait for a batch" is ``wait_s``. Two runs are faster/slower only
by ``stallbench.gate.rule``, the rule ``stallbench gate`` applies.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jinja2

from ..gate import rule as comparing
from .. import results
from ..errors import UserError
from ..measure.load import busy_summary
from ..results import (Attribution, DatasetInfo, Interval, MachineInfo, Resources, Result,
                       Timeline, VariantResult, WhatIfCheck, WhatIfValidation)
from ..analysis.device import AU_PASS, au_label
from ..analysis import figures
from .tables import ZERO_NOTE, spans_zero
from ..analysis.stats import finite_median
from . import plots, profile_lines
from .history import view as history_view

TEMPLATES = Path(__file__).parent / "templates"
NBSP = "\u00a0"
STAGES = ("fetch", "preprocess", "transfer")

# What each emulation knob means for the figures that depend on it.
EMULATED_MEANING = {
    "storage.bandwidth_mb_s": "remote storage bandwidth is a throttle on local reads, not a real network",
    "storage.latency_ms": "per-request storage latency is an injected sleep",
    "loader.wire_bandwidth_mb_s": "the producer-to-trainer link is throttled, not a real second node",
    "model.step_ms": "no real model runs: each step is a wait of step_ms per batch (a sleep; only "
                     "the last ~0.5 ms spins, for precision), so it leaves the CPU free but for that "
                     "spin, like a step on an accelerator",
    "preprocess.cpu_cost_us_per_row": "part of the preprocessing is a busy loop that burns this much "
                                      "CPU time per row (measured on the thread's CPU clock)",
    "executor.simulated_nodes": "the nodes are simulated Ray nodes on this one machine",
    "trainers.straggler_delay_ms": "one rank is made a straggler: a sleep of this many ms in its "
                                   "process per work item it receives (the injected total is "
                                   "measured and shown per rank)",
}


# ------------------------------------------------------------------------------- formatting

def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def format_rate(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def format_s(x: Any) -> str:
    """A duration (``figures.seconds``; a part of the epoch keeps its sign)."""
    return figures.seconds(x, missing="—", signed=True)


def format_pct(x: Any) -> str:
    """A share (``figures.share``: never negative, never "-0%")."""
    return figures.share(x, missing="—")


def format_signed_pct(x: Any, digits: int = 1) -> str:
    """A change or an error (``figures.signed_percent``: no sign where it reads 0)."""
    return figures.signed_percent(x, digits, missing="—")


def format_x(x: Any) -> str:
    return figures.speedup(x, missing="—").replace("x", "×")


def format_mb(x: Any) -> str:
    v = _num(x)
    return "—" if v is None else (f"{v:,.0f} MB" if v >= 100 else f"{v:.1f} MB")


def format_bytes(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(v) < 1024 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "—"  # pragma: no cover


def format_us(x: Any) -> str:
    """Seconds per sample, which are microseconds in practice."""
    v = _num(x)
    return "—" if v is None else f"{v * 1e6:.3g} µs"


def format_interval(iv: Interval | None, fmt: Callable[[Any], str] = format_s) -> str:
    """``low – high``; may break at the dash only (a narrow table column), never in a value."""
    if iv is not None and _num(iv.low) is not None and _num(iv.high) is not None:
        return f"{fmt(iv.low).replace(' ', NBSP)} – {fmt(iv.high).replace(' ', NBSP)}"
    return ""


def format_value(x: Any) -> str:
    """A metadata value: dicts and lists compact, None as a dash."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) and abs(x) >= 10_000:
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.0f}" if x.is_integer() and abs(x) >= 10_000 else f"{x:g}"
    if isinstance(x, dict):
        return ", ".join(f"{k}={format_value(v)}" for k, v in x.items()) or "—"
    if isinstance(x, (list, tuple)):
        return ", ".join(format_value(v) for v in x) or "—"
    return str(x)


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.extend(_flatten(v, key))
            else:
                out.append((key, v))
    return out


def _dig(d: Any, dotted: str) -> Any:
    """A dotted key of ``VariantResult.config`` (the scenario config, a plain dict by design)."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


# ---------------------------------------------------------------------------- view models

@dataclass
class Figure:
    png: str | None
    alt: str
    missing: str            # the one muted line shown when png is None
    error: str | None = None


def _draw(fn: Callable[..., str | None], *args: Any, alt: str, missing: str, **kw: Any) -> Figure:
    """Draw one figure; odd data in a result never takes the whole report down."""
    try:
        return Figure(fn(*args, **kw), alt, missing)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        print(f"stallbench report: could not draw {alt!r}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return Figure(None, alt, missing, error=f"could not draw this figure from the result "
                                                 f"({type(exc).__name__}: {exc})")


Segment = tuple[str, float, tuple[float, float] | None]   # (label, seconds, interval)


@dataclass
class VariantView:
    v: VariantResult
    name: str
    knobs: str
    is_baseline: bool
    is_best: bool
    attribution: Attribution | None
    segments: list[Segment]                 # epoch split for the stacked bar
    split_kind: str                         # "attributed" | "measured" | ""
    attribution_notes: list[str] = field(default_factory=list)
    timeline_fig: Figure | None = None
    resources_fig: Figure | None = None
    timeline_stats: list[tuple[str, str]] = field(default_factory=list)
    resource_stats: list[tuple[str, str]] = field(default_factory=list)
    ranks_fig: Figure | None = None          # trainers.ranks > 1: the per-rank panel
    steady_au: "SteadyAu | None" = None      # AU over the steady window, or why it is missing
    # issue 57: what the "bound by" cell says, as ``analysis`` decided it (the job's own part
    # name; "inconclusive" where it withheld or could not conclude), and whether the parts
    # are withheld (shown as "withheld", never as figures)
    bound_label: str = ""
    withheld: bool = False

    @property
    def split_sum(self) -> float:
        """What the bar adds up to (its positive segments)."""
        return sum(x for _, x, _ in self.segments if _num(x) is not None and x > 0)

    @property
    def split_line(self) -> str:
        """The bar in words (under the figure, and what a reader or a test checks): its
        segments and their sum against the measured epoch it splits; "" without a bar."""
        segs = [(lbl, x) for lbl, x, _ in self.segments if _num(x) is not None and x > 0]
        if not segs:
            return ""
        total = self.split_sum
        return (f"{self.name}: " + " + ".join(f"{lbl} {format_s(x)}" for lbl, x in segs)
                + f" = {format_s(total)}, of a measured epoch of "
                  f"{format_s(self.v.epoch_s.median)}")


@dataclass
class Headline:
    """The verdict card of one run. ``stall_share`` is the baseline variant's trainer stall
    (``stall_share.median``, the run table's figure); ``attributed_stall_share`` the
    attribution's figure for the same variant, shown beside it under its own name."""

    verdict: str
    baseline: str | None
    best: str | None
    speedup: float | None
    derived: bool                   # best / speedup computed here from medians
    bound_by: str | None
    best_bound_by: str | None
    stall_share: float | None
    attributed_stall_share: float | None
    baseline_tput: float | None
    best_tput: float | None
    recommendation: str = ""        # the scenario's next step (analysis.recommendation)
    busy: str | None = None         # heavy foreign load during the runs (measure.load)
    steady_speedup: float | None = None   # best / baseline, steady state (both have one)
    # the baseline's measured wait split into start-up and steady state, where start-up holds
    # more than a tenth of it (``analysis.waits.wait_headline``, issue 39); "" otherwise
    wait_split: str = ""
    bound_label: str = ""           # the "bound by" tile as analysis decided (``bound_label``)

    @property
    def ratio(self) -> float | None:
        """The one headline ratio: steady state where both variants have one (what a long
        epoch sees; the recommendation quotes it too), else the whole run."""
        return self.steady_speedup if self.steady_speedup is not None else self.speedup

    @property
    def ratio_basis(self) -> str:
        return "steady state" if self.steady_speedup is not None else "whole run"

    @property
    def line(self) -> str:
        """The one-line headline (the full verdict goes below it): a reader sees the answer
        before the reasons. One ratio, steady state, the whole run's beside it, labelled."""
        if self.best and self.baseline and self.best != self.baseline and self.ratio:
            if self.steady_speedup is not None and self.speedup:
                return (f"{self.best} is fastest: {self.steady_speedup:.2f}× {self.baseline} "
                        f"in steady state (whole run {self.speedup:.2f}×)")
            return f"{self.best} is fastest: {self.ratio:.2f}× {self.baseline} (whole run)"
        if self.best:
            return f"{self.best} is already the fastest variant"
        return ""


@dataclass
class RunView:
    result: Result
    path: Path
    label: str
    color: str
    variants: list[VariantView]
    headline: Headline
    breakdown_fig: Figure
    throughput_fig: Figure
    whatif_fig: Figure
    whatif: WhatIfValidation | None
    whatif_rows: list[dict[str, Any]]
    stage_rates: list[tuple[str, list[str]]]   # (figure, formatted value per variant)
    measured_lines: list[str]       # ``analysis.figures.measured_line`` per measured variant
    emulated: list[dict[str, Any]]
    predicted: list[str]
    anchor: str
    has_inside: bool = False
    emulated_uniform: bool = True   # every variant emulates the same knobs (no per-row badge)
    has_ranks: bool = False         # a variant ran data-parallel ranks (trainers.ranks > 1)
    device_rows: list[dict[str, Any]] = field(default_factory=list)   # H2D copies, per variant
    au_note: str = ""               # how AU's step time was measured, for this run's variants
    tune_fig: Figure | None = None  # ``stallbench tune -- CMD``: the search (issue 41)
    # a profile's (or a tune's) text as the terminal printed it: the one printer's lines
    terminal_lines: list[str] = field(default_factory=list)
    # a profile's knee as the terminal printed it (``profile_lines.knee_lines``: MEASURED,
    # PREDICTED or "not predicted", and what to do), never the model's bare explanation
    knee_lines: list[str] = field(default_factory=list)


def _pair(iv: Interval) -> tuple[float, float]:
    return (iv.low, iv.high)


def _variant_split(v: VariantResult) -> tuple[list[Segment], str]:
    a = v.attribution
    on_job = v.profile is not None
    stage_map = v.profile.analysis.stage_map if on_job and v.profile.analysis else None
    if a is not None and _num(a.compute_s) is not None and not figures.withheld(a):
        segs: list[Segment] = [("compute (compute-only run)", a.compute_s, _pair(a.intervals.compute_s))]
        for st in STAGES:
            x = _num(a.part_s(st))
            segs.append((f"{figures.part_name(st, on_job, stage_map)} stall (attributed)",
                         x if x is not None else 0.0, _pair(a.part_interval(st))))
        if _num(a.overhead_s) is not None:
            segs.append((f"{figures.part_name('overhead', on_job, stage_map)} (attributed)", a.overhead_s,
                         _pair(a.intervals.overhead_s)))
        if _num(a.interference_s) is not None:
            # the step's own slowdown beside the data path: measured, not a wait, but a part
            # of the epoch the bar splits (issue 57: a bar of 3.27 s for a 5.76 s epoch)
            segs.append(("interference (model step beside the data path)",
                         a.interference_s, None))
        if a.basis == "steady state" and _num(a.startup_cost_s) is not None:
            iv = a.startup_cost_interval
            segs.append(("start-up (beyond the steady rate)", a.startup_cost_s,
                         _pair(iv) if iv else None))
        return segs, "attributed"
    reps = v.repeats
    compute = finite_median((r.compute_s for r in reps), None)
    wait = finite_median((r.wait_s for r in reps), None)
    transfer = finite_median((r.trainer_transfer_s for r in reps), None)
    epoch = finite_median((r.epoch_s for r in reps), None)
    if compute is None or epoch is None:
        return [], ""
    segs = [("compute", compute, None), ("wait for a batch", wait or 0.0, None),
            ("transfer (trainer side)", transfer or 0.0, None)]
    other = epoch - compute - (wait or 0.0) - (transfer or 0.0)
    if other > 0.005 * epoch:
        segs.append(("other", other, None))
    return segs, "measured"


def _attribution_notes(a: Attribution, printed: bool = False) -> list[str]:
    """The attribution's caveats beside its row. ``printed``: a profile's, whose interference
    and wait bound the one printer already writes (``profile_lines``, shown on the page as
    the terminal printed it): not said twice."""
    notes = []
    if _num(a.closure_error) is not None and abs(a.closure_error) > 0.05:
        notes.append("the parts differ from the median epoch by "
                     + figures.signed_percent(a.closure_error, 0))
    if not a.conclusive:
        notes.append("inconclusive" + (f" ({a.inconclusive_because.replace('_', ' ')})"
                                       if a.inconclusive_because else ""))
    if a.negative_parts:
        notes.append("came out below 0, shown as 0: " + ", ".join(a.negative_parts))
    if a.interference_s is not None and not printed:
        notes.append(f"interference {a.interference_s:.2f} s: the model step took longer beside "
                     "the data path than served from memory (measured; not a wait)")
    if a.wait_bound_speedup is not None and math.isfinite(a.wait_bound_speedup) and not printed:
        notes.append(f"removing every wait gives at most {a.wait_bound_speedup:.2f}x")
    return notes


def _profile_notes(v: VariantResult) -> list[str]:
    """``stallbench profile --analyze``: how the parts were made on the user's job (served
    from memory). What the compute-only run kept, the recording budget, where the copy to a
    device is counted and the ablations it could not do are the profile's text, printed once
    (``profile_lines.analysis_lines``) and shown on the page as the terminal printed it."""
    an = v.profile.analysis if v.profile is not None else None
    if an is None or v.attribution is None:
        return []
    return [f"by replay on the job: {an.method}"]


def _printed(v: VariantResult) -> bool:
    """The variant's attribution is in the profile's text (``profile_lines.lines``)."""
    return v.profile is not None and v.profile.analysis is not None


def _timeline_stats(tl: Timeline) -> list[tuple[str, str]]:
    wait = [float(x) for x in tl.wait_s if _num(x) is not None]
    if not wait:
        return []
    tr = [float(x) for x in tl.transfer_s if _num(x) is not None]
    comp = [float(x) for x in tl.compute_s if _num(x) is not None]
    total = sum(wait) + sum(tr) + sum(comp)
    srt = sorted(wait)
    device = []
    h2d = [float(x) for x in tl.h2d_ms or [] if _num(x) is not None]
    if h2d:
        device.append(("H2D copy per batch, median (CUDA events)",
                       format_s(statistics.median(h2d) / 1e3)))
    gpu = [float(x) for x in tl.gpu_step_ms or [] if _num(x) is not None]
    if gpu:
        device.append(("GPU step per batch, median (CUDA events)",
                       format_s(statistics.median(gpu) / 1e3)))
    return device + [("batches", f"{len(wait)}"),
            ("waiting for a batch", f"{format_s(sum(wait))} ({format_pct(sum(wait) / total) if total else '—'})"),
            ("trainer-side transfer", format_s(sum(tr))),
            ("computing", f"{format_s(sum(comp))} ({format_pct(sum(comp) / total) if total else '—'})"),
            ("first batch wait", format_s(wait[0])),
            ("wait per batch, median / p95",
             f"{format_s(statistics.median(srt))} / {format_s(srt[min(len(srt) - 1, int(0.95 * len(srt)))])}")]


def _finite(xs: Iterable[Any]) -> list[float]:
    return [float(x) for x in xs if _num(x) is not None]


def _resource_stats(res: Resources) -> list[tuple[str, str]]:
    out = []
    cores = res.cpu_percent_per_core
    for i, c in enumerate(cores if len(cores) <= 8 else []):
        vals = _finite(c)
        if vals:
            out.append((f"CPU core {i}, mean / peak", f"{statistics.fmean(vals):.0f}% / {max(vals):.0f}%"))
    if len(cores) > 8:
        means = [statistics.fmean(vals) for vals in map(_finite, cores) if vals]
        if means:
            out.append((f"CPU mean over {len(means)} cores", f"{statistics.fmean(means):.0f}%"))
    pss = _finite(res.pss_mb)
    if pss:
        out.append(("memory (PSS) peak", format_mb(max(pss))))
    store = _finite(res.object_store_mb or [])
    if store:
        out.append(("object store peak", format_mb(max(store))))
    gpu = [x for sample in res.gpu_util_percent or [] for x in _finite(sample)]
    if gpu:
        out.append(("GPU util mean", f"{statistics.fmean(gpu):.0f}%"))
    gmem = [sum(_finite(sample)) for sample in res.gpu_memory_mb or []]
    if gmem:
        out.append(("GPU memory used, peak (NVML)", format_mb(max(gmem))))
    return out


def _device_rows(variants: list[VariantResult]) -> list[dict[str, Any]]:
    """The host -> device copies of variants whose batches went to an accelerator."""
    rows = []
    for v in variants:
        d = v.device
        if d is None or d.h2d_gb_s is None:
            continue
        steady = steady_au_view(v)
        rows.append({"name": v.name, "device": d.device, "au": d.au.median,
                     "au_pass": _num(d.au.median) is not None and d.au.median >= AU_PASS,
                     "steady_au": steady,
                     "steady_pass": steady.value is not None and steady.value >= AU_PASS,
                     "step_ms": d.step_ms.median, "h2d_ms": d.h2d_ms.median if d.h2d_ms else None,
                     "h2d_mb": (d.h2d_bytes_per_batch / 1e6
                                if d.h2d_bytes_per_batch is not None else None),
                     "gb_s": d.h2d_gb_s.median, "preload": d.device_prefetch,
                     "host_memory": d.host_memory})
    return rows


@dataclass
class SteadyAu:
    """A variant's steady AU as the report shows it: the measured figure with the window it
    covers, or "not measured" with the reason (no device clock in the result, or no run with
    a steady window). Never derived here: the figure is the result's ``device.steady_au``."""

    value: float | None
    text: str                       # "88%" or "not measured"
    window: str                     # "over 1.20 s after 310 ms start-up", or why not, short
    why: str = ""                   # the result's own reason, in full (the cell's tooltip)


def steady_au_view(v: VariantResult) -> SteadyAu:
    d = v.device
    if d is None:
        return SteadyAu(None, "not measured", "no device clock in this result")
    value = _num(d.steady_au.median) if d.steady_au is not None else None
    if value is None:
        reasons = [r.phases.no_steady_reason for r in v.repeats
                   if r.phases is not None and r.phases.no_steady_reason]
        return SteadyAu(None, "not measured", "no steady window",
                        reasons[0] if reasons else "no run had a steady window")
    ph = v.phases
    if ph is not None and _num(ph.steady_s.median) is not None:
        steady_s, startup_s = (format_s(x).replace(" ", NBSP)       # a value never breaks
                               for x in (ph.steady_s.median, ph.startup_s.median))
        window = f"over {steady_s} after {startup_s} start-up"
    else:
        window = "over the steady window"
    n = len(d.steady_au.values) if d.steady_au is not None else 0
    if n and n < len(v.repeats):
        window += f" ({n} of {len(v.repeats)} runs had one)"
    return SteadyAu(value, format_pct(value), window)


def _au_note(variants: list[VariantResult]) -> str:
    kinds = list(dict.fromkeys(v.device.compute_kind for v in variants if v.device))
    return "; ".join(au_label(k) for k in kinds)


def bound_label(a: Attribution | None, v: VariantResult | None = None) -> str:
    """What a "bound by" tile or cell says, as ``analysis`` decided it: the bound part by the
    job's own name on a profile ("dataset __iter__"), "inconclusive" where the attribution
    did not conclude (its parts withheld, said so), "" without an attribution (issue 57: a
    "BOUND BY fetch" tile stood where the terminal said "inconclusive ... parts withheld")."""
    if a is None:
        return ""
    if not a.conclusive:
        lean = ("" if a.bound_by == "compute" else
                f", leaning {_part_label(a.bound_by, v)}")
        return f"inconclusive{lean}" + ("; parts withheld" if figures.withheld(a) else "")
    return _part_label(a.bound_by, v)


def _part_label(part: str, v: VariantResult | None) -> str:
    on_job = v is not None and v.profile is not None
    stage_map = v.profile.analysis.stage_map if on_job and v.profile.analysis else None
    return part if part == "compute" else figures.part_name(part, on_job, stage_map)


def _knee_lines(r: Result) -> list[str]:
    """A profile's knee and recommendation lines as the one printer writes them (issue 57:
    "Knee at 2 workers: 2 worker(s) remove the data stall" stood under "No what-if curve"
    where the terminal said "not predicted"); [] for a scenario's result (its knee is the
    model's, drawn and explained by the what-if card)."""
    if r.profile is None or r.tune is not None:
        return []
    return [x.strip() for x in profile_lines.knee_lines(r)
            if x.strip().startswith(("knee:", "recommendation:"))]


def _next_step(text: str) -> str:
    """A recommendation as the verdict card's "Next step" says it: the terminal's line
    without its own label ("Next step: recommendation: ..." said it twice)."""
    return text.split(": ", 1)[1] if text.startswith("recommendation: ") else text


def _headline(r: Result) -> Headline:
    a = r.analysis
    names = [v.name for v in r.variants]
    base = a.baseline_variant if a.baseline_variant in names else (names[0] if names else None)

    def tput(name: str | None) -> float | None:
        return _num(r.variant(name).throughput_samples_s.median) if name else None

    best = a.best_variant if a.best_variant in names else None
    derived = False
    if best is None and names:
        ranked = [n for n in names if tput(n) is not None]
        best = max(ranked, key=lambda n: tput(n) or 0.0) if ranked else None
        derived = True
    speedup = _num(a.best_speedup)
    if speedup is None and best and base and tput(best) and tput(base):
        speedup = (tput(best) or 0.0) / (tput(base) or 1.0)
        derived = True
    bv = r.variant(base) if base else None
    ba = bv.attribution if bv else None
    best_a = r.variant(best).attribution if best else None
    steady = None
    if bv is not None and best:
        b_ph, t_ph = bv.phases, r.variant(best).phases
        if b_ph is not None and t_ph is not None:
            x, y = _num(b_ph.steady_samples_s.median), _num(t_ph.steady_samples_s.median)
            steady = y / x if x and y else None
    # a profile's verdict is its attribution's, as the terminal printed it; its
    # recommendation is the "Next step" (``analysis.verdict`` holds that line again)
    profiled = r.profile is not None
    verdict = ((ba.verdict if ba else "") if profiled else
               a.verdict or (ba.verdict if ba else ""))
    return Headline(
        verdict=verdict, bound_label=bound_label(ba, bv),
        baseline=base, best=best, speedup=speedup, derived=derived,
        bound_by=ba.bound_by if ba else None, best_bound_by=best_a.bound_by if best_a else None,
        stall_share=_num(bv.stall_share.median) if bv else None,
        attributed_stall_share=(_num(ba.attributed_stall_share)
                                if ba and not figures.withheld(ba) else None),
        baseline_tput=tput(base), best_tput=tput(best),
        recommendation=_next_step(a.recommendation.text) if a.recommendation else "",
        busy=busy_summary(r), steady_speedup=steady,
        wait_split=_wait_split(bv) if bv is not None else "")


def _wait_split(v: VariantResult) -> str:
    from ..analysis.waits import wait_headline

    line = wait_headline(v)
    return line.split(": ", 1)[1] if "in start-up" in line else ""


def _stage_rate_rows(variants: list[VariantResult]) -> list[tuple[str, list[str]]]:
    """Every measured stage rate (and the trainer's solo probe) as (name, value per variant);
    figures no variant measured are left out."""
    rows = []
    for f in dataclasses.fields(results.StageRates):
        vals = [getattr(v.stage_rates, f.name) for v in variants]
        if any(_num(x) is not None for x in vals):
            rows.append((f.name, [format_rate(x) for x in vals]))
    for f in dataclasses.fields(results.TrainerSolo):
        vals = [getattr(v.trainer_solo, f.name) if v.trainer_solo else None for v in variants]
        if any(_num(x) is not None for x in vals):
            rows.append((f"trainer_solo.{f.name}", [format_us(x) for x in vals]))
    return rows


def _whatif_rows(wi: WhatIfValidation) -> list[dict[str, Any]]:
    """Prediction table rows: each PREDICTED point with the measured check at its n, then
    measured checks at an n the curve does not cover."""
    measured_by_n: dict[int, WhatIfCheck] = {m.n: m for m in wi.measured}
    loo = {p.n: p for p in wi.backtest.points} if wi.backtest else {}
    rows: list[dict[str, Any]] = []
    for p in wi.points:
        rows.append({"n": p.n, "predicted_samples_s": p.predicted_samples_s,
                     "low": p.low_samples_s, "high": p.high_samples_s, "model": p.model,
                     "stall_share": p.stall_share, "bound_by": p.bound_by,
                     # issue 39: the back-test does not vouch for it: no figure, the reason
                     "why": f"not predicted ({p.not_predicted})" if p.not_predicted else p.why,
                     "not_predicted": p.not_predicted,
                     "measured": measured_by_n.pop(p.n, None), "backtest": loo.pop(p.n, None)})
    for n, m in measured_by_n.items():
        rows.append({"n": n, "predicted_samples_s": m.predicted_samples_s, "stall_share": None,
                     "low": None, "high": None, "model": m.model,
                     "bound_by": m.bound_by or None, "why": "", "not_predicted": "", "measured": m,
                     "backtest": loo.pop(n, None)})
    return rows


def _build_run(r: Result, path: Path, label: str, color: str, anchor: str) -> RunView:
    head = _headline(r)
    views: list[VariantView] = []
    for v in r.variants:
        segs, kind = _variant_split(v)
        a = v.attribution
        vv = VariantView(v=v, name=v.name, knobs=format_value(v.knobs) if v.knobs else "(base config)",
                         is_baseline=v.name == head.baseline, is_best=v.name == head.best,
                         attribution=a, segments=segs, split_kind=kind,
                         attribution_notes=(_attribution_notes(a, _printed(v)) if a else [])
                         + _profile_notes(v), bound_label=bound_label(a, v),
                         withheld=figures.withheld(a))
        vv.timeline_fig = _draw(plots.timeline, v.timeline, alt=f"per-batch timeline of {v.name}",
                                missing="No per-batch timeline in this result for this variant.")
        vv.resources_fig = _draw(plots.resources, v.resources, alt=f"resources of {v.name}",
                                 missing="No resource samples in this result for this variant.")
        vv.steady_au = steady_au_view(v)
        vv.timeline_stats = _timeline_stats(v.timeline)
        vv.resource_stats = _resource_stats(v.resources)
        if v.ranks is not None:
            vv.ranks_fig = _draw(plots.ranks, v.ranks, alt=f"per-rank figures of {v.name}",
                                 missing="No per-rank figures in this result for this variant.")
        views.append(vv)

    rows = []
    for vv in views:
        ep = vv.v.epoch_s
        rows.append({"name": vv.name, "segments": vv.segments,
                     "total_range": (ep.min, ep.max) if vv.split_kind == "measured" else None})
    breakdown = _draw(plots.epoch_breakdown, rows, alt="epoch time per variant",
                      missing="No epoch split in this result.")
    tp = _draw(plots.throughput, [v.name for v in r.variants],
               [{"label": label, "values": {v.name: v.throughput_samples_s.values for v in r.variants}}],
               alt="throughput per variant", missing="No throughput figures in this result.")

    wi = r.analysis.whatif
    no_whatif = ("No what-if prediction in this result (it needs variants that differ only in "
                 "their worker or node count).")
    if wi is not None:
        bt = wi.backtest
        band = (f"{bt.interval_level:.0%} prediction interval (back-test)"
                if bt and bt.interval_level else "prediction interval (back-test)")
        withheld = bool(wi.points) and all(p.not_predicted for p in wi.points)
        wi_fig = _draw(plots.whatif, wi.points, wi.measured, wi.knee, wi.axis or "workers", band,
                       alt="what-if: predicted throughput",
                       missing=("No what-if curve: the back-test vouches for no prediction "
                                "(the table below says why)." if withheld else no_whatif))
    else:
        wi_fig = Figure(None, "what-if: predicted throughput", no_whatif)

    emulated: dict[str, list[str]] = {}
    for v in r.variants:
        for key in v.emulated:
            emulated.setdefault(key, []).append(v.name)
    emu_rows = []
    for key, vnames in emulated.items():
        vals = {format_value(_dig(v.config, key)) for v in r.variants if v.name in vnames}
        vals.discard("—")
        meaning = EMULATED_MEANING.get(key, "emulated, not measured on real hardware")
        emu_rows.append({"key": key, "meaning": meaning,
                         "variants": "all variants" if len(vnames) == len(r.variants) else ", ".join(vnames),
                         "value": ", ".join(sorted(vals))})
    attributions = [v.attribution for v in r.variants if v.attribution is not None]
    predicted = []
    if wi is not None and wi.points:
        predicted.append(f"The what-if curve over {wi.axis or 'workers'} is a model fed with the "
                         "measured per-producer stage rates; only the diamond points were measured.")
    if attributions:
        predicted.append("“Ideal speedup” per variant is what removing the bounding stage's attributed "
                         "stall would give: predicted, not measured.")
        methods = sorted({a.method for a in attributions if a.method})
        intervals = sorted({a.interval for a in attributions if a.interval})
        predicted.append("The attributed stall per stage (" + (", ".join(methods) or "ablations")
                         + ") is derived from ablation runs, as differences of their epochs"
                         + (f"; intervals are {', '.join(intervals)}" if intervals else "") + ".")
    tune_fig = None
    if r.tune is not None:
        tune_fig = _draw(plots.tune_search, r.tune.trials, r.tune.ceiling_samples_s,
                         r.tune.best.name if r.tune.best else None,
                         alt="tune: each trial's steady rate against the compute-only ceiling",
                         missing="No trial of this tune measured a rate.")
    return RunView(result=r, path=path, label=label, color=color, variants=views, headline=head,
                   tune_fig=tune_fig,
                   terminal_lines=profile_lines.text(r) if r.profile is not None else [],
                   knee_lines=_knee_lines(r),
                   breakdown_fig=breakdown, throughput_fig=tp, whatif_fig=wi_fig,
                   whatif=wi, whatif_rows=_whatif_rows(wi) if wi is not None else [],
                   stage_rates=_stage_rate_rows(r.variants),
                   measured_lines=[figures.measured_line(v) for v in r.variants
                                   if v.repeats and v.repeats[0].samples],
                   emulated=emu_rows, predicted=predicted, anchor=anchor,
                   emulated_uniform=len({tuple(sorted(v.emulated)) for v in r.variants}) <= 1,
                   has_ranks=any(v.ranks is not None for v in r.variants),
                   device_rows=_device_rows(r.variants), au_note=_au_note(r.variants),
                   has_inside=any(vv.timeline_fig.png or vv.resources_fig.png or vv.timeline_fig.error
                                  or vv.resources_fig.error for vv in views))


def _commit(machine: MachineInfo) -> str:
    git = machine.git
    if git is None or not git.commit:
        return ""
    return git.commit[:7] + ("-dirty" if git.dirty else "")


def _run_labels(loaded: Sequence[tuple[Path, Result]]) -> list[str]:
    parents = {p.resolve().parent.name for p, _ in loaded}
    labels = []
    for p, r in loaded:
        try:
            when = datetime.fromisoformat(r.created_utc).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")
        except (TypeError, ValueError):
            when = str(r.created_utc)
        commit = _commit(r.machine)
        label = when + (f" @{commit}" if commit else "")
        if len(parents) > 1:
            label = f"{p.resolve().parent.name}: {label}"
        labels.append(label)
    for i, lab in enumerate(labels):
        if labels.count(lab) > 1:
            labels[i] = f"{lab} ({loaded[i][0].name})"
    return labels


def _shown_path(p: Path) -> str:
    """A result path as the user would type it: relative to the working directory if inside."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(p)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s).strip("-").lower() or "scenario"


THROUGHPUT = comparing.METRICS["throughput"]
# The rule, in words, for the page (numbers from the module that applies it).
COMPARE_RULE = {"threshold": comparing.DEFAULT_THRESHOLD, "alpha": comparing.DEFAULT_ALPHA,
                "min_repeats": comparing.MIN_REPEATS}


def _compare_note(c: comparing.Comparison) -> str:
    if c.verdict in (comparing.NOT_COMPARABLE, comparing.BUSY, comparing.TOO_FEW):
        return c.note
    if c.verdict == comparing.SAME:
        return f"change within ±{comparing.DEFAULT_THRESHOLD:.0%}"
    if c.test == "mann-whitney":
        return f"Mann-Whitney p = {c.p_value:.2g}" if c.p_value is not None else "Mann-Whitney"
    if c.test == "ci-overlap":   # significant exactly when the intervals are apart
        return (f"{(1 - comparing.DEFAULT_ALPHA) * 100:.0f}% t-intervals "
                + ("overlap" if c.verdict == comparing.INCONCLUSIVE else "apart"))
    return c.note


def _compare(runs: list[RunView]) -> dict[str, Any]:
    """Side-by-side numbers of several runs of one scenario (oldest first). The change and the
    verdict compare the oldest run with the newest, by ``stallbench.gate.rule`` (the gate's rule)."""
    names: list[str] = []
    for run in runs:
        for v in run.result.variants:
            if v.name not in names:
                names.append(v.name)
    rows = []
    for name in names:
        cells = []
        summaries = []
        loads = []
        for run in runs:
            try:
                s = run.result.variant(name).throughput_samples_s
            except KeyError:
                cells.append(None)
                summaries.append(None)
                loads.append([])
                continue
            cells.append({"median": s.median, "min": s.min, "max": s.max, "n": len(s.values)})
            summaries.append(s)
            loads.append([f.load for f in run.result.variant(name).repeats])
        first, last = summaries[0], summaries[-1]
        delta, verdict, note = None, "", ""
        if first is not None and last is not None:
            c = comparing.under_load(
                comparing.compare(_finite(first.values), _finite(last.values), THROUGHPUT),
                loads[0], loads[-1])
            verdict, note = c.verdict, _compare_note(c)
            if _num(c.change) is not None:
                delta = c.change - 1
            elif _num(first.median) and _num(last.median) is not None:
                delta = last.median / first.median - 1
        elif len(runs) > 1:
            verdict, note = comparing.NOT_COMPARABLE, "not run in " + (
                "the oldest run" if first is None else "the newest run")
        rows.append({"name": name, "cells": cells, "delta": delta, "verdict": verdict, "note": note})
    fig = _draw(plots.throughput, names,
                [{"label": run.label,
                  "values": {v.name: v.throughput_samples_s.values for v in run.result.variants}}
                 for run in runs],
                alt="throughput per variant across runs", missing="No throughput figures to compare.")
    fps = {run.result.scenario.fingerprint for run in runs}
    shas = {run.result.scenario.sha256 for run in runs}
    machines = {comparing.machine_key(run.result.machine) for run in runs}   # the gate's criterion
    warnings = []
    if len(fps) > 1:
        warnings.append("The scenario fingerprints differ: these runs measured different work and are "
                        "not strictly comparable.")
    elif len(shas) > 1:
        warnings.append("The scenario text differs (comments or description only; same fingerprint).")
    if len(machines) > 1:
        warnings.append("The runs come from different machines (CPU model or core count): "
                        "differences may be the machine. This page compares absolute throughput; "
                        "stallbench gate compares such runs by within-run ratios instead.")
    return {"rows": rows, "fig": fig, "warnings": warnings, "rule": COMPARE_RULE}


def _machine_items(m: MachineInfo) -> list[tuple[str, str]]:
    """Every field of the machine description, in schema order, formatted for a table."""
    items: list[tuple[str, str]] = []
    for f in dataclasses.fields(m):
        x = getattr(m, f.name)
        if f.name == "libraries":
            items.extend((f"library {k}", format_value(v)) for k, v in x.items())
        elif f.name == "git":
            items.append(("git", _commit(m) or "—"))
        elif f.name == "gpu":
            items.append(("gpu", ", ".join(f"{g.name} ({format_mb(g.memory_mb)})" for g in x)
                          if x else "none"))
        else:
            items.append((f.name, format_value(x)))
    return items


def _machine_table(runs: list[RunView]) -> list[dict[str, Any]]:
    keys: list[str] = []
    flat = []
    for run in runs:
        d = dict(_machine_items(run.result.machine))
        d["result created"] = str(run.result.created_utc)
        d["stallbench"] = format_value(run.result.tool.version)
        flat.append(d)
        for k in d:
            if k not in keys:
                keys.append(k)
    return [{"key": k, "values": [d.get(k, "—") for d in flat],
             "differs": len({d.get(k, "—") for d in flat}) > 1} for k in keys]


def _settings_rows(r: Result) -> list[tuple[str, Any]]:
    """The run's settings; its command on one line (a profiled job's argument may hold a
    newline, and a line of the page starting with '::' is a CI runner's command)."""
    from ..outputs import one_line
    return [(k, "stallbench " + one_line(" ".join(map(str, v)))
             if k == "argv" and isinstance(v, list) else v)
            for k, v in _flatten(dataclasses.asdict(r.settings))]


def _dataset_rows(d: DatasetInfo) -> list[tuple[str, Any]]:
    """What the result holds about its dataset: a count of 0, "no" and an empty value are what a
    result that never described its dataset holds (a profile result: the job's own loaders,
    no files, rows or bytes measured), not figures, so they are left out; none left, the
    section is absent (issue 42: a "Dataset" card of zeros)."""
    return [(k, v) for k, v in _flatten(dataclasses.asdict(d))
            if v is not None and v != "" and v is not False
            and not (isinstance(v, (int, float)) and v == 0)]


def _scenario_view(name: str, loaded: list[tuple[Path, Result]], index: int) -> dict[str, Any]:
    loaded = sorted(loaded, key=lambda pr: (str(pr[1].created_utc), str(pr[0])))
    labels = _run_labels(loaded)
    colors = ([plots.RUN_COLORS[1]] if len(loaded) == 1
              else [plots.RUN_COLORS[i % len(plots.RUN_COLORS)] for i in range(len(loaded))])
    slug = f"s{index}-{_slug(name)}"
    runs = [_build_run(r, Path(_shown_path(p)), lab, col, f"{slug}-run{i}")
            for i, ((p, r), lab, col) in enumerate(zip(loaded, labels, colors))]
    primary = runs[-1]
    sc = primary.result.scenario
    meta = [("path", sc.path), ("fingerprint", sc.fingerprint),
            ("sha256", sc.sha256[:16] + "…" if sc.sha256 else ""), ("matrix", sc.matrix)]
    dataset = primary.result.dataset
    return {
        "name": name, "anchor": slug, "runs": runs, "primary": primary,
        "older": runs[:-1][::-1],
        "compare": _compare(runs) if len(runs) > 1 else None,
        "history": history_view(loaded, _draw),
        "machine": _machine_table(runs),
        "machine_missing": all(run.result.machine == MachineInfo() for run in runs),
        "settings": _settings_rows(primary.result),
        "dataset": _dataset_rows(dataset),
        "text": sc.text,
        "scenario_meta": [(k, v if k == "sha256" else format_value(v)) for k, v in meta if v],
        "description": sc.description,
    }


def threads_text(v: VariantResult) -> str:
    """The thread budget the variant ran with (``ThreadBudget``, as resolved), beside the
    throughput it explains: two runs of one job differ by 10x with another budget (issue 42)."""
    t = v.threads
    if t is None:
        return "—"
    torch_n = "" if t.trainer_torch_threads is None else f"torch {t.trainer_torch_threads}"
    if v.executor.kind == "profile":
        # read inside the user's job: torch's threads in its process and in its loader
        # workers (the job's pyarrow pool is not read, so it is not shown)
        work = ("no loader workers" if not t.local_producers
                else f"{t.local_producers} loader worker{'s' if t.local_producers != 1 else ''}"
                     + ("" if t.producer_threads is None else f" × torch {t.producer_threads}"))
        return " · ".join(x for x in (f"job {torch_n}" if torch_n else "", work,
                                      f"{t.cores} cores") if x)
    arrow = "library default" if t.trainer_threads is None else str(t.trainer_threads)
    prod = ("—" if t.producer_threads is None
            else f"{t.producer_threads} × {t.local_producers} producer"
                 f"{'s' if t.local_producers != 1 else ''}")
    trainer = f"arrow {arrow}" + (f", {torch_n}" if torch_n else "")
    return f"trainer {trainer} · producers {prod} · {t.cores} cores"


def busy_text(v: VariantResult) -> str:
    """The machine's busy share while the variant's runs ran: cores other processes took
    (``ForeignLoad.foreign_cores``, median over repeats) of the machine's, beside the figures
    a busy machine slows."""
    loads = [f.load for f in v.repeats if f.load is not None and f.load.cores > 0]
    if not loads:
        return "—"
    taken = statistics.median(ld.foreign_cores + (ld.steal_cores or 0.0) for ld in loads)
    return f"{taken:.2f} of {loads[0].cores:g} cores ({figures.share(taken / loads[0].cores)})"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html"]), extensions=["jinja2.ext.do"],
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(rate=format_rate, secs=format_s, pct=format_pct, times=format_x, mb=format_mb,
                       bytes=format_bytes, interval=format_interval, value=format_value, us=format_us,
                       signed_pct=format_signed_pct)
    env.globals["stage_color"] = plots.STAGE_COLORS
    env.globals.update(threads_text=threads_text, busy_text=busy_text, part_name=figures.part_name,
                       data_ideal=figures.data_ideal_speedup)
    env.globals["zero_note"] = ZERO_NOTE
    env.tests["spanning_zero"] = spans_zero
    return env


def render(result_paths: Sequence[str | Path], out: str | Path) -> Path:
    """Render the given result files into one HTML file at ``out``; returns ``out``.

    Raises ``ResultError`` for a missing or malformed result file and ``UserError`` when no
    file is given. Several results of one scenario are shown side by side.
    """
    paths = [Path(p) for p in result_paths]
    if not paths:
        raise UserError("no result files to report on")
    loaded = [(p, results.load(p)) for p in paths]
    groups: dict[str, list[tuple[Path, Result]]] = {}
    for p, r in loaded:
        groups.setdefault(r.scenario.name or p.stem, []).append((p, r))
    scenarios = [_scenario_view(name, runs, i) for i, (name, runs) in enumerate(groups.items())]
    version = next((r.tool.version for _, r in loaded if r.tool.version), "")
    html = _environment().get_template("report.html").render(
        scenarios=scenarios,
        files=[_shown_path(p) for p in paths],
        generated_utc=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=version,
    )
    from .. import outputs

    # A profiled command's argv bytes that were not UTF-8 are kept in the result as lone
    # surrogates (so they round-trip, issue 38 class 9); in the page they read as ``\udcNN``.
    html = html.encode("utf-8", "backslashreplace").decode("utf-8")
    return outputs.write_file(Path(out), html, outputs.REPORT, "-o")
