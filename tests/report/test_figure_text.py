"""One figure, one value (issue 42): a share, a duration and a speed-up are written by one
rule (``analysis.figures``) on every surface: the terminal tables, the verdict line and the
report. Golden strings: the rule is the contract, so a change to it shows here."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stallbench.analysis import differential, figures
from stallbench.report import tables
from stallbench.results import Interval

# (value, share, seconds, table cell): "~0" where the figure is not distinguishable from 0
GOLDEN = [
    (0.1234, "12%", "123 ms", "0.123"),
    (0.158, "16%", "158 ms", "0.158"),
    (13.74, "1374%", "13.74 s", "13.74"),
    (0.0042, "~0%", "4.20 ms", "0.0042"),
    (0.0, "0%", "0 s", "0"),
    (-0.0001, "~0%", "~0 s", "~0"),      # "-0%": only noise makes a share below 0
    (-0.01, "~0%", "~0 s", "~0"),        # "-1%" beside "0%" in one output
    (1e-7, "~0%", "~0 s", "~0"),
    (None, "-", "-", "-"),
    (math.nan, "-", "-", "-"),
    (math.inf, "-", "-", "-"),
]


@pytest.mark.parametrize("x, share, secs, cell", GOLDEN)
def test_golden(x: float | None, share: str, secs: str, cell: str) -> None:
    assert figures.share(x) == share
    assert figures.seconds(x) == secs
    assert figures.seconds_cell(x) == cell


def test_an_interval_spanning_zero_is_zero_whatever_the_point() -> None:
    iv = Interval(-0.5, 1.5)
    assert figures.share(0.3, interval=iv) == "~0%"
    assert figures.seconds(0.3, interval=iv) == "~0 s"
    assert figures.seconds_cell(-1.29, iv, signed=True) == "~0"
    # clearly negative (an ablation part said, not hidden): its minus sign stays
    assert figures.seconds_cell(-1.29, Interval(-1.5, -1.1), signed=True) == "-1.29"
    assert figures.seconds(-0.35, signed=True) == "-350 ms"


def test_digits_and_rounding_to_zero() -> None:
    assert figures.share(0.0004, 1) == "~0%" and figures.share(0.0006, 1) == "0.1%"
    assert figures.share(0.005) == "~0%"          # rounds to "0%" without being 0
    assert figures.share(1.0) == "100%"
    assert figures.speedup(1.523) == "1.52x" and figures.speedup(None) == "-"


@pytest.mark.parametrize("x, digits, text", [
    (8.0, 1, "+8.0"), (-0.091, 1, "-0.1"), (-0.04, 1, "0.0"), (0.04, 1, "0.0"), (-0.0, 1, "0.0"),
    (0.0, 0, "0"), (-0.4, 0, "0"), (0.6, 0, "+1"), (None, 1, "-"), (math.nan, 1, "-"),
])
def test_a_signed_figure_that_reads_zero_has_no_sign(x: float | None, digits: int,
                                                     text: str) -> None:
    """The one sign rule (issue 42): "-0.0" or "+0.0" claims a direction the digits do not
    show; a figure that shows keeps its sign."""
    assert figures.signed(x, digits) == text
    scaled = None if x is None else x / 100
    unit = "" if text == "-" else "%"
    assert figures.signed_percent(scaled, digits) == text + unit
    assert figures.signed_points(scaled, digits) == text + ("" if text == "-" else " pt")


def test_every_signed_surface_writes_zero_without_a_sign() -> None:
    """The terminal's errors (whatif's back-test, tune's confirmation), the report's and the
    history's changes: one rule, so an error of -0.04% is "0.0%" on each, never "-0.0%"."""
    from types import SimpleNamespace as NS

    from stallbench.commands.whatif import backtest_lines
    from stallbench.report import render

    assert tables.format_percent(-0.0004, "+.1%") == "0.0%" == render.format_signed_pct(-0.0004)
    assert render.format_signed_pct(0.052) == "+5.2%" and render.format_signed_pct(None) == "—"
    bt = NS(points=[NS(n=2, error=-0.0004, steady_error=0.052, model="amdahl")],
            max_abs_error=0.0004, mean_abs_error=0.0004, max_abs_steady_error=0.052,
            mean_abs_steady_error=0.052, interval_log_half_width=1e-5, interval_level=0.9,
            covered=1, checked=1)
    per, _, interval = backtest_lines(bt)
    assert per.endswith("2: 0.0% / +5.2% (amdahl)")
    assert "(0.0% .. 0.0%," in interval and "-0.0" not in interval


def test_every_surface_writes_a_value_the_same_way() -> None:
    """The terminal's share and the report's, the report's duration and the verdict's."""
    from stallbench.report import render

    for x, share, secs, _ in GOLDEN:
        if x is None or not math.isfinite(x):
            assert render.format_pct(x) == render.format_s(x) == "—"
            continue
        assert tables.format_percent(x) == render.format_pct(x) == share
        if x >= 0:
            assert render.format_s(x) == secs
    assert tables.startup_text(-0.02) == "~0" and tables.startup_text(0.172) == "0.172"
    assert tables.format_percent(-0.012, "+.1%") == "-1.2%"   # a signed change keeps its sign


def test_run_table_and_verdict_never_print_a_negative_share(make_result: Any) -> None:
    """A variant whose stall share came out below 0 (noise) and a verdict on a negative
    share: "~0%", never "-1%" or "-0%"."""
    r = make_result(analysis=True, whatif=False, timeline=False, resources=False)
    v = r.variants[0]
    v.stall_share.median = -0.01
    v.stall_s.median = 0.158
    row = next(x for x in tables.run_table(r).splitlines() if x.startswith(v.name))
    assert "~0%" in row and "-1%" not in row and "-0%" not in row and " 0.158 " in row
    a = v.attribution
    a.basis, a.steady_attributed_stall_share = "whole run", None
    a.attributed_stall_share = -0.004
    a.conclusive, a.bound_by = True, "fetch"
    text = differential.verdict(a)
    assert "(~0% of the epoch is attributed stall)" in text, text


def test_the_gate_table_prints_no_negative_zero() -> None:
    from stallbench.gate.formats import format_change, format_interval
    from stallbench.gate.rows import Row

    r = Row.__new__(Row)
    r.change_kind, r.change, r.ci_low, r.ci_high = "points", -0.0004, -0.0003, 0.0172
    assert format_change(r) == "0.0 pt" and format_interval(r) == "[0.0, +1.7] pt"
    r.change_kind, r.change = "ratio", 0.9996
    assert format_change(r) == "1.000 (0.0%)"
