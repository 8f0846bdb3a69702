"""Class 1 and 6 of issue 13: every output path is checked before any work.

The rule (``stallbench/outputs.py``): a result or report never replaces a file that is not its
own kind, never a directory, device, FIFO or symbolic link, never anything under /proc, /sys
or /dev; a path under a file, an unwritable directory or a name too long: one line naming
the flag, exit 2, before the run starts (the scenario line is never printed, the file is
untouched).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from reliability_helpers import TINY, no_files, one_error_line, sb, write

from stallbench import outputs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "results" / "examples" / "schema-v2.json"


# ------------------------------------------------------------------------------ run --out

@pytest.mark.parametrize("make, expect", [
    (lambda d: (d / "out").write_text("precious"), "exists and is not a directory"),
    (lambda d: (d / "f").write_text("x"), "which is not a directory"),          # --out f/sub
    (lambda d: None, "is under /proc"),
    (lambda d: os.symlink(d / "target.txt", d / "out") or (d / "target.txt").write_text("x"),
     "exists and is not a directory"),
])
def test_run_out_refused_before_the_run(tmp_path: Path, env: dict, make, expect: str) -> None:
    make(tmp_path)
    out = {"is under /proc": "/proc/self/stallbench-out",
           "which is not a directory": "f/sub"}.get(expect, "out")
    write(tmp_path, TINY)
    r = sb(["run", "s.toml", "--out", out, "--no-progress"], env, tmp_path, timeout=120)
    one_error_line(r, "--out", expect)
    assert "scenario tiny" not in r.stdout            # nothing ran
    if (tmp_path / "target.txt").exists():
        assert (tmp_path / "target.txt").read_text() == "x"
    if out == "out" and (tmp_path / "out").is_file() and not (tmp_path / "out").is_symlink():
        assert (tmp_path / "out").read_text() == "precious"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only (0555) directory")
def test_run_out_unwritable_directory(tmp_path: Path, env: dict) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        write(tmp_path, TINY)
        r = sb(["run", "s.toml", "--out", "locked/results", "--no-progress"], env, tmp_path)
        one_error_line(r, "--out", "not writable")
    finally:
        locked.chmod(0o755)


def test_run_cache_dir_that_is_a_file(tmp_path: Path, env: dict) -> None:
    (tmp_path / "cache").write_text("not a directory")
    write(tmp_path, TINY)
    r = sb(["run", "s.toml", "--out", "out", "--cache-dir", "cache", "--no-progress"], env,
           tmp_path)
    one_error_line(r, "--cache-dir", "not a directory")
    assert no_files(tmp_path / "out")


def test_long_scenario_name_refused_before_the_run(tmp_path: Path, env: dict) -> None:
    """300 characters used to fail at save ("File name too long"), after the whole run."""
    write(tmp_path, TINY.replace('name = "tiny"', f'name = "{"n" * 300}"'))
    r = sb(["run", "s.toml", "--out", "out", "--no-progress"], env, tmp_path)
    one_error_line(r, "s.toml: name: ", "at most 128 characters")
    assert no_files(tmp_path / "out")


def test_result_name_checked_against_the_file_system(tmp_path: Path) -> None:
    """The name limit is the directory's own (PC_NAME_MAX) plus the temp name's 14 extra."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    outputs.check_dir(tmp_path, "--out", ["x" * (limit - outputs.TEMP_EXTRA)])
    with pytest.raises(outputs.UserError, match="too long"):
        outputs.check_dir(tmp_path, "--out", ["x" * (limit - outputs.TEMP_EXTRA + 1)])


def test_run_writes_into_a_new_nested_directory(tmp_path: Path, env: dict) -> None:
    """The rule refuses only what it must: a missing --out (several levels) is created."""
    write(tmp_path, TINY)
    r = sb(["run", "s.toml", "--out", "a/b/c", "--no-progress"], env, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list((tmp_path / "a/b/c").glob("tiny-*.json"))) == 1


# ------------------------------------------------------------------------------ report -o

def _report_case(d: Path, kind: str) -> str:
    if kind == "result json":
        shutil.copy(EXAMPLE, d / "old.json")
        return "old.json"
    if kind == "text file":
        (d / "notes.html").write_text("my notes")
        return "notes.html"
    if kind == "directory":
        (d / "site").mkdir()
        return "site"
    if kind == "device":
        return "/dev/null"
    if kind == "fifo":
        os.mkfifo(d / "pipe.html")
        return "pipe.html"
    if kind == "symlink to a report":
        (d / "real.html").write_text('<meta name="generator" content="stallbench 0.1">')
        os.symlink(d / "real.html", d / "link.html")
        return "link.html"
    if kind == "under a file":
        (d / "file").write_text("x")
        return "file/report.html"
    if kind == "proc":
        return "/proc/self/report.html"
    if kind == "name too long":
        return "r" * 250 + ".html"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, expect", [
    ("result json", "is not a stallbench HTML report"),
    ("text file", "is not a stallbench HTML report"),
    ("directory", "is a directory"),
    ("device", "is under /dev"),
    ("fifo", "not a regular file"),
    ("symlink to a report", "symbolic link"),
    ("under a file", "which is not a directory"),
    ("proc", "is under /proc"),
    ("name too long", "too long"),
])
def test_report_output_refused_before_reading(tmp_path: Path, env: dict, kind: str,
                                              expect: str) -> None:
    target = _report_case(tmp_path, kind)
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    # The results named do not exist: the output check must come first to be seen.
    r = sb(["report", "missing-results/", "-o", target], env, tmp_path, timeout=60)
    one_error_line(r, "-o: ", expect)
    for p, data in before.items():
        assert p.read_bytes() == data


def test_report_replaces_an_earlier_report(tmp_path: Path, env: dict) -> None:
    shutil.copy(EXAMPLE, tmp_path / "r.json")
    first = sb(["report", "r.json", "-o", "index.html"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    mark = (tmp_path / "index.html").stat().st_mtime_ns
    again = sb(["report", "r.json", "-o", "index.html"], env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "index.html").stat().st_mtime_ns != mark
    assert outputs.REPORT.is_own(tmp_path / "index.html")


# ------------------------------------------------------------------ gate --update-baseline

@pytest.mark.parametrize("kind, expect", [
    ("fifo", "not a regular file"),
    ("directory", "is a directory"),
    ("symlink", "symbolic link"),
])
def test_update_baseline_destination_refused_before_the_gate(tmp_path: Path, env: dict,
                                                             kind: str, expect: str) -> None:
    (tmp_path / "cur").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "cur" / "r.json")
    base = tmp_path / "base"
    base.mkdir()
    dest = base / "r.json"
    if kind == "fifo":
        os.mkfifo(dest)
    elif kind == "directory":
        dest.mkdir()
    else:
        (tmp_path / "elsewhere.json").write_text("{}")
        os.symlink(tmp_path / "elsewhere.json", dest)
    r = sb(["gate", "--baseline", "base", "--current", "cur", "--threshold", "10%",
            "--update-baseline"], env, tmp_path, timeout=60)
    one_error_line(r, "--update-baseline", expect)
    if kind == "symlink":
        assert (tmp_path / "elsewhere.json").read_text() == "{}"


def test_result_kind_is_recognised_by_its_marker(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "r.json")
    (tmp_path / "other.json").write_text('{"schema_version": 2, "tool": {"name": "other"}}')
    assert outputs.RESULT.is_own(tmp_path / "r.json")
    assert outputs.RESULT.is_own(ROOT / "results" / "examples" / "schema-v1.json")
    assert not outputs.RESULT.is_own(tmp_path / "other.json")
    assert not outputs.REPORT.is_own(tmp_path / "r.json")
