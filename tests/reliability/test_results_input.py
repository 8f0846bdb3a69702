"""Class 5 and 9 (results) of issue 13: results read by report, gate and whatif are input too.

The rule: a result is loaded strictly (``results/codec.py``: types, finite numbers, required
keys, bounded nesting) and refused before reading when it cannot be one (not a regular file,
larger than ``MAX_RESULT_BYTES``); a figure the gate compares must be measured in every
repeat (a null there is bad input naming file and variant, never "gate PASS"); the what-if
model refuses to fit on null or impossible figures. Every case: exit 2, one line naming the
file, no traceback (no RecursionError), within seconds.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from reliability_helpers import one_error_line, sb

from stallbench.results import store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "results" / "examples" / "schema-v2.json"
COMMANDS = {
    "report": lambda f: ["report", f, "-o", "out.html"],
    "gate": lambda f: ["gate", "--baseline", str(EXAMPLE), "--current", f, "--threshold", "10%"],
    "gate-baseline": lambda f: ["gate", "--baseline", f, "--current", str(EXAMPLE),
                                "--threshold", "10%"],
    "whatif": lambda f: ["whatif", f],
}


def _example() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def _edit(d: Path, change: Callable[[dict[str, Any]], None], name: str = "bad.json") -> str:
    data = _example()
    change(data)
    (d / name).write_text(json.dumps(data, indent=1))
    return name


def _name(i: int) -> str:
    """Variant names come from the committed example (they change when a scenario grows an
    axis, as ``ranks`` did); the tests below name whichever variant they edited."""
    return _example()["variants"][i]["name"]


def _summary(values: list[float | None]) -> dict[str, Any]:
    """A summary as the writer makes it from these per-repeat values (``Summary.of``; null for
    NaN): the reader refuses a median, min or max its values do not give."""
    from stallbench.results import Summary, codec

    return codec.to_json(Summary.of([float("nan") if x is None else x for x in values]))


def _null_throughput(d: dict) -> None:
    d["variants"][1]["throughput_samples_s"] = _summary([None, None])


@pytest.mark.parametrize("side", ["gate", "gate-baseline"])
def test_gate_refuses_unmeasured_throughput(tmp_path: Path, env: dict, side: str) -> None:
    """Used to print "gate PASS" (rc 0) with the metric "not comparable (no data)"."""
    f = _edit(tmp_path, _null_throughput)
    r = sb(COMMANDS[side](f), env, tmp_path, timeout=60)
    one_error_line(r, f"bad.json: variant {_name(1)!r}: throughput has 2 of 2 values null")
    assert "PASS" not in r.stdout


def test_gate_refuses_a_partly_measured_stall_share(tmp_path: Path, env: dict) -> None:
    f = _edit(tmp_path, lambda d: d["variants"][0].update(stall_share=_summary([0.5, None])))
    r = sb(COMMANDS["gate"](f), env, tmp_path, timeout=60)
    one_error_line(r, f"bad.json: variant {_name(0)!r}: stall_share has 1 of 2 values null")


def test_gate_refuses_empty_throughput_naming_the_file(tmp_path: Path, env: dict) -> None:
    f = _edit(tmp_path, lambda d: d["variants"][1].update(throughput_samples_s=_summary([])))
    r = sb(COMMANDS["gate"](f), env, tmp_path, timeout=60)
    one_error_line(r, "bad.json: ", f"{_name(1)} has 0 repeat")


def test_gate_still_passes_good_results(tmp_path: Path, env: dict) -> None:
    r = sb(COMMANDS["gate"](str(EXAMPLE)), env, tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gate PASS" in r.stdout


BAD = {
    "NaN literal": lambda t: t.replace('"median": ', '"median": NaN, "x": ', 1),
    "Infinity literal": lambda t: t.replace('"median": ', '"median": Infinity, "x": ', 1),
    "string for a number": lambda t: json.dumps(_set_first_median(json.loads(t), "fast")),
    "missing key": lambda t: json.dumps({k: v for k, v in json.loads(t).items()
                                         if k != "variants"}),
    "deep nesting": lambda t: '{"schema_version": 2, "x": ' + "[" * 200_000 + "]" * 200_000 + "}",
    "not JSON": lambda t: t[:5000],
}


def _set_first_median(d: dict, value: Any) -> dict:
    d = copy.deepcopy(d)
    d["variants"][0]["throughput_samples_s"]["median"] = value
    return d


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", list(BAD))
def test_malformed_results_are_one_line(tmp_path: Path, env: dict, command: str,
                                        kind: str) -> None:
    (tmp_path / "bad.json").write_text(BAD[kind](EXAMPLE.read_text()))
    r = sb(COMMANDS[command]("bad.json"), env, tmp_path, timeout=90)
    line = one_error_line(r, "bad.json")
    assert "RecursionError" not in r.stderr and "Traceback" not in r.stderr, line
    assert not (tmp_path / "out.html").exists()


@pytest.mark.parametrize("command", ["report", "gate", "whatif"])
def test_huge_result_refused_before_reading(tmp_path: Path, env: dict, command: str) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:         # sparse: 1 GB on paper, nothing on disk
        fh.truncate(1024 * 2**20)
    r = sb(COMMANDS[command]("big.json"), env, tmp_path, timeout=60)
    one_error_line(r, "big.json: 1,024 MB", f"at most {store.MAX_RESULT_BYTES // 2**20} MB")


@pytest.mark.parametrize("command", ["report", "whatif"])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_non_regular_result_refused_without_blocking(tmp_path: Path, env: dict, command: str,
                                                     kind: str) -> None:
    """A FIFO would block the read forever, /dev/zero never end."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "r.json")
        name = "r.json"
    else:
        name = "/dev/zero"
    r = sb(COMMANDS[command](name), env, tmp_path, timeout=60)
    one_error_line(r, name, "not a regular file")


@pytest.mark.parametrize("change, expect", [
    (lambda d: [rep.update(samples=0) for rep in d["variants"][0]["repeats"]],
     "no measured runs"),
    (lambda d: d["variants"][0].update(throughput_samples_s=_summary([None, None])),
     "throughput_samples_s.median is null"),
    (lambda d: [rep["stage_s"].update(fetch=-5.0) for rep in d["variants"][0]["repeats"]],
     "p_wall"),
    (lambda d: d.update(variants=[]), "no variants"),
])
def test_whatif_refuses_to_fit_on_unmeasured_figures(tmp_path: Path, env: dict, change: Callable,
                                                     expect: str) -> None:
    def strip(d: dict) -> None:
        d["analysis"]["whatif"] = None          # fit on the first variant
        change(d)

    f = _edit(tmp_path, strip)
    r = sb(["whatif", f], env, tmp_path, timeout=60)
    one_error_line(r, "bad.json", expect)
