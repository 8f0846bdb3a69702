"""Class 3 of issue 26: results (and calibration files) are validated as data, and every string
from them is escaped for the sink it reaches.

The rules (``results/codec.check_range``/``check_created``, ``results/store.from_dict``,
``outputs.one_line``/``markdown_cell``/``annotation``, ``report/plots`` ``text.parse_math``
off): ``created_utc`` is a real UTC timestamp at most a day ahead (``history`` and the gate
order by it: ``9999-12-31`` would shadow every real result); variant names are unique (the
gate keys by name: the last would win); every figure is within the range the schema states
(counts and magnitudes < 1e15, times/rates/sizes >= 0, shares in [0, 1]; changes and
differential attributions keep their sign). A violation is one line naming file and key, exit
2. A string from a result never makes a new output line (a GitHub ``::error`` command) nor a
mathtext crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from reliability_helpers import one_error_line, sb

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "results" / "examples" / "schema-v2.json"


def _data() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def _write(d: Path, change: Callable[[dict[str, Any]], None], name: str = "bad.json") -> str:
    data = _data()
    change(data)
    (d / name).write_text(json.dumps(data, indent=1))
    return name


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        keys = path.split(".")
        cur: Any = d
        for k in keys[:-1]:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        last = keys[-1]
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value
    return change


@pytest.mark.parametrize("value, says", [
    ("9999-12-31T23:59:59+00:00", "in the future"),
    ("zzz", "expected an ISO 8601 UTC timestamp"),
    ("2026-01-01T00:00:00", "expected a UTC timestamp"),
    ("2026-01-01T00:00:00+05:00", "expected a UTC timestamp"),
    (20260101, "expected a string"),
])
@pytest.mark.parametrize("command", ["report", "gate", "history"])
def test_created_utc_is_a_real_utc_timestamp(tmp_path: Path, env: dict, value: Any, says: str,
                                             command: str) -> None:
    f = _write(tmp_path, _set("created_utc", value))
    args = {"report": ["report", f, "-o", "r.html"],
            "gate": ["gate", "--baseline", str(EXAMPLE), "--current", f],
            "history": ["history", f]}[command]
    r = sb(args, env, tmp_path, timeout=120)
    one_error_line(r, "bad.json", "created_utc", says)
    assert not (tmp_path / "r.html").exists()


def test_duplicate_variant_names_are_refused(tmp_path: Path, env: dict) -> None:
    def dup(d: dict[str, Any]) -> None:
        d["variants"][1]["name"] = d["variants"][0]["name"]
    f = _write(tmp_path, dup)
    r = sb(["gate", "--baseline", str(EXAMPLE), "--current", f], env, tmp_path, timeout=120)
    one_error_line(r, "bad.json", "variants[1].name", "appears twice")


@pytest.mark.parametrize("path, value, says", [
    ("variants.0.repeats.0.throughput_samples_s", -5.0, ">= 0"),
    ("variants.0.repeats.0.samples", 10 ** 4000, "expected a count"),
    ("variants.0.repeats.0.samples", -1, "expected a count"),
    ("variants.0.repeats.0.epoch_s", 1e300, "beyond any measured figure"),
    ("variants.0.repeats.0.peak_pss_mb", -1.0, ">= 0"),
    ("variants.0.repeats.0.wait_s", -0.5, ">= 0"),
    ("variants.0.stall_share.values.0", 1.5, "share from 0 to 1"),
    ("variants.0.stall_share.values.0", -0.1, "share from 0 to 1"),
    ("variants.0.repeats.0.batches", 1.5, "expected an integer"),
])
@pytest.mark.parametrize("command", ["report", "whatif"])
def test_figures_out_of_their_physical_range_are_refused(tmp_path: Path, env: dict, path: str,
                                                         value: Any, says: str,
                                                         command: str) -> None:
    f = _write(tmp_path, _set(path, value))
    args = ["report", f, "-o", "r.html"] if command == "report" else ["whatif", f]
    r = sb(args, env, tmp_path, timeout=120)
    one_error_line(r, "bad.json", path.split(".")[-1] if not path[-1].isdigit()
                   else path.split(".")[-2], says)


@pytest.mark.parametrize("path, value, says", [
    ("variants.0.throughput_samples_s.median", 1.0, "throughput_samples_s.median: expected the "
                                                    "median of its values (338329.70"),
    ("variants.0.throughput_samples_s.values.0", 1.0, "throughput_samples_s.median: expected "
                                                      "the median of its values (167788.0"),
    ("variants.1.epoch_s.min", 0.0, "epoch_s.min: expected the min of its values"),
    ("variants.2.peak_pss_mb.max", 1e6, "peak_pss_mb.max: expected the max of its values"),
    ("variants.0.stall_share.median", 0.9, "stall_share.median: expected the median of its "
                                           "values"),
    ("variants.0.throughput_samples_s.median", None, "expected the median of its values"),
])
def test_summary_figures_are_what_their_values_give(tmp_path: Path, path: str, value: Any,
                                                    says: str) -> None:
    """A summary's median, min and max are derived from its per-repeat values (``Summary.of``);
    a file whose summary says otherwise (a hand edit) is refused, naming file and key."""
    from stallbench.errors import ResultError
    from stallbench.results import load

    load(tmp_path / _write(tmp_path, lambda d: None, "ok.json"))   # unedited: loads
    with pytest.raises(ResultError) as info:
        load(tmp_path / _write(tmp_path, _set(path, value)))
    assert str(info.value).startswith(f"{tmp_path / 'bad.json'}: variants[{path.split('.')[1]}]")
    assert says in str(info.value), str(info.value)


def test_gate_refuses_a_hand_edited_summary(tmp_path: Path, env: dict) -> None:
    f = _write(tmp_path, _set("variants.0.throughput_samples_s.median", 1e9))
    r = sb(["gate", "--baseline", str(EXAMPLE), "--current", f], env, tmp_path, timeout=120)
    one_error_line(r, "bad.json", "variants[0].throughput_samples_s.median",
                   "expected the median of its values")


def test_signed_figures_keep_their_sign(tmp_path: Path, env: dict) -> None:
    """Changes, differences and differential attributions may be negative: still accepted."""
    def signed(d: dict[str, Any]) -> None:
        d["created_utc"] = "2026-01-01T00:00:00+00:00"
    f = _write(tmp_path, signed, "ok.json")
    r = sb(["report", f, "-o", "r.html"], env, tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("key, value, says", [
    ("detect", -1, ">= 0"),
    ("detect", 0, "slowdown > 0"),
    ("alpha", 2.0, "share from 0 to 1"),
    ("pairs", -3, "expected a count"),
    ("created_utc", "9999-01-01T00:00:00+00:00", "in the future"),
])
def test_calibration_files_are_validated_as_data(tmp_path: Path, key: str, value: Any,
                                                  says: str) -> None:
    from stallbench.errors import ResultError
    from stallbench.gate import calibration

    cal = {"calibration_version": calibration.CALIBRATION_VERSION,
           "created_utc": "2026-01-01T00:00:00+00:00", "tool_version": "x", "scenario": "s",
           "scenario_sha256": "0", "scenario_path": "s.toml",
           "machine": {"cpu_model": "x", "cores_logical": 2}, "commit": None, "threshold": 0.1, "alpha": 0.05, "pairs": 5,
           "rounds": 3, "detect": 0.1, "power_target": 0.95, "resamples": 100,
           "seconds": 1.0, "metrics": []}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(cal))
    calibration.load(good)          # the valid file loads: only the edited key is wrong
    cal[key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(cal))
    with pytest.raises(ResultError) as info:
        calibration.load(bad)
    assert key in str(info.value) and says in str(info.value), str(info.value)


GOLDEN = ROOT / "tests" / "golden" / "result_errors.txt"


def _calibration() -> dict[str, Any]:
    from stallbench.gate import calibration

    return {"calibration_version": calibration.CALIBRATION_VERSION,
            "created_utc": "2026-01-01T00:00:00+00:00", "tool_version": "x", "scenario": "s",
            "scenario_sha256": "0", "scenario_path": "s.toml",
            "machine": {"cpu_model": "x", "cores_logical": 2}, "commit": None,
            "threshold": 0.1, "alpha": 0.05, "pairs": 5, "rounds": 3, "detect": 0.1,
            "power_target": 0.95, "resamples": 100, "seconds": 1.0, "metrics": []}


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        cur: Any = d
        for k in head:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        del cur[last]
    return change


def test_validation_lines_golden(tmp_path: Path, env: dict) -> None:
    """Result and calibration refusals read ``file.json: key.path: expected ..., got ...``,
    like every other one-line error (they printed ``file.json:.created_utc``: the file's root
    joined to its first key with a dot). STALLBENCH_UPDATE_GOLDEN=1 refreshes the file."""
    from stallbench.errors import ResultError
    from stallbench.gate import calibration

    cases = [("created_utc", _set("created_utc", "zzz")),
             ("a string", _set("scenario.path", 3)),
             ("a nested figure", _set("variants.0.repeats.0.epoch_s", -1.0)),
             ("a summary's share", _set("variants.0.stall_share.median", 2.0)),
             ("a summary's median", _set("variants.0.throughput_samples_s.median", 1.0)),
             ("a missing key", _drop("variants.0.name")),
             ("a list item", _set("variants.0.repeats", [1]))]
    got = []
    for what, change in cases:
        f = _write(tmp_path, change)
        r = sb(["history", f], env, tmp_path, timeout=120)
        got.append(f"$ stallbench history bad.json  # {what}\nrc={r.returncode}\n{r.stderr}")
    for key, value in (("created_utc", "zzz"), ("detect", -1), ("metrics", [{}])):
        cal = _calibration()
        cal[key] = value
        bad = tmp_path / "calibration.json"
        bad.write_text(json.dumps(cal))
        try:
            calibration.load(bad)
            said = "loaded"
        except ResultError as exc:
            said = str(exc).replace(str(tmp_path) + "/", "")
        got.append(f"# calibration.load: {key} = {json.dumps(value)}\n{said}\n")
    text = "\n".join(got)
    if __import__("os").environ.get("STALLBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert ":." not in text and ": :" not in text


NASTY = ["x\n::error title=injected::boom", "a\r\n::warning::w", "esc\x1b[2J", "$\\sqrt{\\sqrt{$",
         "$" + "\\sqrt{" * 40 + "x" + "}" * 40 + "$", "bidi\u202egnp.exe"]


@pytest.mark.parametrize("fmt", ["github", "markdown", "table"])
def test_a_variant_name_never_makes_its_own_output_line(tmp_path: Path, env: dict,
                                                         fmt: str) -> None:
    def rename(d: dict[str, Any]) -> None:
        for v, name in zip(d["variants"], NASTY):
            v["name"] = name
    cur = _write(tmp_path, rename, "cur.json")
    base = _write(tmp_path, rename, "base.json")
    r = sb(["gate", "--baseline", base, "--current", cur, "--format", fmt], env, tmp_path,
           timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    for line in r.stdout.splitlines():
        assert not line.startswith("::") or line.startswith("::error title=stallbench gate::") \
            or line.startswith("::warning title=stallbench gate::"), line
        assert "\x1b" not in line and "\u202e" not in line, repr(line)


@pytest.mark.parametrize("command", ["whatif", "history"])
def test_names_from_results_are_escaped_in_every_verb(tmp_path: Path, env: dict,
                                                      command: str) -> None:
    """The gate escaped names; ``whatif`` and ``history`` printed them raw (a re-run found
    ``::error title=x::pwned`` at the start of their stdout lines). Names are escaped once,
    where results are read (``results/store.from_dict``)."""
    def rename(d: dict[str, Any]) -> None:
        d["scenario"]["name"] = "s\n::error::scenario"
        for v, name in zip(d["variants"], NASTY):
            v["name"] = name
    f = _write(tmp_path, rename, "r.json")
    r = sb([command, f], env, tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "x\\n::error title=injected::boom" in r.stdout, r.stdout[-2000:]
    for line in (r.stdout + r.stderr).splitlines():
        assert not line.startswith("::"), line
        assert "\x1b" not in line and "\u202e" not in line, repr(line)


@pytest.mark.parametrize("text, key", [
    ('name = "t\\n::error::x"', "name"),
    ('name = "t\\u001b[2J"', "name"),
    ('name = "t"\n[matrix]\nloader = [{label = "a\\n::error::x", batch_size = 8}, '
     '{label = "b", batch_size = 16}]', "matrix"),
    ('name = "t"\n[matrix]\n"dataset.path" = ["d\\r\\n::warning::w.parquet"]', "matrix"),
])
def test_scenario_names_and_labels_are_printable(tmp_path: Path, env: dict, text: str,
                                                 key: str) -> None:
    """``run`` printed a label's newline as is (its variant line started ``::error``)."""
    (tmp_path / "s.toml").write_text(text + "\n")
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=120)
    one_error_line(r, "s.toml", key, "printable")
    assert not (tmp_path / "out").exists()


def test_report_renders_labels_as_text(tmp_path: Path, env: dict) -> None:
    def rename(d: dict[str, Any]) -> None:
        for v, name in zip(d["variants"], NASTY[3:]):
            v["name"] = name
    f = _write(tmp_path, rename, "r.json")
    r = sb(["report", f, "-o", "r.html"], env, tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    html = (tmp_path / "r.html").read_text()
    assert "\\sqrt{\\sqrt{" in html


@pytest.mark.parametrize("path, value, side", [
    ("variants.0.stall_share.values.0", -0.2, "--current"),
    ("variants.0.stall_share.median", -0.01, "--baseline"),
    ("variants.0.repeats.0.phases.steady_stall_share", -0.5, "--current"),
    ("variants.0.phases.steady_stall_share.min", 1.2, "--baseline"),
    ("variants.0.phases.steady_stall_share.values.0", -0.1, "--current"),
])
def test_the_gate_refuses_shares_out_of_range(tmp_path: Path, env: dict, path: str,
                                              value: Any, side: str) -> None:
    """A negative (or above 1) share in either side never reaches the gate's comparison."""
    good = _write(tmp_path, lambda d: None, "good.json")
    bad = _write(tmp_path, _set(path, value))
    pair = [good, bad] if side == "--current" else [bad, good]
    r = sb(["gate", "--baseline", pair[0], "--current", pair[1]], env, tmp_path, timeout=120)
    one_error_line(r, "bad.json", path.split(".")[-1] if not path[-1].isdigit()
                   else path.split(".")[-2], "share from 0 to 1")


# A name that *starts* with "::" needs no newline to start a line: the gate's and history's
# rows start with the scenario's name, the run's table rows with the variant's (camp3 found
# ``::error::pwned  one  throughput ...`` on the gate's default table, rc 0). GitHub's runner
# trims leading blanks before it looks for "::", so blanks do not save it either.
LEADING = ["::error title=x::pwned", "  ::add-mask::x", "::stop-commands::tok"]


def _ours(line: str) -> bool:
    return line.startswith(("::error title=stallbench gate::",
                            "::warning title=stallbench gate::"))


@pytest.mark.parametrize("args", [["gate", "--format", "table"], ["gate", "--format", "markdown"],
                                  ["gate", "--format", "github"], ["history"], ["whatif"]])
def test_a_name_starting_with_a_workflow_command_never_starts_a_line(
        tmp_path: Path, env: dict, args: list[str]) -> None:
    def rename(d: dict[str, Any]) -> None:
        d["scenario"]["name"] = "::error::scenario"
        for v, name in zip(d["variants"], LEADING):
            v["name"] = name
    f = _write(tmp_path, rename, "r.json")
    files = ["--baseline", f, "--current", f] if args[0] == "gate" else [f]
    r = sb([args[0], *files, *args[1:]], env, tmp_path, timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert "\\x3a:error::scenario" in r.stdout, r.stdout[-2000:]
    for line in (r.stdout + r.stderr).splitlines():
        assert not line.lstrip().startswith("::") or _ours(line), line


@pytest.mark.parametrize("text, key", [
    ('name = "::error::x"', "name"),
    ('name = "  ::add-mask::x"', "name"),
    ('name = "t"\n[matrix]\nloader = [{label = "::warning file=a::w", batch_size = 8}, '
     '{label = "b", batch_size = 16}]', "matrix"),
])
def test_scenario_names_and_labels_never_start_with_a_workflow_command(
        tmp_path: Path, env: dict, text: str, key: str) -> None:
    """``run`` printed ``::warning file=a::w   260,459 ...``: the label leads its table row."""
    (tmp_path / "s.toml").write_text(text + "\n")
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path, timeout=120)
    one_error_line(r, "s.toml", key, "does not start with '::'")
    assert not (tmp_path / "out").exists()
