"""Numbers given on the command line: finite, within a documented range, or one line and exit 2.

The same rule as scenario numbers (``scenario.knob``): parsed here rather than by argparse's
``type=`` (whose errors are a usage block), so every bad number is a ``UserError`` naming the
flag, the range and what was given. NaN and infinity are never in range.
"""

from __future__ import annotations

import math
from typing import NoReturn


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
