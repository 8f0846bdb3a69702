"""The README is part of the product: its key reference must match the code."""

from __future__ import annotations

from pathlib import Path

from stallbench.run import preflight as validate

ROOT = Path(__file__).resolve().parents[1]


def test_readme_key_reference_is_generated_from_the_code() -> None:
    readme = (ROOT / "README.md").read_text()
    assert validate.reference_markdown().lstrip("\n") in readme, (
        "README key reference is stale: paste validate.reference_markdown() between the markers")


def test_readme_has_the_two_commands_and_ci_calls_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
