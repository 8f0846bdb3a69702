"""Fixtures of the hostile-input tests: one dataset cache for the session, a clean env."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reliability-cache")


@pytest.fixture
def env(cache_dir: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["STALLBENCH_CACHE"] = str(cache_dir)
    e["PYTHONUNBUFFERED"] = "1"
    e.pop("RAY_ADDRESS", None)
    return e
