"""Numbers given on the command line: finite, within a documented range, or one line and exit 2.

The same rule as scenario numbers (``scenario.knob``): parsed here rather than by argparse's
``type=`` (whose errors are a usage block), so every bad number is a ``UserError`` naming the
flag, the range and what was given. NaN and infinity are never in range.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

NODE_WAIT_S = 120.0         # profile.nodes.NODE_WAIT_S (not imported: the parser stays light)
MIN_NODE_WAIT_S, MAX_NODE_WAIT_S = 1.0, 86400.0


def _bound(lo: float, hi: float, lo_open: bool, hi_open: bool = False) -> str:
    return f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def integer(text: str | int | None, flag: str, lo: int, hi: int) -> int | None:
    """A whole number in [lo, hi]; None stays None (flag not given)."""
    if text is None:
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise_usage(flag, f"a whole number in [{lo}, {hi}]", text)
    if not lo <= value <= hi:
        raise_usage(flag, f"a whole number in [{lo}, {hi}]", text)
    return value


def number(text: str | float | None, flag: str, lo: float, hi: float, *,
           lo_open: bool = False, hi_open: bool = False) -> float | None:
    """A finite number in [lo, hi] (``lo_open``/``hi_open``: bound excluded); None stays None."""
    if text is None:
        return None
    bound = _bound(lo, hi, lo_open, hi_open)
    try:
        value = float(str(text).strip())
    except ValueError:
        raise_usage(flag, f"a number in {bound}", text)
    if (not math.isfinite(value) or value > hi or value < lo or (lo_open and value <= lo)
            or (hi_open and value >= hi)):
        raise_usage(flag, f"a finite number in {bound}", text)
    return value


def counts(text: str, flag: str, hi: int, max_values: int) -> list[int]:
    """``N``, ``A..B`` or ``A,B,C``: whole numbers in [0, hi], at most ``max_values`` of them
    (a range's size is checked before it is built: ``0..100000000`` is refused at once)."""
    expected = f"N, A..B or A,B,C with whole numbers in [0, {hi}], at most {max_values} values"
    try:
        if ".." in text:
            lo_s, hi_s = text.split("..", 1)
            a, b = int(lo_s), int(hi_s)
            if a > b or b - a + 1 > max_values:
                raise ValueError
            values = list(range(a, b + 1))
        else:
            parts = text.split(",")
            if len(parts) > max_values:
                raise ValueError
            values = [int(x) for x in parts]
    except ValueError:
        raise_usage(flag, expected, text)
    if not values or min(values) < 0 or max(values) > hi:
        raise_usage(flag, expected, text)
    return values


def raise_usage(flag: str, expected: str, got: object) -> NoReturn:
    from ..errors import UserError

    raise UserError(f"{flag}: expected {expected}, got {str(got)!r}")


# ---- the numbers of a torchrun across nodes: profile's and tune's flags, one text

def add_node_args(p: Any, what: str) -> None:
    """``--node-port`` and ``--node-wait``: ``profile``'s and ``tune``'s, one text but what
    node rank 0 does on the port (``what``)."""
    n = p.add_argument_group("torchrun across machines (one per node; docs/profile.md, "
                             "Across machines)")
    n.add_argument("--node-port", default=None, metavar="PORT",
                   help="the port node rank 0's launcher listens on (default: the "
                        "rendezvous port + 1: --rdzv-endpoint's, else --master-port's), where "
                        f"it {what}")
    n.add_argument("--node-wait", default=None, metavar="S",
                   help="how long node rank 0 waits, after each of its runs, for the other "
                        "nodes' figures before it names a node as missing, and another node "
                        f"for node rank 0 ({MIN_NODE_WAIT_S:g}..{MAX_NODE_WAIT_S:g}; default "
                        f"{NODE_WAIT_S:g})")


def node_args(args: Any) -> tuple[int | None, float]:
    """(``--node-port``, ``--node-wait``), checked (one line, exit 2)."""
    port = integer(args.node_port, "--node-port", 1, 65535)
    wait = number(args.node_wait, "--node-wait", MIN_NODE_WAIT_S, MAX_NODE_WAIT_S)
    return port, NODE_WAIT_S if wait is None else wait
