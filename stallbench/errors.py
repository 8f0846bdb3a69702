"""Errors the CLI turns into one clear line and exit code 2.

Every user-facing failure (bad scenario, unreadable Parquet, unusable result file) is a
``UserError``: the CLI prints ``str(err)`` and exits 2 without a traceback. Anything else is a
bug in stallbench and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator


class UserError(Exception):
    """Bad input from the user; printed as one line, exit code 2."""

    exit_code = 2


class ScenarioError(UserError):
    """A scenario file is missing, malformed or has a bad value.

    Carries file and dotted key separately so tests can check both, and so the message always
    names where to look.
    """

    def __init__(self, file: str, key: str | None, message: str) -> None:
        self.file = file
        self.key = key
        self.message = message
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}")


class DataError(UserError):
    """A dataset cannot be read or has a column stallbench cannot use."""


class ResultError(UserError):
    """A result file is missing, malformed, or of an unknown schema version."""


class UserCodeError(UserError):
    """The user's own code (a ``"pkg.mod:fn"`` transform, a ``"pkg.mod:factory"`` model) could
    not be imported, raised, or returned the wrong type: in the trainer, a loader worker or a
    Ray worker. Printed as one block naming the code, the scenario file and key, and its
    exception; ``stallbench --debug`` adds the traceback (kept as text, because the error may
    have happened in another process and crossed back pickled).
    """

    def __init__(self, file: str, key: str, what: str, problem: str, where: str = "",
                 traceback_text: str = "", pid: int | None = None) -> None:
        self.file, self.key, self.what, self.problem = file, key, what, problem
        self.where = where
        self.traceback_text = traceback_text
        self.pid = os.getpid() if pid is None else pid     # the process it happened in
        super().__init__(self._text())

    def _text(self) -> str:
        place = f" (in {self.where})" if self.where else ""
        return f"{self.file}: {self.key}: {self.what}{place}: {self.problem}"

    def located(self, where: str) -> "UserCodeError":
        """The same error, saying which process it happened in."""
        if not self.where:
            self.where = where
            self.args = (self._text(),)
        return self

    def __str__(self) -> str:
        return self._text()

    def __reduce__(self) -> tuple:   # crosses process boundaries (loader and Ray workers)
        return (type(self), (self.file, self.key, self.what, self.problem, self.where,
                             self.traceback_text, self.pid))


class UserExit(BaseException):
    """``os._exit(code)`` called by the user's code inside stallbench's own process (a
    model's factory or step, a transform at ``num_workers = 0``): raised in its place so that
    the code's end is reported as its error (exit 2), never taken for stallbench's own end
    (``os._exit(0)`` there ended ``stallbench run`` with exit 0 and no result)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_COMMAND_PID: list[int] = []      # the stallbench command's own process (``cli.main``)


def command_process() -> None:
    """This process runs a stallbench command: its exit code is the command's (``cli.main``)."""
    _COMMAND_PID[:] = [os.getpid()]


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Around a call of the user's code in the command's own process: ``os._exit`` from this
    thread raises ``UserExit`` instead (issue 59). Other threads, the processes it forks
    (loader workers leave through ``os._exit`` by design) and other processes (a rank, a Ray
    actor: their death is reported as theirs, with its status) keep the real one."""
    real = os._exit
    if getattr(real, "_stallbench_guard", False) or _COMMAND_PID != [os.getpid()]:
        yield                           # nested (the outer guard holds), or not the command
        return
    pid, thread = os.getpid(), threading.get_ident()

    def guarded(code: int) -> None:
        if os.getpid() == pid and threading.get_ident() == thread:
            raise UserExit(code)
        real(code)

    guarded._stallbench_guard = True  # type: ignore[attr-defined]
    os._exit = guarded  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real


MESSAGE_CHARS = 1000    # of a user's exception message quoted in our one line


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` on one line (the first line of a multi-line message, at most
    ``MESSAGE_CHARS`` of it: a 5 MB message is not a line). ``sys.exit(n)`` says so."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (sys.exit({exc.code!r:.{MESSAGE_CHARS}}))"
    if isinstance(exc, UserExit):
        return f"os._exit({exc.code!r:.{MESSAGE_CHARS}}) (it would have ended stallbench)"
    text = str(exc).strip().splitlines()
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {cut(text[0], MESSAGE_CHARS)}"


# Characters that never reach a sink as themselves: ``outputs.one_line`` shows them as escapes,
# and names that every verb prints (scenario and variant names, in scenarios and in results)
# refuse them. Unicode categories: controls (newline, ESC), format characters (bidi
# overrides), line/paragraph separators, surrogates, private use, unassigned.
CONTROL_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def is_control(c: str) -> bool:
    import unicodedata

    return not (c.isprintable() or c == " ") and unicodedata.category(c) in CONTROL_CATEGORIES


def has_control(text: str) -> bool:
    """True when ``text`` holds a character ``is_control`` names (one_line would change it)."""
    return not text.isprintable() and any(is_control(c) for c in text)


def starts_command(text: str) -> bool:
    """True when ``text`` starts (after blanks) with ``::``: printed first on a line (a
    scenario's name leads the gate's and history's rows, a label the run's table), it is a
    GitHub Actions workflow command (``::error::``, ``::add-mask::``, ``::stop-commands::``),
    which the runner executes after trimming leading blanks, even on a PASS."""
    return text.lstrip().startswith("::")


def escape_controls(text: str) -> str:
    """``text`` with each ``is_control`` character shown as its ``\\xNN``/``\\uNNNN`` escape
    (``outputs.one_line``; names read from results, which every verb prints), and a leading
    ``::`` (``starts_command``) shown as ``\\x3a:``, so that it can never start a line as a
    workflow command."""
    if not text.isprintable():
        text = "".join(c.encode("unicode_escape").decode("ascii") if is_control(c) else c
                       for c in text)
    if starts_command(text):
        blanks = len(text) - len(text.lstrip())
        text = text[:blanks] + "\\x3a" + text[blanks + 1:]
    return text


def cut(text: str, chars: int) -> str:
    """``text``, or its first ``chars`` characters saying that the rest was cut."""
    if len(text) <= chars:
        return text
    return f"{text[:chars]}... (cut at {chars:,} of {len(text):,} characters)"


_OURS = os.path.dirname(os.path.abspath(__file__))


def user_frame(tb: object) -> str:
    """``file:line in function`` of the deepest frame of a traceback that is neither
    stallbench's nor an installed library's: where the user's code was when it failed."""
    import sys
    import traceback
    libs = {os.path.realpath(p) for p in sys.path if "site-packages" in p or "/lib/python" in p}
    found = ""
    for fs in traceback.extract_tb(tb):  # type: ignore[arg-type]
        f = os.path.realpath(fs.filename)
        if f.startswith(_OURS) or any(f.startswith(lib + os.sep) for lib in libs) \
                or fs.filename.startswith("<"):
            continue
        found = f"{fs.filename}:{fs.lineno} in {fs.name}"
    return found


# The optional parts of stallbench and the packages each brings (pyproject.toml's extras). The
# core install is what `profile`, `gate`, `history`, `whatif` and local scenarios need: it lands
# in the user's training image, where a second Ray or a plotting stack is a conflict.
EXTRAS: dict[str, tuple[str, ...]] = {
    "ray": ("ray", "ray.data"),
    "report": ("matplotlib", "jinja2"),
    "live": ("prometheus_client",),     # `profile --live`'s endpoint (the launcher's side)
}


class MissingExtra(UserError):
    """A verb or scenario needs an extra that is not installed: one line naming it, exit 2."""

    def __init__(self, what: str, extra: str, missing: str) -> None:
        self.what, self.extra, self.missing = what, extra, missing
        super().__init__(f"{what} needs the [{extra}] extra (cannot import {missing}): "
                         f"pip install 'stallbench[{extra}]'")


def need_extra(extra: str, what: str) -> None:
    """Raise ``MissingExtra`` unless every package of ``extra`` can be imported; ``what`` names
    the verb or scenario key that needs it ("stallbench report"). The one rule for an optional
    dependency: checked where the verb starts, before anything is read or written."""
    import importlib

    for name in EXTRAS[extra]:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingExtra(what, extra, name) from None


class ProcessDied(UserError):
    """A process the run depends on died under it: a loader worker, a trainer rank (any cause:
    the user's code calling ``os._exit``, a segfault in an extension, ``kill -9``, the OOM
    killer). One line naming the process and its exit status, exit 2, no result: never the
    DataLoader's or the rank launcher's traceback, never exit 1 as if stallbench had a bug."""


def exit_status(code: int | None) -> str:
    """A process's end in words: ``killed by SIGKILL``, ``exited with status 3``."""
    import signal

    if code is None:
        return "ended (exit status unknown)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class NoProgress(UserError):
    """The trainer waited ``[run] progress_timeout_s`` with no batch and no producer progress
    (``measure.watchdog``)."""


class PayloadError(Exception):
    """A serialized batch is corrupt; never turned into a garbage tensor."""
