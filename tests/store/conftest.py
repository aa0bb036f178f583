"""Fixtures of the store tests: `path`, the SQLite file a test's store lives in (the file the
shared `store` fixture opens, tests/support/fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "xce.db"
