"""``stallbench report [PATHS...] -o report/index.html``: result files to one HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import outputs, results
from ..errors import UserError, need_extra

DEFAULT_PATHS = ["results/"]
DEFAULT_OUT = Path("report/index.html")


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="render result files into one self-contained HTML page",
        description="Render stallbench result files into one self-contained HTML report (figures "
                    "inlined, no network needed). Several results of one scenario, e.g. a baseline "
                    "and the current run, are shown side by side.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="result files or directories (searched one level deep for *.json; "
                        "default: results/)")
    p.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT, metavar="FILE",
                   help=f"HTML file to write (default: {DEFAULT_OUT})")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Render; a missing/malformed result raises ResultError (the CLI prints one line, exit 2)."""
    need_extra("report", "stallbench report")
    from ..report.render import render  # matplotlib is imported only when a report is made

    outputs.check_file(args.output, outputs.REPORT, "-o")   # before reading anything
    paths = list(getattr(args, "paths", None) or DEFAULT_PATHS)
    files = results.find(paths)
    if not files:
        raise UserError(f"no result files (*.json) in {', '.join(map(str, paths))}: "
                        "run `stallbench run SCENARIO` first or name result files")
    out = render(files, args.output)
    outputs.published(out)      # named on stderr if stdout fails (outputs.guarded_streams)
    size_kb = out.stat().st_size / 1024
    print(f"wrote {out} ({len(files)} result file{'s' if len(files) != 1 else ''}, {size_kb:.0f} KB)")
    return 0
