"""The ``stallbench`` command: one small module per verb under ``commands/``.

Bad input is a ``UserError``: one line on stderr, exit code 2, no traceback. The user's own
code failing (``UserCodeError``) is one block naming the code, the scenario file and key, and
its exception; the global ``--debug`` flag adds the traceback. SIGINT and SIGTERM are handled
from here to the end (``stallbench.interrupts``): exit 130 / 143 with one line, no result
(results are only published whole), and every process started under the command stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, interrupts
from .errors import UserCodeError, UserError, cut


def build_parser() -> argparse.ArgumentParser:
    from .commands import gate, history, profile, report, run, serve, tune, whatif

    p = argparse.ArgumentParser(prog="stallbench",
                                description="Find out why ML training waits for data, and prove it.")
    p.add_argument("--version", action="version", version=f"stallbench {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of a failure in your own code (transforms, models)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in (run, profile, report, gate, whatif, tune, history, serve):
        mod.add_parser(sub)
    return p


LINE_CHARS = 4000     # of an error line


def dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with ``--opt -5%`` written ``--opt=-5%`` for every option of one value.

    argparse takes a value that starts with ``-`` for an option unless it reads as a negative
    number, so ``gate --threshold -5%`` failed with "expected one argument" while
    ``--threshold=-5%`` reached the range check; users write both. A token that is one of
    the verb's own options (``--threshold --format``) stays an option. Nothing after ``--``,
    nor after the first positional of a verb that passes the rest on (``profile``'s
    command), is touched: those are the user's own arguments."""
    subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    out, i, current = list(argv), 0, parser
    while i < len(out):
        tok = out[i]
        if tok == "--":
            break
        if current is parser and subs is not None and tok in subs.choices:
            current = subs.choices[tok]
            i += 1
            continue
        if not tok.startswith("-"):
            if any(a.nargs == argparse.REMAINDER for a in current._actions):
                break
            i += 1
            continue
        action = current._option_string_actions.get(tok)
        nxt = out[i + 1] if i + 1 < len(out) else None
        if (action is not None and action.nargs is None and nxt is not None
                and nxt.startswith("-") and nxt != "--"
                and nxt.split("=", 1)[0] not in current._option_string_actions):
            out[i:i + 2] = [f"{tok}={nxt}"]
        i += 1
    return out


COMMAND_VERBS = ("tune",)      # verbs that take a scenario, or ``-- COMMAND [ARGS...]``


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``tune [options] -- python train.py ...``: the words before ``--`` for argparse, the
    user's command after it untouched (``profile`` takes its command by REMAINDER instead,
    having no positional of its own; ``tune`` keeps its scenario positional)."""
    verb = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if verb is None or argv[verb] not in COMMAND_VERBS or "--" not in argv[verb:]:
        return argv, None
    k = argv.index("--", verb)
    return argv[:k], argv[k + 1:]


def _say_error(exc: UserError, debug: bool) -> None:
    if isinstance(exc, UserCodeError) and not exc.where:
        exc.located("the trainer" if exc.pid == os.getpid() else f"process {exc.pid}")
    from .outputs import one_line   # a file's name or a user's message: never two lines

    # Every error is one bounded line, whatever it quotes (a user's message is already cut
    # at errors.MESSAGE_CHARS; this bounds the rest: paths, a rank's or a server's text).
    # The hint to see the user's traceback ends the same line: an error is one line, which a
    # CI log or a caller's ``tail -1`` shows whole (it was a second line of its own).
    hint = (" (run `stallbench --debug ...` to see its traceback)"
            if isinstance(exc, UserCodeError) and exc.traceback_text and not debug else "")
    # Notes (``BaseException.add_note``) name where more is kept (Ray Client's log of a
    # failed run): after the cut, so a long message never cuts them off.
    notes = "".join(f" ({one_line(n)})" for n in getattr(exc, "__notes__", ()) or ())
    print(f"stallbench: error: {cut(one_line(exc), LINE_CHARS)}{notes}{hint}",
          file=sys.stderr)
    if isinstance(exc, UserCodeError) and debug and exc.traceback_text:
        print(exc.traceback_text.rstrip(), file=sys.stderr)


def user_code_path() -> None:
    """Nothing of the working directory on the import path: a scenario's ``"mytf:fn"`` is
    loaded by its file path (``registry.locate``), so the directory need not be importable,
    and must not be: libraries probe optional modules by importing them (``cython``,
    ``uarray``), and a file of that name there would run under every command. ``python -m``
    puts the directory first (``__main__`` drops it before any import); an empty entry
    (``PYTHONPATH=:...``) means the same. Loader workers are forked or spawned with this path."""
    sys.path[:] = [p for p in sys.path if p != ""]


def main(argv: list[str] | None = None) -> int:
    from .errors import command_process
    from .outputs import guarded_streams, reopen_closed_streams

    reopen_closed_streams()     # before any file is opened: see its docstring
    command_process()           # user code here cannot end it with os._exit (errors.user_code)

    # A closed or full stdout (`| head`, `> /dev/full`) never raises into the command: its
    # results are kept, and the exit says why (outputs.guarded_streams).
    with guarded_streams() as ending:
        code = ending(_main(argv))
    if interrupts.runtime_left_behind():
        interrupts.end_process(code)      # never returns (see its docstring)
    return code


def _main(argv: list[str] | None) -> int:
    before: set[int] | None = None
    debug, nothing = False, "nothing written"
    try:
        interrupts.install()    # before anything else: SIGTERM must unwind like Ctrl-C
        user_code_path()
        interrupts.adopt_orphans()
        before = interrupts.children()
        parser = build_parser()
        words, command = split_command(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(dash_values(parser, words))
        if command is not None:
            args.cmd = command
        # (argparse exits 2 on bad usage, as we do)
        debug = args.debug
        nothing = ("no result written" if args.command in ("run", "tune", "profile")
                   else nothing)
        code = int(args.func(args) or 0)
        interrupts.check()  # a signal whose exception was swallowed still ends the command
        if interrupts.was_committed() and interrupts.pending() is not None:
            sig = interrupts.Interrupted(interrupts.pending())
            print(f"stallbench: {sig.name} came after everything was published; it is kept "
                  f"(exit {code})", file=sys.stderr)
        return code
    except interrupts.Interrupted as exc:
        print(f"stallbench: interrupted by {exc.name}; {exc.outcome or nothing}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:      # before our handler, or a library's own SIGINT handling
        sig = interrupts.Interrupted(interrupts.pending() or 2)   # SIGTERM stays SIGTERM
        print(f"stallbench: interrupted by {sig.name}; {nothing}", file=sys.stderr)
        return sig.exit_code
    except UserError as exc:
        if interrupts.pending() is not None:   # an error while unwinding from a signal
            sig = interrupts.Interrupted(interrupts.pending())
            print(f"stallbench: interrupted by {sig.name}; {nothing}", file=sys.stderr)
            return sig.exit_code
        _say_error(exc, debug)
        return exc.exit_code
    finally:
        # The command's work is over: a signal from here on is recorded, not raised, so the
        # clean-up that stops the children always finishes.
        interrupts.exiting()
        if before is not None:
            interrupts.stop_new_children(before)
        interrupts.stop_adopting()
        interrupts.uninstall()


if __name__ == "__main__":
    sys.exit(main())
