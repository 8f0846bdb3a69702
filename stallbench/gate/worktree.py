"""A git ref checked out into a temporary worktree for the length of a ``with`` block.

The same-job A/B gate needs REF's tree beside the working tree. ``git worktree add --detach``
shares the repository's objects (no clone, no network) and leaves the working tree alone. The
worktree is removed on the way out of the block whatever happens: normal exit, an error,
Ctrl-C, or SIGTERM (turned into KeyboardInterrupt while the block runs, the way the Ray
executor does, so ``finally`` runs instead of the process dying mid-way).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import UserError


def _git(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise UserError("gate --against: git is not installed") from None


def toplevel(path: Path) -> Path:
    """The root of the git working tree holding ``path`` (UserError outside a repository)."""
    out = _git(["rev-parse", "--show-toplevel"], path)
    if out.returncode != 0:
        raise UserError(f"gate --against: {path} is not inside a git repository "
                        f"({out.stderr.strip() or 'git rev-parse failed'})")
    return Path(out.stdout.strip()).resolve()


def is_shallow(repo: Path) -> bool:
    out = _git(["rev-parse", "--is-shallow-repository"], repo)
    return out.returncode == 0 and out.stdout.strip() == "true"


def resolve(repo: Path, ref: str) -> str:
    """REF as a full commit id. A ref that does not resolve is bad input (exit 2); in a shallow
    clone the message says why HEAD~1 is missing and how to get it, so CI never passes
    silently for want of history."""
    if ref.startswith("-"):
        raise UserError(f"gate --against: {ref!r} is not a git ref")
    out = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], repo)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    hint = ""
    if is_shallow(repo):
        hint = ("; this is a shallow clone without that history: fetch it (`git fetch "
                "--deepen=1`, or `fetch-depth: 2` in actions/checkout)")
    raise UserError(f"gate --against: {ref!r} is not a commit in {repo}{hint}")


def describe(repo: Path, commit: str) -> str:
    """A short readable name for a commit (abbreviated id and subject)."""
    out = _git(["log", "-1", "--format=%h %s", commit], repo)
    return out.stdout.strip() if out.returncode == 0 else commit[:12]


@contextlib.contextmanager
def checkout(repo: Path, commit: str) -> Iterator[Path]:
    """``commit`` checked out (detached) in a fresh temporary directory, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="stallbench-ref-"))
    path = parent / "tree"
    try:
        out = _git(["worktree", "add", "--detach", "--quiet", str(path), commit], repo)
        if out.returncode != 0:
            raise UserError(f"gate --against: cannot check out {commit[:12]} into a temporary "
                            f"worktree: {out.stderr.strip()}")
        compile_tree(path)
        yield path
    finally:
        remove(repo, path)
        shutil.rmtree(parent, ignore_errors=True)


def compile_tree(path: Path) -> None:
    """REF's Python compiled to bytecode once, as the working tree's usually is: where
    ``PYTHONDONTWRITEBYTECODE`` is set (CI images often set it) nothing is ever cached, and
    every REF run would compile its package again (~0.4 s of CPU per process for stallbench
    itself), a start-up cost only one side of each pair pays. Best effort: a tree that does not
    compile (a file that is not Python 3) runs exactly as it would have."""
    import compileall

    with contextlib.suppress(Exception):
        compileall.compile_dir(str(path), quiet=2, workers=1)


def remove(repo: Path, path: Path) -> None:
    """Remove the worktree and git's record of it; robust to a half-created one. ``git
    worktree prune`` (which forgets every worktree whose directory is gone, not only ours) runs
    only when the precise removal failed."""
    removed = False
    with contextlib.suppress(Exception):
        removed = _git(["worktree", "remove", "--force", str(path)], repo,
                       timeout=60).returncode == 0
    shutil.rmtree(path, ignore_errors=True)
    if not removed:
        with contextlib.suppress(Exception):
            _git(["worktree", "prune"], repo, timeout=60)
