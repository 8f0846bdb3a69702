"""``stallbench whatif``: placeholder until the what-if model lands (issue 6)."""

from __future__ import annotations

import argparse

from ..errors import UserError


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("whatif", help="predict throughput for more workers/nodes (not yet)")
    p.add_argument("result")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    raise UserError("whatif: not implemented yet")
