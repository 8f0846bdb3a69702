"""The agent's frames, hidden from the job's own tracebacks (issue 59).

Why: the hooks sit between the job's loop and its dataset (``__next__``, the fetchers), so an
exception the job's own ``Dataset`` raises passed through two or three of the agent's frames
on its way up, and the job's traceback showed ``stallbench/profile/agent/passes.py`` between
the user's lines: a reader takes the tool for the cause. A guest leaves no trace in what the
job prints. The job's exceptions are never caught or changed here; only where a traceback
is printed for the job (the interpreter's ``sys.excepthook`` for an uncaught exception, a
thread's ``threading.excepthook``, torch's ``ExceptionWrapper`` that carries a loader
worker's traceback to the loop as text) is it printed without the agent's frames. A
traceback made only of the agent's frames (a bug of ours) is printed whole.
"""

from __future__ import annotations

import os
import sys
import threading
import types

AGENT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _ours(tb) -> bool:
    try:
        return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(AGENT_DIR)
    except Exception:  # noqa: BLE001 - an odd frame is the job's
        return False


def without_agent(tb):
    """``tb`` without the agent's frames: a new chain over the same frames (the job's
    objects are not touched); ``tb`` itself where every frame is the agent's or it fails."""
    try:
        kept = []
        t = tb
        while t is not None:
            if not _ours(t):
                kept.append(t)
            t = t.tb_next
        if not kept or len(kept) == _length(tb):
            return tb
        out = None
        for t in reversed(kept):
            out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
        return out
    except Exception:  # noqa: BLE001 - printed as it was
        return tb


def _length(tb) -> int:
    n = 0
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def hide_in_chain(exc) -> list:
    """The tracebacks of ``exc`` and its causes and contexts without the agent's frames,
    where an uncaught exception is about to be printed (Python's printers print each
    exception's own ``__traceback__``); returns (exception, its traceback before) for each,
    so that a caller whose process goes on can put them back."""
    seen: set = set()
    kept: list = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            tb = e.__traceback__
            e.__traceback__ = without_agent(tb)
            kept.append((e, tb))
            todo += [e.__cause__, e.__context__]
        except Exception:  # noqa: BLE001 - printed as it was
            pass
    return kept


def install() -> None:
    """Wrap ``sys.excepthook`` and ``threading.excepthook`` (whatever they are now: a job's
    own hook set later replaces ours and sees the frames, as it would any library's; Python
    3.7 has no ``threading.excepthook``: its threads' tracebacks keep the frames). Never
    raises: the job's tracebacks are then printed as they were."""
    try:
        _install()
    except Exception:  # noqa: BLE001
        pass


def _install() -> None:
    orig = sys.excepthook

    def excepthook(typ, value, tb):
        hide_in_chain(value)
        return orig(typ, value, without_agent(tb))

    sys.excepthook = excepthook
    orig_thread = getattr(threading, "excepthook", None)
    if orig_thread is None:
        return

    def thread_hook(args):
        # the process goes on and the job may still hold the exception: its tracebacks are
        # filtered for the printer (which prints an exception's own ``__traceback__``, not
        # the one it is handed) and put back as they were after it
        kept = hide_in_chain(args.exc_value)
        try:
            return orig_thread(args)
        finally:
            for e, tb in kept:
                try:
                    e.__traceback__ = tb
                except Exception:  # noqa: BLE001
                    pass

    threading.excepthook = thread_hook
