"""Change points (E-divisive means) on series of known shape, the history command with the
commit of each change point, and the report's history section."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import factories
from stallbench import cli, results
from stallbench.gate import history
from stallbench.results import GitInfo, MachineInfo

LEVELS = [(100.0, 20), (88.0, 15), (95.0, 20)]


def steps(levels=LEVELS, sd: float = 1.5, seed: int = 1) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for level, n in levels for x in rng.normal(level, sd, n)]


def test_energy_statistic_matches_its_formula() -> None:
    x = np.array([1.0, 2.0, 4.0, 10.0, 11.0, 13.0])
    tau, q = history._q_all(x, 2)
    a, b = x[:tau], x[tau:]
    m, k = a.size, b.size
    e = (2 * np.abs(a[:, None] - b[None, :]).mean()
         - np.abs(a[:, None] - a[None, :]).sum() / (m * (m - 1))
         - np.abs(b[:, None] - b[None, :]).sum() / (k * (k - 1)))
    assert tau == 3 and q == pytest.approx(m * k / (m + k) * e)


def test_finds_two_shifts_near_where_they_are() -> None:
    cps = history.change_points(steps())
    assert len(cps) == 2
    assert abs(cps[0].index - 20) <= 1 and abs(cps[1].index - 35) <= 2
    assert cps[0].change == pytest.approx(-0.12, abs=0.02)
    assert all(cp.p_value < 0.05 for cp in cps)
    assert history.change_points(steps()) == cps            # seeded: same history, same answer


def test_no_change_point_in_noise_and_too_short_series() -> None:
    assert history.change_points(steps([(100.0, 40)], sd=3.0)) == []
    assert history.change_points([1.0, 2.0, 3.0, 4.0, 5.0]) == []
    with pytest.raises(ValueError):
        history.change_points([1.0, math.nan])


def test_min_change_drops_tiny_shifts() -> None:
    series = steps([(100.0, 20), (98.0, 20)], sd=0.2)
    assert len(history.change_points(series)) == 1
    assert history.change_points(series, min_change=0.05) == []


def nightly(tmp_path: Path, values: list[float]) -> Path:
    out = tmp_path / "nightly"
    out.mkdir()
    for i, tp in enumerate(values):
        r = factories.result([factories.variant("opt", [tp * 1000, tp * 1000 * 1.001])],
                             scenario="ci", created=f"2026-10-{i + 1:02d}T03:00:00+00:00",
                             machine=MachineInfo(cpu_model="Test CPU", cores_logical=2,
                                                 git=GitInfo(f"{i:02d}" + "c" * 38, False)))
        (out / f"ci-{i:02d}.json").write_text(json.dumps(results.to_dict(r)))
    return out


def test_history_command_prints_each_change_point_with_its_commit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = nightly(tmp_path, steps([(100.0, 10), (85.0, 10)], sd=1.0))
    assert cli.main(["history", str(d), "--metric", "throughput"]) == 0
    out = capsys.readouterr().out
    assert "history of ci: 20 results, 2026-10-01T03:00:00+00:00 .. 2026-10-20" in out
    assert "opt throughput: 1 change point(s)" in out
    assert "at result #11 (2026-10-11T03:00:00+00:00, commit 10cccccccccc)" in out
    assert "-15." in out or "-14." in out
    assert cli.main(["history", str(d), "--max-p", "2"]) == 2
    assert cli.main(["history", str(d), "--scenario", "nope"]) == 2


def test_report_plots_the_history_with_its_change_points(tmp_path: Path) -> None:
    from stallbench.report.render import render

    d = nightly(tmp_path, steps([(100.0, 8), (80.0, 8)], sd=1.0))
    out = render(sorted(d.glob("*.json")), tmp_path / "r.html")
    html = out.read_text()
    assert 'data-section="history"' in html
    assert "<code>08cccccccccc</code>" in html          # the commit of the first slower night
    few = tmp_path / "few"
    few.mkdir()
    for p in sorted(d.glob("*.json"))[:3]:
        (few / p.name).write_text(p.read_text())
    html = render(sorted(few.glob("*.json")), tmp_path / "f.html").read_text()
    assert 'data-section="history"' not in html
