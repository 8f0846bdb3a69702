"""The HTML report: ``render(result_paths, out)`` turns result files into one self-contained page."""

from __future__ import annotations

from .render import render

__all__ = ["render"]
