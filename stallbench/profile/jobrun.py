"""The job-run layer that ``stallbench profile -- CMD`` and ``stallbench tune -- CMD`` share:
the scratch directory the runs write into, the check of what a run left, its trace events, and
the result published with its trace (issue 55).

Why one layer: both verbs run the user's command many times (``launcher.run_once``) and must
agree on everything around a run: a scratch directory no other profile sweeps while it lives
and that is removed however the verb ends, a run's figures refused when a process could not
write them, ``--trace`` events labelled the same way, and the result and its trace written
together or not at all. Two copies of this drifted (tune's scratch removal did not wait for a
signal that landed inside it); the verbs under ``commands/`` now only parse and print, and
neither imports the other.

Light at import (the command line imports it for its flag bounds): nothing of torch, the
launcher or the results package until a run or a publish asks for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .. import interrupts, outputs
from ..errors import UserError
from .agent import wire

if TYPE_CHECKING:
    from ..results import Result
    from .merge import StreamRun
    from .agent.wire import Parts

MIN_PROGRESS_S = 1.0        # the agent beats at most every 0.5 s (agent beats.BEAT_S)
MAX_PROGRESS_S = 10**7

SCRATCH = ".stallbench-profile-"
_OWN_SCRATCH = re.compile(r"\.stallbench-profile-[0-9a-f]{12}")
OWNER = "owner.lock"
UNOWNED_AGE_S = 60.0    # a scratch directory without its lock file yet: a profile starting


class JobFailed(Exception):
    def __init__(self, code: int, where: str) -> None:
        super().__init__(f"the job exited with code {code} ({where}); no result written")
        self.code = code


class NodePartsLeft(Exception):
    """Not node rank 0: this launcher's work ends with its figures handed to node rank 0 (sent,
    or left on a shared ``--out``); ``code`` 0, or ``PARTIAL`` where they could not be handed
    on as asked (refused, node rank 0 unreachable)."""

    def __init__(self, line: str, code: int = 0) -> None:
        super().__init__(line)
        self.code = code


PARTIAL = 3     # a multi-node result written without a node's figures (each named), issue 56


class PartsLost(UserError):
    """A process of the job could not write its figures: what is left is not the whole."""


# ------------------------------------------------------------------ the scratch directory

def claim_scratch(run_root: Path) -> int:
    """Make this profile's scratch directory and hold an exclusive ``flock`` on its lock file
    while the profile lives: the kernel drops it however the profile ends (SIGKILL too), which
    is how a later profile tells a directory left by a dead run from a running one's."""
    run_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_root / OWNER, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep_scratch(out: Path) -> list[Path]:
    """Remove the scratch directories (``.stallbench-profile-<12 hex>``) that killed profiles
    left in ``out``: their lock is free (the owner is gone), or, without a lock file, they are
    older than ``UNOWNED_AGE_S``. A running profile's (lock held) is never touched; a
    multi-node run's shared directory is named otherwise and left to its node rank 0."""
    removed = []
    try:
        dirs = [d for d in out.iterdir() if _OWN_SCRATCH.fullmatch(d.name) and d.is_dir()]
    except OSError:
        return removed
    for d in dirs:
        try:
            fd = os.open(d / OWNER, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                if time.time() - d.stat().st_mtime > UNOWNED_AGE_S:
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(d)
            except OSError:
                pass
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:          # held: a running profile's
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def scratch(out: Path, say: Callable[[str], None], shared: str | None = None,
            remove: bool = True) -> Iterator[Path]:
    """The directory every run of one verb writes into, for as long as the verb lives.

    Alone on this machine (``shared`` None): a fresh ``.stallbench-profile-<12 hex>`` under
    ``out``, claimed by its lock, after the ones killed profiles left are swept. A multi-node
    job's (``shared``: its name) is one every node's launcher finds, so it has no lock and is
    never swept; only node rank 0 removes it (``remove``). The removal finishes before a
    signal that lands in it is raised (a SIGTERM as the job ended left it behind, CI v29)."""
    from .launcher import job_cwd
    owner = None
    if shared is not None:
        root = out / shared
    else:
        root = out / f"{SCRATCH}{uuid.uuid4().hex[:12]}"
        for d in sweep_scratch(out):
            say(f"removed {d}, left by a profile that was killed")
        owner = claim_scratch(root)
    try:
        with _in_ray_working_dir(root, say) as cwd, job_cwd(cwd):
            yield root
    finally:
        with interrupts.deferred():
            if remove:
                shutil.rmtree(root, ignore_errors=True)
            if owner is not None:
                os.close(owner)


RAY_WORKING_DIR = ("runtime_resources", "working_dir_files")   # where Ray unpacks one


def ray_working_dir() -> Path | None:
    """The working directory when stallbench is a ``ray job submit`` entrypoint running in
    Ray's unpacked ``--working-dir`` (None anywhere else, or where it is gone)."""
    try:
        cwd = Path.cwd()
    except OSError:
        return None
    return cwd if all(p in cwd.parts for p in RAY_WORKING_DIR) else None


def refuse_paths_in_ray_working_dir(**paths: Path | None) -> None:
    """A relative output path of a ``ray job submit`` entrypoint lands in Ray's unpacked
    working directory, which Ray removes once the job's first driver ends: refused at
    once (one line naming the flag), not after the whole profile."""
    if ray_working_dir() is None:
        return
    for flag, path in paths.items():
        if path is not None and not path.is_absolute():
            name = "--" + flag.replace("_", "-")
            raise UserError(f"{name} {path}: relative to Ray's --working-dir, which Ray "
                            f"removes when the job's first run ends: give {name} an absolute "
                            "path (a directory of the head node, or a shared one)")


@contextlib.contextmanager
def _in_ray_working_dir(root: Path, say: Callable[[str], None]) -> Iterator[Path | None]:
    """Where the runs run the job when stallbench is a ``ray job submit`` entrypoint whose
    working directory is Ray's unpacked ``--working-dir``: a copy of it in the scratch
    directory, which stallbench's own process also works in meanwhile. Ray removes its copy
    when the job's first driver disconnects (a plain ``bash -c "python job.py; python
    job.py"`` entrypoint fails the same way on its second run), and a profile runs the job
    several times (variants, repeats, ablations, trials); a process in a removed directory
    cannot even import torch (oneMKL ends it: "Cannot load libtorch_cpu.so"). Yields None
    (nothing changed) anywhere else."""
    cwd = ray_working_dir()
    if cwd is None:
        yield None
        return
    copy = root / "working_dir"
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cwd, copy, symlinks=True)
    say("the job runs in a copy of Ray's --working-dir (Ray removes its own when the job's "
        "first run ends; every run of the profile needs it)")
    os.chdir(copy)
    try:
        yield copy
    finally:
        os.chdir(cwd if cwd.is_dir() else root.parent)      # out: absolute (refused else)


# ------------------------------------------------------------------ the check of a run

def parts_lost(run_dir: Path) -> str:
    """Why a run's figures are not all there ("" when they are): a ``lost-*`` marker (the
    agent's writer: a write failed and was not made good by a later one; an empty file, which
    a full disk still takes), a run directory that cannot be written now (a part written at
    exit would have failed the same way), or no run directory at all."""
    if not run_dir.is_dir():
        return (f"the job removed stallbench's run directory {run_dir} while it ran (did it "
                "delete its --out?), and the figures in it with it: give --out a directory "
                "the job leaves alone")
    lost = sorted(run_dir.glob(f"{wire.LOST_PREFIX}-*"))
    probe = run_dir / f".probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
        writable = True
    except OSError:
        writable = False
    if lost or not writable:
        n = f"{len(lost)} process(es)" if lost else "the job's processes"
        return (f"{n} could not write their figures to {run_dir} during the job (disk full, "
                "or not writable): what was written is not the whole run")
    return ""


def check_parts(run_dir: Path, where: str) -> None:
    """Refuse a run whose figures were not all written (``parts_lost``): ``PartsLost``."""
    why = parts_lost(run_dir)
    if why:
        raise PartsLost(f"profile: {where}: {why}; no result written")


# ------------------------------------------------------------------ the trace of a run

def by_rank(streams: list[StreamRun]) -> list[list[StreamRun]]:
    out: dict[int, list[StreamRun]] = {}
    for s in streams:
        out.setdefault(s.rank, []).append(s)
    return [out[k] for k in sorted(out)]


def trace_run(events: list[dict[str, Any]] | None, label: str, parts: Parts) -> None:
    """``--trace``: the run's streams as trace events, one process per rank labelled
    ``<label> rank <n>`` (nothing where no trace was asked for)."""
    if events is None:
        return
    from . import merge, trace
    for rank_streams in by_rank(merge.streams(parts)):
        pid = len([e for e in events if e.get("name") == "process_name"])
        events.extend(trace.events(f"{label} rank {rank_streams[0].rank}", pid, rank_streams))


# ------------------------------------------------------------------ naming and publishing

def result_name(given: str | None, default: str, verb: str = "profile") -> str:
    """The result's name, by the rule scenario names follow (``scenario.name_problem``: it
    names the result file and starts printed lines): refused at entry, exit 2, never escaped
    later by each reader."""
    from ..scenario import name_problem

    name = default if given is None else given
    problem = name_problem(name)
    if problem:
        where = ("--name" if given is not None else
                 "the result name (the script's stem; give one with --name)")
        raise UserError(f"{verb}: {where}: {problem}")
    return name


def publish(result: Result, out: Path, trace: Path | None,
            events: list | None) -> Path:
    """The result and its trace, together or neither: both written whole to temp files
    first (the trace checked again: it may have changed during the run), then linked and
    renamed (``results.save``'s ``also``). A signal before that is exit 130/143 with no file;
    one after it is kept, with the files (``interrupts.committed``)."""
    from .. import results
    also: tuple = ()
    if trace is not None:
        from . import trace as trace_mod
        try:
            outputs.check_file(trace, outputs.TRACE, "--trace")
        except UserError as exc:
            raise UserError(f"{exc}; no result written") from None
        also = ((trace, trace_mod.dumps(events or []), "--trace"),)
    with interrupts.deferred():
        path = results.save(result, out, also)
        interrupts.committed()
    outputs.published(path, *([trace] if trace is not None else []))
    return path


@dataclass
class Outcome:
    """How a verb's runs ended: a published result (code 0, or ``PARTIAL`` where a node of
    the job is missing from it: ``lines`` name each), or the line and exit code of a job that
    gave none (its own exit code, or a node's that handed its figures to node rank 0)."""

    result: Result | None = None
    path: Path | None = None
    code: int = 0
    line: str = ""
    lines: list[str] = field(default_factory=list)


def measure_and_publish(measure: Callable[[], Result], out: Path, trace: Path | None,
                        events: list | None) -> Outcome:
    """``measure`` then ``publish``, inside ``outputs.made_here(out)``: ``--out`` is created by
    the first run's directory, and one the verb made and left empty (an error, a job that
    failed, Ctrl-C, SIGTERM) is removed on the way out."""
    refuse_paths_in_ray_working_dir(out=out, trace=trace)
    with outputs.made_here(out):
        try:
            result = measure()
        except JobFailed as exc:
            return Outcome(code=exc.code, line=str(exc))
        except NodePartsLeft as exc:
            return Outcome(code=exc.code, line=str(exc))
        path = publish(result, out, trace, events)
    from .nodes import missing_lines
    missing = missing_lines(result)
    return Outcome(result=result, path=path, code=PARTIAL if missing else 0, lines=missing)
