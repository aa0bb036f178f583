"""The type checker is part of the one test command: mypy over xce_lite/ (its configuration is
pyproject.toml's [tool.mypy]) reports no error, in any module.

mypy keeps its incremental cache in the repository's .mypy_cache (its default, which a developer's
own `mypy` run shares; git ignores it): a cold run checks everything (seconds), a warm one only what
changed.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

from tests.support import paths

ROOT = paths.ROOT

ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error: ", re.M)


def test_mypy_finds_no_type_error_in_xce_lite():
    assert importlib.util.find_spec("mypy"), "mypy is missing: install the test extra (pip install '.[test]')"
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), "xce_lite"],
                            cwd=ROOT, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode in (0, 1) and re.search(r"^(Success|Found \d+ errors?)", output, re.M), \
        f"mypy did not run to its end (exit {result.returncode}):\n{output}"
    errors = [m.group(0) + output[m.end():].split("\n", 1)[0] for m in ERROR.finditer(output)]
    assert errors == [], f"{len(errors)} type error(s) (run `mypy` in the repository):\n" + "\n".join(errors)
