"""The HTML report: bad inputs fail with one clear error, absent sections degrade to one line."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from stallbench.commands import report as report_cmd
from stallbench.errors import ResultError, UserError
from stallbench.report import plots, render

LIGHT = {"timeline": False, "resources": False}  # fewer figures where a test does not need them


def _html(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _imgs(html: str) -> list[str]:
    return re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)


def _assert_self_contained(html: str) -> None:
    # No URL the browser could fetch: no external src/href, no stylesheet link, no script.
    assert not re.search(r'(src|href)="(?!data:|#)', html)
    assert "<link" not in html and "<script" not in html
    assert "http://" not in html and "https://" not in html
    assert "@import" not in html and "url(" not in html


# ----------------------------------------------------------------------------------- errors

def test_missing_file_is_a_result_error(tmp_path: Path) -> None:
    with pytest.raises(ResultError, match="no such result file"):
        render([tmp_path / "nope.json"], tmp_path / "out.html")
    assert not (tmp_path / "out.html").exists()


def test_malformed_json_is_a_result_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "variants": [', encoding="utf-8")
    with pytest.raises(ResultError, match=r"bad\.json: not valid JSON"):
        render([bad], tmp_path / "out.html")


def test_json_that_is_not_a_result_is_a_result_error(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema_version": 1, "hello": "world"}), encoding="utf-8")
    with pytest.raises(ResultError, match="other.json"):
        render([other], tmp_path / "out.html")


def test_unknown_schema_version_is_a_result_error(tmp_path: Path, make_result: Any,
                                                  write_result: Any) -> None:
    d = make_result().to_dict()
    d["schema_version"] = 99
    p = tmp_path / "future.json"
    p.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(ResultError, match="schema_version"):
        render([p], tmp_path / "out.html")


def test_no_paths_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError):
        render([], tmp_path / "out.html")


# ---------------------------------------------------------------------------------- content

def test_full_result_renders_every_section(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    r = make_result(object_store=True, gpu=True)
    out = render([write_result(r)], tmp_path / "report" / "index.html")
    assert out == tmp_path / "report" / "index.html"
    html = _html(out)
    _assert_self_contained(html)
    assert r.analysis["verdict"] in html
    for heading in ("Where the epoch goes", "Throughput per variant", "What if: more workers",
                    "Per-batch timeline", "Emulated / predicted figures", "Scenario", "Machine"):
        assert heading in html, heading
    # breakdown, throughput, what-if + (timeline, resources) per variant
    assert len(_imgs(html)) == 3 + 2 * len(r.variants)
    assert "could not draw" not in html
    for placeholder in ("No verdict", "No what-if", "No per-batch", "No resource", "No per-stage"):
        assert placeholder not in html, placeholder
    # numbers, not only plots
    for v in r.variants:
        assert f"{v.throughput_samples_s.median:,.0f}" in html
    assert "storage.bandwidth_mb_s" in html and "PREDICTED" in html
    assert "Calibrated at the fit: producers +0.5 us/sample outside the stage timers" in html
    assert "object store" in html and "GPU" in html
    # the page is readable by anyone, not just the owner (mkstemp makes 0600)
    assert out.stat().st_mode & 0o044


def test_result_without_analysis_renders_placeholders(tmp_path: Path, make_result: Any,
                                                      write_result: Any) -> None:
    r = make_result(analysis=False, whatif=False, timeline=False, resources=False)
    for v in r.variants:
        v.stage_rates = {}
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    _assert_self_contained(html)
    assert "No verdict in this result" in html
    assert "No what-if prediction in this result" in html
    assert "No per-batch timeline or resource samples in this result" in html
    assert "No per-stage attribution" in html
    # measured split and throughput are still drawn
    assert len(_imgs(html)) == 2
    assert "from medians" in html  # speedup derived from the measured medians


def test_minimal_result_from_json_with_nulls(tmp_path: Path, make_result: Any) -> None:
    """A result whose figures are null (NaN on save) and with no optional keys at all."""
    d = make_result(analysis=False, whatif=False, timeline=False, resources=False).to_dict()
    for v in d["variants"]:
        for k in ("stage_rates", "bytes", "ablations", "analysis", "timeline", "resources", "emulated"):
            v.pop(k, None)
    d.pop("analysis")
    d.pop("dataset")
    d["machine"] = {}
    d["scenario"].pop("text")
    d["variants"][1]["throughput_samples_s"] = {"median": None, "min": None, "max": None,
                                                "values": [None, None]}
    p = tmp_path / "min.json"
    p.write_text(json.dumps(d), encoding="utf-8")
    html = _html(render([p], tmp_path / "out.html"))
    assert "Nothing emulated" in html
    assert "does not carry the scenario text" in html
    assert "No machine metadata" in html


def test_two_runs_of_one_scenario_side_by_side(tmp_path: Path, make_result: Any,
                                               write_result: Any) -> None:
    base = make_result(seed=1, created_utc="2025-11-19T08:00:00+00:00", git_commit="1a2b3c4")
    cur = make_result(seed=2, speed=1.3, created_utc="2025-11-21T09:30:00+00:00", git_commit="7c0ffee")
    cur.machine["git"]["dirty"] = True
    # given newest first: the page still orders oldest -> newest and leads with the newest
    paths = [write_result(cur, "current/r.json"), write_result(base, "baseline/r.json")]
    html = _html(render(paths, tmp_path / "out.html"))
    _assert_self_contained(html)
    assert html.count('class="scenario"') == 1
    assert "Runs side by side" in html
    assert "baseline: 2025-11-19 08:00 @1a2b3c4" in html
    assert "current: 2025-11-21 09:30 @7c0ffee-dirty" in html
    assert html.index(cur.analysis["verdict"]) < html.index("Runs side by side")
    assert "Earlier run: baseline" in html
    assert "faster" in html
    # comparison figure + both runs' figures
    per_run = 3 + 2 * len(cur.variants)
    assert len(_imgs(html)) == 1 + 2 * per_run
    for v in cur.variants:
        new, old = (r.variant(v.name).throughput_samples_s.median for r in (cur, base))
        delta = new / old - 1
        assert f"{delta * 100:+.1f}%" in html


def test_different_scenarios_get_their_own_sections(tmp_path: Path, make_result: Any,
                                                    write_result: Any) -> None:
    paths = [write_result(make_result("alpha", **LIGHT), "a.json"),
             write_result(make_result("beta", **LIGHT), "b.json")]
    html = _html(render(paths, tmp_path / "out.html"))
    assert html.count('class="scenario"') == 2
    assert 'href="#s0-alpha"' in html and 'id="s1-beta"' in html
    assert "Runs side by side" not in html


def test_changed_fingerprint_warns(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    a, b = make_result(**LIGHT), make_result(created_utc="2025-11-22T00:00:00+00:00", **LIGHT)
    b.scenario["fingerprint"] = "ffffffffffffffff"
    html = _html(render([write_result(a, "a.json"), write_result(b, "b.json")], tmp_path / "o.html"))
    assert "not strictly comparable" in html


def test_text_is_escaped(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    r = make_result(**LIGHT)
    r.scenario["text"] += '\n# <script>alert("x")</script>\n'
    r.analysis["verdict"] = "fetch-bound <b>really</b>"
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "&lt;b&gt;really&lt;/b&gt;" in html


def test_odd_fields_degrade_instead_of_crashing(tmp_path: Path, make_result: Any,
                                                write_result: Any) -> None:
    r = make_result()
    v0, v1, v2 = r.variants
    v0.timeline = {"t_start_s": [0.0, 0.1, 0.2], "wait_s": [0.05], "compute_s": [0.01, "x", None]}
    v1.resources = {"t_s": [0, 1, 2], "cpu_percent_per_core": [[1, 2]], "rss_mb": "lots"}
    v2.analysis = {"compute_s": 1.0, "intervals": {"compute_s": [1]}, "bound_by": None}
    r.analysis["whatif"] = {"points": [{"n": 1}, {"predicted_samples_s": 5}, "junk"],
                            "measured": [{"n": 2, "measured_samples_s": 10.0}], "knee": None}
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert r.analysis["verdict"] in html
    assert len(_imgs(html)) >= 3


# ------------------------------------------------------------------------------------ plots

def test_plots_return_none_without_data() -> None:
    assert plots.epoch_breakdown([]) is None
    assert plots.throughput(["a"], [{"label": "x", "values": {}}]) is None
    assert plots.whatif([]) is None
    assert plots.timeline({}) is None
    assert plots.resources({}) is None
    assert plots.resources({"t_s": [0, 1], "rss_mb": []}) is None


def test_many_cores_are_summarised() -> None:
    res = {"t_s": [0, 1, 2], "cpu_percent_per_core": [[10, 20, 30]] * 16}
    assert plots.resources(res)


# -------------------------------------------------------------------------------------- CLI

def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stallbench")
    report_cmd.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", *argv])


def test_cli_renders_a_directory(tmp_path: Path, make_result: Any, write_result: Any,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_result(make_result(**LIGHT), "results/one.json")
    write_result(make_result("nested-xyz", **LIGHT), "results/nested/ignored.json")  # one level only
    out = tmp_path / "report" / "index.html"
    args = _args(str(tmp_path / "results"), "-o", str(out))
    assert args.func is report_cmd.run
    assert report_cmd.run(args) == 0
    assert out.exists() and "recsys-workers" in _html(out) and "nested-xyz" not in _html(out)
    assert f"wrote {out}" in capsys.readouterr().out


def test_cli_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_result: Any,
                      write_result: Any) -> None:
    write_result(make_result(**LIGHT), "results/one.json")
    monkeypatch.chdir(tmp_path)
    args = _args()
    assert args.paths == [] and args.output == Path("report/index.html")
    assert report_cmd.run(args) == 0
    assert (tmp_path / "report" / "index.html").exists()


def test_cli_without_result_files_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no result files"):
        report_cmd.run(_args(str(tmp_path / "empty"), "-o", str(tmp_path / "o.html")))


def test_cli_missing_path_is_a_result_error(tmp_path: Path) -> None:
    with pytest.raises(ResultError, match="no such result file"):
        report_cmd.run(_args(str(tmp_path / "missing"), "-o", str(tmp_path / "o.html")))


def test_cli_malformed_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ResultError) as exc:
        report_cmd.run(_args(str(bad), "-o", str(tmp_path / "o.html")))
    assert "\n" not in str(exc.value) and "bad.json" in str(exc.value)


# ---------------------------------------------------------------------------- committed data

def test_committed_example_results_render(tmp_path: Path, example_results: list[Path]) -> None:
    if not example_results:
        pytest.skip("no committed example results under results/examples/ yet")
    html = _html(render(example_results, tmp_path / "out.html"))
    _assert_self_contained(html)
    assert "could not draw" not in html
    assert _imgs(html)


def test_resources_per_sample_and_absolute_clock_are_understood() -> None:
    t = [1_700_000_000.0 + i * 0.1 for i in range(5)]
    per_sample = [[50.0, 20.0]] * 5   # [core0, core1] at each sample
    assert plots.resources({"t_s": t, "cpu_percent_per_core": per_sample})
    assert plots.timeline({"t_start_s": [1e6, 1e6 + 0.2], "wait_s": [0.1, 0.1],
                           "compute_s": [0.1, 0.1]})


def test_negative_stall_and_knee_without_n(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """Attribution is a difference of noisy means (a part can be < 0); the model may find no knee."""
    r = make_result(timeline=False, resources=False)
    r.variants[1].analysis["fetch_stall_s"] = -0.097
    r.analysis["whatif"]["knee"] = {"n": None, "bound_by": "transfer", "saturates_at": 4,
                                    "explanation": "no worker count removes the stall"}
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert "-97 ms" in html
    assert "No knee; saturates at 4 workers" in html
    assert "could not draw" not in html
