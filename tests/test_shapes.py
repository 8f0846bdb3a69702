"""The shape generator's bookkeeping (issue 58), on a tiny fixed draw run for real.

``benchmarks/shapes.py`` holds the accuracy goals; on this shared machine a test must not
(timing assertions do not belong here). What is checked: the same seed draws the same shapes;
every drawn field lies in the issue's ranges; a shape's scenario parses with its keys; the
truth is what was injected; and a tiny run (seed 9: one worker sweep with a differential run
at 0 workers, one two-rank job with a bursty straggler) scores every prediction kind the shapes
allow, each score an error, a coverage, a withheld reason or a yes/no, and the summary prints.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import shapes  # noqa: E402

from stallbench import scenario  # noqa: E402

pytestmark = pytest.mark.e2e


def test_a_seed_draws_the_same_shapes_within_the_issues_ranges() -> None:
    a = [shapes.draw(i, random.Random(5)) for i in range(1)]
    rng1, rng2 = random.Random(11), random.Random(11)
    one = [shapes.draw(i, rng1) for i in range(30)]
    two = [shapes.draw(i, rng2) for i in range(30)]
    assert one == two and a
    for s in one:
        assert 0 <= s.latency_ms <= 20
        assert all(0 <= x <= 50 for x in (s.decode_us, s.transform_us, s.collate_us))
        assert s.burst in shapes.BURSTS and s.cores in (1, 2) and 1 <= s.ranks <= 4
        assert all(0 <= w <= 8 for w in s.workers) and s.workers == sorted(set(s.workers))
        assert (s.straggler == "none") == (s.ranks == 1 or s.straggler == "none")
        sc = scenario.parse(shapes.scenario_text(s), f"shape-{s.index}.toml")
        assert sc.base.dataset.rows == s.rows
    assert len({s.straggler for s in one if s.ranks > 1}) >= 3     # drawn, several kinds


def test_truth_is_the_injected_cost() -> None:
    s = shapes.draw(0, random.Random(9), tiny=True)
    s.burst, s.decode_us, s.transform_us, s.collate_us = "constant", 1.0, 2.0, 3.0
    assert s.cpu_us_per_row() == 6.0
    s.burst, s.spike_p, s.spike_us = "spikes", 0.5, 10.0
    assert s.cpu_us_per_row() == 11.0
    s.ranks, s.straggler, s.straggler_cost, s.items, s.epochs = 2, "constant", 10.0, 8, 1
    assert math.isclose(s.straggler_extra_s(), 0.04)


def test_a_tiny_draw_scores_every_kind_it_allows(tmp_path: Path) -> None:
    out = shapes.run_draw(2, 9, tiny=True, work=tmp_path, verbose=False, timeout=240)
    assert out["seed"] == 9 and len(out["runs"]) == 2
    failed = [r["error"] for r in out["runs"] if "error" in r]
    assert not failed, failed
    kinds = {x["kind"] for x in out["scores"]}
    assert {"whatif_beyond", "compute_floor", "attribution"} <= kinds, kinds
    assert kinds & {"straggler", "straggler_small", "straggler_none"}, kinds
    for x in out["scores"]:
        assert (x["error"] is not None or x["withheld"] or x["ok"] is not None), x
    text = shapes.report(out["summary"])
    assert "what-if inside" in text and "coverage" in text
