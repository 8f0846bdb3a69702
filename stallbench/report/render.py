"""Render result files into one self-contained HTML page.

``render(paths, out)`` loads every result (a bad file raises ``ResultError``), groups them by
scenario name, draws the figures (``plots``) and fills ``templates/report.html``. The page has
no external reference at all: figures are base64 data URIs, the CSS is inlined, fonts are the
system's. Sections whose data a result does not carry (no analysis, no what-if, no timeline...)
render as one muted line instead of failing.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jinja2

from .. import results
from ..errors import UserError
from ..results import Result, VariantResult
from . import plots

TEMPLATES = Path(__file__).parent / "templates"
STAGES = ("fetch", "preprocess", "transfer")

# What each emulation knob means for the figures that depend on it.
EMULATED_MEANING = {
    "storage.bandwidth_mb_s": "remote storage bandwidth is a throttle on local reads, not a real network",
    "storage.latency_ms": "per-request storage latency is an injected sleep",
    "loader.wire_bandwidth_mb_s": "the producer-to-trainer link is throttled, not a real second node",
    "model.step_ms": "the model step is a fixed-length busy loop, not a real model",
    "preprocess.cpu_cost_us_per_row": "part of the preprocessing is a calibrated busy CPU cost per row",
    "executor.simulated_nodes": "the nodes are simulated Ray nodes on this one machine",
}


# ------------------------------------------------------------------------------- formatting

def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def fmt_rate(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def fmt_s(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—"
    if v == 0:
        return "0 s"
    if abs(v) < 0.01:
        return f"{v * 1e3:.2f} ms"
    if abs(v) < 1:
        return f"{v * 1e3:.0f} ms"
    return f"{v:.2f} s"


def fmt_pct(x: Any) -> str:
    v = _num(x)
    return "—" if v is None else f"{v * 100:.0f}%"


def fmt_x(x: Any) -> str:
    v = _num(x)
    return "—" if v is None else f"{v:.2f}×"


def fmt_mb(x: Any) -> str:
    v = _num(x)
    return "—" if v is None else (f"{v:,.0f} MB" if v >= 100 else f"{v:.1f} MB")


def fmt_bytes(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(v) < 1024 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "—"  # pragma: no cover


def fmt_interval(iv: Any, fmt: Callable[[Any], str] = fmt_s) -> str:
    if isinstance(iv, (list, tuple)) and len(iv) == 2 and all(_num(v) is not None for v in iv):
        return f"{fmt(iv[0])} – {fmt(iv[1])}"
    return ""


def fmt_value(x: Any) -> str:
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
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in x.items()) or "—"
    if isinstance(x, (list, tuple)):
        return ", ".join(fmt_value(v) for v in x) or "—"
    return str(x)


def _median(vals: Iterable[Any]) -> float | None:
    xs = [float(v) for v in vals if _num(v) is not None]
    return statistics.median(xs) if xs else None


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


@dataclass
class VariantView:
    v: VariantResult
    name: str
    knobs: str
    is_baseline: bool
    is_best: bool
    a: dict[str, Any]                       # variant.analysis (may be empty)
    segments: list[tuple[str, float, Any]]  # epoch split for the stacked bar
    split_kind: str                         # "attributed" | "measured" | ""
    timeline_fig: Figure | None = None
    resources_fig: Figure | None = None
    timeline_stats: list[tuple[str, str]] = field(default_factory=list)
    resource_stats: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class RunView:
    result: Result
    path: Path
    label: str
    color: str
    variants: list[VariantView]
    headline: dict[str, Any]
    breakdown_fig: Figure
    throughput_fig: Figure
    whatif_fig: Figure
    whatif: dict[str, Any]
    emulated: list[dict[str, Any]]
    predicted: list[str]
    anchor: str
    has_inside: bool = False
    emulated_uniform: bool = True   # every variant emulates the same knobs (no per-row badge)
    pss: bool = False               # memory figures are PSS sums (sampler), not RSS


def _variant_split(v: VariantResult) -> tuple[list[tuple[str, float, Any]], str]:
    a = v.analysis or {}
    iv = a.get("intervals") or {}
    if _num(a.get("compute_s")) is not None:
        segs = [("compute", float(a["compute_s"]), iv.get("compute_s"))]
        for st in STAGES:
            x = _num(a.get(f"{st}_stall_s"))
            segs.append((f"{st} stall", x if x is not None else 0.0, iv.get(f"{st}_stall_s")))
        if _num(a.get("overhead_s")) is not None:
            segs.append(("loader overhead", float(a["overhead_s"]), iv.get("overhead_s")))
        return segs, "attributed"
    reps = v.repeats
    compute = _median(r.compute_s for r in reps)
    wait = _median(r.wait_s for r in reps)
    transfer = _median(r.trainer_transfer_s for r in reps)
    epoch = _median(r.epoch_s for r in reps)
    if compute is None or epoch is None:
        return [], ""
    segs = [("compute", compute, None), ("wait", wait or 0.0, None),
            ("transfer (trainer side)", transfer or 0.0, None)]
    other = epoch - compute - (wait or 0.0) - (transfer or 0.0)
    if other > 0.005 * epoch:
        segs.append(("other", other, None))
    return segs, "measured"


def _timeline_stats(tl: dict[str, Any]) -> list[tuple[str, str]]:
    wait = [float(x) for x in tl.get("wait_s") or [] if _num(x) is not None]
    if not wait:
        return []
    tr = [float(x) for x in tl.get("transfer_s") or [] if _num(x) is not None]
    comp = [float(x) for x in tl.get("compute_s") or [] if _num(x) is not None]
    total = sum(wait) + sum(tr) + sum(comp)
    srt = sorted(wait)
    out = [("batches", f"{len(wait)}"),
           ("waiting", f"{fmt_s(sum(wait))} ({fmt_pct(sum(wait) / total) if total else '—'})"),
           ("trainer-side transfer", fmt_s(sum(tr))),
           ("computing", f"{fmt_s(sum(comp))} ({fmt_pct(sum(comp) / total) if total else '—'})"),
           ("first batch wait", fmt_s(wait[0])),
           ("wait per batch, median / p95",
            f"{fmt_s(statistics.median(srt))} / {fmt_s(srt[min(len(srt) - 1, int(0.95 * len(srt)))])}")]
    return out


def _resource_stats(res: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    cores = res.get("cpu_percent_per_core") or []
    for i, c in enumerate(cores if len(cores) <= 8 else []):
        vals = [float(x) for x in c if _num(x) is not None]
        if vals:
            out.append((f"CPU core {i}, mean / peak", f"{statistics.fmean(vals):.0f}% / {max(vals):.0f}%"))
    if len(cores) > 8:
        means = [statistics.fmean(vals) for vals in
                 ([float(x) for x in c if _num(x) is not None] for c in cores) if vals]
        if means:
            out.append((f"CPU mean over {len(means)} cores", f"{statistics.fmean(means):.0f}%"))
    rss_label = "memory (PSS) peak" if res.get("memory_metric") == "pss" else "RSS peak"
    for key, label, f in (("rss_mb", rss_label, fmt_mb), ("object_store_mb", "object store peak", fmt_mb),
                          ("gpu_util_percent", "GPU util mean", lambda x: f"{x:.0f}%")):
        vals = [float(x) for x in res.get(key) or [] if _num(x) is not None]
        if vals:
            out.append((label, f(statistics.fmean(vals) if key == "gpu_util_percent" else max(vals))))
    return out


def _headline(r: Result, variants: list[VariantResult]) -> dict[str, Any]:
    a = r.analysis or {}
    names = [v.name for v in variants]
    base = a.get("baseline_variant") if a.get("baseline_variant") in names else (names[0] if names else None)

    def tput(name: str | None) -> float | None:
        return _num(r.variant(name).throughput_samples_s.median) if name else None

    best = a.get("best_variant") if a.get("best_variant") in names else None
    derived = False
    if best is None and names:
        ranked = [n for n in names if tput(n) is not None]
        best = max(ranked, key=lambda n: tput(n)) if ranked else None
        derived = True
    speedup = _num(a.get("best_speedup"))
    if speedup is None and best and base and tput(best) and tput(base):
        speedup = tput(best) / tput(base)
        derived = True
    bv = r.variant(base).analysis if base else {}
    best_a = r.variant(best).analysis if best else {}
    stall_share = _num((bv or {}).get("stall_share"))
    if stall_share is None and base:
        stall_share = _num(r.variant(base).stall_share.median)
    return {
        "verdict": a.get("verdict") or (bv or {}).get("verdict"),
        "baseline": base, "best": best, "speedup": speedup, "derived": derived,
        "bound_by": (bv or {}).get("bound_by"), "best_bound_by": (best_a or {}).get("bound_by"),
        "stall_share": stall_share,
        "baseline_tput": tput(base), "best_tput": tput(best),
        "has_analysis": bool(a) or any(v.analysis for v in variants),
    }


def _build_run(r: Result, path: Path, label: str, color: str, anchor: str) -> RunView:
    head = _headline(r, r.variants)
    views: list[VariantView] = []
    for v in r.variants:
        segs, kind = _variant_split(v)
        vv = VariantView(v=v, name=v.name, knobs=fmt_value(v.knobs) if v.knobs else "(base config)",
                         is_baseline=v.name == head["baseline"], is_best=v.name == head["best"],
                         a=v.analysis or {}, segments=segs, split_kind=kind)
        vv.timeline_fig = _draw(plots.timeline, v.timeline or {}, alt=f"per-batch timeline of {v.name}",
                                missing="No per-batch timeline in this result for this variant.")
        vv.resources_fig = _draw(plots.resources, v.resources or {}, alt=f"resources of {v.name}",
                                 missing="No resource samples in this result for this variant.")
        vv.timeline_stats = _timeline_stats(v.timeline or {})
        vv.resource_stats = _resource_stats(v.resources or {})
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

    wi = (r.analysis or {}).get("whatif") or {}
    wi_fig = _draw(plots.whatif, wi.get("points") or [], wi.get("measured") or [], wi.get("knee"),
                   wi.get("axis") or "workers", alt="what-if: predicted throughput",
                   missing="No what-if prediction in this result (it needs variants that differ "
                           "only in their worker or node count).")
    measured_by_n = {m.get("n"): m for m in wi.get("measured") or [] if isinstance(m, dict)}
    wi_rows = []
    for p in wi.get("points") or []:
        if isinstance(p, dict):
            wi_rows.append({**p, "measured": measured_by_n.pop(p.get("n"), None)})
    for n, m in measured_by_n.items():  # measured at an n the curve does not cover
        wi_rows.append({"n": n, "predicted_samples_s": m.get("predicted_samples_s"), "measured": m})

    emulated: dict[str, list[str]] = {}
    for v in r.variants:
        for key in v.emulated or []:
            emulated.setdefault(key, []).append(v.name)
    emu_rows = []
    for key, vnames in emulated.items():
        vals = {fmt_value(_dig(v.config, key)) for v in r.variants if v.name in vnames}
        vals.discard("—")
        meaning = EMULATED_MEANING.get(key, "emulated, not measured on real hardware")
        emu_rows.append({"key": key, "meaning": meaning,
                         "variants": "all variants" if len(vnames) == len(r.variants) else ", ".join(vnames),
                         "value": ", ".join(sorted(vals))})
    predicted = []
    if wi.get("points"):
        predicted.append(f"The what-if curve over {wi.get('axis') or 'workers'} is a model fed with the "
                         "measured per-worker stage rates; only the diamond points were measured.")
    if any("ideal_speedup" in (v.analysis or {}) for v in r.variants):
        predicted.append("“Ideal speedup” per variant is what removing the bounding stage's stall would "
                         "give: predicted, not measured.")
    methods = {(v.analysis or {}).get("method") for v in r.variants} - {None}
    if methods:
        intervals = {(v.analysis or {}).get("interval") for v in r.variants} - {None}
        predicted.append("Stall attribution per stage (" + ", ".join(sorted(methods)) + ") is derived from "
                         "ablation runs"
                         + (f"; intervals are {', '.join(sorted(intervals))}" if intervals else "")
                         + ".")
    return RunView(result=r, path=path, label=label, color=color, variants=views, headline=head,
                   breakdown_fig=breakdown, throughput_fig=tp, whatif_fig=wi_fig,
                   whatif={**wi, "rows": wi_rows}, emulated=emu_rows, predicted=predicted,
                   anchor=anchor,
                   pss=any((v.resources or {}).get("memory_metric") == "pss" for v in r.variants),
                   emulated_uniform=len({tuple(sorted(v.emulated or [])) for v in r.variants}) <= 1,
                   has_inside=any(vv.timeline_fig.png or vv.resources_fig.png or vv.timeline_fig.error
                                  or vv.resources_fig.error for vv in views))


def _commit(machine: dict[str, Any]) -> str:
    git = machine.get("git_commit") or machine.get("git")
    if isinstance(git, dict):
        dirty = "-dirty" if git.get("dirty") else ""
        git = git.get("commit") or git.get("sha") or ""
        return str(git)[:7] + dirty if git else ""
    return str(git or "")


def _run_labels(loaded: Sequence[tuple[Path, Result]]) -> list[str]:
    parents = {p.resolve().parent.name for p, _ in loaded}
    labels = []
    for p, r in loaded:
        try:
            when = datetime.fromisoformat(r.created_utc).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")
        except (TypeError, ValueError):
            when = str(r.created_utc)
        commit = _commit(r.machine or {})
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


def _compare(runs: list[RunView]) -> dict[str, Any]:
    """Side-by-side numbers of several runs of one scenario (oldest first)."""
    names: list[str] = []
    for run in runs:
        for v in run.result.variants:
            if v.name not in names:
                names.append(v.name)
    rows = []
    for name in names:
        cells = []
        for run in runs:
            try:
                s = run.result.variant(name).throughput_samples_s
                cells.append({"median": s.median, "min": s.min, "max": s.max, "n": len(s.values)})
            except KeyError:
                cells.append(None)
        first, last = cells[0], cells[-1]
        delta, verdict = None, ""
        if first and last and _num(first["median"]) and _num(last["median"]):
            delta = last["median"] / first["median"] - 1
            lo_new, hi_new = _num(last["min"]), _num(last["max"])
            lo_old, hi_old = _num(first["min"]), _num(first["max"])
            if lo_new is not None and hi_old is not None and lo_new > hi_old:
                verdict = "faster"
            elif hi_new is not None and lo_old is not None and hi_new < lo_old:
                verdict = "slower"
            else:
                verdict = "within noise"
        rows.append({"name": name, "cells": cells, "delta": delta, "verdict": verdict})
    fig = _draw(plots.throughput, names,
                [{"label": run.label,
                  "values": {v.name: v.throughput_samples_s.values for v in run.result.variants}}
                 for run in runs],
                alt="throughput per variant across runs", missing="No throughput figures to compare.")
    fps = {str(run.result.scenario.get("fingerprint")) for run in runs}
    shas = {str(run.result.scenario.get("sha256")) for run in runs}
    machines = {(run.result.machine or {}).get("cpu_model") for run in runs}
    warnings = []
    if len(fps) > 1:
        warnings.append("The scenario fingerprints differ: these runs measured different work and are "
                        "not strictly comparable.")
    elif len(shas) > 1:
        warnings.append("The scenario text differs (comments or description only; same fingerprint).")
    if len(machines) > 1:
        warnings.append("The runs come from different CPUs: differences may be the machine.")
    return {"rows": rows, "fig": fig, "warnings": warnings}


def _machine_table(runs: list[RunView]) -> list[dict[str, Any]]:
    keys: list[str] = []
    flat = []
    for run in runs:
        m = dict(run.result.machine or {})
        libs = m.pop("libraries", {}) or {}
        items = [(k, v) for k, v in m.items()] + [(f"library {k}", v) for k, v in libs.items()]
        d = {k: fmt_value(v) for k, v in items}
        d["result created"] = str(run.result.created_utc)
        d["stallbench"] = fmt_value((run.result.tool or {}).get("version"))
        flat.append(d)
        for k in d:
            if k not in keys:
                keys.append(k)
    return [{"key": k, "values": [d.get(k, "—") for d in flat],
             "differs": len({d.get(k, "—") for d in flat}) > 1} for k in keys]


def _scenario_view(name: str, loaded: list[tuple[Path, Result]], index: int) -> dict[str, Any]:
    loaded = sorted(loaded, key=lambda pr: (str(pr[1].created_utc), str(pr[0])))
    labels = _run_labels(loaded)
    colors = ([plots.RUN_COLORS[1]] if len(loaded) == 1
              else [plots.RUN_COLORS[i % len(plots.RUN_COLORS)] for i in range(len(loaded))])
    slug = f"s{index}-{_slug(name)}"
    runs = [_build_run(r, Path(_shown_path(p)), lab, col, f"{slug}-run{i}")
            for i, ((p, r), lab, col) in enumerate(zip(loaded, labels, colors))]
    primary = runs[-1]
    sc = primary.result.scenario or {}
    return {
        "name": name, "anchor": slug, "runs": runs, "primary": primary,
        "older": runs[:-1][::-1],
        "compare": _compare(runs) if len(runs) > 1 else None,
        "machine": _machine_table(runs),
        "machine_missing": all(not run.result.machine for run in runs),
        "settings": [(k, "stallbench " + " ".join(map(str, v)) if k == "argv" and isinstance(v, list) else v)
                     for k, v in _flatten(primary.result.settings)],
        "dataset": _flatten(primary.result.dataset),
        "text": sc.get("text") or "",
        "scenario_meta": [(k, fmt_value(sc.get(k)) if k != "sha256" else str(sc.get(k))[:16] + "…")
                          for k in ("path", "fingerprint", "sha256", "matrix")
                          if sc.get(k) not in (None, "", {})],
        "description": sc.get("description") or "",
    }


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html"]), extensions=["jinja2.ext.do"],
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(rate=fmt_rate, secs=fmt_s, pct=fmt_pct, times=fmt_x, mb=fmt_mb,
                       bytes=fmt_bytes, interval=fmt_interval, value=fmt_value)
    env.globals["stage_color"] = plots.STAGE_COLORS
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
        groups.setdefault(str((r.scenario or {}).get("name") or p.stem), []).append((p, r))
    scenarios = [_scenario_view(name, runs, i) for i, (name, runs) in enumerate(groups.items())]
    version = next((str(r.tool["version"]) for _, r in loaded
                    if isinstance(r.tool, dict) and r.tool.get("version")), "")
    html = _environment().get_template("report.html").render(
        scenarios=scenarios,
        files=[_shown_path(p) for p in paths],
        generated_utc=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=version,
    )
    out = Path(out)
    results.write_atomic(out, html)
    return out
