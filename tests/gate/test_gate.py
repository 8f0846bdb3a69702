"""The CI gate: decision rule, exit codes, cross-machine ratios, formats, and its error rates.

Result sets are built in memory (``make_result``) so every test is fast and deterministic; CLI
tests write them as JSON the way ``stallbench run`` would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from stallbench.gate import baseline as gate
from stallbench.gate import formats, rows
from stallbench.gate.rule import BUSY
from stallbench.commands import gate as gate_cmd
from stallbench.errors import ResultError, UserError
from stallbench import results
from stallbench.results import MachineInfo, Result, VariantResult, load

import factories

ROOT = Path(__file__).resolve().parents[2]
MACHINE = MachineInfo(cpu_model="Test CPU 3000", cores_logical=2, memory_gb=8)


# ------------------------------------------------------------------------------ factory

def make_variant(name: str, tp: list[float], share: list[float] | None = None,
                 rss: list[float] | None = None) -> VariantResult:
    return factories.variant(name, tp, share, rss)


def make_result(variants: dict[str, list[float]] | list[VariantResult], *, scenario: str = "tiny",
                fingerprint: str = factories.FP, machine: MachineInfo | None = None,
                created: str = "2024-05-01T12:00:00+00:00",
                schema_version: int = results.SCHEMA_VERSION) -> Result:
    return factories.result(variants, scenario=scenario, fingerprint=fingerprint,
                            machine=machine or MACHINE, created=created,
                            schema_version=schema_version)


def save(result: Result, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results.to_dict(result)), encoding="utf-8")
    return path


BASE = [1000.0, 1010.0, 990.0, 1005.0, 995.0]


def scaled(values: list[float], factor: float) -> list[float]:
    return [v * factor for v in values]


def cmp(base: Result, cur: Result, **kw) -> rows.GateReport:
    kw.setdefault("threshold", 0.10)
    kw.setdefault("n_boot", 200)
    return gate.compare([base], [cur], **kw)


def row(report: rows.GateReport, metric: str = "throughput", variant: str = "opt") -> rows.Row:
    return next(r for r in report.rows if r.metric == metric and r.variant == variant)


# ------------------------------------------------------------------------------ decision rule

def test_identical_inputs_never_fail() -> None:
    r = make_result({"naive": BASE, "opt": scaled(BASE, 3)})
    report = cmp(r, r)
    assert rows.exit_code(report) == 0
    assert {x.verdict for x in report.rows} == {"same"}
    assert row(report).change == 1.0


def test_30_percent_slowdown_with_5_repeats_fails() -> None:
    base = make_result({"naive": BASE, "opt": scaled(BASE, 3)})
    cur = make_result({"naive": BASE, "opt": scaled(BASE, 3 * 0.7)})
    report = cmp(base, cur)
    r = row(report)
    assert r.verdict == "slower" and r.test == "mann-whitney"
    assert r.p_value < 0.01 and r.change == pytest.approx(0.7)
    assert r.ci_low <= 0.7 <= r.ci_high
    assert row(report, variant="naive").verdict == "same"
    assert rows.exit_code(report) == 1


def test_3_percent_noise_passes() -> None:
    base = make_result({"opt": BASE})
    cur = make_result({"opt": scaled(BASE, 0.97)})
    report = cmp(base, cur)
    assert row(report).verdict == "same"
    assert rows.exit_code(report) == 0


def test_over_threshold_but_noisy_is_inconclusive_and_passes() -> None:
    base = make_result({"opt": [1000, 1500, 700, 1300, 800]})
    cur = make_result({"opt": [800, 1200, 650, 1100, 600]})
    report = cmp(base, cur)
    r = row(report)
    assert r.change < 0.9 and r.p_value >= 0.01
    assert r.verdict == "inconclusive"
    assert rows.exit_code(report) == 0


def test_improvement_fails_only_with_fail_on_improvement() -> None:
    base = make_result({"opt": BASE})
    cur = make_result({"opt": scaled(BASE, 1.5)})
    assert row(cmp(base, cur)).verdict == "faster"
    assert rows.exit_code(cmp(base, cur)) == 0
    assert rows.exit_code(cmp(base, cur, fail_on_improvement=True)) == 1


def _loaded(result: Result, cores: list[float]) -> Result:
    """Give each repeat of every variant the foreign load measured during it."""
    from stallbench.results import ForeignLoad

    for v in result.variants:
        for f, c in zip(v.repeats, cores):
            f.load = ForeignLoad(wall_s=1.0, busy_cpu_s=1.0 + c, own_cpu_s=1.0, foreign_cpu_s=c,
                                 foreign_cores=c, steal_cores=0.0, cores=2.0)
    return result


def test_busy_machine_precheck_replaces_slower_and_does_not_fail() -> None:
    """A 30% slowdown measured while another process took a core: the gate says the machine
    was busy instead of "slower", and passes; the same slowdown on a quiet machine fails."""
    base = make_result({"opt": BASE})
    quiet = [0.05] * 5
    cur_busy = _loaded(make_result({"opt": scaled(BASE, 0.7)}), [0.05, 1.0, 1.0, 1.0, 1.0])
    report = cmp(_loaded(base, quiet), cur_busy)
    r = row(report)
    assert r.verdict == BUSY and rows.exit_code(report) == 0
    assert "4 current repeat(s) ran with more than 0.25 cores" in r.note
    assert "1 busy machine (not judged)" in formats.summary_line(report)
    assert "::warning title=stallbench gate::" in formats.format_github(report)
    cur_quiet = _loaded(make_result({"opt": scaled(BASE, 0.7)}), quiet)
    assert row(cmp(_loaded(make_result({"opt": BASE}), quiet), cur_quiet)).verdict == "slower"
    # results without load readings (older files) are judged as before
    assert row(cmp(make_result({"opt": BASE}), make_result({"opt": scaled(BASE, 0.7)}))).verdict == "slower"


def test_busy_machine_precheck_leaves_same_alone() -> None:
    busy = [1.0] * 5
    r = row(cmp(_loaded(make_result({"opt": BASE}), busy), _loaded(make_result({"opt": BASE}), busy)))
    assert r.verdict == "same"


def test_few_repeats_fall_back_to_interval_overlap() -> None:
    """3 vs 3 repeats cannot reach p < 0.01 with a rank test; a clear shift still decides."""
    base = make_result({"opt": BASE[:3]})
    cur = make_result({"opt": scaled(BASE[:3], 0.5)})
    r = row(cmp(base, cur))
    assert r.test == "ci-overlap" and r.verdict == "slower"


def test_stall_share_regression_uses_share_points() -> None:
    def res(share: list[float]) -> Result:
        return make_result([make_variant("opt", BASE, share=share)])

    base = res([0.00, 0.01, 0.00, 0.02, 0.01])
    worse = res([0.20, 0.22, 0.19, 0.21, 0.20])
    report = cmp(base, worse)
    r = row(report, "stall_share")
    assert r.change_kind == "points" and r.change == pytest.approx(0.19)
    assert r.verdict == "slower" and rows.exit_code(report) == 1
    # +5 points is under a 10% (= 10 points) threshold even though the ratio would be huge.
    slightly = res([0.05, 0.06, 0.05, 0.07, 0.06])
    assert row(cmp(base, slightly), "stall_share").verdict == "same"


def test_memory_only_with_include_memory() -> None:
    base = make_result([make_variant("opt", BASE, rss=[500, 505, 498, 502, 501])])
    cur = make_result([make_variant("opt", BASE, rss=[800, 805, 798, 802, 801])])
    assert not [r for r in cmp(base, cur).rows if r.metric == "peak_pss_mb"]
    report = cmp(base, cur, include_memory=True)
    assert row(report, "peak_pss_mb").verdict == "slower"
    assert rows.exit_code(report) == 1


def test_missing_variant_is_not_comparable_not_a_failure() -> None:
    base = make_result({"naive": BASE, "opt": BASE})
    cur = make_result({"naive": BASE, "new": BASE})
    report = cmp(base, cur)
    verdicts = {(r.variant, r.verdict) for r in report.rows}
    assert ("opt", "not comparable") in verdicts and ("new", "not comparable") in verdicts
    assert rows.exit_code(report) == 0


def test_newest_result_per_scenario_is_used() -> None:
    base = make_result({"opt": BASE})
    old = make_result({"opt": scaled(BASE, 0.5)}, created="2024-05-01T10:00:00+00:00")
    new = make_result({"opt": BASE}, created="2024-05-02T10:00:00+00:00")
    assert rows.exit_code(gate.compare([base], [new, old], threshold=0.1, n_boot=50)) == 0
    assert rows.exit_code(gate.compare([base], [old], threshold=0.1, n_boot=50)) == 1


# ------------------------------------------------------------------------------ bad input

def test_fingerprint_mismatch_is_bad_input() -> None:
    base = make_result({"opt": BASE})
    cur = make_result({"opt": BASE}, fingerprint="fedcba9876543210")
    with pytest.raises(ResultError, match="fingerprint"):
        cmp(base, cur)


def test_single_repeat_is_bad_input() -> None:
    base = make_result({"opt": BASE[:1]})
    with pytest.raises(ResultError, match="repeat"):
        cmp(base, base)


def test_an_older_baseline_gates_against_current_results(tmp_path: Path) -> None:
    """A committed baseline of an older schema migrates on load: gating it against the same
    figures written in the current schema compares like with like (every row the same), not a
    schema error."""
    older = ROOT / "results" / "examples" / "schema-v2.json"
    assert json.loads(older.read_text())["schema_version"] < results.SCHEMA_VERSION
    cur = results.save(load(older), tmp_path)
    assert json.loads(cur.read_text())["schema_version"] == results.SCHEMA_VERSION
    assert cli(["--baseline", str(older), "--current", str(cur), "--threshold", "10%"]) == 0


def test_nothing_comparable_is_bad_input() -> None:
    with pytest.raises(ResultError, match="nothing comparable"):
        cmp(make_result({"opt": BASE}, scenario="a"), make_result({"opt": BASE}, scenario="b"))


# ------------------------------------------------------------------------------ cross-machine

OTHER = MachineInfo(cpu_model="Other CPU 9000", cores_logical=16)


def test_cross_machine_compares_within_run_ratios() -> None:
    base = make_result({"naive": BASE, "opt": scaled(BASE, 3)})
    # A machine twice as fast, same code: the absolute figures double, the ratio does not move.
    fast = make_result({"naive": scaled(BASE, 2), "opt": scaled(BASE, 6)}, machine=OTHER)
    report = cmp(base, fast)
    assert report.modes == {"tiny": "cross-machine"}
    assert "machines differ" in formats.format_table(report)
    assert [r.metric for r in report.rows] == ["throughput_vs_naive", "stall_share_vs_naive"]
    assert row(report, "throughput_vs_naive").change == pytest.approx(1.0)
    assert rows.exit_code(report) == 0
    # Same faster machine, but the optimised variant lost 30% against the reference.
    regressed = make_result({"naive": scaled(BASE, 2), "opt": scaled(BASE, 6 * 0.7)}, machine=OTHER)
    report = cmp(base, regressed)
    assert row(report, "throughput_vs_naive").verdict == "slower"
    assert rows.exit_code(report) == 1
    # Forcing absolute comparison on a 2x machine calls the unchanged code "faster".
    assert row(cmp(base, fast, machine="same")).verdict == "faster"


def test_cross_machine_single_variant_is_not_comparable() -> None:
    base = make_result({"opt": BASE})
    with pytest.raises(ResultError, match="single variant"):
        cmp(base, make_result({"opt": BASE}, machine=OTHER))


# ------------------------------------------------------------------------------ formats

GOLDEN_TABLE = """\
scenario  variant  metric       baseline  current  change          99% CI          p        test          verdict
tiny      naive    throughput   1,000     1,000    1.000 (0.0%)    [0.988, 1.011]  1        mann-whitney  same
tiny      naive    stall_share  20.0%     20.0%    0.0 pt          [0.0, 0.0] pt   1        mann-whitney  same
tiny      opt      throughput   3,000     2,100    0.700 (-30.0%)  [0.692, 0.708]  0.00794  mann-whitney  slower
tiny      opt      stall_share  20.0%     20.0%    0.0 pt          [0.0, 0.0] pt   1        mann-whitney  same
gate FAIL: 1 slower, 0 faster, 0 inconclusive, 3 same, 0 not comparable (threshold 10%, alpha 0.01)
"""


def _golden_pair() -> tuple[Result, Result]:
    return (make_result({"naive": BASE, "opt": scaled(BASE, 3)}),
            make_result({"naive": BASE, "opt": scaled(BASE, 2.1)}))


def test_table_golden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = _golden_pair()
    code = cli(["--baseline", str(save(base, tmp_path / "b" / "tiny-1.json")),
                "--current", str(save(cur, tmp_path / "c" / "tiny-2.json")),
                "--threshold", "10%"])
    assert code == 1
    assert capsys.readouterr().out == GOLDEN_TABLE


def test_a_change_that_rounds_to_zero_has_no_sign() -> None:
    """A stall share 0.0004 lower and a throughput 0.04% lower print "0.0 pt" and "0.0%":
    "-0.0 pt" beside "same" claims a direction the digits do not show (issue 42)."""
    pts = rows.Row("s", "v", "stall_share", 0.2004, 0.2, -0.0004, "points", -0.0004, 0.0003,
                   1.0, "mann-whitney", "same")
    ratio = rows.Row("s", "v", "throughput", 1000.0, 999.6, 0.9996, "ratio", 0.9, 1.1, 1.0,
                     "mann-whitney", "same")
    assert formats.format_change(pts) == "0.0 pt"
    assert formats.format_interval(pts) == "[0.0, 0.0] pt"
    assert formats.format_change(ratio) == "1.000 (0.0%)"
    worse = rows.Row("s", "v", "stall_share", 0.2, 0.28, 0.08, "points", 0.07, 0.09, 0.001,
                     "mann-whitney", "slower")
    assert formats.format_change(worse) == "+8.0 pt"    # a change that shows keeps its sign
    assert formats.format_interval(worse) == "[+7.0, +9.0] pt"


def test_json_markdown_github_formats() -> None:
    report = cmp(*_golden_pair())
    data = json.loads(formats.format_json(report))
    assert data["exit_code"] == 1 and data["counts"]["slower"] == 1
    assert data["rows"][2]["verdict"] == "slower" and data["rows"][2]["change"] == pytest.approx(0.7)
    md = formats.format_markdown(report)
    assert md.startswith("| scenario | variant |") and "**gate FAIL" in md
    gh = formats.format_github(report).splitlines()
    assert gh[0].startswith("::error title=stallbench gate::tiny/opt throughput: slower")
    assert "%25" in gh[0] and not any(l.startswith("::") for l in gh[1:])


def test_github_warns_on_inconclusive() -> None:
    base = make_result({"opt": [1000, 1500, 700, 1300, 800]})
    cur = make_result({"opt": [800, 1200, 650, 1100, 600]})
    assert formats.format_github(cmp(base, cur)).startswith("::warning ")


# ------------------------------------------------------------------------------ CLI

def cli(argv: list[str]) -> int:
    """What stallbench.cli does: parse, run, and turn a UserError into exit 2."""
    parser = argparse.ArgumentParser(prog="stallbench")
    gate_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gate", *argv])
    try:
        return args.func(args)
    except UserError as err:
        print(f"error: {err}")
        return err.exit_code


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = save(make_result({"naive": BASE, "opt": scaled(BASE, 3)}), tmp_path / "b" / "tiny.json")
    same = save(make_result({"naive": BASE, "opt": scaled(BASE, 3)}), tmp_path / "same" / "t.json")
    slow = save(make_result({"naive": BASE, "opt": scaled(BASE, 2.1)}), tmp_path / "slow" / "t.json")
    fast = save(make_result({"naive": BASE, "opt": scaled(BASE, 4.5)}), tmp_path / "fast" / "t.json")
    one = save(make_result({"naive": BASE[:1], "opt": BASE[:1]}), tmp_path / "one" / "t.json")
    other_fp = save(make_result({"opt": BASE}, fingerprint="f" * 16), tmp_path / "fp" / "t.json")
    bad_json = tmp_path / "bad" / "t.json"
    bad_json.parent.mkdir()
    bad_json.write_text("{not json", encoding="utf-8")
    v2 = tmp_path / "v2" / "t.json"
    v2.parent.mkdir()
    v2.write_text(json.dumps({**json.loads(base.read_text()), "schema_version": 99}))

    def run(cur: Path | str, *extra: str) -> int:
        return cli(["--baseline", str(base.parent), "--current", str(cur), "--threshold", "10%",
                    *extra])

    assert run(same) == 0
    assert run(same.parent, "--format", "json") == 0
    assert run(slow) == 1
    assert run(fast) == 0
    assert run(fast, "--fail-on-improvement") == 1
    capsys.readouterr()
    for bad, message in [(tmp_path / "missing.json", "no such result"), (bad_json, "not valid JSON"),
                         (v2, "schema_version"), (other_fp, "fingerprint"), (one, "repeat")]:
        assert run(bad) == 2, bad
        out = capsys.readouterr().out
        assert message in out and len(out.strip().splitlines()) == 1, out
    assert run(same, "--threshold", "fast") == 2
    assert run(same, "--threshold", "10") == 2
    assert "did you mean 10%" in capsys.readouterr().out
    assert run(same, "--alpha", "2") == 2


@pytest.mark.parametrize("text,value", [("10%", 0.10), ("0.1", 0.1), (" 2.5% ", 0.025)])
def test_parse_threshold(text: str, value: float) -> None:
    assert gate_cmd.parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "abc", "0", "-5%", "100%", "10", "1.5"])
def test_parse_threshold_rejects(text: str) -> None:
    with pytest.raises(UserError, match="--threshold"):
        gate_cmd.parse_threshold(text)


def test_cli_metric_selection_and_cross_machine_override(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    base = save(make_result({"naive": BASE, "opt": scaled(BASE, 3)}), tmp_path / "b" / "t.json")
    cur = save(make_result({"naive": BASE, "opt": scaled(BASE, 3)}), tmp_path / "c" / "t.json")
    assert cli(["--baseline", str(base), "--current", str(cur), "--threshold", "0.1",
                "--metric", "throughput", "--cross-machine", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["metric"] for r in rows] == ["throughput_vs_naive"]


# ------------------------------------------------------------------------------ update-baseline

def test_update_baseline_replaces_same_scenario(tmp_path: Path) -> None:
    bdir = tmp_path / "baseline"
    old = save(make_result({"opt": BASE}), bdir / "tiny-old.json")
    keep = save(make_result({"opt": BASE}, scenario="other"), bdir / "other.json")
    cur = save(make_result({"opt": scaled(BASE, 1.01)}, created="2024-06-01T00:00:00+00:00"),
               tmp_path / "cur" / "tiny-new.json")
    written = gate.update_baseline([cur], bdir)
    assert written == [bdir / "tiny-new.json"]
    assert not old.exists() and keep.exists()
    assert (bdir / "tiny-new.json").read_text() == cur.read_text()
    assert not list(bdir.glob(".*.tmp"))


def test_cli_update_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bdir = tmp_path / "baseline"
    first = save(make_result({"opt": BASE}), tmp_path / "r1" / "tiny-1.json")
    args = ["--baseline", str(bdir), "--threshold", "10%", "--update-baseline", "--current"]
    assert cli([*args, str(first)]) == 0                       # no baseline yet: created
    assert [p.name for p in bdir.glob("*.json")] == ["tiny-1.json"]
    slow = save(make_result({"opt": scaled(BASE, 0.5)}), tmp_path / "r2" / "tiny-2.json")
    assert cli([*args, str(slow)]) == 1                        # a regression is never accepted
    assert [p.name for p in bdir.glob("*.json")] == ["tiny-1.json"]
    fast = save(make_result({"opt": scaled(BASE, 1.5)}), tmp_path / "r3" / "tiny-3.json")
    assert cli([*args, str(fast)]) == 0                        # an improvement refreshes it
    assert [p.name for p in bdir.glob("*.json")] == ["tiny-3.json"]
    assert load(bdir / "tiny-3.json").variants[0].throughput_samples_s.median == 1500


# ------------------------------------------------------------------------------ error rates

REPEATS = 5          # what the CI scenarios run
PAIRS = 400


def _draw(rng: np.random.Generator, cv: float, slowdown: float = 1.0) -> Result:
    """Two variants with lognormal throughput noise of the given CV and noisy stall shares."""
    sigma = math.sqrt(math.log(1 + cv * cv))
    noise = lambda: list(rng.lognormal(0.0, sigma, REPEATS))  # noqa: E731
    share = lambda m, sd: list(np.clip(rng.normal(m, sd, REPEATS), 0, 1))  # noqa: E731
    return make_result([
        make_variant("naive", scaled(noise(), 1000.0), share=share(0.6, 0.03)),
        make_variant("opt", scaled(noise(), 3000.0 / slowdown), share=share(0.1, 0.02)),
    ])


def _failure_rate(cv: float, slowdown: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(PAIRS):
        report = gate.compare([_draw(rng, cv)], [_draw(rng, cv, slowdown)], threshold=0.10,
                              alpha=0.01, n_boot=50)
        fails += rows.exit_code(report)
    return fails / PAIRS


def test_aa_false_positive_rate_under_5_percent() -> None:
    """Same noise on both sides (CV 8%, the noisy end): the gate almost never fails."""
    assert _failure_rate(cv=0.08, slowdown=1.0, seed=1) < 0.05


def test_ab_30_percent_slowdown_caught_over_95_percent() -> None:
    """Epoch time x1.3 (throughput / 1.3) at CV 6% with 5 repeats: caught in > 95% of draws."""
    assert _failure_rate(cv=0.06, slowdown=1.3, seed=2) > 0.95


# ------------------------------------------------------------------------------ too few repeats
# 2 vs 2 repeats can never reach p < 0.01 in the rank test (min p = 1/3), and the fallback
# 99% t-intervals with 1 degree of freedom are ~64 standard errors wide: before the rule below,
# a throughput of 0 was "inconclusive" and the gate passed.

def test_two_repeats_collapse_to_zero_fails_as_too_few_repeats() -> None:
    base = make_result({"opt": [1000.0, 1100.0]})
    for cur_tp in ([0.0, 0.0], [10.0, 11.0]):          # a collapse, and 100x slower
        report = cmp(base, _throughput(make_result({"opt": [1.0, 1.0]}), cur_tp))
        r = row(report)
        assert r.verdict == "too few repeats" and r.direction == "worse"
        assert "2 vs 2 repeats can never reach p < 0.01" in r.note and ">= 5 repeats" in r.note
        assert rows.exit_code(report) == 1
        assert formats.summary_line(report).startswith("gate FAIL: 0 slower")
        assert "1 too few repeats" in formats.summary_line(report)
        assert formats.format_github(report).startswith("::error ")


def _throughput(r: Result, values: list[float]) -> Result:
    """``r`` with its variant's throughput replaced (the factory derives epochs from it, so a
    throughput of 0 is set here)."""
    r.variants[0].throughput_samples_s = results.Summary.of(values)
    return r


def test_too_few_repeats_is_one_rule_for_every_metric() -> None:
    """The stall share (points) follows the same rule as throughput (ratio)."""
    base = make_result([make_variant("opt", [1000.0, 1000.0], share=[0.10, 0.40])])
    cur = make_result([make_variant("opt", [1000.0, 1000.0], share=[0.90, 0.95])])
    r = row(cmp(base, cur), metric="stall_share")
    assert r.verdict == "too few repeats" and r.direction == "worse"


def test_too_few_repeats_better_fails_only_with_fail_on_improvement() -> None:
    base = make_result({"opt": [100.0, 140.0]})
    cur = make_result({"opt": [300.0, 420.0]})
    report = cmp(base, cur)
    assert row(report).verdict == "too few repeats" and row(report).direction == "better"
    assert rows.exit_code(report) == 0
    assert formats.format_github(report).startswith("::warning ")
    assert rows.exit_code(cmp(base, cur, fail_on_improvement=True)) == 1


def test_enough_repeats_keep_inconclusive_and_few_repeats_keep_decided_verdicts() -> None:
    """Where the rank test can reach alpha nothing changes (the noisy 5 vs 5 above stays
    inconclusive and passes); with few repeats a decided verdict (intervals apart) and a change
    within the threshold stay what they were."""
    noisy = cmp(make_result({"opt": [1000, 1500, 700, 1300, 800]}),
                make_result({"opt": [800, 1200, 650, 1100, 600]}))
    assert row(noisy).verdict == "inconclusive" and rows.exit_code(noisy) == 0
    apart = cmp(make_result({"opt": [1000.0, 1001.0, 1002.0]}),
                make_result({"opt": [500.0, 501.0, 502.0]}))
    assert row(apart).verdict == "slower" and row(apart).test == "ci-overlap"
    within = cmp(make_result({"opt": [1000.0, 1100.0]}), make_result({"opt": [980.0, 1050.0]}))
    assert row(within).verdict == "same" and rows.exit_code(within) == 0


def test_few_repeats_that_disagree_stay_inconclusive() -> None:
    """Beyond the threshold by the medians, but the ranges overlap (a current repeat beats a
    baseline one): the repeats disagree on the direction, so it is noise-like, inconclusive,
    and passes, as before."""
    report = cmp(make_result({"opt": [1000.0, 1400.0]}), make_result({"opt": [800.0, 1200.0]}))
    assert row(report).change < 0.9 and row(report).verdict == "inconclusive"
    assert rows.exit_code(report) == 0
    from stallbench.gate.rule import METRICS, compare_paired

    mixed = compare_paired([100.0, 110.0, 90.0], [50.0, 120.0, 40.0], METRICS["throughput"],
                           alpha=0.05)
    assert mixed.test == "paired-t" and mixed.verdict == "inconclusive"


def test_paired_rule_too_few_pairs() -> None:
    from stallbench.gate.rule import METRICS, compare_paired

    tp = METRICS["throughput"]
    c = compare_paired([100.0, 110.0, 90.0], [20.0, 90.0, 30.0], tp, alpha=0.05)
    assert c.test == "paired-t" and c.verdict == "too few repeats" and c.direction == "worse"
    assert "3 pairs that differ" in c.note and ">= 6 pairs" in c.note


def test_too_few_repeats_golden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's table, summary and exit code for a 2 vs 2 collapse (tests/golden)."""
    from stallbench import cli as main_cli

    b = save(make_result({"opt": [1000.0, 1100.0]}), tmp_path / "b" / "tiny.json")
    c = save(_throughput(make_result({"opt": [1.0, 1.0]}), [0.0, 0.0]), tmp_path / "c" / "t.json")
    code = main_cli.main(["gate", "--baseline", str(b), "--current", str(c), "--threshold", "10%"])
    got = f"rc={code}\n" + capsys.readouterr().out
    golden = ROOT / "tests" / "golden" / "gate_too_few.txt"
    if os.environ.get("STALLBENCH_REGOLD"):
        golden.write_text(got)
    assert got == golden.read_text()
