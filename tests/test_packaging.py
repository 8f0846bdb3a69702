"""Packaging: stallbench installs into a training environment without replacing its torch, and
the two README commands stay fast here because `make setup` pins the CPU build first."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_torch_is_a_lower_bound_not_a_pin() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = [d for d in deps if re.match(r"torch\b", d)]
    assert torch == ["torch>=2.3"], torch     # no ==, no upper bound: the user's torch stays


def test_make_setup_installs_the_pinned_cpu_torch_before_the_package() -> None:
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH\s*\?=\s*torch==\d", make, re.M)
    torch_line = make.index("'$(TORCH)'")
    assert torch_line < make.index("-e '.[dev]'")
