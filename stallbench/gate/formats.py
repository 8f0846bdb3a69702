"""A gate report in the four output formats (``--format table|markdown|json|github``), and
its cells, one ``format_*`` per figure kind: both gates print through here."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Callable

from .. import outputs
from ..analysis import figures
from .rows import GateReport, Row, exit_code
from .rule import BUSY, FASTER, INCONCLUSIVE, SLOWER, TOO_FEW, VERDICTS


def format_number(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}" if abs(x) >= 10 else f"{x:.3f}"


def format_value(r: Row, x: float) -> str:
    if r.change_kind == "points" and math.isfinite(x):
        return f"{x * 100:.1f}%"
    return format_number(x)


def format_change(r: Row) -> str:
    """A change signed by ``figures.signed``'s rule: one that rounds to 0 has no sign
    ("0.0 pt", never "-0.0 pt" beside a verdict of "same")."""
    if not math.isfinite(r.change):
        return "-"
    if r.change_kind == "points":
        return figures.signed_points(r.change)
    return f"{r.change:.3f} ({figures.signed_percent(r.change - 1)})"


def format_interval(r: Row) -> str:
    if not (math.isfinite(r.ci_low) and math.isfinite(r.ci_high)):
        return "-"
    if r.change_kind == "points":
        return f"[{figures.signed(r.ci_low * 100)}, {figures.signed(r.ci_high * 100)}] pt"
    return f"[{r.ci_low:.3f}, {r.ci_high:.3f}]"


def format_p(r: Row) -> str:
    return "-" if r.p_value is None else f"{r.p_value:.3g}"


def _cells(report: GateReport) -> tuple[list[str], list[list[str]]]:
    conf = f"{(1 - report.alpha) * 100:g}% CI"
    head = ["scenario", "variant", "metric", "baseline", "current", "change", conf, "p", "test",
            "verdict"]
    # Every cell on one printable line (outputs.one_line): a label with a newline would start
    # an output line of its own (under --format github, a workflow command such as ::error).
    body = [[outputs.one_line(c) for c in (
        r.scenario, r.variant, r.metric, format_value(r, r.baseline), format_value(r, r.current),
        format_change(r), format_interval(r), format_p(r), r.test or "-",
        r.verdict + (f" ({r.note})" if r.note else ""))] for r in report.rows]
    return head, body


def summary_line(report: GateReport) -> str:
    """One line a CI log reader can grep: PASS/FAIL and the verdict counts."""
    status = "FAIL" if report.failing else "PASS"
    counts = ", ".join(f"{report.count(v)} {v}" for v in VERDICTS)
    if report.count(TOO_FEW):    # beyond the threshold, undecidable: fails when worse
        counts += f", {report.count(TOO_FEW)} {TOO_FEW} (fails when worse: add repeats)"
    if report.count(BUSY):       # said, never failed on: see compare.busy_note
        counts += f", {report.count(BUSY)} {BUSY} (not judged)"
    extra = ", fail on improvement" if report.fail_on_improvement else ""
    return (f"gate {status}: {counts} (threshold {report.threshold * 100:g}%, "
            f"alpha {report.alpha:g}{extra})")


def format_table(report: GateReport) -> str:
    head, body = _cells(report)
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
    lines += [f"note: {outputs.one_line(n)}" for n in report.notes]
    lines.append(summary_line(report))
    return "\n".join(lines) + "\n"


def format_markdown(report: GateReport) -> str:
    head, body = _cells(report)
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
    lines.append("")
    lines += [f"- {outputs.one_line(n)}" for n in report.notes]
    lines.append(f"**{summary_line(report)}**")
    return "\n".join(lines) + "\n"


def _jsonable(x: object) -> object:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return x


def format_json(report: GateReport) -> str:
    data = {
        "passed": not report.failing,
        "exit_code": exit_code(report),
        "threshold": report.threshold,
        "alpha": report.alpha,
        "fail_on_improvement": report.fail_on_improvement,
        "counts": {v: report.count(v) for v in (*VERDICTS, TOO_FEW, BUSY)},
        "modes": report.modes,
        "notes": report.notes,
        "rows": [asdict(r) for r in report.rows],
    }
    return json.dumps(_jsonable(data), indent=1) + "\n"


def escape_github(s: str) -> str:
    """GitHub workflow-command data escaping (``outputs.annotation``: ``%``, CR, LF, and any
    other control character shown as an escape), or the annotation is mangled."""
    return outputs.annotation(s)


def format_github(report: GateReport) -> str:
    """``::error::``/``::warning::`` annotations for the rows that matter, then the table."""
    lines = []
    for r in report.rows:
        what = f"{r.label}: {r.verdict}, change {format_change(r)}, p={format_p(r)} ({r.test})"
        if r.verdict == SLOWER:
            lines.append(f"::error title=stallbench gate::{escape_github(what)}")
        elif r.verdict == FASTER and report.fail_on_improvement:
            what += "; refresh the baseline (--update-baseline)"
            lines.append(f"::error title=stallbench gate::{escape_github(what)}")
        elif r.verdict == TOO_FEW:
            kind = "error" if r in report.failing else "warning"
            lines.append(f"::{kind} title=stallbench gate::{escape_github(what + ': ' + r.note)}")
        elif r.verdict == INCONCLUSIVE:
            what += " (over threshold, not significant)"
            lines.append(f"::warning title=stallbench gate::{escape_github(what)}")
        elif r.verdict == BUSY:
            lines.append(f"::warning title=stallbench gate::{escape_github(what + ': ' + r.note)}")
    return "\n".join(lines) + ("\n" if lines else "") + format_markdown(report)


FORMATTERS: dict[str, Callable[[GateReport], str]] = {
    "table": format_table, "json": format_json, "markdown": format_markdown,
    "github": format_github,
}
