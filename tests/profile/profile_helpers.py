"""Running ``stallbench profile`` on user-style scripts, as a user would (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONUNBUFFERED"] = "1"
    e.update(extra)
    return e


def profile(args: list[str], cwd: Path, timeout: float = 300, **extra: str
            ) -> subprocess.CompletedProcess:
    """``stallbench profile ARGS``; ``--no-analyze`` unless ARGS say ``--analyze``: the
    ablation runs (issue 28) are tested on their own (test_ablate.py), and would multiply
    every other test's runs by five."""
    if "--analyze" not in args and "--no-analyze" not in args:
        args = ["--no-analyze", *args]
    return subprocess.run([sys.executable, "-m", "stallbench", "profile", *args], cwd=cwd,
                          env=env(**extra), capture_output=True, text=True, timeout=timeout)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def result_files(out: Path) -> list[Path]:
    return sorted(out.glob("*.json")) if out.exists() else []


def load(out: Path):
    from stallbench import results

    files = result_files(out)
    assert len(files) == 1, files
    return results.load(files[0])


def truth(stdout: str) -> dict:
    line = [x for x in stdout.splitlines() if x.startswith("truth: ")][-1]
    return json.loads(line[len("truth: "):])


def item_seconds(data: Path) -> list[float]:
    out = []
    for f in sorted((data / "truth").glob("items-*.txt")):
        out.extend(float(x) for x in f.read_text().split())
    return out


def load_hooks(name: str):
    """The in-process hooks, loaded as the bootstrap loads them (by path, registered under
    ``name``), with their doors, without installing anything: for tests of their rules."""
    import importlib.util

    from stallbench.profile.launcher import HOOKS

    spec = importlib.util.spec_from_file_location(name, HOOKS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    mod.load_doors()
    return mod
