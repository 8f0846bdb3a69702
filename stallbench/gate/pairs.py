"""Same-job A/B runs: two code trees measured on the same scenarios, pair by pair, in one job.

asv's ``continuous`` runs both commits in one job; so does this. Each measured run is a fresh
subprocess of the one Python environment the gate runs in::

    PYTHONPATH=<side root>[:<the caller's PYTHONPATH, mapped into the side's tree>] \
        python -P -m stallbench run <scenario files> --out <fresh dir> --repeats 1

with the caller's working directory, so relative paths in a scenario (``dataset.path``, the
dataset cache under ``.cache/stallbench``) resolve to the same files for both sides and both
read the same input bytes.

Why this interface
    - ``<side root>`` first on the import path: stallbench itself (when the repository is
      stallbench) and the user's own transforms and models (``"mytf:fn"``) are imported from
      that side's tree. ``-P`` keeps Python from putting the working directory in front of it
      (the working directory is the *current* tree: the REF side would import the working
      tree's modules). The editable install's finder sits after ``PYTHONPATH`` on the path, so
      a tree holding ``stallbench/`` wins over the installed one; a tree without it (a user's
      repository) runs the installed stallbench on both sides.
    - The user's modules are looked up next to the scenario file and in the working directory
      (``registry.user_dirs``), loaded by file path: ``STALLBENCH_SIDE_TREE`` maps those
      directories into REF's checkout for REF's runs, so a module REF lacks fails REF's side
      (exit 2 naming REF) instead of importing the working tree's copy.
    - ``PYTHONPATH`` entries inside the working tree (e.g. ``src``) are mapped to the same place
      in REF's tree, so a ``src/`` layout also gets each side's own code.
    - ``run SCENARIO --out DIR --repeats 1`` is all a side's stallbench must understand: an
      older REF (result schema 1, fewer flags) runs too; its results load through the
      migration.

Scenario files: both sides run the *working tree's* scenario files. A benchmark is the
question and the code is what changes (asv runs its current benchmark suite against old
commits the same way); if the scenario itself changed between REF and the working tree, it is
the new question that is asked of both. A scenario REF's stallbench cannot run (a key it does
not know, a transform that did not exist yet) is an error naming the side.

Order: pairs alternate which side goes first (A B, B A, A B, ...): adjacent runs share the
machine's state, and alternating cancels any advantage of running first or second (warm page
cache, CPU frequency) instead of giving it to one side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..errors import UserError
from ..registry import SIDE_TREE
from ..results import Result, find, load


@dataclass(frozen=True)
class Side:
    """One side of an A/B: a label for people and the tree whose code it runs."""

    label: str
    root: Path


@dataclass
class Pair:
    """One measured pair: both sides' results of every scenario, keyed by scenario name."""

    index: int
    first: str                   # "a" or "b": which side ran first
    a: dict[str, Result]
    b: dict[str, Result]
    seconds: dict[str, float] = field(default_factory=dict)   # wall time of each side's run


def side_env(side: Side, work_root: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one side's run: its root first on ``PYTHONPATH``; the caller's
    entries that point into the working tree are mapped into this side's tree."""
    env = dict(os.environ if env is None else env)
    entries: list[str] = [str(side.root)]
    for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        p = Path(entry).resolve()
        try:
            rel = p.relative_to(work_root)
        except ValueError:
            entries.append(entry)
            continue
        entries.append(str(side.root / rel))
    env["PYTHONPATH"] = os.pathsep.join(entries)
    # The user's "mytf:fn" modules are found next to the scenario and in the working
    # directory (registry.user_dirs): on REF's side, those directories in REF's checkout.
    if Path(side.root).resolve() != Path(work_root).resolve():
        env[SIDE_TREE] = f"{Path(work_root).resolve()}{os.pathsep}{Path(side.root).resolve()}"
    else:
        env.pop(SIDE_TREE, None)
    return env


def command(scenarios: Sequence[Path], out: Path, repeats: int = 1) -> list[str]:
    """The one command line a side's stallbench must understand (keep it minimal: old REFs)."""
    return [sys.executable, "-P", "-m", "stallbench", "run", *map(str, scenarios),
            "--out", str(out), "--repeats", str(repeats)]


def run_side(side: Side, scenarios: Sequence[Path], out: Path, cwd: Path, work_root: Path,
             repeats: int = 1) -> tuple[dict[str, Result], float]:
    """One measured run of ``side``: its results by scenario name, and its wall time."""
    out.mkdir(parents=True)
    log = out.parent / f"{out.name}.log"
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(command(scenarios, out, repeats), cwd=cwd,
                                env=side_env(side, work_root), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:      # interrupted (Ctrl-C, SIGTERM) or an error here
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    seconds = time.perf_counter() - t0
    if code != 0:
        tail = _tail(log)
        raise UserError(f"gate: the {side.label} side failed to run "
                        f"{', '.join(s.name for s in scenarios)} (exit {code}): {tail}")
    loaded = [load(p) for p in find([out])]
    by_name = {r.scenario.name: r for r in loaded}
    if len(by_name) != len(scenarios):
        raise UserError(f"gate: the {side.label} side wrote {len(by_name)} result(s) for "
                        f"{len(scenarios)} scenario file(s) in {out}")
    return by_name, seconds


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    useful = [ln for ln in text if ln.strip()][-lines:]
    return " | ".join(useful) or "(no output)"


def run_pairs(scenarios: Sequence[Path], a: Side, b: Side, pairs: int, *, cwd: Path,
              work_root: Path, say: Callable[[str], None] = lambda s: None,
              keep: Path | None = None, repeats: int = 1) -> list[Pair]:
    """``pairs`` interleaved pairs of runs (A B, B A, ...) of every scenario on both sides.

    Result files go to a temporary directory removed afterwards (or under ``keep``)."""
    if pairs < 1:
        raise UserError(f"gate: --repeats must be at least 1 pair, got {pairs}")
    scen = [Path(s).resolve() for s in scenarios]
    tmp = Path(tempfile.mkdtemp(prefix="stallbench-ab-")) if keep is None else keep
    try:
        out: list[Pair] = []
        for i in range(pairs):
            order = (("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a))
            runs: dict[str, dict[str, Result]] = {}
            secs: dict[str, float] = {}
            for key, side in order:
                runs[key], secs[key] = run_side(side, scen, tmp / f"pair{i:03d}-{key}", cwd,
                                                work_root, repeats)
            out.append(Pair(i, order[0][0], runs["a"], runs["b"], secs))
            say(f"pair {i + 1}/{pairs} ({order[0][1].label} first): "
                f"{a.label} {secs['a']:.1f} s, {b.label} {secs['b']:.1f} s")
        return out
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
