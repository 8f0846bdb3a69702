"""Fixtures for the report tests: plausible v2 results (``sample.make_result``) written as files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from stallbench import results

_HERE = Path(__file__).parent
REPO = _HERE.parent.parent


def _load_sample() -> Any:
    # A unique module name: tests/ has no __init__.py, and "sample" is too generic to import bare.
    name = "stallbench_tests_report_sample"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HERE / "sample.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


sample = _load_sample()


@pytest.fixture
def make_result() -> Callable[..., Any]:
    return sample.make_result


@pytest.fixture
def write_result(tmp_path: Path) -> Callable[..., Path]:
    """``write_result(result, name)`` -> path of the result saved as JSON under tmp_path."""

    def write(result: Any, name: str = "result.json") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results.to_dict(result), indent=1), encoding="utf-8")
        return path

    return write


@pytest.fixture
def example_results() -> list[Path]:
    """Committed example results, once they exist (results/examples/*.json)."""
    return sorted((REPO / "results" / "examples").glob("*.json"))
