"""docs/architecture.md is the living picture of the code: it must name every module, and every
module it names must exist (a renamed or new module fails here until the page says so)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "stallbench"
DOC = ROOT / "docs" / "architecture.md"


def _modules() -> list[str]:
    return sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def _named(text: str, rel: str) -> bool:
    """``rel`` (e.g. ``executors/ray/driver.py``) is named by its path, or by its stem in
    backticks within the paragraph that names its package (``executors/ray/``)."""
    if f"`{rel}`" in text or f"`{rel[:-3]}`" in text:
        return True
    parent, stem = rel.rsplit("/", 1) if "/" in rel else ("", rel)
    if not parent:
        return False
    for para in text.split("\n\n"):
        if f"`{parent}/`" in para and re.search(rf"`{re.escape(stem[:-3])}(\.py)?`", para):
            return True
    return False


def test_every_module_is_on_the_page() -> None:
    text = DOC.read_text()
    missing = [m for m in _modules() if not _named(text, m)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_every_module_the_page_names_exists() -> None:
    """Names with a folder are paths under ``stallbench/``; bare names (inside a package's
    paragraph) must be some module's file name. The departures section names old files."""
    text = DOC.read_text().split("\n## Where this departs", 1)[0]
    names = {p.name for p in PKG.rglob("*.py")}
    named = set(re.findall(r"`([a-z_/]+\.py)`", text))
    gone = sorted(n for n in named
                  if not ((ROOT / n).exists() if n.startswith("tests/") else
                          (PKG / n).exists() if "/" in n else n in names))
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"
