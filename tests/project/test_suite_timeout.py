"""The suite's guard against a hang (pyproject.toml's `timeout`, `timeout_method`): a test that never
ends fails where it waits, by name, and the run goes on to its end, under xdist as in CI; without it
CI runs into its 90 minutes and names nothing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANGS = "import time\n\ndef test_waits_forever():\n    time.sleep(3600)\n\ndef test_fine():\n    pass\n"


def test_a_test_that_hangs_fails_by_name_with_where_it_waited_and_the_run_ends(tmp_path):
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < ini["timeout"] <= 900, ini  # far below CI's 90 minutes, far above the longest test
    (tmp_path / "test_hang.py").write_text(HANGS)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ntimeout = 2\ntimeout_method = {ini['timeout_method']}\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED test_hang.py::test_waits_forever - Failed: Timeout" in run.stdout, run.stdout
    assert "time.sleep(3600)" in run.stdout, run.stdout  # where it waited
    assert "1 failed, 1 passed" in run.stdout, run.stdout
