"""Class 4 and 5 (CLI numbers) of issue 13: every number is finite and within a documented bound.

The rule for scenario numbers lives in one function (``scenario._check_number``, applied to
every knob and every element of a list knob): NaN and infinity are refused (``value < lo`` is
false for NaN, so a plain range check let ``step_ms = nan`` run), and every numeric knob has a
finite ``min`` and ``max`` (shown in the key reference of docs/scenarios.md). CLI numbers follow the same
rule (``commands/numbers.py``): bounded ranges, finite numbers, one line, exit 2.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path

import pytest
from reliability_helpers import TINY, no_files, one_error_line, sb, write

from stallbench import scenario
from stallbench.run import preflight as validate
from stallbench.errors import ScenarioError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "results" / "examples" / "schema-v2.json"


def _numeric_knobs() -> list[tuple[str, str, dataclasses.Field, type]]:
    out = []
    for section, cls in scenario.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            args = [a for a in typing.get_args(tp) if a is not type(None)] \
                if typing.get_origin(tp) in (typing.Union, types.UnionType) else [tp]
            for a in args:
                inner = typing.get_args(a)[0] if typing.get_origin(a) is list else a
                if inner in (int, float):
                    out.append((section, f.name, f, inner))
    return out


KNOBS = _numeric_knobs()


def test_the_walk_finds_the_numeric_knobs() -> None:
    names = {f"{s}.{n}" for s, n, _, _ in KNOBS}
    assert {"dataset.rows", "model.step_ms", "model.bottom_mlp", "run.sample_interval_s",
            "executor.cpus", "loader.num_workers"} <= names
    assert len(KNOBS) >= 35


@pytest.mark.parametrize("section, name, f, tp", KNOBS, ids=[f"{s}.{n}" for s, n, _, _ in KNOBS])
def test_every_numeric_knob_has_finite_documented_bounds(section: str, name: str,
                                                         f: dataclasses.Field, tp: type) -> None:
    """A numeric knob without both bounds is a bug: add min= and max= to its knob()."""
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    assert lo is not None and hi is not None, f"{section}.{name} needs min= and max="
    assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
    ref = validate.reference_markdown()
    row = next(ln for ln in ref.splitlines() if ln.startswith(f"| `{name}` |"))
    assert "Range" in row, row


def _toml(v: object) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


@pytest.mark.parametrize("section, name, f, tp", KNOBS, ids=[f"{s}.{n}" for s, n, _, _ in KNOBS])
def test_every_numeric_knob_refuses_out_of_range_and_non_finite(section: str, name: str,
                                                                f: dataclasses.Field,
                                                                tp: type) -> None:
    hi = f.metadata["max"]
    too_big = hi * 10 + 1 if tp is int else hi * 10
    values = [too_big] + ([math.nan, math.inf, -math.inf, 1e300] if tp is float else [10**23])
    is_list = isinstance(f.default_factory() if f.default is dataclasses.MISSING else f.default,
                         list)
    for v in values:
        value = f"[{_toml(v)}]" if is_list else _toml(v)
        text = f'name = "x"\n[{section}]\n{name} = {value}\n'
        with pytest.raises(ScenarioError) as info:
            scenario.parse(text, "n.toml")
        assert info.value.key == f"{section}.{name}", (value, str(info.value))
        assert info.value.file == "n.toml"


@pytest.mark.parametrize("text, key", [
    ('[model]\nkind = "emulated"\nstep_ms = nan\n', "model.step_ms"),
    ('[run]\nsample_interval_s = nan\n', "run.sample_interval_s"),
    ('[model]\nkind = "emulated"\nstep_ms = inf\n', "model.step_ms"),
    ('[model]\nkind = "emulated"\nstep_ms = 1e300\n', "model.step_ms"),
    ('[storage]\nlatency_ms = inf\n', "storage.latency_ms"),
    ('[dataset]\nrows = 100000000000000000000000\n', "dataset.rows"),
    ('[matrix]\n"model.step_ms" = [1.0, nan]\n', "model.step_ms"),
    ('[matrix]\nloader = [{num_workers = 1}, {num_workers = 10000}]\n', "loader.num_workers"),
])
def test_cli_refuses_non_finite_and_huge_scenario_numbers(tmp_path: Path, env: dict, text: str,
                                                          key: str) -> None:
    write(tmp_path, 'name = "n"\n' + text)
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=120)
    one_error_line(r, f"s.toml: {key}: ")
    assert no_files(tmp_path / "out")


@pytest.mark.parametrize("params, key", [
    ('{name = "normalize_dense", clip = nan}', "preprocess.transforms[0]"),
    ('{name = "normalize_dense", mean = inf}', "preprocess.transforms[0]"),
    ('{name = "hash_ids", buckets = 100000000000000000000}', "preprocess.transforms[0]"),
    ('{name = "join", table_rows = 1000000000}', "preprocess.transforms[0]"),
])
def test_transform_parameters_are_finite_and_bounded(tmp_path: Path, env: dict, params: str,
                                                     key: str) -> None:
    write(tmp_path, TINY + f"[preprocess]\ntransforms = [{params}]\n")
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=120)
    one_error_line(r, f"s.toml: {key}: ")
    assert no_files(tmp_path / "out")


@pytest.mark.parametrize("args, flag", [
    (["--repeats", "0"], "--repeats"),
    (["--repeats", "100000"], "--repeats"),
    (["--repeats", "nan"], "--repeats"),
    (["--max-batches", "-1"], "--max-batches"),
    (["--max-batches", "1e12"], "--max-batches"),
])
def test_run_flags_bounded(tmp_path: Path, env: dict, args: list[str], flag: str) -> None:
    write(tmp_path, TINY)
    r = sb(["run", "s.toml", "--out", "out", "--no-progress", *args], env, tmp_path)
    one_error_line(r, f"{flag}: expected a whole number in [1, ")


@pytest.mark.parametrize("args, flag", [
    (["--bandwidth-mb-s", "nan"], "--bandwidth-mb-s"),
    (["--bandwidth-mb-s", "-5"], "--bandwidth-mb-s"),
    (["--bandwidth-mb-s", "1e-320"], "--bandwidth-mb-s"),  # printed "inf us/sample" and
    (["--storage-cap-mb-s", "1e-310"], "--storage-cap-mb-s"),   # workers removing the stall
    (["--cores", "1e-320"], "--cores"),
    (["--storage-cap-mb-s", "inf"], "--storage-cap-mb-s"),
    (["--cpus-per-node", "0"], "--cpus-per-node"),
    (["--cpu-node-cost", "-1"], "--cpu-node-cost"),
    (["--gpu-node-cost", "inf"], "--gpu-node-cost"),
    (["--cores", "0"], "--cores"),
    (["--cores", "nan"], "--cores"),
    (["--cache", "1"], "--cache"),
    (["--cache", "nan"], "--cache"),
    (["--workers", "0..100000000"], "--workers"),
    (["--workers", "5..1"], "--workers"),
    (["--nodes", "1,2,-3"], "--nodes"),
    (["--workers", "200000"], "--workers"),
])
def test_whatif_flags_bounded_and_fast(tmp_path: Path, env: dict, args: list[str],
                                       flag: str) -> None:
    """``--workers 0..100000000`` used to hang building the table: refused before any
    prediction is made (the subprocess timeout only guards against the hang; a wall-time
    bound failed at load 16, where starting Python alone took tens of seconds)."""
    r = sb(["whatif", str(EXAMPLE), *args], env, tmp_path)
    one_error_line(r, f"{flag}: expected ")


def test_whatif_accepts_the_bounds(tmp_path: Path, env: dict) -> None:
    r = sb(["whatif", str(EXAMPLE), "--workers", "0..999", "--cache", "0.5",
            "--cpu-node-cost", "0", "--gpu-node-cost", "2.5", "--bandwidth-mb-s", "100"],
           env, tmp_path)
    assert r.returncode == 0, r.stderr
    # 1,000 counts predicted: equal consecutive rows collapse, the last count is on the table
    rows = [line.split()[0] for line in r.stdout.splitlines() if line[:1].isdigit()]
    assert "PREDICTED" in r.stdout and rows[-1].split("..")[-1] == "999", rows


@pytest.mark.parametrize("args, flag", [
    (["--threshold", "nan%"], "--threshold"),
    (["--threshold", "inf"], "--threshold"),
    (["--alpha", "nan"], "--alpha"),
])
def test_gate_numbers_finite(tmp_path: Path, env: dict, args: list[str], flag: str) -> None:
    base = ["gate", "--baseline", str(EXAMPLE), "--current", str(EXAMPLE), "--threshold", "10%"]
    if args[0] == "--threshold":
        base = base[:-2]
    r = sb([*base, *args], env, tmp_path)
    one_error_line(r, f"{flag}: ")


@pytest.mark.parametrize("args, flag", [
    (["history", str(EXAMPLE), "--max-p", "abc"], "--max-p"),
    (["history", str(EXAMPLE), "--permutations", "1e9"], "--permutations"),
    (["history", str(EXAMPLE), "--min-size", "x"], "--min-size"),
    (["gate", "--baseline", str(EXAMPLE), "--current", str(EXAMPLE), "--repeats", "x"],
     "--repeats"),
    (["gate", "--against", "HEAD", "s.toml", "--rounds", "1e3"], "--rounds"),
    (["serve", "s.toml", "--port", "1e5"], "--port"),
])
def test_count_flags_are_one_line_in_every_verb(tmp_path: Path, env: dict, args: list[str],
                                                 flag: str) -> None:
    """argparse's ``type=int`` answered ``x`` or ``1e9`` with a usage block (6 to 11 lines)
    in ``history``, ``gate`` and ``serve``, where ``run``'s flags were one line."""
    r = sb(args, env, tmp_path)
    one_error_line(r, f"{flag}: expected ")
