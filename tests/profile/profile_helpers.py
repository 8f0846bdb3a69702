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


def load_agent(name: str):
    """The agent, loaded as the bootstrap loads it (its folder as a package, by path,
    registered under ``name``: each name a fresh copy with state of its own), its doors
    loaded, nothing installed: for tests of its rules. Its modules are the package's
    attributes (``a.streams``, ``a.state``, ...)."""
    import importlib
    import importlib.util

    from stallbench.profile.launcher import AGENT

    for old in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[old]            # a name loaded again is a fresh copy
    spec = importlib.util.spec_from_file_location(name, AGENT / "__init__.py",
                                                  submodule_search_locations=[str(AGENT)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    importlib.import_module(f"{name}.install").load_doors()
    return pkg
