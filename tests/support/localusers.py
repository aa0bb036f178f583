"""Running the `xce` CLI as another local user of this machine, for the shared-lab tests.

The interpreter running the tests, and the checkout itself, may live where other users cannot read
(pyenv and a clone under /root, 0700), so a user runs the system's /usr/bin/python3 with PYTHONPATH
holding a copy, made once in a directory they can read, of the package under test and of what the
CLI's client path imports besides the standard library (click; checked by
tests/project/test_cli_imports.py to stay that light).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from xce_lite.testhosts import LocalUser

USER_PYTHON = "/usr/bin/python3"
CLIENT_DEPS = ("click",)
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def user_pythonpath(dir: Path) -> str:
    """PYTHONPATH for other users' `python3 -m xce_lite`: `dir`/pylib (made here, 0755) holding a copy
    of the package under test and of the client's dependencies."""
    lib = dir / "pylib"
    if not lib.exists():
        tmp = dir / ".pylib.tmp"
        tmp.mkdir(mode=0o755)
        for name in ("xce_lite", *CLIENT_DEPS):
            module = __import__(name)
            shutil.copytree(Path(module.__file__).parent, tmp / name, ignore=_SKIP)
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        tmp.rename(lib)
    return str(lib)


def user_env(user: LocalUser, pythonpath: str, **extra: str) -> dict[str, str]:
    """A login-like environment for `user`: nothing of the test run's own (XCE_*, HOME) leaks in."""
    return {"HOME": str(user.home), "USER": user.name, "LOGNAME": user.name, "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8", "PYTHONPATH": pythonpath, **extra}


def xce_as(user: LocalUser, args: list[str], pythonpath: str, cwd: Path | None = None, timeout: float = 120,
           **extra: str) -> subprocess.CompletedProcess:
    """`xce ARGS` run by `user` in `cwd` (default: their home)."""
    return subprocess.run(user.argv([USER_PYTHON, "-m", "xce_lite", *args]), env=user_env(user, pythonpath, **extra),
                          cwd=cwd or user.home, capture_output=True, text=True, timeout=timeout)


def user_shims(bin_dir: Path, pythonpath: str) -> Path:
    """`xce` and `xceadmin` for other users (0755 in a 0755 `bin_dir`), as a system-wide install gives them."""
    bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, module in (("xce", "-m xce_lite"), ("xceadmin", "-c 'from xce_lite.cli.admin import main; main()'")):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\nPYTHONPATH={pythonpath} exec {USER_PYTHON} {module} \"$@\"\n")
        shim.chmod(0o755)
    return bin_dir
