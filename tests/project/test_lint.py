"""The linter is part of the one test command: `ruff check` over the package must be clean."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.support import paths

ROOT = paths.ROOT


def test_ruff_finds_nothing():
    assert importlib.util.find_spec("ruff"), "ruff is missing: install the test extra (pip install '.[test]')"
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "xce_lite"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
