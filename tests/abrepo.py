"""A user's repository in a temporary directory, for the same-job A/B tests: git, a scenario
that imports a transform from the repository (``"mytf:fn"``), and commits on top."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_CONFIG_NOSYSTEM": "1"}

# Serial loader (no workers), an EMULATED accelerator step that sleeps most of the epoch, and a
# small table: the data work (and any cost a commit adds to it) is part of every epoch, and the
# sleeping step keeps CPU contention from other processes out of most of the epoch.
SCENARIO = """
name = "userpipe"
[dataset]
rows = 65536
row_group_rows = 8192
files = 1
dense_features = 4
sparse_features = 2
sequence_features = 1
sequence_max_len = 4
seed = 3
[preprocess]
transforms = ["mytf:fn"]
[model]
kind = "emulated"
step_ms = 20
[loader]
batch_size = 1024
num_workers = 0
[analysis]
differential = false
[run]
repeats = 1
"""

IDENTITY = '''"""The user's transform."""
VERSION = "{version}"


def fn(table):
    {log}return table
'''

# Busy CPU on the thread's own clock: a cost known by construction, like stallbench's
# cpu_cost_us_per_row, but written the way a user's slower commit would be.
BURN = '''"""The user's transform, now doing more work per row."""
import time

VERSION = "{version}"
COST_S_PER_ROW = {cost!r}


def fn(table):
    {log}end = time.thread_time() + COST_S_PER_ROW * table.num_rows
    while time.thread_time() < end:
        pass
    return table
'''

LOG = ("import os\n    if os.environ.get('MYTF_LOG'):\n"
       "        open(os.environ['MYTF_LOG'], 'a').write(VERSION + '\\n')\n    ")


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, **GIT_ENV}, check=True)
    return out.stdout.strip()


def identity(version: str, log: bool = False) -> str:
    return IDENTITY.format(version=version, log=LOG if log else "")


def burn(version: str, cost_s_per_row: float, log: bool = False) -> str:
    return BURN.format(version=version, cost=cost_s_per_row, log=LOG if log else "")


def make(repo: Path, scenario: str = SCENARIO, transform: str | None = None) -> Path:
    """A git repository with scenario.toml and mytf.py, one commit."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "scenario.toml").write_text(scenario)
    (repo / "mytf.py").write_text(transform or identity("v1"))
    (repo / ".gitignore").write_text(".cache/\nresults/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def commit(repo: Path, message: str, **files: str) -> str:
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def stallbench(args: list[str], repo: Path, env: dict[str, str] | None = None,
               timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallbench", *args], cwd=repo,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def worktrees(repo: Path) -> list[str]:
    return [ln.split(" ", 1)[1] for ln in git(repo, "worktree", "list", "--porcelain").splitlines()
            if ln.startswith("worktree ")]


def idle_epoch(v) -> float:
    """The epoch an undisturbed machine would give, estimated from one variant's repeats of a
    serial (``num_workers = 0``) run with an EMULATED step: the step's measured wall time
    (it sleeps, so load barely stretches it) plus the trainer's CPU seconds less the step's
    own spin (~0.5 ms a batch). The wall epoch stretches with other processes' load; this
    does not, so a cost sized from it is a share of the epoch of a quiet machine, not of
    whatever the load was while sizing it."""
    import statistics

    step_s = float(v.config["model"]["step_ms"]) / 1000
    ests = [r.compute_s + r.trainer_cpu_s - r.batches * min(0.0005, step_s) for r in v.repeats]
    return statistics.median(ests)
