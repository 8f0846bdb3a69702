"""The result schema: round trip, atomic writes, naming, and loading errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from stallbench import results
from stallbench.errors import ResultError
from stallbench.results import RepeatFigures, Result, Summary, VariantResult

ROOT = Path(__file__).resolve().parents[1]


def _repeat(epoch: float) -> RepeatFigures:
    return RepeatFigures(epoch_s=epoch, samples=1000, batches=10, throughput_samples_s=1000 / epoch,
                         steady_throughput_samples_s=1100 / epoch, stall_s=0.1, wait_s=0.08,
                         trainer_transfer_s=0.02, compute_s=epoch - 0.1,
                         time_to_first_batch_s=0.01, peak_rss_mb=300.0,
                         stage_s={"fetch": 0.1}, stage_rows={"fetch": 1000},
                         bytes={"wire_bytes": 10}, workers=1, extra={"faults": []})


def make_result(name: str = "sc") -> Result:
    reps = [_repeat(1.0), _repeat(1.1)]
    v = VariantResult(
        name="default", knobs={}, config={"loader": {"batch_size": 100}}, emulated=["model.step_ms"],
        throughput_samples_s=Summary.of([r.throughput_samples_s for r in reps]),
        epoch_s=Summary.of([1.0, 1.1]), stall_s=Summary.of([0.1, 0.1]),
        stall_share=Summary.of([0.1, 0.09]), time_to_first_batch_s=Summary.of([0.01, 0.01]),
        peak_rss_mb=Summary.of([300.0, 300.0]), repeats=reps,
        analysis={"bound_by": "compute", "ideal_speedup": math.inf})
    return Result(schema_version=results.SCHEMA_VERSION, tool={"name": "stallbench", "version": "0"},
                  created_utc="2026-01-01T00:00:00+00:00",
                  scenario={"name": name, "path": "x.toml", "sha256": "0", "fingerprint": "f",
                            "text": "", "matrix": {}},
                  machine={"cpu_model": "cpu", "cores_logical": 2}, settings={"repeats": 2},
                  dataset={}, variants=[v])


def test_summary_of() -> None:
    s = Summary.of([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max, s.values) == (2.0, 1.0, 3.0, [3.0, 1.0, 2.0])


def test_round_trip(tmp_path: Path) -> None:
    r = make_result()
    path = results.save(r, tmp_path)
    back = results.load(path)
    assert back.to_dict() == r.to_dict()
    assert back.variants[0].repeats[0].extra == {"faults": []}
    # JSON has no infinity: stored as null, the file stays readable by any JSON parser
    assert json.loads(path.read_text())["variants"][0]["analysis"]["ideal_speedup"] is None


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
    ('{"schema_version": 99}', "schema_version: expected one of [1], got 99"),
    ('{"schema_version": 1, "variants": []}', "not a stallbench result"),
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
    path = ROOT / "results" / "examples" / f"schema-v{version}.json"
    r = results.load(path)
    assert r.schema_version == version
    assert r.variants and r.variants[0].repeats
