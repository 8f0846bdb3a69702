"""Honest windows (issue 25): a quick look (``max_batches = 20``) at a transform-bound loop
(20 us of CPU per row, 1024-row jagged batches, 8 batches per row group, 0 and 2 loader
workers) is too short for a steady state. stallbench must say so, print no steady-state
ratio, start-up cost or steady verdict from it, refuse (not clamp) a stage stall longer than
the run, and quote the 2-worker variant it measured as measured, not predicted. Before, the
same look said "use num_workers=2 (measured 5.52x)" from a steady rate above what two cores
can do at 20 us/row, and start-up -1.07 s. The full product path: ``run_scenario``.
"""

from __future__ import annotations

import math
from pathlib import Path

from factories import transform_bound_scenario

from stallbench import scenario
from stallbench.report import tables
from stallbench.run.runner import RunOptions, run_scenario

TEXT = transform_bound_scenario("transform-bound", row_group_rows=8192, max_batches=20)


def test_a_quick_look_too_short_for_a_steady_state_says_so(tmp_path: Path) -> None:
    r = run_scenario(scenario.parse(TEXT, "<short>"), RunOptions(cache_dir=tmp_path,
                                                                 progress=False))
    zero, two = r.variants
    for v in r.variants:
        for f in v.repeats:
            assert f.phases is not None and not f.phases.has_steady
            assert f.phases.no_steady_reason.startswith("too short for a steady state")
        # no steady rate, no start-up cost: nothing the window cannot support
        assert not math.isfinite(v.phases.steady_samples_s.median)
        assert not math.isfinite(v.phases.startup_cost_s.median)
        a = v.attribution
        assert a is not None and a.basis.startswith("whole run")
        epoch = a.epoch_s
        for stage in ("fetch", "preprocess", "transfer"):
            # a stall longer than the run is refused with the reason, never printed as found
            if a.part_s(stage) > epoch:
                assert not a.conclusive and a.inconclusive_because == "impossible"
                assert a.verdict.startswith("refused: the ")
        assert "of steady state" not in a.verdict
    lines = tables.phase_lines(r)
    assert any(line.startswith("num_workers=0: too short for a steady state: 12 batches")
               for line in lines), lines
    assert any(line.startswith("num_workers=2: too short for a steady state: 4 batches")
               for line in lines), lines
    rec = zero.recommendation
    assert rec is not None
    if rec.value == 2:       # the suggested count was measured: quoted as measured
        assert rec.measured_variant == "num_workers=2" and rec.predicted_speedup is None
        assert "whole run" in rec.text and "predicted" not in rec.text.split(";")[0]
    top = r.analysis.recommendation
    assert top is not None and "in steady state" not in top.text
