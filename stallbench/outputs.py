"""Where stallbench writes: every output path is checked by one rule, before any work.

The rule. stallbench writes only
  (a) new files it names itself in a directory (results: ``results.store.save`` links a
      complete temp file under a free name, never replacing anything; dataset caches), or
  (b) one file the user names that is of its own kind: a report over an earlier stallbench
      report, a baseline result over an earlier stallbench result (``Kind.is_own`` reads the
      marker each writes at its start).
It never replaces a file of another kind, a directory, a device, a FIFO or socket, or a
symbolic link (the rename would replace the link, not its target), and writes nothing under
``/proc``, ``/sys`` or ``/dev``. A path under a file, a directory it cannot write, a name too
long for the file system (a temp name adds 14 characters to the final one): one line naming
the flag and the path, exit 2, before the run starts. ``write_file`` checks again when it
writes, so a file put there during an hour-long run is still not replaced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .errors import UserError

FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")


def default_cache_dir() -> Path:
    """Generated datasets live outside git: $STALLBENCH_CACHE or ./.cache/stallbench. One
    rule for the runner and the verbs that check the cache before it runs (without torch)."""
    return Path(os.environ.get("STALLBENCH_CACHE", Path.cwd() / ".cache" / "stallbench"))
TEMP_EXTRA = len("..") + 8 + len(".tmp")      # ".{name}.XXXXXXXX.tmp" around a final name
_HEAD_BYTES = 4096


@dataclass(frozen=True)
class Kind:
    """A kind of file stallbench writes, recognised by the marker it starts with."""

    name: str
    marker: Callable[[bytes], bool]

    def is_own(self, path: Path) -> bool:
        try:
            with open(path, "rb") as fh:
                head = fh.read(_HEAD_BYTES)
        except OSError:
            return False
        return self.marker(head)


# The marker where the report writes it (its template's first lines), never anywhere in a
# file's head: a user's NOTES.md quoting the meta tag is theirs, and is not overwritten.
_REPORT_MARK = re.compile(rb'\A<!DOCTYPE html>\s*<html lang="en">\s*<head>\s*'
                          rb'<meta charset="utf-8">\s*<meta name="viewport"[^>\n]*>\s*'
                          rb'<meta name="generator" content="stallbench[ "]')
_RESULT_MARK = re.compile(rb'\A\s*\{\s*"schema_version"\s*:\s*\d+\s*,\s*"tool"\s*:\s*\{\s*'
                          rb'"name"\s*:\s*"stallbench"')

REPORT = Kind("stallbench HTML report", lambda head: bool(_REPORT_MARK.match(head)))
RESULT = Kind("stallbench result", lambda head: bool(_RESULT_MARK.match(head)))
TRACE_MARK = b'{"otherData": {"generator": "stallbench'
TRACE = Kind("stallbench trace", lambda head: head.startswith(TRACE_MARK))


def _fail(flag: str, path: str | Path, problem: str) -> UserError:
    return UserError(f"{flag}: {path}: {problem}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _check_place(p: Path, flag: str) -> None:
    for candidate in {os.path.abspath(p), os.path.realpath(p)}:
        for root in FORBIDDEN_ROOTS:
            if _under(candidate, root):
                raise _fail(flag, p, f"is under {root}: stallbench writes no files there")


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _existing_ancestor(p: Path, flag: str, shown: Path) -> Path:
    """The deepest existing ancestor of ``p``; a file on the way is an error."""
    a = Path(os.path.abspath(p))
    while not os.path.lexists(a):
        if a.parent == a:
            break
        a = a.parent
    if not a.is_dir():
        raise _fail(flag, shown, f"is under {a}, which is not a directory")
    return a


def _check_names(directory: Path, names: Iterable[str], flag: str, shown: Path) -> None:
    limit = _name_max(directory)
    for name in names:
        if len(os.fsencode(name)) + TEMP_EXTRA > limit:
            raise _fail(flag, shown, f"the file name {name[:40]!r}... is too long: "
                                     f"{len(os.fsencode(name))} bytes, at most {limit - TEMP_EXTRA} "
                                     "here (with the temp name written first)")
    for part in Path(os.path.abspath(shown)).parts:
        if len(os.fsencode(part)) > limit:
            raise _fail(flag, shown, f"a path component is {len(os.fsencode(part))} bytes long, "
                                     f"at most {limit} here")


def _probe(directory: Path, name: str, flag: str, shown: Path) -> None:
    """Create and remove a temp file of the final temp name's length: permission, a read-only
    file system and name limits all show here, before the run instead of after it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            why = f"cannot write in {directory} ({why})"
        raise _fail(flag, shown, why) from None
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _writable_ancestor(anc: Path, flag: str, shown: Path) -> None:
    if not os.access(anc, os.W_OK | os.X_OK):
        raise _fail(flag, shown, f"cannot create it: {anc} is not writable")


def check_dir(path: str | Path, flag: str, names: Iterable[str] = ()) -> Path:
    """A directory stallbench will create new files in (``names``: the longest it will use)."""
    p = Path(path)
    _check_place(p, flag)
    names = list(names) or ["x"]
    if os.path.lexists(p):
        try:
            st = os.stat(p)             # a symlink to a directory is a directory here
        except OSError as exc:
            raise _fail(flag, p, f"cannot use it ({exc.strerror or exc})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _fail(flag, p, "exists and is not a directory")
        _check_names(p, names, flag, p)
        _probe(p, max(names, key=len), flag, p)
        return p
    anc = _existing_ancestor(p, flag, p)
    _check_names(anc, names, flag, p)
    _writable_ancestor(anc, flag, p)
    return p


@contextlib.contextmanager
def made_here(path: str | Path) -> Iterator[Path]:
    """Around a command that may create the directory ``path`` (and missing parents): on the
    way out, however it ends (a result, an error, SIGINT or SIGTERM), every directory of them
    that did not exist on entry and is empty now is removed, deepest first. An interrupted or
    failed command leaves no empty directory behind it; a directory the user had is never
    touched (it existed on entry), nor one holding anything (``os.rmdir`` removes only empty
    ones, so a file written there meanwhile keeps it)."""
    p = Path(os.path.abspath(path))
    made = []
    a = p
    while not os.path.lexists(a) and a.parent != a:
        made.append(a)
        a = a.parent
    try:
        yield Path(path)
    finally:
        for d in made:                 # deepest first
            try:
                os.rmdir(d)
            except OSError:            # not empty, not there, or not ours to remove: keep
                break


def check_file(path: str | Path, kind: Kind, flag: str) -> Path:
    """A file stallbench will write whole (temp + rename), replacing only its own ``kind``."""
    p = Path(path)
    _check_place(p, flag)
    if not p.name or p.name in (".", ".."):
        raise _fail(flag, p, "expected a file name")
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):   # the latter: a file on the way
        st = None
    except OSError as exc:
        raise _fail(flag, p, f"cannot use it ({exc.strerror or exc})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise _fail(flag, p, f"is a symbolic link; stallbench replaces only a regular file "
                                 f"it wrote (a {kind.name}): remove the link or name another file")
        if stat.S_ISDIR(st.st_mode):
            raise _fail(flag, p, f"is a directory; expected a file name for the {kind.name}")
        if not stat.S_ISREG(st.st_mode):
            raise _fail(flag, p, "is not a regular file (a device, FIFO or socket); "
                                 "stallbench never replaces one")
        if not kind.is_own(p):
            raise _fail(flag, p, f"exists and is not a {kind.name}; stallbench never replaces "
                                 "another file: remove it or name another file")
    parent = p.parent if str(p.parent) else Path(".")
    if os.path.isdir(parent):
        _check_names(parent, [p.name], flag, p)
        _probe(parent, p.name, flag, p)
    else:
        anc = _existing_ancestor(parent, flag, p)
        _check_names(anc, [p.name], flag, p)
        _writable_ancestor(anc, flag, p)
    return p


def write_file(path: str | Path, payload: str, kind: Kind, flag: str) -> Path:
    """Check ``path`` again (it may have changed during the run), then write it atomically."""
    from .results.store import write_atomic

    p = check_file(path, kind, flag)
    try:
        write_atomic(p, payload)
    except OSError as exc:
        raise _fail(flag, p, f"cannot write it ({exc.strerror or exc})") from None
    return p


# ---------------------------------------------------------------- strings, escaped per sink
# A string from a file (a variant name, an axis label, a path, a user's exception message)
# reaches terminals, markdown, HTML, plots and CI annotations. Each sink has its escaping,
# applied where the text is written (docs/reliability-rules.md "Escaped for each sink"): the
# terminal and markdown get one line without control characters (a newline would start a
# line GitHub Actions executes as "::error ...", an ESC sequence would repaint the
# terminal); HTML is escaped by the template engine; plots render labels as text
# (``report.plots``: ``text.parse_math`` off); annotation data escapes ``%``, CR and LF.

def one_line(text: object) -> str:
    """``text`` on one printable line: control and line-separator characters (newlines, ESC,
    bidi overrides) shown as ``\\xNN``/``\\uNNNN`` escapes, so what was written is still seen."""
    from .errors import escape_controls

    return escape_controls(str(text))


def markdown_cell(text: object) -> str:
    """One line for a markdown table cell: ``one_line``, ``|`` escaped."""
    return one_line(text).replace("|", "\\|")


def annotation(text: object) -> str:
    """GitHub workflow-command data (``::error title=..::DATA``): ``%``, CR and LF escaped (the
    command ends at the line's end), other control characters as ``one_line`` shows them."""
    s = str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return one_line(s)



# ------------------------------------------------------- closed or full standard streams
# A closed pipe (``stallbench profile ... | head``) or a full disk (``> /dev/full``) must never
# cost a result nor print a traceback: stdout and stderr are wrapped for the whole command
# (``cli``), a write that fails is recorded instead of raised, the rest of that stream's
# output is dropped, and the command ends with one line on stderr (if stderr still takes it)
# naming every file it published (``published``) and exit 2.

def reopen_closed_streams() -> list[int]:
    """Standard descriptors the command was started without (``2>&-``, ``>&-``, ``<&-``)
    opened on ``/dev/null``, and Python's ``None`` streams made again; returns those fds.

    Why first of all: a closed descriptor 1 or 2 is the lowest free number, so the next file
    the command opens (a result's temp file, a lock) would take it, and every ``print`` would
    write into that file. Python itself sets ``sys.stdout``/``sys.stderr`` to ``None`` and
    exits 120 at its last flush. On ``/dev/null`` the command's lines go nowhere, as the
    user asked, its files stay its own, its exit code is the documented one, and a job it
    starts inherits ``/dev/null`` where it would have inherited nothing (what it writes
    there is dropped either way)."""
    import io
    import sys

    reopened = []
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, flags)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        reopened.append(fd)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None or fd in reopened:
            setattr(sys, name, io.TextIOWrapper(
                io.FileIO(fd, mode, closefd=False), encoding="utf-8",
                errors="backslashreplace" if fd == 2 else "surrogateescape",
                line_buffering=fd != 0, write_through=fd == 2))
    return reopened


class Guarded:
    """A standard stream whose writes never raise. The first ``OSError`` (EPIPE, ENOSPC, EIO)
    is kept in ``error``; the descriptor is then pointed at ``/dev/null`` so that what is
    still buffered, and the interpreter's last flush at exit, go nowhere instead of failing
    again ("Exception ignored ... BrokenPipeError", exit 120)."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self._stream.write(text)   # type: ignore[attr-defined]
            except OSError as exc:
                self._fail(exc)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.error is None:
            try:
                self._stream.flush()              # type: ignore[attr-defined]
            except OSError as exc:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.error = exc
        try:
            fd = self._stream.fileno()            # type: ignore[attr-defined]
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


_published: list[str] = []


def stdout_error() -> OSError | None:
    """The error that made stdout drop the command's output, None while it writes (a command
    that runs on, ``serve``, says it on stderr at once rather than at its end)."""
    import sys

    out = sys.stdout
    if isinstance(out, Guarded):
        out.flush()
        return out.error
    return None


def published(*paths: object) -> None:
    """Record files the command published: named on stderr if stdout failed meanwhile."""
    _published.extend(str(p) for p in paths)


@contextlib.contextmanager
def guarded_streams() -> Iterator[Callable[[int], int]]:
    """Around a whole command: stdout and stderr as ``Guarded``. Yields ``ending(code)``,
    which, if stdout failed, says so in one line on stderr (what failed, every file
    published) and returns 2 for a command that would have returned 0."""
    import sys

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Guarded(out), Guarded(err)
    _published.clear()
    guard_out = sys.stdout

    def ending(code: int) -> int:
        guard_out.flush()           # a block-buffered pipe fails only when flushed
        exc = guard_out.error
        if exc is None:
            return code
        kept = (f"published: {', '.join(_published)}" if _published else "nothing was published")
        print(f"stallbench: error: cannot write to stdout ({exc.strerror or exc}): the rest of "
              f"the output was dropped; {kept}", file=sys.stderr, flush=True)
        return 2 if code == 0 else code

    try:
        yield ending
    finally:
        for guard in (sys.stdout, sys.stderr):
            if isinstance(guard, Guarded):
                guard.flush()
        sys.stdout, sys.stderr = out, err
