"""Same-job A/B: the temporary worktree, each side's import path, the paired rows and the
confirmation flow. Fast tests use canned pairs; two tests run real subprocesses (a few s)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import abrepo
import factories
from stallbench import cli
from stallbench.gate import pairs as ab
from stallbench.gate import ab as ab_gate
from stallbench.gate import worktree
from stallbench.errors import UserError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


# ------------------------------------------------------------------------------ import path

def test_side_root_goes_first_and_working_tree_entries_map_into_the_side(tmp_path: Path) -> None:
    work, ref = tmp_path / "work", tmp_path / "ref"
    (work / "src").mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join([str(work / "src"), "/opt/elsewhere"])}
    got = ab.side_env(ab.Side("REF", ref), work.resolve(), env)["PYTHONPATH"].split(os.pathsep)
    assert got == [str(ref), str(ref / "src"), "/opt/elsewhere"]
    got = ab.side_env(ab.Side("wt", work.resolve()), work.resolve(), env)["PYTHONPATH"]
    assert got.split(os.pathsep)[:2] == [str(work.resolve()), str((work / "src").resolve())]


def test_command_is_the_minimal_stable_interface(tmp_path: Path) -> None:
    cmd = ab.command([tmp_path / "s.toml"], tmp_path / "out")
    assert cmd[1:] == ["-P", "-m", "stallbench", "run", str(tmp_path / "s.toml"), "--out",
                       str(tmp_path / "out"), "--repeats", "1"]


# ------------------------------------------------------------------------------ worktree

def test_checkout_gives_refs_tree_and_removes_it(tmp_path: Path) -> None:
    repo = abrepo.make(tmp_path / "repo", transform=abrepo.identity("v1"))
    abrepo.commit(repo, "second", **{"mytf.py": abrepo.identity("v2")})
    commit = worktree.resolve(repo, "HEAD~1")
    with worktree.checkout(repo, commit) as tree:
        assert 'VERSION = "v1"' in (tree / "mytf.py").read_text()
        assert str(tree) in abrepo.worktrees(repo)
    assert not tree.exists()
    assert abrepo.worktrees(repo) == [str(repo.resolve())]
    assert 'VERSION = "v2"' in (repo / "mytf.py").read_text()     # working tree untouched


def test_checkout_is_removed_on_errors_and_interrupts(tmp_path: Path) -> None:
    repo = abrepo.make(tmp_path / "repo")
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with worktree.checkout(repo, worktree.resolve(repo, "HEAD")) as tree:
                raise exc
        assert not tree.exists()
        assert abrepo.worktrees(repo) == [str(repo.resolve())]


def test_unknown_ref_and_shallow_clone_are_one_line_errors(tmp_path: Path) -> None:
    repo = abrepo.make(tmp_path / "repo")
    with pytest.raises(UserError, match="'HEAD~1' is not a commit"):
        worktree.resolve(repo, "HEAD~1")          # a first commit has no parent
    abrepo.commit(repo, "second", **{"mytf.py": abrepo.identity("v2")})
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)],
                   check=True, capture_output=True)
    with pytest.raises(UserError, match=r"shallow clone .*git fetch --deepen=1"):
        worktree.resolve(shallow, "HEAD~1")
    with pytest.raises(UserError, match="not a git ref"):
        worktree.resolve(repo, "--output=x")
    with pytest.raises(UserError, match="not inside a git repository"):
        worktree.toplevel(tmp_path)


# ------------------------------------------------------------------------------ real sides

def test_in_stallbenchs_own_repository_the_ref_side_imports_refs_stallbench() -> None:
    """The editable install's finder sits after PYTHONPATH: REF's tree wins for stallbench."""
    import subprocess
    import sys

    here = Path(__file__).resolve().parents[2]
    repo = worktree.toplevel(here)
    with worktree.checkout(repo, worktree.resolve(repo, "HEAD")) as tree:
        env = ab.side_env(ab.Side("REF", tree), repo)
        out = subprocess.run([sys.executable, "-P", "-c",
                              "import stallbench; print(stallbench.__file__)"], cwd=here,
                             env=env, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).is_relative_to(tree), out.stdout

def test_each_side_imports_its_own_trees_transform(tmp_path: Path) -> None:
    """REF's mytf.py on the REF side, the working tree's (uncommitted) on the other, although
    both run in the working tree's directory (where Python would find the working tree's)."""
    repo = abrepo.make(tmp_path / "repo", transform=abrepo.identity("ref-version", log=True))
    (repo / "mytf.py").write_text(abrepo.identity("working-version", log=True))
    log = tmp_path / "mytf.log"
    os.environ["MYTF_LOG"] = str(log)
    try:
        with worktree.checkout(repo, worktree.resolve(repo, "HEAD")) as ref_root:
            pairs = ab.run_pairs([repo / "scenario.toml"], ab.Side("REF", ref_root),
                                 ab.Side("working tree", repo), 1, cwd=repo, work_root=repo)
    finally:
        del os.environ["MYTF_LOG"]
    seen = log.read_text().split()
    n = len(seen) // 2
    assert seen[:n] == ["ref-version"] * n and seen[n:] == ["working-version"] * n, seen
    assert pairs[0].a["userpipe"].variants[0].throughput_samples_s.values


def test_a_side_that_cannot_run_is_named(tmp_path: Path) -> None:
    repo = abrepo.make(tmp_path / "repo")
    (repo / "mytf.py").write_text("def other(table):\n    return table\n")
    with pytest.raises(UserError, match=r"the working tree side failed to run scenario.toml "
                                        r"\(exit 2\).*mytf"):
        ab.run_side(ab.Side("working tree", repo), [repo / "scenario.toml"], tmp_path / "o",
                    repo, repo)


# ------------------------------------------------------------------------------ paired rows

BASE = [200_000.0, 240_000.0, 180_000.0, 260_000.0, 210_000.0, 190_000.0, 250_000.0,
        230_000.0, 170_000.0, 220_000.0]          # a drifting machine


def pairs_of(factor: float, share_delta: float = 0.0, n: int = 10) -> list[ab.Pair]:
    out = []
    for i, tp in enumerate(BASE[:n]):
        a = factories.result([factories.variant("v", [tp], [0.30])], scenario="s")
        b = factories.result([factories.variant("v", [tp * factor], [0.30 + share_delta])],
                             scenario="s")
        out.append(ab.Pair(i, "a" if i % 2 == 0 else "b", {"s": a}, {"s": b}))
    return out


def test_paired_rows_see_a_ten_percent_slowdown_through_drift() -> None:
    rep = ab_gate.paired_report(pairs_of(1 / 1.1, 0.08), threshold=0.05, alpha=0.01)
    rows = {r.metric: r for r in rep.rows}
    assert set(rows) == {"throughput", "stall_share"}
    assert rows["throughput"].verdict == "slower" and rows["throughput"].test == "wilcoxon"
    assert rows["throughput"].change == pytest.approx(1 / 1.1)
    assert rows["stall_share"].verdict == "slower"
    assert rows["stall_share"].change == pytest.approx(0.08)
    same = ab_gate.paired_report(pairs_of(1.0), threshold=0.05, alpha=0.01)
    assert {r.verdict for r in same.rows} == {"same"}


def _fake_gate(monkeypatch: pytest.MonkeyPatch, runs: list[list[ab.Pair]]) -> list[int]:
    calls: list[int] = []

    def fake(files, a, b, pairs, **kw):
        calls.append(pairs)
        return runs[len(calls) - 1]

    monkeypatch.setattr(ab, "run_pairs", fake)
    return calls


def _pairs_by(factors: list[float]) -> list[ab.Pair]:
    """Pairs whose working-tree throughput is REF's times each factor (a spread of changes)."""
    out = []
    for i, (tp, f) in enumerate(zip(BASE, factors)):
        a = factories.result([factories.variant("v", [tp], [0.30])], scenario="s")
        b = factories.result([factories.variant("v", [tp * f], [0.30])], scenario="s")
        out.append(ab.Pair(i, "a" if i % 2 == 0 else "b", {"s": a}, {"s": b}))
    return out


def test_too_few_pairs_for_a_large_worse_change_fail_once_confirmed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 pairs can never reach p < 0.05 in the signed-rank test (2/8): a 3x slower throughput
    whose paired t interval is wide is 'too few repeats', fails like a slower row, and a rerun
    that says slower (the same direction) confirms it."""
    repo = abrepo.make(tmp_path / "repo")
    abrepo.commit(repo, "second", **{"mytf.py": abrepo.identity("v2")})
    s = ab_gate.ABSettings(threshold=0.05, alpha=0.05, pairs=3, metrics=("throughput",))
    wide = _pairs_by([0.2, 0.9, 0.3])
    _fake_gate(monkeypatch, [wide, wide])
    out = ab_gate.run_gate([repo / "scenario.toml"], "HEAD~1", s, cwd=repo)
    (r,) = out.first.rows
    assert r.verdict == "too few repeats" and r.direction == "worse" and r.test == "paired-t"
    assert out.failed and ab_gate.summary(out).startswith("gate FAIL: confirmed by the rerun")
    _fake_gate(monkeypatch, [wide, pairs_of(0.5, n=3)])
    out = ab_gate.run_gate([repo / "scenario.toml"], "HEAD~1", s, cwd=repo)
    assert out.rerun is not None and out.rerun.rows[0].verdict == "slower" and out.failed
    _fake_gate(monkeypatch, [_pairs_by([3.0, 1.2, 2.5]), []])
    out = ab_gate.run_gate([repo / "scenario.toml"], "HEAD~1", s, cwd=repo)
    assert out.first.rows[0].direction == "better" and not out.failed and out.rerun is None
    assert "too few repeats (better)" in ab_gate.summary(out)


def test_slower_fails_only_when_the_rerun_confirms(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    repo = abrepo.make(tmp_path / "repo")
    abrepo.commit(repo, "second", **{"mytf.py": abrepo.identity("v2")})
    s = ab_gate.ABSettings(threshold=0.05, alpha=0.01, pairs=10)
    _fake_gate(monkeypatch, [pairs_of(0.9), pairs_of(0.9)])
    out = ab_gate.run_gate([repo / "scenario.toml"], "HEAD~1", s, cwd=repo)
    assert out.failed and out.rerun is not None
    assert {r.metric for r in out.confirmed} == {"throughput"}
    assert ab_gate.summary(out).startswith("gate FAIL: confirmed by the rerun: s/v throughput")
    _fake_gate(monkeypatch, [pairs_of(0.9), pairs_of(1.0)])
    out = ab_gate.run_gate([repo / "scenario.toml"], "HEAD~1", s, cwd=repo)
    assert not out.failed and out.unconfirmed
    assert "not confirmed by the rerun" in ab_gate.summary(out)
    calls = _fake_gate(monkeypatch, [pairs_of(1.0)])
    out = ab_gate.run_gate([repo / "scenario.toml"], "HEAD~1", s, cwd=repo)
    assert not out.failed and out.rerun is None and calls == [10]
    assert abrepo.worktrees(repo) == [str(repo.resolve())]


def _mask(text: str) -> str:
    text = re.sub(r"\b[0-9a-f]{7,40}\b", "<commit>", text)
    return re.sub(r"\(\d+ s\)", "(<s> s)", text)


def test_cli_prints_both_runs_and_exits_1_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    repo = abrepo.make(tmp_path / "repo")
    abrepo.commit(repo, "second", **{"mytf.py": abrepo.identity("v2")})
    monkeypatch.chdir(repo)
    _fake_gate(monkeypatch, [pairs_of(1 / 1.1, 0.08), pairs_of(1 / 1.1, 0.08)])
    code = cli.main(["gate", "--against", "HEAD~1", "scenario.toml"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "no calibration at results/baseline/calibration/userpipe.json" in err
    got = _mask(out)
    golden = GOLDEN / "gate_against.txt"
    if os.environ.get("STALLBENCH_REGOLD"):
        golden.write_text(got)
    assert got == golden.read_text()
    _fake_gate(monkeypatch, [pairs_of(1 / 1.1), pairs_of(1.0)])
    assert cli.main(["gate", "--against", "HEAD~1", "scenario.toml", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and [r["title"] for r in data["runs"]] == ["first run",
                                                                   "confirmation rerun"]
    assert data["summary"].startswith("gate PASS:")


def test_cli_mode_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    repo = abrepo.make(tmp_path / "repo")
    monkeypatch.chdir(repo)
    cases = [
        (["gate", "scenario.toml"], "scenario files are run only with --against"),
        (["gate", "--against", "HEAD"], "name the scenario files"),
        (["gate", "--against", "HEAD~1", "scenario.toml"], "'HEAD~1' is not a commit"),
        (["gate", "--against", "HEAD", "scenario.toml", "--current", "x"], "--current"),
        (["gate", "--against", "HEAD", "scenario.toml", "--repeats", "1"], "--repeats"),
        (["gate", "--against", "HEAD", "scenario.toml", "--rounds", "2"], "--calibrate"),
        (["gate", "--against", "HEAD", "nope.toml"], "nope.toml"),
        (["gate"], "needs --baseline and --current"),
        (["gate", "--against", "HEAD", "scenario.toml", "--update-baseline"],
         "--update-baseline"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (argv, err)
