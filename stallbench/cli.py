"""The ``stallbench`` command: one small module per verb under ``commands/``.

Bad input is a ``UserError``: one line on stderr, exit code 2, no traceback. Ctrl-C exits 130
and, because results are only written whole at the end, leaves no partial file.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import UserError


def build_parser() -> argparse.ArgumentParser:
    from .commands import gate, report, run, tune, whatif

    p = argparse.ArgumentParser(prog="stallbench",
                                description="Find out why ML training waits for data, and prove it.")
    p.add_argument("--version", action="version", version=f"stallbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in (run, report, gate, whatif, tune):
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)   # argparse exits 2 on bad usage, as we do
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"stallbench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stallbench: interrupted; no result written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
