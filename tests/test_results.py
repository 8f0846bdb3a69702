"""The result schema: round trip, atomic writes, naming, and loading errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from stallbench import results
from stallbench.errors import ResultError
from stallbench.results import (Attribution, ByteCounts, Interval, PartIntervals, Result,
                                StageRows, StageSeconds, Summary)

import factories

ROOT = Path(__file__).resolve().parents[1]


def make_result(name: str = "sc") -> Result:
    reps = [factories.repeat(1000 / e, samples=1000, stage_s=StageSeconds(fetch=0.1),
                             stage_rows=StageRows(fetch=1000), bytes=ByteCounts(wire_bytes=10),
                             producer_processes=1, executor_figures={"faults": []})
            for e in (1.0, 1.1)]
    v = factories.variant("default", [r.throughput_samples_s for r in reps])
    v.repeats = reps
    v.attribution = attribution(ideal_speedup=math.inf)
    return factories.result([v], scenario=name)


def attribution(**kw) -> Attribution:
    iv = Interval(0.0, 0.0)
    base = dict(method="chain", interval="x", compute_s=1.0, fetch_stall_s=0.0,
                preprocess_stall_s=0.0, transfer_stall_s=0.0, overhead_s=0.0, epoch_s=1.0,
                attributed_stall_s=0.0, attributed_stall_share=0.0, overhead_share=0.0,
                bound_by="compute", ideal_speedup=1.0, intervals=PartIntervals(iv, iv, iv, iv, iv),
                closure_error=0.0, ablation_epoch_s={"full": 1.0})
    return Attribution(**{**base, **kw})


def test_summary_of() -> None:
    s = Summary.of([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max, s.values) == (2.0, 1.0, 3.0, [3.0, 1.0, 2.0])


def test_round_trip(tmp_path: Path) -> None:
    r = make_result()
    path = results.save(r, tmp_path)
    back = results.load(path)
    assert results.to_dict(back) == results.to_dict(r)
    assert back.variants[0].repeats[0].executor_figures == {"faults": []}
    # JSON has no infinity: stored as null, the file stays readable by any JSON parser, and
    # reads back as "not measured" (NaN)
    assert json.loads(path.read_text())["variants"][0]["attribution"]["ideal_speedup"] is None
    assert math.isnan(back.variants[0].attribution.ideal_speedup)


def test_never_overwrites(tmp_path: Path) -> None:
    paths = {results.save(make_result(), tmp_path) for _ in range(3)}
    assert len(paths) == 3 and all(p.exists() for p in paths)


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")

    def boom(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C between write and rename

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        results.write_atomic(target, "new content")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.parametrize("content, fragment", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"schema_version": 99}', "schema_version: expected one of [1, 2, 3], got 99"),
    ('{"schema_version": 2, "variants": []}', "tool: missing"),
    ('{"schema_version": 1, "variants": {}}', "variants: expected a list"),
])
def test_load_errors_are_one_line(tmp_path: Path, content: str, fragment: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(ResultError) as info:
        results.load(p)
    assert fragment in str(info.value) and str(p) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ResultError, match="no such result file"):
        results.load("/nonexistent/x.json")


def test_find_searches_one_level(tmp_path: Path) -> None:
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline" / "b.json").write_text("{}")
    (tmp_path / "a.json").write_text("{}")
    assert [p.name for p in results.find([tmp_path])] == ["a.json"]
    with pytest.raises(ResultError):
        results.find([tmp_path / "missing"])


@pytest.mark.parametrize("version", results.SUPPORTED_VERSIONS)
def test_committed_example_for_every_schema_version(version: int) -> None:
    """Every version ever written loads (older ones through their migration) into the current
    typed schema."""
    path = ROOT / "results" / "examples" / f"schema-v{version}.json"
    assert json.loads(path.read_text())["schema_version"] == version
    r = results.load(path)
    assert r.schema_version == results.SCHEMA_VERSION
    assert r.variants and r.variants[0].repeats


def _keys(x: object, prefix: str = "") -> set[str]:
    """Every key path of a JSON value; list items share their parent's path, and the free-form
    parts (a variant's knobs and config, executor figures, scenario matrix) count as leaves."""
    out: set[str] = set()
    if isinstance(x, dict):
        for k, v in x.items():
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            if k not in FREE_FORM:
                out |= _keys(v, path)
    elif isinstance(x, list):
        for v in x:
            out |= _keys(v, prefix + "[]")
    return out


FREE_FORM = {"knobs", "config", "executor_figures", "matrix", "libraries", "ablation_epoch_s",
             "ablations", "notes", "stage_wall"}


def _nulls(x: object, prefix: str = "") -> set[str]:
    """Key paths whose value is null: an optional part this run did not measure (e.g. H2D
    copy figures without a GPU), whose own keys a run that measured it also writes."""
    out: set[str] = set()
    if isinstance(x, dict):
        for k, v in x.items():
            path = f"{prefix}.{k}" if prefix else k
            if v is None:
                out.add(path)
            elif k not in FREE_FORM:
                out |= _nulls(v, path)
    elif isinstance(x, list):
        for v in x:
            out |= _nulls(v, prefix + "[]")
    return out


def _under(key: str, nulls: set[str]) -> bool:
    return any(key.startswith(n + ".") or key.startswith(n + "[]") for n in nulls)


def test_current_example_has_exactly_the_keys_the_code_writes(tmp_path: Path) -> None:
    """The committed example of the current version cannot go stale: a run of the tiny
    scenario (every code path that writes a key: ablations, what-if, workers) writes exactly
    its keys. Numbers are not compared."""
    from stallbench import scenario
    from stallbench.run.runner import RunOptions, run_scenario

    sc = scenario.parse(EXAMPLE_SCENARIO, "example.toml")
    fresh = results.to_dict(run_scenario(sc, RunOptions(cache_dir=tmp_path, progress=False)))
    example = json.loads((ROOT / "results" / "examples"
                          / f"schema-v{results.SCHEMA_VERSION}.json").read_text())
    # Inside a part that is null on one side (not measured on this machine: no GPU, no
    # accelerator copies) the other side's keys are not a difference.
    missing = {k for k in _keys(fresh) - _keys(example) if not _under(k, _nulls(example))}
    extra = {k for k in _keys(example) - _keys(fresh) if not _under(k, _nulls(fresh))}
    assert not missing and not extra, (
        f"re-record results/examples/schema-v{results.SCHEMA_VERSION}.json with "
        f"`python tests/test_results.py`: the code writes {sorted(missing)} that the example "
        f"lacks, and the example has {sorted(extra)} that the code no longer writes")


# The example's scenario: small, with workers (what-if, trainer solo probe), ablations and
# data-parallel ranks (per-rank figures, the straggler, a what-if over ranks).
EXAMPLE_SCENARIO = """
name = "example"
description = "The committed example result of the current schema version."
[dataset]
rows = 8192
row_group_rows = 2048
dense_features = 2
sparse_features = 2
sequence_features = 1
[model]
kind = "emulated"
step_ms = 2
[loader]
batch_size = 1024
[run]
repeats = 2
[matrix]
"loader.num_workers" = [0, 1]
"trainers.ranks" = [1, 2]
"""


if __name__ == "__main__":   # re-record the current version's example (keys are what matter)
    import tempfile

    from stallbench import scenario
    from stallbench.run.runner import RunOptions, run_scenario

    with tempfile.TemporaryDirectory() as cache:
        r = run_scenario(scenario.parse(EXAMPLE_SCENARIO, "example.toml"),
                         RunOptions(cache_dir=Path(cache), progress=False))
    out = ROOT / "results" / "examples" / f"schema-v{results.SCHEMA_VERSION}.json"
    results.write_atomic(out, json.dumps(results.to_dict(r), indent=1) + "\n")
    print(f"wrote {out}")


def test_v2_to_v3_gives_the_recommendations_stall_share_a_name_of_its_own() -> None:
    """Issue 25: a recommendation's ``stall_share`` was the steady-state attributed share while
    a variant's ``stall_share`` is the whole run's measured stall; v3 renames the former, and
    the migration carries the figure over unchanged (v1 -> v2 -> v3 chains)."""
    from stallbench.results import migrate

    v2 = json.loads((ROOT / "results" / "examples" / "schema-v2.json").read_text())
    v3 = migrate.v2_to_v3(v2, "schema-v2.json")
    assert v2["schema_version"] == 2 and v3["schema_version"] == 3
    for old, new in zip(v2["variants"], v3["variants"]):
        assert new["stall_share"] == old["stall_share"]            # the whole run: unchanged
        if old.get("recommendation"):
            assert "stall_share" not in new["recommendation"]
            # v2 held the whole run's share where the attribution had no steady window:
            # not a steady figure, so null in v3
            steady = (old.get("attribution") or {}).get("basis") == "steady state"
            assert (new["recommendation"]["steady_attributed_stall_share"]
                    == (old["recommendation"]["stall_share"] if steady else None))
    top = v3["analysis"]["recommendation"]
    assert top["steady_attributed_stall_share"] == v2["analysis"]["recommendation"]["stall_share"]
    r = results.load(ROOT / "results" / "examples" / "schema-v1.json")
    assert r.schema_version == 3


def test_signed_differences_and_rounding_slack_read_back() -> None:
    """What our own writer can produce reads back: a difference named like a non-negative
    figure keeps its sign (``RankSummary.others_wait_s``: exchangeable ranks give < 0), and a
    share a few ulps past 1 is rounding, not out of range; a share really past 1 is refused."""
    from stallbench.errors import ResultError

    d = json.loads((ROOT / "results" / "examples" / "schema-v3.json").read_text())
    ranked = next(v for v in d["variants"] if v.get("ranks"))
    ranked["ranks"]["others_wait_s"] = -0.25
    share = d["variants"][0]["stall_share"]

    def first_share(x: float) -> None:   # a summary stays what its values give (Summary.of)
        s = Summary.of([x, *share["values"][1:]])
        share.update(median=s.median, min=s.min, max=s.max, values=s.values)

    first_share(1.0 + 1e-12)
    r = results.from_dict(json.loads(json.dumps(d)), "signed.json")
    assert next(v for v in r.variants if v.ranks).ranks.others_wait_s == -0.25
    first_share(1.01)
    with pytest.raises(ResultError, match="share from 0 to 1"):
        results.from_dict(d, "bad.json")


def test_save_refuses_a_result_the_reader_would_refuse(tmp_path: Path) -> None:
    """A result ``report`` and ``gate`` would refuse is a stallbench bug said by the run that
    made it: nothing is written."""
    from stallbench.errors import ResultError

    r = results.load(ROOT / "results" / "examples" / "schema-v3.json")
    r.variants[0].stall_share.median = 1.5
    with pytest.raises(ResultError, match="stallbench bug, nothing written"):
        results.save(r, tmp_path)
    assert not list(tmp_path.iterdir())
