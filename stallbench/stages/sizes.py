"""Integer sizes: how many batches some rows make, how many nodes some workers fill, a byte
size rounded up to an alignment. One ceiling division for all of them (it was written out
twelve times as ``-(-a // b)``); light, so analysis can use it without importing torch."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers (exact for any size, unlike ``math.ceil(a / b)``)."""
    return -(-a // b)


def align_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (an alignment, a page)."""
    return ceil_div(n, multiple) * multiple
