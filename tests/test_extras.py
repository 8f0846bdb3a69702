"""The core install (issue 42): without the extras' packages (Ray, matplotlib, jinja2; and
pandas and scipy, which nothing of stallbench needs), every core module imports, `profile`
and `gate` work, and a verb or scenario that needs an extra says which in one line, exit 2.

The extras are installed here (`make setup` installs `.[dev]`, which pulls `[all]`), so they
are hidden from a subprocess by a ``sitecustomize`` on its ``PYTHONPATH`` whose meta-path
finder refuses them: the same ``ModuleNotFoundError`` an install without them raises.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("ray", "pandas", "scipy", "matplotlib", "jinja2", "prometheus_client")
# Modules that exist to serve an extra: the HTML report's (need [report]).
REPORT_ONLY = ("stallbench.report.plots", "stallbench.report.render", "stallbench.report.history")

BLOCKER = f'''
import sys
from importlib.machinery import PathFinder
BLOCKED = {BLOCKED!r}
class _Slim(PathFinder):
    """sys.path without the extras' packages: finds nothing of them, as an install without
    them does (``importlib.util.find_spec`` says None, ``import`` raises ModuleNotFoundError)."""
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return PathFinder.find_spec(name, path, target)
sys.meta_path[:] = [_Slim if f is PathFinder else f for f in sys.meta_path]
'''


def slim_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that cannot import any of ``BLOCKED``."""
    d = tmp / "slim"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(d), *filter(None, [env.get("PYTHONPATH")])])
    return env


def slim(args: list[str], tmp: Path, timeout: float = 300, **extra: str
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=tmp, env=slim_env(tmp, **extra),
                          capture_output=True, text=True, timeout=timeout)


def test_the_blocker_blocks(tmp_path: Path) -> None:
    """Without this, every test below could pass with the packages imported after all."""
    for name in BLOCKED:
        cp = slim(["-c", f"import {name}"], tmp_path)
        assert cp.returncode != 0 and "ModuleNotFoundError" in cp.stderr, (name, cp.stderr)


def test_core_modules_import_without_the_extras(tmp_path: Path) -> None:
    """Every module of stallbench but the report's imports with none of ``BLOCKED``: Ray is
    imported only where the ray executor runs, matplotlib and jinja2 only by the report."""
    code = f"""
import importlib, pkgutil, sys, stallbench
names = sorted(m.name for m in pkgutil.walk_packages(stallbench.__path__, "stallbench."))
skip = {REPORT_ONLY!r} + ("stallbench.__main__",)
for n in names:
    if n not in skip:
        importlib.import_module(n)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
print(len(names) - len(skip), "modules;", "leaked:", leaked)
"""
    cp = slim(["-c", code], tmp_path)
    assert cp.returncode == 0, cp.stderr
    n = int(cp.stdout.split()[0])
    assert n > 100 and cp.stdout.rstrip().endswith("leaked: []"), cp.stdout


def test_no_module_imports_what_nothing_needs() -> None:
    """pandas and scipy are no dependency at all: no module of stallbench imports them, not
    even lazily inside a function (a lazy ``from scipy.special import stdtrit`` in the what-if
    back-test crashed `profile --set dataloader.num_workers=0,2` in a core install, which
    importing every module could not see)."""
    import ast

    found = []
    for path in sorted((ROOT / "stallbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("pandas", "scipy")]
    assert not found, found


def test_report_says_which_extra_it_needs(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    cp = slim(["-m", "stallbench", "report", "results", "-o", "r.html"], tmp_path)
    assert cp.returncode == 2, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cp.stderr, cp.stderr
    assert ("stallbench report needs the [report] extra (cannot import matplotlib): "
            "pip install 'stallbench[report]'") in lines[0], lines[0]
    assert not (tmp_path / "r.html").exists()


def test_profile_live_says_which_extra_it_needs(tmp_path: Path) -> None:
    """``--live``'s endpoint is the launcher's (issue 60): without prometheus_client a
    profile without --live runs as before (the agent never needs it), and --live says
    which extra, before the job runs."""
    marker = tmp_path / "ran"
    cp = slim(["-m", "stallbench", "profile", "--live", "0", "--", sys.executable, "-c",
               f"open({str(marker)!r}, 'w')"], tmp_path)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert ("stallbench profile --live needs the [live] extra (cannot import "
            "prometheus_client): pip install 'stallbench[live]'") in cp.stderr, cp.stderr
    assert not marker.exists()


def test_a_ray_scenario_says_which_extra_it_needs(tmp_path: Path) -> None:
    cp = slim(["-m", "stallbench", "run", str(ROOT / "scenarios" / "disaggregated.toml"),
               "--out", str(tmp_path / "results")], tmp_path)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    line = cp.stderr.strip().splitlines()[-1]
    assert ('executor.kind = "ray" needs the [ray] extra (cannot import ray): '
            "pip install 'stallbench[ray]'") in line, line
    assert not list((tmp_path / "results").glob("*.json"))


def test_extras_hold_what_the_core_leaves_out() -> None:
    """The core dependencies hold none of the extras' packages; `dev` (what `make setup`
    installs) pulls `all` and `frameworks`, and `all` every other extra but the peers' own venv."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(proj["dependencies"])
    for name in BLOCKED:
        assert name not in core, name
    extras = proj["optional-dependencies"]
    assert any(d.startswith("ray[data,train,client]") for d in extras["ray"])
    assert {d.split(">")[0] for d in extras["report"]} == {"matplotlib", "jinja2"}
    assert extras["all"] == ["stallbench[ray,report,live]"]
    assert [d.split(">")[0] for d in extras["live"]] == ["prometheus-client"]
    assert "stallbench[all]" in extras["dev"]
    # the framework doors' tests (Lightning, Accelerate) run on a fresh clone (issue 40)
    assert "stallbench[frameworks]" in extras["dev"]


def test_profile_and_gate_without_the_extras(tmp_path: Path) -> None:
    """The issue's "done when": `profile -- python examples/train_parquet.py` and `gate` on
    its result, in an environment without Ray, pandas, scipy, matplotlib or jinja2, with the
    example's own `--set dataloader.num_workers=0,2` (two variants: the what-if and its
    back-test run too). It reads no verdict off timings (the gate compares a result with
    itself), so it runs in the parallel pass."""
    out = tmp_path / "results"
    data = str(tmp_path / "data")
    cp = slim(["-m", "stallbench", "profile", "--no-analyze", "--repeats", "2", "--out", str(out),
               "--set", "dataloader.num_workers=0,2", "--", sys.executable,
               str(ROOT / "examples" / "train_parquet.py")], tmp_path, TRAIN_PARQUET_DATA=data)
    assert cp.returncode == 0, cp.stderr
    assert any(x.startswith("result: ") for x in cp.stdout.splitlines()), cp.stdout
    assert len(list(out.glob("*.json"))) == 1
    gate = slim(["-m", "stallbench", "gate", "--baseline", str(out), "--current", str(out)],
                tmp_path)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "train_parquet" in gate.stdout and "throughput" in gate.stdout, gate.stdout
