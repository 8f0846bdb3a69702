"""CI regression gate: fail a change that really slowed the pipeline, not one the noise slowed.

Rows
    One row per scenario / variant / metric. Baseline and current results are paired by scenario
    name (the newest result by ``created_utc`` when a side has several) and variants by name.

Metrics and the decision rule
    ``stallbench.gate.rule`` holds both (throughput, stall_share, peak_pss_mb; asv's threshold +
    significance rule): the report decides "faster"/"slower" with the same code, so a page and
    a CI log never disagree about the same repeats.

Cross-machine rule
    Absolute throughput from two different machines says nothing about the change. When the two
    results of a scenario come from different machines (``cpu_model`` or ``cores_logical``
    differ; override with ``machine="same"|"cross"``), every metric is taken *within the run*,
    relative to the scenario's reference variant (the baseline's first variant) in the same
    repeat: ``throughput_vs_<ref>`` = variant / reference throughput per repeat index,
    ``stall_share_vs_<ref>`` = variant - reference share, ``peak_pss_mb_vs_<ref>`` = ratio. Those
    figures are then compared with the same rule. The reference itself gets no row; a scenario
    with a single variant has nothing within-run to compare and is "not comparable".

Exit codes (``exit_code``)
    0 nothing regressed; 1 a row is slower (or faster, with ``fail_on_improvement``), or a
    change beyond the threshold in that direction that too few repeats can decide
    (``rule.TOO_FEW``: the rank test cannot reach alpha at these sizes). Bad input is
    raised as ``ResultError`` (exit 2): different schema versions, a scenario whose fingerprint
    differs between the sides, fewer than 2 repeats on either side of a compared variant (one
    repeat measures no spread, so noise cannot be told from change), or nothing comparable at
    all. A variant or scenario present on one side only is a "not comparable" row, not a failure.
    A slower/faster row whose repeats ran under heavy foreign CPU load is "busy machine"
    (``compare.under_load``): said, never failed on.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from .. import outputs
from . import metrics as metric_values
from . import rows
from .rows import GateReport, Row, gated_metrics, not_comparable
from .rule import (MIN_REPEATS, NOT_COMPARABLE, Metric, compare as compare_values, machine_key,
                   under_load)
from ..errors import ResultError, UserError
from ..results import Result, VariantResult, load

__all__ = ["compare", "machines_differ", "update_baseline"]


# ------------------------------------------------------------------------------ compare

def compare(
    baseline: Sequence[Result],
    current: Sequence[Result],
    *,
    threshold: float,
    alpha: float = 0.01,
    metrics: Iterable[str] = ("throughput", "stall_share", "attribution"),
    include_memory: bool = False,
    fail_on_improvement: bool = False,
    machine: str = "auto",
    n_boot: int = 2000,
    seed: int = 0,
    sources: dict[int, str] | None = None,
) -> GateReport:
    """Compare two result sets row by row with the module's decision rule.

    ``machine``: "auto" (cross-machine rule when the machines differ), "same" or "cross".
    ``n_boot`` only sizes the displayed bootstrap interval; decisions do not depend on it.
    ``sources``: ``id(result)`` -> its file, so bad input names the file. A figure the gate
    compares must be measured in every repeat: a null (NaN) value is bad input (ResultError),
    never a "not comparable" row that lets the gate pass.
    """
    chosen = gated_metrics(metrics, include_memory)
    _check_args(threshold, alpha, machine)
    if not baseline:
        raise ResultError("gate: no baseline results")
    if not current:
        raise ResultError("gate: no current results")
    base, cur = _newest_by_scenario(baseline), _newest_by_scenario(current)
    report = GateReport([], threshold, alpha, fail_on_improvement)
    ctx = _Ctx(threshold, alpha, n_boot, seed, dict(sources or {}))
    for name in list(base) + [n for n in cur if n not in base]:
        _compare_scenario(report, ctx, name, base.get(name), cur.get(name), chosen, machine)
    if not any(r.verdict != NOT_COMPARABLE for r in report.rows):
        why = "; ".join(report.notes) or "no scenario/variant present on both sides"
        raise ResultError(f"gate: nothing comparable between baseline and current ({why})")
    return report


@dataclass(frozen=True)
class _Ctx:
    threshold: float
    alpha: float
    n_boot: int
    seed: int
    sources: dict[int, str] = field(default_factory=dict)


def _check_args(threshold: float, alpha: float, machine: str) -> None:
    if not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
        raise UserError("gate: threshold must be between 0 and 100% (exclusive), "
                        f"got {threshold!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 0.5):
        raise UserError(f"gate: alpha must be between 0 and 0.5 (exclusive), got {alpha!r}")
    if machine not in ("auto", "same", "cross"):
        raise UserError(f"gate: machine must be auto, same or cross, got {machine!r}")


def _created(r: Result) -> datetime | str:
    try:
        return datetime.fromisoformat(r.created_utc)
    except (TypeError, ValueError):
        return str(r.created_utc)


def _newest_by_scenario(results: Sequence[Result]) -> dict[str, Result]:
    """One result per scenario name: the newest, so a results dir with history still works."""
    out: dict[str, Result] = {}
    for r in results:
        name = r.scenario.name
        if name not in out or _later(r, out[name]):
            out[name] = r
    return out


def _later(a: Result, b: Result) -> bool:
    ca, cb = _created(a), _created(b)
    if type(ca) is not type(cb):
        return str(a.created_utc) >= str(b.created_utc)
    try:
        return ca >= cb  # type: ignore[operator]
    except TypeError:  # naive vs aware datetimes
        return str(a.created_utc) >= str(b.created_utc)


def machines_differ(a: Result, b: Result) -> bool:
    """Different CPU model or logical core count: absolute throughput is not comparable."""
    return machine_key(a.machine) != machine_key(b.machine)


def _machine_label(r: Result) -> str:
    return f"{r.machine.cpu_model or '?'} x{r.machine.cores_logical or '?'}"


def _compare_scenario(report: GateReport, ctx: _Ctx, name: str, b: Result | None,
                      c: Result | None, metrics: list[Metric], machine: str) -> None:
    if b is None or c is None:
        side = "current" if c is None else "baseline"
        present = b or c
        assert present is not None
        report.rows.extend(not_comparable(name, v.name, m.name, f"scenario missing in {side}")
                           for v in present.variants for m in metrics)
        return
    fb, fc = b.scenario.fingerprint, c.scenario.fingerprint
    if fb != fc:
        raise ResultError(f"gate: scenario {name!r} differs between baseline (fingerprint {fb}) "
                          f"and current (fingerprint {fc}); refresh the baseline with "
                          "--update-baseline or gate against a matching one")
    cross = machine == "cross" or (machine == "auto" and machines_differ(b, c))
    report.modes[name] = "cross-machine" if cross else "same-machine"
    if cross:
        ref = b.variants[0].name if b.variants else "?"
        why = "forced" if machine == "cross" else (
            f"machines differ: {_machine_label(b)} vs {_machine_label(c)}")
        report.notes.append(f"{name}: cross-machine ({why}); figures are relative to the "
                            f"reference variant {ref!r} measured in the same run")
        _rows_within_run(report, ctx, name, b, c, metrics)
    else:
        _rows_absolute(report, ctx, name, b, c, metrics)


def _variant_names(b: Result, c: Result) -> list[str]:
    names = [v.name for v in b.variants]
    return names + [v.name for v in c.variants if v.name not in names]


def _get(r: Result, name: str) -> VariantResult | None:
    return next((v for v in r.variants if v.name == name), None)


def _check_repeats(ctx: _Ctx, r: Result, vname: str, side: str, v: VariantResult) -> None:
    n = len(v.throughput_samples_s.values)
    if n < MIN_REPEATS:
        where = ctx.sources.get(id(r), "gate")
        raise ResultError(f"{where}: {r.scenario.name}/{vname} has {n} repeat in the {side}; "
                          f"the gate needs at "
                          f"least {MIN_REPEATS} repeats a side (5 recommended) to tell noise from "
                          "change: re-run with more repeats")


def _rows_absolute(report: GateReport, ctx: _Ctx, name: str, b: Result, c: Result,
                   metrics: list[Metric]) -> None:
    for vname in _variant_names(b, c):
        vb, vc = _get(b, vname), _get(c, vname)
        if vb is None or vc is None:
            side = "current" if vc is None else "baseline"
            report.rows.extend(not_comparable(name, vname, m.name, f"variant missing in {side}")
                               for m in metrics)
            continue
        _check_repeats(ctx, b, vname, "baseline", vb)
        _check_repeats(ctx, c, vname, "current", vc)
        for m in metrics:
            if not _present(m, vb, vc):
                continue
            report.rows.append(_row(ctx, name, vname, m.name, m,
                                    _measured(ctx, b, vb, m, "baseline"),
                                    _measured(ctx, c, vc, m, "current"),
                                    (_loads(vb), _loads(vc))))


def _rows_within_run(report: GateReport, ctx: _Ctx, name: str, b: Result, c: Result,
                     metrics: list[Metric]) -> None:
    ref = b.variants[0].name if b.variants else None
    rb, rc = (_get(b, ref), _get(c, ref)) if ref else (None, None)
    if rb is None or rc is None:
        report.notes.append(f"{name}: cross-machine, but the reference variant {ref!r} is missing "
                            "in the current result; no within-run ratio to compare")
    others = [n for n in _variant_names(b, c) if n != ref]
    if not others:
        report.notes.append(f"{name}: cross-machine and a single variant: no within-run ratio to "
                            "compare (use --same-machine to compare absolute figures)")
        report.rows.extend(not_comparable(name, ref or "?", m.name,
                                           "cross-machine, single variant") for m in metrics)
        return
    for vname in others:
        vb, vc = _get(b, vname), _get(c, vname)
        for m in metrics:
            if not _present(m, vb, vc, rb, rc):
                continue
            mname = f"{m.name}_vs_{ref}"
            if vb is None or vc is None or rb is None or rc is None:
                why = "reference missing" if rb is None or rc is None else (
                    f"variant missing in {'current' if vc is None else 'baseline'}")
                report.rows.append(not_comparable(name, vname, mname, why))
                continue
            _check_repeats(ctx, b, vname, "baseline", vb)
            _check_repeats(ctx, c, vname, "current", vc)
            for r, v, side in ((b, vb, "baseline"), (b, rb, "baseline"), (c, vc, "current"),
                               (c, rc, "current")):
                _measured(ctx, r, v, m, side)
            report.rows.append(_row(ctx, name, vname, mname, m,
                                    _relative(vb, rb, m), _relative(vc, rc, m),
                                    (_loads(vb, rb), _loads(vc, rc))))


def _loads(*vs: VariantResult) -> list:
    """Every compared repeat's foreign load (the busy-machine pre-check reads them)."""
    return [f.load for v in vs for f in v.repeats]


def _present(m: Metric, *vs: VariantResult | None) -> bool:
    """A metric some results cannot hold (the attribution's parts) gets rows only where a side
    holds it; where one side lacks it the row says "no data"."""
    return any(v is not None and metric_values.available(v, m) for v in vs)


def _measured(ctx: _Ctx, r: Result, v: VariantResult, m: Metric, side: str) -> list[float]:
    """The values of a figure the gate compares: every repeat measured, or bad input. A
    figure this variant cannot hold at all (an attribution part without ablations) is no data."""
    if not metric_values.available(v, m):
        return []
    values = list(metric_values.per_repeat(v, m))
    bad = sum(not _ok(x) for x in values)
    if bad or not values:
        where = ctx.sources.get(id(r)) or f"the {side} result of scenario {r.scenario.name!r}"
        what = ("is empty" if not values else
                f"has {bad} of {len(values)} values null (not measured)")
        raise ResultError(f"{where}: variant {v.name!r}: {m.name} {what}; the gate "
                          "compares only figures measured in every repeat")
    return [float(x) for x in values]


def _relative(v: VariantResult, ref: VariantResult, m: Metric) -> list[float]:
    """Per repeat index, the variant relative to the reference measured in the same run."""
    out = []
    for x, r in zip(metric_values.per_repeat(v, m), metric_values.per_repeat(ref, m)):
        if m.kind == "points":
            out.append(x - r if _ok(x) and _ok(r) else math.nan)
        else:
            out.append(x / r if _ok(x) and _ok(r) and r != 0 else math.nan)
    return _finite(out)


def _ok(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _finite(values: Iterable[object]) -> list[float]:
    return [float(x) for x in values if _ok(x)]  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ one row

def _row(ctx: _Ctx, scenario: str, variant: str, metric: str, m: Metric,
         base: list[float], cur: list[float], loads: tuple[list, list] = ([], [])) -> Row:
    c = under_load(compare_values(base, cur, m, threshold=ctx.threshold, alpha=ctx.alpha), *loads)
    if c.verdict == NOT_COMPARABLE and (not base or not cur):
        c = dataclasses.replace(c, note="no data")
    return rows.row(scenario, variant, metric, m, c, base, cur, rows.unpaired_interval,
                    alpha=ctx.alpha, n_boot=ctx.n_boot, seed=ctx.seed)


# ------------------------------------------------------------------------------ baseline

def update_baseline(current_paths: Sequence[str | Path], baseline_dir: str | Path) -> list[Path]:
    """Copy the newest current result of each scenario into ``baseline_dir``, atomically.

    Older baseline files of the same scenario are removed only after the new file is written, so
    an interrupted update never leaves a scenario without a baseline. Files are copied verbatim.
    """
    bdir = Path(baseline_dir)
    if bdir.exists() and not bdir.is_dir():
        raise UserError(f"{bdir}: --update-baseline needs a baseline directory, not a file")
    existing = {p: load(p) for p in sorted(bdir.glob("*.json"))} if bdir.is_dir() else {}
    loaded = {Path(p): load(p) for p in current_paths}
    newest = _newest_by_scenario(list(loaded.values()))
    written: list[Path] = []
    for name, res in newest.items():
        src = next(p for p, r in loaded.items() if r is res)
        dest = bdir / src.name
        outputs.write_file(dest, src.read_text(encoding="utf-8"), outputs.RESULT,
                           "--update-baseline")
        written.append(dest)
        for old, r in existing.items():
            if r.scenario.name == name and old.resolve() != dest.resolve():
                old.unlink(missing_ok=True)
    return written
