"""Run the user's command once, hooked, and collect what its processes wrote.

Why a process of its own (``start_new_session``): the job and everything it starts (loader
workers, torchrun's ranks) form one process group whose id is the job's PID, so a signal to
stallbench reaches all of it with one ``killpg`` and nothing is left behind; the job's output
goes straight to the terminal (inherited stdout/stderr: streamed, never buffered by us).

Injection (``bootstrap/sitecustomize.py`` says how and why): ``PYTHONPATH`` gets the
bootstrap directory in front of the user's value (kept as given; an unset or empty one is not
turned into "the current directory"), and ``STALLBENCH_PROFILE`` carries the settings as one
JSON object: the run directory, the hooks' file, the overrides, ``max_batches``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import interrupts
from ..measure.load import LoadMeter
from ..measure.sampler import Sampler
from ..results import ForeignLoad, Resources

HERE = Path(__file__).resolve().parent
BOOTSTRAP = HERE / "bootstrap"
HOOKS = HERE / "hooks.py"
STOP_GRACE_S = 5.0


def exit_status(code: int) -> int:
    """The job's exit code as a shell says it: a job killed by signal N (``Popen`` gives -N)
    is 128+N (137 for SIGKILL). One rule for the profile runs and the ablation runs."""
    return 128 - code if code < 0 else code


@dataclass
class JobRun:
    """One run of the command: its exit code, wall time, and what its processes wrote."""

    exit_code: int
    wall_s: float
    parts: list[dict[str, Any]] = field(default_factory=list)
    peak_pss_mb: float = 0.0
    resources: Resources = field(default_factory=Resources)
    load: ForeignLoad | None = None


def job_env(base: dict[str, str], run_dir: Path, overrides: dict[str, Any],
            max_batches: int | None, replay: dict[str, Any] | None = None) -> dict[str, str]:
    env = dict(base)
    user = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(BOOTSTRAP) + (os.pathsep + user if user else "")
    env["STALLBENCH_PROFILE"] = json.dumps({
        "run_dir": str(run_dir), "hooks": str(HOOKS), "overrides": overrides,
        "max_batches": max_batches, **({"replay": replay} if replay else {})})
    return env


def _stop(proc: subprocess.Popen[bytes], signum: int) -> None:
    """The job's process group gets the signal stallbench got; after a grace, SIGKILL."""
    for sig, grace in ((signum, STOP_GRACE_S), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:                        # the leader is gone; its group may not be
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def read_parts(run_dir: Path) -> list[dict[str, Any]]:
    parts = []
    for p in sorted(run_dir.glob("*.json")):
        try:
            part = json.loads(p.read_text())
        except (OSError, ValueError):
            continue                # a part caught mid-write by a kill: its process's loss
        if p.name.startswith("epochs-"):    # epochs-<host>-<pid>-<seq>.json: order them
            part["seq"] = int(p.stem.rsplit("-", 1)[1])
        parts.append(part)
    return parts


def run_once(argv: list[str], run_dir: Path, overrides: dict[str, Any],
             max_batches: int | None, replay: dict[str, Any] | None = None) -> JobRun:
    """``replay``: the ablation this run is (``replay.py``; None: the job as it is)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = job_env(dict(os.environ), run_dir, overrides, max_batches, replay)
    with LoadMeter() as meter, Sampler(interval_s=0.2) as sampler:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, env=env, start_new_session=True)
        except OSError as exc:
            from ..errors import UserError
            from .redact import word     # the word may be API_KEY=X: never quoted as given
            raise UserError(f"cannot start {word(argv[0])!r}: {exc.strerror or exc}") from None
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    interrupts.check()
        except BaseException as exc:
            signum = exc.signum if isinstance(exc, interrupts.Interrupted) else signal.SIGINT
            with interrupts.deferred():
                _stop(proc, signum)
            raise
        wall = time.perf_counter() - t0
        try:                        # workers the job left behind in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return JobRun(exit_code=rc, wall_s=wall, parts=read_parts(run_dir),
                  peak_pss_mb=sampler.peak_pss_mb, resources=sampler.resources(),
                  load=meter.load)
