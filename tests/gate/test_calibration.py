"""A/A calibration: noise, false alarms and power from measured differences of known shape;
the versioned file; the gate's use of it (pairs, refusal of a threshold below the noise)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import abrepo
import factories
from stallbench import cli
from stallbench.gate import pairs as ab
from stallbench.gate import calibration
from stallbench.gate.rule import METRICS
from stallbench.errors import ResultError, UserError

TP = METRICS["throughput"]


def noise(sd: float, n: int = 60, mean: float = 0.0, seed: int = 0) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, sd, n))


def test_quiet_machine_catches_ten_percent_and_rarely_alarms() -> None:
    d = noise(0.02)
    assert calibration.false_alarm_rate(d, TP, 0.05, 0.01, 10) <= 0.02
    assert calibration.power(d, TP, 0.05, 0.01, 10, 0.10) >= 0.99
    assert calibration.pairs_for_power(d, TP, 0.05, 0.01, 0.10) == calibration.MIN_PAIRS
    assert calibration.noise_floor(d, TP, 0.01, 10) == pytest.approx(0.005)


def test_noisy_machine_needs_more_pairs_than_a_gate_can_afford() -> None:
    d = noise(0.25)
    assert calibration.power(d, TP, 0.05, 0.01, 10, 0.10) < 0.5
    assert calibration.pairs_for_power(d, TP, 0.05, 0.01, 0.10, max_pairs=20) is None
    mid = noise(0.06)
    n = calibration.pairs_for_power(mid, TP, 0.05, 0.01, 0.10)
    assert n is not None and 8 < n <= 40
    assert calibration.power(mid, TP, 0.05, 0.01, n, 0.10) ** 2 >= 0.95


def test_a_biased_a_a_raises_the_noise_floor() -> None:
    """A/A differences that lean one way (the pairing broken, e.g. one side always first on a
    warming machine) make a small threshold alarm: the floor moves above the lean."""
    d = noise(0.02, mean=-0.06)
    assert calibration.false_alarm_rate(d, TP, 0.05, 0.01, 10) > 0.5
    floor = calibration.noise_floor(d, TP, 0.01, 10)
    assert floor is not None and floor > 0.06


def test_shift_is_a_slowdown_in_each_metrics_worse_direction() -> None:
    assert calibration.shift_for(TP, 0.10) == pytest.approx(-math.log(1.1))
    assert calibration.shift_for(METRICS["peak_pss_mb"], 0.10) == pytest.approx(math.log(1.1))
    assert calibration.shift_for(METRICS["stall_share"], 0.10) == pytest.approx(0.10)


def test_observed_false_alarms_count_disjoint_gates() -> None:
    assert calibration.observed_false_alarms([0.01, -0.01] * 15, TP, 0.05, 0.01, 10) == (0, 3)
    assert calibration.observed_false_alarms([-0.2] * 20, TP, 0.05, 0.01, 10) == (2, 2)


def make_cal(diffs: list[float], **kw) -> calibration.Calibration:
    m = calibration.assess("v", TP, diffs, threshold=0.05, alpha=0.01, pairs=10, detect=0.10)
    base = dict(calibration_version=1, created_utc="2026-11-23T00:00:00+00:00",
                tool_version="0.1.0", scenario="s", scenario_sha256="abc", scenario_path="s.toml",
                machine=calibration.CalibrationMachine("Test CPU", 2), commit=None,
                threshold=0.05, alpha=0.01, pairs=10, rounds=3, detect=0.10, power_target=0.95,
                resamples=calibration.RESAMPLES, seconds=1.0, metrics=[m],
                recommended_pairs=calibration.recommended([m]))
    base.update(kw)
    return calibration.Calibration(**base)


def test_file_round_trips_and_loads_strictly(tmp_path: Path) -> None:
    cal = make_cal(noise(0.03, n=30))
    path = calibration.save(cal, tmp_path / "calibration")
    assert path == tmp_path / "calibration" / "s.json"
    back = calibration.load(path)
    assert back.metrics[0].diffs == pytest.approx(cal.metrics[0].diffs)
    assert back.recommended_pairs == cal.recommended_pairs
    data = json.loads(path.read_text())
    data["calibration_version"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match="calibration_version: expected 1, got 2"):
        calibration.load(path)
    data["calibration_version"] = 1
    data["metrics"][0]["diffs"] = "fast"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match=r"metrics\[0\]\.diffs: expected a list"):
        calibration.load(path)
    del data["alpha"]
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match="alpha: missing"):
        calibration.load(path)


def test_only_this_machines_calibration_of_this_scenario_text_is_used(tmp_path: Path) -> None:
    calibration.save(make_cal(noise(0.03, n=30)), tmp_path)
    cal, why = calibration.find_for(tmp_path, "s", "abc", ("Test CPU", 2))
    assert cal is not None and "using calibration" in why
    assert calibration.find_for(tmp_path, "s", "abc", ("Other CPU", 2))[0] is None
    cal, why = calibration.find_for(tmp_path, "s", "def", ("Test CPU", 2))
    assert cal is None and "scenario changed" in why
    assert "no calibration" in calibration.find_for(tmp_path, "t", "abc", ("Test CPU", 2))[1]


def test_gate_takes_pairs_and_refuses_a_threshold_under_the_noise() -> None:
    quiet = make_cal(noise(0.02))
    a = calibration.apply([quiet], threshold=0.05, alpha=0.01, pairs=None, default_pairs=10,
                          metrics=("throughput",))
    assert a.pairs == calibration.MIN_PAIRS and "caught in" in a.notes[-1]
    a = calibration.apply([quiet], threshold=0.05, alpha=0.01, pairs=12, default_pairs=10,
                          metrics=("throughput",))
    assert a.pairs == 12
    biased = make_cal(noise(0.02, mean=-0.06))
    with pytest.raises(UserError, match=r"--threshold 5% is below the noise floor of s/v "
                                        r"throughput .* at 10 pairs"):
        calibration.apply([biased], threshold=0.05, alpha=0.01, pairs=10, default_pairs=10,
                          metrics=("throughput",))


def test_cli_calibrates_then_the_gate_uses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    repo = abrepo.make(tmp_path / "repo")
    monkeypatch.chdir(repo)
    rng = np.random.default_rng(3)

    def fake(files, a, b, pairs, **kw):
        out = []
        for i in range(pairs):
            tp = 200_000 * (1 + 0.2 * rng.random())           # drift
            ra = factories.result([factories.variant("default", [tp])], scenario="userpipe")
            rb = factories.result([factories.variant("default",
                                                     [tp * math.exp(rng.normal(0, 0.02))])],
                                  scenario="userpipe")
            for r in (ra, rb):
                r.scenario.sha256 = _sha(repo)
            out.append(ab.Pair(i, "a", {"userpipe": ra}, {"userpipe": rb}))
        return out

    monkeypatch.setattr(ab, "run_pairs", fake)
    assert cli.main(["gate", "--calibrate", "scenario.toml", "--repeats", "10"]) == 0
    out = capsys.readouterr().out
    assert "A/A calibration of userpipe" in out and "recommended pairs (--repeats)" in out
    path = repo / "results" / "baseline" / "calibration" / "userpipe.json"
    cal = calibration.load(path)
    assert cal.pairs == 10 and cal.rounds == 3
    assert {x.metric for x in cal.metrics} == {"throughput", "stall_share"}
    assert len(cal.metrics[0].diffs) == 30
    calls = []

    def fake_gate(files, a, b, pairs, **kw):
        calls.append(pairs)
        return fake(files, a, b, pairs)

    monkeypatch.setattr(ab, "run_pairs", fake_gate)
    abrepo.commit(repo, "second", **{"mytf.py": abrepo.identity("v2")})
    assert cli.main(["gate", "--against", "HEAD~1", "scenario.toml"]) == 0
    err = capsys.readouterr().err
    assert "using calibration" in err and calls == [cal.recommended_pairs]


def _sha(repo: Path) -> str:
    from stallbench import scenario

    return scenario.load(repo / "scenario.toml").sha256
