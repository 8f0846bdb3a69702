"""The HTML report: bad inputs fail with one clear error, absent sections degrade to one line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from stallbench import results
from stallbench.gate import rule as compare
from stallbench.commands import report as report_cmd
from stallbench.errors import ResultError, UserError
from stallbench.report import plots
from stallbench.report.render import render
from stallbench.report.render import format_mb, format_pct, format_s
from stallbench.results import (Interval, Knee, Resources, StageRates, Summary, Timeline,
                                WhatIfCheck, WhatIfPoint)

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
    d = results.to_dict(make_result())
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
    assert r.analysis.verdict in html
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
        v.stage_rates = StageRates()
        v.trainer_solo = None
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
    d = results.to_dict(make_result(analysis=False, whatif=False, timeline=False, resources=False))
    for v in d["variants"]:
        for k in ("stage_rates", "trainer_solo", "bytes", "ablations", "attribution", "notes",
                  "timeline", "resources"):
            v.pop(k, None)
        v["emulated"] = []
    d.pop("analysis")
    d["dataset"] = {}
    d["machine"] = {}
    d["scenario"]["text"] = ""
    d["variants"][1]["throughput_samples_s"] = {"median": None, "min": None, "max": None,
                                                "values": [None, None]}
    p = tmp_path / "min.json"
    p.write_text(json.dumps(d), encoding="utf-8")
    html = _html(render([p], tmp_path / "out.html"))
    assert "Nothing emulated" in html
    assert "does not carry the scenario text" in html
    assert "No machine metadata" in html
    assert ">Dataset</h3>" not in html     # a card shows what the result holds or is absent


def test_a_profile_results_dataset_shows_only_what_it_holds(tmp_path: Path, make_result: Any,
                                                             write_result: Any) -> None:
    """Issue 42: a profile result's dataset is the job's own loaders: no files, rows or bytes
    measured, so none is shown as 0."""
    from stallbench.results import DatasetInfo

    r = make_result(timeline=False, resources=False)
    r.dataset = DatasetInfo(source="the job's own loaders")
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    card = html[html.index(">Dataset</h3>"):]
    card = card[:card.index("</table>")]
    assert "the job" in card and "files" not in card and "rows" not in card and "bytes" not in card


def test_two_runs_of_one_scenario_side_by_side(tmp_path: Path, make_result: Any,
                                               write_result: Any) -> None:
    base = make_result(seed=1, created_utc="2025-11-19T08:00:00+00:00", git_commit="1a2b3c4")
    cur = make_result(seed=2, speed=1.3, created_utc="2025-11-21T09:30:00+00:00", git_commit="7c0ffee")
    cur.machine.git.dirty = True
    # given newest first: the page still orders oldest -> newest and leads with the newest
    paths = [write_result(cur, "current/r.json"), write_result(base, "baseline/r.json")]
    html = _html(render(paths, tmp_path / "out.html"))
    _assert_self_contained(html)
    assert html.count('class="scenario"') == 1
    assert "Runs side by side" in html
    assert "baseline: 2025-11-19 08:00 @1a2b3c4" in html
    assert "current: 2025-11-21 09:30 @7c0ffee-dirty" in html
    assert html.index(cur.analysis.verdict) < html.index("Runs side by side")
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
    b.scenario.fingerprint = "ffffffffffffffff"
    html = _html(render([write_result(a, "a.json"), write_result(b, "b.json")], tmp_path / "o.html"))
    assert "not strictly comparable" in html
    assert "different machines" not in html


def test_other_core_count_warns_like_the_gate(tmp_path: Path, make_result: Any,
                                              write_result: Any) -> None:
    """Same CPU model, other core count: the gate's ``machines_differ`` says so, the page too."""
    a, b = make_result(**LIGHT), make_result(created_utc="2025-11-22T00:00:00+00:00", **LIGHT)
    b.machine.cores_logical = 16
    html = _html(render([write_result(a, "a.json"), write_result(b, "b.json")], tmp_path / "o.html"))
    assert "different machines (CPU model or core count)" in html
    assert "within-run ratios" in html


def test_text_is_escaped(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    r = make_result(**LIGHT)
    r.scenario.text += '\n# <script>alert("x")</script>\n'
    r.analysis.verdict = "fetch-bound <b>really</b>"
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "&lt;b&gt;really&lt;/b&gt;" in html


def test_odd_fields_degrade_instead_of_crashing(tmp_path: Path, make_result: Any,
                                                write_result: Any) -> None:
    """Loading checks types, not tidiness: series of unequal lengths, nulls (NaN) in figures,
    intervals of a point, a what-if point without a prediction all still render."""
    r = make_result()
    v0, v1, v2 = r.variants
    v0.timeline = Timeline(t_start_s=[0.0, 0.1, 0.2], wait_s=[0.05], compute_s=[0.01, math.nan])
    v1.resources = Resources(t_s=[0, 1, 2], cpu_percent_per_core=[[1, 2]], pss_mb=[math.nan] * 3,
                             gpu_util_percent=[[], [50.0], [math.nan, 40.0]])
    a = v2.attribution
    a.fetch_stall_s = math.nan
    a.intervals.compute_s = Interval(math.nan, math.nan)
    a.bound_by = ""
    wi = r.analysis.whatif
    wi.points = [WhatIfPoint(n=1, predicted_samples_s=math.nan, stall_share=math.nan,
                             bound_by="", why="")]
    wi.measured = [WhatIfCheck(n=2, variant="num_workers=2", measured_samples_s=10.0,
                               predicted_samples_s=math.nan)]
    wi.knee = Knee(n=None, bound_by=None, explanation="")
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert r.analysis.verdict in html
    assert "could not draw" not in html
    assert len(_imgs(html)) >= 3


# ------------------------------------------------------------------------------------ plots

def test_plots_return_none_without_data() -> None:
    assert plots.epoch_breakdown([]) is None
    assert plots.throughput(["a"], [{"label": "x", "values": {}}]) is None
    assert plots.whatif([]) is None
    assert plots.timeline(Timeline()) is None
    assert plots.resources(Resources()) is None
    assert plots.resources(Resources(t_s=[0, 1], pss_mb=[])) is None


def test_many_cores_are_summarised() -> None:
    res = Resources(t_s=[0, 1, 2], cpu_percent_per_core=[[10, 20, 30]] * 16)
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
    assert plots.resources(Resources(t_s=t, cpu_percent_per_core=per_sample))
    assert plots.timeline(Timeline(t_start_s=[1e6, 1e6 + 0.2], wait_s=[0.1, 0.1],
                                   compute_s=[0.1, 0.1]))


def test_negative_stall_and_knee_without_n(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """Attribution is a difference of noisy means (a part can be < 0); the model may find no knee."""
    r = make_result(timeline=False, resources=False)
    r.variants[1].attribution.fetch_stall_s = -0.097
    r.analysis.whatif.knee = Knee(n=None, bound_by="transfer", saturates_at=4,
                                  explanation="no worker count removes the stall")
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert "-97 ms" in html
    assert "No knee; saturates at 4 workers" in html
    assert "could not draw" not in html
    assert 'data-figure="zero"' not in html


def test_a_part_whose_interval_spans_zero_is_not_a_negative_stall(
        tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """Issue 25: "a fetch stall of -1.29 s [-1.55, 4.96]" was printed as a figure. A part
    whose interval spans 0 reads "~0" with its interval and the note, in the table and in
    the chart's note, never as a negative stall."""
    r = make_result(timeline=False, resources=False)
    a = r.variants[1].attribution
    a.fetch_stall_s = -1.29
    a.intervals.fetch_stall_s = Interval(-1.55, 4.96)
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    cells = re.findall(r'<td class="num" data-figure="zero">([^<]*)<span class="ci">([^<]*)<', html)
    assert [(x, iv.replace("\xa0", " ")) for x, iv in cells] == [("~0", "-1.55 s – 4.96 s")]
    assert "~0: not distinguishable from 0 (its interval spans 0)" in html
    assert "-1.29" not in html


# ------------------------------------------------------------- one meaning per name (issue 12)

V1_EXAMPLE = Path(__file__).resolve().parent.parent.parent / "results" / "examples" / "schema-v1.json"


def _card(html: str, figure: str) -> str:
    """The value of the verdict card's tile ``data-figure=figure`` (the first run's card)."""
    m = re.search(rf'<div class="tile" data-figure="{figure}".*?<div class="tile-v">([^<]*)<', html, re.S)
    assert m, f"no {figure} tile"
    return m.group(1).strip()


def _cells(html: str, figure: str) -> list[str]:
    return [c.strip() for c in re.findall(rf'<td class="num" data-figure="{figure}">([^<]*)<', html)]


def _attributed_sub(html: str) -> str:
    m = re.search(r'<div class="tile-sub" data-figure="attributed-stall">([^<]*)<', html)
    assert m, "no attributed stall beside the trainer stall"
    return m.group(1).strip()


def test_trainer_stalled_card_is_the_variants_stall_share(tmp_path: Path, make_result: Any,
                                                          write_result: Any) -> None:
    """The card named "trainer stalled" shows the run table's figure (``stall_share.median``),
    not the attribution's, which is shown beside it under its own name."""
    r = make_result(timeline=False, resources=False)
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    base = r.variant(r.analysis.baseline_variant)
    trainer, attributed = format_pct(base.stall_share.median), format_pct(base.attribution.attributed_stall_share)
    assert trainer != attributed   # the sample makes them differ, as real runs do
    assert _card(html, "trainer-stalled") == trainer
    assert _attributed_sub(html) == f"attributed stall (above compute-only run): {attributed}"
    # the throughput table's "trainer stalled" column: the same figure, per variant
    assert _cells(html, "trainer-stalled") == [format_pct(v.stall_share.median) for v in r.variants]
    # the attribution table's total: the attributed stall, seconds and share
    for v in r.variants:
        a = v.attribution
        assert (f'data-figure="attributed-stall">{format_s(a.attributed_stall_s)}'
                f'<span class="ci">{format_pct(a.attributed_stall_share)} of the epoch</span>') in html


def test_stall_labels_each_name_one_figure(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """Every table header and card label that says "stall" says which stall: the trainer's
    (``stall_share``) or the attribution's (``attributed_stall_*``); none says a bare "stall"."""
    r = make_result(timeline=False, resources=False)
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    labels = re.findall(r"<th[^>]*>([^<]*)</th>", html) + \
        re.findall(r'<div class="tile-k">([^<]*)<', html)
    stall = [lab.strip().lower() for lab in labels if re.search(r"\bstall(?!bench)", lab.lower())]
    assert stall, "no stall label at all"
    for lab in stall:
        assert "trainer stalled" in lab or "attributed stall" in lab, lab


def test_v1_example_renders_through_migration(tmp_path: Path) -> None:
    """The committed v1 example loads (migrated to v2) and its figures land under v2 names:
    its ``analysis.stall_share`` is the attributed stall, its ``stall_share`` the trainer's."""
    raw = json.loads(V1_EXAMPLE.read_text(encoding="utf-8"))
    assert raw["schema_version"] == 1
    html = _html(render([V1_EXAMPLE], tmp_path / "out.html"))
    _assert_self_contained(html)
    assert "could not draw" not in html
    base = next(v for v in raw["variants"] if v["name"] == raw["analysis"]["baseline_variant"])
    assert _card(html, "trainer-stalled") == format_pct(base["stall_share"]["median"])
    assert _attributed_sub(html).endswith(format_pct(base["analysis"]["stall_share"]))
    assert _cells(html, "trainer-stalled") == [format_pct(v["stall_share"]["median"]) for v in raw["variants"]]
    for v in raw["variants"]:   # v1's peak_rss_mb held PSS: shown as peak memory (PSS)
        assert format_mb(v["peak_rss_mb"]["median"]) in html
    assert "peak memory (PSS)" in html and "memory (PSS) peak" in html
    assert raw["analysis"]["verdict"].replace("'", "&#39;") in html
    assert len(_imgs(html)) == 3 + 2 * len(raw["variants"])


def test_v2_sample_renders_every_typed_part(tmp_path: Path, make_result: Any,
                                            write_result: Any) -> None:
    r = make_result(gpu=True, object_store=True)
    path = write_result(r)
    assert json.loads(path.read_text())["schema_version"] == results.SCHEMA_VERSION == 3
    html = _html(render([path], tmp_path / "out.html"))
    # typed metadata listed generically: every machine field, the settings and the dataset
    for f in ("hostname", "cpu_model", "cores_logical", "cpu_affinity", "load_avg_at_start",
              "library torch"):
        assert f"<th scope=\"row\">{f}</th>" in html, f
    assert "NVIDIA T4 (15,360 MB)" in html and "3f2c9a1" in html
    assert "stallbench run scenarios/recsys-workers.toml" in html
    for f in ("compressed_bytes", "dense_columns", "cardinality"):
        assert f"<th scope=\"row\">{f}</th>" in html, f
    # stage rates and the solo probe; the variant's notes
    for f in ("preprocess_rows_s", "storage_mb_s", "trainer_solo.data_s_per_sample"):
        assert f"<code>{f}</code>" in html, f
    assert "device_copy: no-op: trainer device is the CPU" in html
    # what-if rows come from typed points and checks
    wi = r.analysis.whatif
    assert "predicted trainer stalled" in html and wi.knee.explanation in html
    assert len(_imgs(html)) == 3 + 2 * len(r.variants)


def test_emulated_model_step_is_described_as_a_wait(tmp_path: Path, make_result: Any,
                                                    write_result: Any) -> None:
    """EmulatedCompute sleeps (``costs.precise_wait``): the page must not call it a busy loop."""
    r = make_result(**LIGHT)
    for v in r.variants:
        v.emulated.append("model.step_ms")
        v.config["model"] = {"kind": "emulated", "step_ms": 4.0}
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    row = re.search(r"<code>model\.step_ms</code></td>(.*?)</tr>", html, re.S).group(1)
    assert "4" in row and "sleep" in row and "leaves the CPU free" in row
    assert "busy loop" not in row


# ------------------------------------------------------------- one rule for slower/faster

def _verdicts(html: str) -> dict[str, str]:
    rows = re.findall(r'<td class="name">([^<]*)</td>(?:(?!</tr>).)*?<td data-verdict="([^"]*)"',
                      html, re.S)
    return dict(rows)


def test_compare_verdict_is_the_gates_rule(tmp_path: Path, make_result: Any,
                                           write_result: Any) -> None:
    """The page's faster/slower is ``stallbench.gate.rule.compare``'s verdict. The values are
    chosen so the old min..max-overlap rule would say the opposite for every variant."""
    cases = {   # variant: (baseline repeats, current repeats, verdict by the shared rule)
        # ranges overlap (130 > 125), yet 24% faster and Mann-Whitney p = 0.003
        "num_workers=0": ([100, 101, 102, 103, 104, 105, 106, 130],
                          [125, 126, 127, 128, 129, 131, 132, 133], compare.FASTER),
        # ranges apart, but a 3% change is within the 10% threshold
        "num_workers=1": ([100, 101, 102], [103, 104, 105], compare.SAME),
        # ranges apart and 29% faster, but 2 vs 2 repeats: the rank test can never decide and
        # the t-intervals overlap, so the rule says too few repeats (not "inconclusive")
        "num_workers=2": ([100, 140], [150, 160], compare.TOO_FEW),
    }
    base = make_result(seed=1, created_utc="2025-11-19T08:00:00+00:00", **LIGHT)
    cur = make_result(seed=2, created_utc="2025-11-21T09:30:00+00:00", **LIGHT)
    for name, (b, c, _) in cases.items():
        base.variant(name).throughput_samples_s = Summary.of(b)
        cur.variant(name).throughput_samples_s = Summary.of(c)
    html = _html(render([write_result(base, "b.json"), write_result(cur, "c.json")],
                        tmp_path / "out.html"))
    shown = _verdicts(html)
    for name, (b, c, expected) in cases.items():
        rule = compare.compare(b, c, compare.METRICS["throughput"])
        assert rule.verdict == expected
        assert shown[name] == rule.verdict, name
        old_rule_faster = min(c) > max(b)
        assert (rule.verdict == compare.FASTER) != old_rule_faster, name
        assert f"{(rule.change - 1) * 100:+.1f}%" in html
    assert "Mann-Whitney p = 0.003" in html
    assert "the rule <code>stallbench gate</code> applies" in html
    assert "min..max ranges do not overlap" not in html


def test_compare_with_one_repeat_is_not_comparable(tmp_path: Path, make_result: Any,
                                                   write_result: Any) -> None:
    base = make_result(seed=1, repeats=1, created_utc="2025-11-19T08:00:00+00:00", **LIGHT)
    cur = make_result(seed=2, repeats=1, speed=2.0, created_utc="2025-11-21T09:30:00+00:00", **LIGHT)
    html = _html(render([write_result(base, "b.json"), write_result(cur, "c.json")],
                        tmp_path / "out.html"))
    assert set(_verdicts(html).values()) == {compare.NOT_COMPARABLE}
    assert "needs &gt;= 2 repeats a side (has 1 and 1)" in html
    # the median change is still shown, only no verdict is drawn from it
    v = cur.variants[0].name
    delta = cur.variant(v).throughput_samples_s.median / base.variant(v).throughput_samples_s.median - 1
    assert f"{delta * 100:+.1f}%" in html


# ------------------------------------------------------------------------------------- ranks

def _rank_summary(straggler: int | None) -> Any:
    from stallbench.results import RankStats, RankSummary

    stats = [RankStats(rank=r, stall_s=0.9 if r == 2 else 0.2, wait_s=0.8 if r == 2 else 0.15,
                       trainer_transfer_s=0.05, compute_s=1.0, sync_s=0.1 if r == 2 else 0.8,
                       steady_throughput_samples_s=20000.0, time_to_first_batch_s=0.1,
                       last_step_share=0.9 if r == 2 else 0.03,
                       straggler_delay_s=0.7 if r == 2 else 0.0) for r in range(4)]
    return RankSummary(world=4, launcher="processes", backend="gloo", sharding="a loader per rank",
                       producers_per_rank=True, launch_s=0.4, ranks=stats,
                       max_stall_s=Summary.of([0.9]), median_stall_s=Summary.of([0.2]),
                       spread_s=0.7, noise_s=0.1, straggler=straggler, candidate=2,
                       straggler_excess_s=0.7, gain_if_median_pace_s=0.65, gain_speedup=1.4,
                       verdict="rank 2 is the straggler: test verdict")


def test_rank_panel_highlights_the_straggler(tmp_path: Path, make_result: Any,
                                             write_result: Any) -> None:
    r = make_result(**LIGHT)
    r.variants[1].ranks = _rank_summary(straggler=2)
    r.variants[1].emulated = [*r.variants[1].emulated, "trainers.straggler_delay_ms"]
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert "Data-parallel ranks" in html and "rank 2 is the straggler: test verdict" in html
    rows = re.findall(r'<tr class="hl straggler" data-rank="(\d+)">', html)
    assert rows == ["2"]
    assert "could not draw" not in html
    assert 'alt="per-rank figures of' in html
    assert "one rank is made a straggler" in html        # the EMULATED key explained


def test_no_rank_panel_without_ranks_and_no_straggler_badge_when_none(
        tmp_path: Path, make_result: Any, write_result: Any) -> None:
    r = make_result(**LIGHT)
    html = _html(render([write_result(r)], tmp_path / "a.html"))
    assert "Data-parallel ranks" not in html
    r.variants[0].ranks = _rank_summary(straggler=None)
    html = _html(render([write_result(r)], tmp_path / "b.html"))
    assert "no straggler" in html and 'class="hl straggler"' not in html


def test_device_figures_render(tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """A GPU run's figures (made up here, typed as the runner writes them): AU per variant in
    the throughput table, the H2D table, GPU memory in the resource plot and stats."""
    from stallbench.results import DeviceFigures, Summary

    r = make_result(gpu=True)
    for i, v in enumerate(r.variants):
        v.device = DeviceFigures(device="cuda:0", compute_kind="gpu", compute_clock="cuda_events",
                                 au=Summary.of([0.91 + 0.01 * i, 0.93]),
                                 step_ms=Summary.of([9.4, 9.5]), h2d_gb_s=Summary.of([21.5, 22.5]),
                                 h2d_ms=Summary.of([0.41, 0.43]), h2d_bytes_per_batch=9.1e6,
                                 host_memory="pinned pool, no host copy 100%", device_prefetch=2)
        n = len(v.resources.t_s)
        v.resources.gpu_memory_mb = [[1000.0 + 10 * k] for k in range(n)]
        v.timeline.h2d_ms = [0.42] * len(v.timeline.rows)
        v.timeline.gpu_step_ms = [9.45] * len(v.timeline.rows)
    html = _html(render([write_result(r)], tmp_path / "index.html"))
    assert "Host → device copies" in html and "could not draw" not in html
    assert "22.0" in html and "9.10" in html and "pinned pool, no host copy 100%" in html
    assert "GPU step time by CUDA events" in html and "≥ 90%" in html
    assert 'data-figure="au">92%' in html
    assert "GPU memory used, peak (NVML)" in html and "H2D copy per batch, median" in html
    res = r.variants[0].resources
    assert plots.resources(res) != plots.resources(dataclasses.replace(res, gpu_memory_mb=None))


def _load(result: Any, cores: float) -> Any:
    from stallbench.results import ForeignLoad

    for v in result.variants:
        for f in v.repeats:
            f.load = ForeignLoad(wall_s=1.0, busy_cpu_s=1.0 + cores, own_cpu_s=1.0,
                                 foreign_cpu_s=cores, foreign_cores=cores, steal_cores=0.0,
                                 cores=2.0)
    return result


def test_headline_leads_with_the_recommendation_and_says_a_busy_machine(
        tmp_path: Path, make_result: Any, write_result: Any) -> None:
    from stallbench.results import Recommendation

    r = _load(make_result(**LIGHT), 1.0)
    r.analysis.recommendation = Recommendation(
        variant="num_workers=2", bound_by="compute", steady_attributed_stall_share=0.01,
        action="nothing",
        text="use num_workers=2 (measured 1.90x num_workers=0 in steady state); then nothing")
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    rec = html.index("Next step:</strong> use num_workers=2 (measured 1.90x")
    assert rec < html.index('class="verdict"') < html.index("Where the epoch goes")
    assert 'data-figure="busy-machine"' in html
    n = sum(len(v.repeats) for v in r.variants)
    assert f"{n} of {n} measured runs ran while other processes" in html
    quiet = _html(render([write_result(_load(make_result(**LIGHT), 0.05), "q.json")],
                         tmp_path / "quiet.html"))
    assert 'data-figure="busy-machine"' not in quiet


def test_compare_under_heavy_load_says_busy_machine(tmp_path: Path, make_result: Any,
                                                    write_result: Any) -> None:
    base = _load(make_result(seed=1, created_utc="2025-11-19T08:00:00+00:00", **LIGHT), 0.05)
    cur = _load(make_result(seed=2, speed=2.0, created_utc="2025-11-21T09:30:00+00:00", **LIGHT),
                1.2)
    for v in cur.variants:    # clearly faster by the rule, but measured on a busy machine
        b = base.variant(v.name).throughput_samples_s.values
        v.throughput_samples_s = Summary.of([2 * x for x in b])
    html = _html(render([write_result(base, "b.json"), write_result(cur, "c.json")],
                        tmp_path / "out.html"))
    assert set(_verdicts(html).values()) == {compare.BUSY}
    assert "re-run on a quiet machine" in html


def test_whatif_card_draws_the_back_test_band_and_errors(tmp_path: Path, make_result: Any,
                                                        write_result: Any) -> None:
    """A result with a back-test: the card says its errors and interval, the table has the
    interval, the model and the back-test error per measured point, and the plot draws."""
    from stallbench.results import BackTest, BackTestPoint

    r = make_result()
    wi = r.analysis.whatif
    for p in wi.points:
        p.model = "contention"
        p.low_samples_s, p.high_samples_s = p.predicted_samples_s * 0.9, p.predicted_samples_s * 1.1
    m = wi.measured[-1]
    wi.backtest = BackTest(
        method="leave-one-out", max_abs_error=0.043, mean_abs_error=0.021,
        max_abs_steady_error=0.031, mean_abs_steady_error=0.012, interval_level=0.75,
        interval_log_half_width=0.095, coverage=2 / 3, covered=2, checked=3,
        points=[BackTestPoint(n=m.n, variant=m.variant, model="contention",
                              fitted_on=["num_workers=1"], measured_samples_s=100.0,
                              predicted_run_samples_s=104.3, error=0.043, covered=False)])
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert "worst 4.3%" in html and "mean 2.1%" in html and "75% prediction interval" in html
    assert "covered 2 of 3" in html
    assert ">interval<" in html and ">model<" in html and "back-test error" in html
    assert "+4.3%" in html and "contention" in html
    assert "could not draw" not in html
    assert plots.whatif(wi.points, wi.measured, wi.knee, "workers", "75% band") is not None


def test_png_draws_the_pixels_savefig_draws() -> None:
    """``plots.png`` draws once on an Agg canvas instead of ``savefig`` (which, with the
    constrained layout, draws twice and encodes a PNG only to decode it again): the page must
    show the same pixels. Ground truth: the same figure saved the old way, quantized alike."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    def draw() -> Any:
        fig = plots.figure(2.4)
        ax, ax2 = fig.subplots(1, 2)
        ax.plot([0, 1, 2, 3], [3, 1, 4, 1], color=plots.STAGE_COLORS["fetch"], label="fetch")
        ax.fill_between([0, 1, 2], [0, 1, 0], alpha=0.3)
        ax.set_title("a title with a long tail that the layout must make room for")
        ax.set_ylabel("samples/s")
        ax.legend()
        ax2.barh(["compute", "wait"], [2.5, 1.25], color=plots.RUN_COLORS[:2])
        return fig

    with plots.style():
        got = plots.png(draw())
        buf = io.BytesIO()
        draw().savefig(buf, format="png", dpi=plots.DPI, facecolor="white")
    want = Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(
        colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).convert("RGB")
    have = Image.open(io.BytesIO(base64.b64decode(got))).convert("RGB")
    assert have.size == want.size
    assert np.array_equal(np.asarray(have), np.asarray(want))


def test_a_start_up_dominated_wait_is_split_on_the_card(tmp_path: Path, make_result: Any,
                                                        write_result: Any) -> None:
    """Issue 39: a loop that waited nearly all its wait before its first batch shows that
    split under "trainer stalled", not a steady figure alone."""
    r = make_result(timeline=False, resources=False)
    base = r.variant(r.analysis.baseline_variant)
    stall = base.stall_s.median
    one = Summary.of([1.0])
    base.phases = results.PhaseSummary(
        rule="x", startup_s=one, startup_cost_s=one, startup_stall_s=Summary.of([0.9 * stall]),
        steady_s=one, steady_stall_share=one, steady_samples_s=one)
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert 'data-figure="wait-split"' in html
    assert f"{0.9 * stall:.2f} s in start-up" in html
    base.phases.startup_stall_s = Summary.of([0.01 * stall])
    html = _html(render([write_result(r)], tmp_path / "out2.html"))
    assert 'data-figure="wait-split"' not in html


def test_thread_budget_and_busy_share_beside_the_throughput(tmp_path: Path, make_result: Any,
                                                            write_result: Any) -> None:
    """Issue 42: the thread budget (a 10x difference between two runs of one job) and the
    machine's busy share appear in the throughput table, from the result's own fields."""
    from stallbench.results import ForeignLoad, ThreadBudget

    r = make_result(timeline=False, resources=False)
    v = r.variants[0]
    v.threads = ThreadBudget(producer_threads=1, trainer_threads=4, local_producers=2, cores=8)
    for i, rep in enumerate(v.repeats):
        rep.load = ForeignLoad(wall_s=10.0, busy_cpu_s=0.0, own_cpu_s=0.0, foreign_cpu_s=0.0,
                               foreign_cores=[1.0, 2.0, 3.0][i % 3], steal_cores=None, cores=8.0)
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    threads = re.findall(r'<span data-figure="threads">([^<]*)<', html)
    busy = re.findall(r'<span data-figure="machine-busy">([^<]*)<', html)
    assert threads[0] == "trainer arrow 4 · producers 1 × 2 producers · 8 cores", threads
    want = f"{statistics.median([1.0, 2.0, 3.0][i % 3] for i in range(len(v.repeats))):.2f} of 8 cores"
    assert busy[0].startswith(want), busy


@pytest.mark.parametrize("kind, budget, want", [
    ("local", dict(producer_threads=None, trainer_threads=None, local_producers=0,
                   trainer_torch_threads=2),
     "trainer arrow library default, torch 2 · producers — · 8 cores"),
    ("profile", dict(producer_threads=1, trainer_threads=None, local_producers=2,
                     trainer_torch_threads=3),
     "job torch 3 · 2 loader workers × torch 1 · 8 cores"),
    ("profile", dict(producer_threads=None, trainer_threads=None, local_producers=0,
                     trainer_torch_threads=16),
     "job torch 16 · no loader workers · 8 cores"),
])
def test_thread_budget_says_what_was_read(tmp_path: Path, make_result: Any, write_result: Any,
                                          kind: str, budget: dict, want: str) -> None:
    """Issue 42: a profiled job's budget is what the hooks read in it (torch's threads in its
    process and its loader workers), never a scenario's pyarrow budget it did not have."""
    from stallbench.results import ThreadBudget

    r = make_result(timeline=False, resources=False, whatif=False)
    r.variants[0].threads = ThreadBudget(cores=8, **budget)
    r.variants[0].executor.kind = kind
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    assert re.findall(r'<span data-figure="threads">([^<]*)<', html)[0] == want


def test_a_profiled_jobs_parts_are_named_after_its_own_stages(
        tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """Issue 42: on a user's job "fetch" is whatever its dataset's ``__getitem__`` did: the
    attribution's columns say so; a scenario's result keeps the scenario's words."""
    from stallbench.results import ProfileVariant

    r = make_result(timeline=False, resources=False, whatif=False)
    for v in r.variants:
        v.profile = ProfileVariant(loaders=[])
    html = _html(render([write_result(r)], tmp_path / "job.html"))
    head = html[html.index('<table class="data attribution">'):]
    head = head[:head.index("</thead>")]
    assert all(x in head for x in ("dataset __getitem__", "collate_fn", "pin_memory",
                                   "loader hand-off")), head
    plain = _html(render([write_result(make_result(timeline=False, resources=False,
                                                   whatif=False), "s.json")],
                         tmp_path / "scenario.html"))
    head = plain[plain.index('<table class="data attribution">'):]
    head = head[:head.index("</thead>")]
    assert "__getitem__" not in head and ">fetch<" in head and ">loader overhead<" in head


def test_both_ideal_speedups_shown_each_from_its_one_figure(
        tmp_path: Path, make_result: Any, write_result: Any) -> None:
    """Issue 42: "ideal speedup 1.52x" sat beside the verdict's "no data stall would give
    1.56x" unlabelled: the cell gives both, each from ``analysis.figures``."""
    from stallbench.analysis import figures
    from stallbench.report.render import format_x

    r = make_result(timeline=False, resources=False, whatif=False)
    html = _html(render([write_result(r)], tmp_path / "out.html"))
    cells = re.findall(r'<td class="num" data-figure="ideal-speedup">([^<]*)<span class="ci" '
                       r'data-figure="data-ideal-speedup">all data work ([^<]*)<', html)
    want = [(format_x(v.attribution.ideal_speedup),
             format_x(figures.data_ideal_speedup(v.attribution)))
            for v in r.variants if v.attribution is not None]
    assert cells == want and want, (cells, want)


def test_a_tune_of_the_users_job_draws_its_search(tmp_path: Path, make_result: Any,
                                                   write_result: Any) -> None:
    """Issue 41: a ``stallbench tune -- CMD`` result shows each trial's measured rate against
    the compute-only ceiling, in order, the predicted figure badged, a failed trial as
    failed, and the answer with its speedup and ceiling share."""
    from stallbench.results import JobTrial, JobTune, JobTuneBest

    r = make_result(**LIGHT)
    trials = [JobTrial("default", {}, "the job as written", "measured", 206.0,
                       "epochs 2-5", 0.46, 0.021, 32, 4),
              JobTrial("num_workers=1", {"num_workers": 1}, "the loop waited 46%", "measured",
                       119.0, "epochs 2-5", 0.66, 0.021, 32, 4, predicted_samples_s=375.0),
              JobTrial("num_workers=2", {"num_workers": 2}, "the knee", "failed",
                       exit_code=1),
              JobTrial("num_workers=1,persistent_workers=true",
                       {"num_workers": 1, "persistent_workers": True}, "start-up 63%",
                       "measured", 326.0, "epochs 2-7", 0.14, 0.021, 48, 6)]
    r.tune = JobTune(budget_s=600.0, wall_s=40.0, loader_kind="torch.DataLoader",
                     loader_name="Items#0", as_written={"num_workers": 0}, cores=2.0,
                     ceiling_samples_s=375.0, ceiling_note="375 samples/s compute-only",
                     trials=trials,
                     best=JobTuneBest("num_workers=1,persistent_workers=true",
                                      {"num_workers": 1, "persistent_workers": True}, 325.0,
                                      1.57, 0.87, "no_gain_predicted", "nothing left",
                                      speedup_low=1.56, speedup_high=1.58, confirm_runs=1,
                                      still_binds="the data path",
                                      apply="DataLoader(..., num_workers=1, "
                                            "persistent_workers=True)"),
                     runs=7)
    path = write_result(r)
    assert results.load(path).tune.trials[2].outcome == "failed"     # the contract round-trips
    html = _html(render([path], tmp_path / "out.html"))
    card = html[html.index('data-figure="tune"'):]
    card = card[:card.index("</div>")]
    assert card.count('data-figure="tune-trial"') == 4
    assert "failed (exit 1)" in card and "PREDICTED" in card
    assert "1.57x the job as written [1.56, 1.58]" in card and "87% of the ceiling" in card
    assert 'alt="tune: each trial' in card and _imgs(card)     # drawn, not its fallback line
    _assert_self_contained(html)


def test_a_profile_shows_the_lines_the_terminal_printed(tmp_path: Path, make_result: Any,
                                                         write_result: Any) -> None:
    """Issue 55: one printer for a profile's text (``report.profile_lines``): the page shows
    the lines ``stallbench profile`` printed, and the notes the printer writes (the transfer
    note, the recording budget, interference) are not said a second time beside the
    attribution row; a scenario's result has no such block."""
    import html as html_mod

    from stallbench.report import profile_lines
    from stallbench.results import ProfileAnalysis, ProfileCommand, ProfileVariant

    r = make_result(**LIGHT, whatif=False)
    r.profile = ProfileCommand(argv=["python", "train.py"], cwd="/w", environment={},
                               torch="2.5", ray=None, hooks_written_for={})
    for v in r.variants:
        v.profile = ProfileVariant(loaders=[])
    r.variants[0].attribution.interference_s = 0.25
    r.variants[0].profile.analysis = ProfileAnalysis(
        method="by replay", keep_batches=8, budget_mb=64.0, transfer_note="TRANSFER-NOTE",
        budget_basis="BUDGET-BASIS", notes=["A-NOTE"])
    page = _html(render([write_result(r)], tmp_path / "out.html"))
    block = re.search(r'data-figure="terminal-text".*?<pre class="terminal"><code>(.*?)</code>',
                      page, re.S)
    assert block, "no terminal block"
    want = profile_lines.lines(results.load(write_result(r, "again.json")))
    assert html_mod.unescape(block.group(1)).split("\n") == want
    assert "  note: TRANSFER-NOTE" in want and "  note: recording budget BUDGET-BASIS" in want
    for said_once in ("TRANSFER-NOTE", "BUDGET-BASIS", "A-NOTE"):
        assert page.count(said_once) == "\n".join(want).count(said_once), said_once
    # the interference the printer writes is not a second note beside the row (the bars'
    # legend names the segment, issue 57, which is no note)
    assert "interference (own line)" in "\n".join(want) and "interference 0.25 s" not in page
    plain = _html(render([write_result(make_result(**LIGHT, whatif=False), "s.json")],
                         tmp_path / "scenario.html"))
    assert 'data-figure="terminal-text"' not in plain
