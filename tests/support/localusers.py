"""Real local users for the shared-mode tests, and the `xce` CLI run as one of them.

Users are made and removed by `xce_lite.testhosts.add_local_users` / `remove_local_users` (the test
hosts know them too) and a command runs as one through `LocalUser.argv`, which reaches this
interpreter and the tree under test even from a checkout under a 0700 /root. Here: a directory
users and hosts both reach, a user's environment, `xce` as a user and `xce` shims for their PATH.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xce_lite.testhosts import PACKAGE_ROOT, LocalUser

SHARED_PARENT = Path("/var/lib/xce-tests")


@contextmanager
def shared_dir(prefix: str = "shared-") -> Iterator[Path]:
    """A new directory users can pass through (0711) that test hosts see too (outside /tmp, outside
    root's 0700 home); removed after, with the parent once no other test (another pytest worker's,
    another session's) has a directory there: so one may remove the parent between our mkdir of it
    and our mkdtemp in it, and we make it again."""
    while True:
        SHARED_PARENT.mkdir(mode=0o711, exist_ok=True)
        try:
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=SHARED_PARENT))
            break
        except FileNotFoundError:
            continue
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        try:
            SHARED_PARENT.rmdir()
        except OSError:
            pass  # another test's directory is still there


def user_env(user: LocalUser, **extra: str) -> dict[str, str]:
    """A login-like environment for `user`: nothing of the test run's own (XCE_*, HOME) leaks in; the
    package under test on PYTHONPATH."""
    return {"HOME": str(user.home), "USER": user.name, "LOGNAME": user.name, "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8", "PYTHONPATH": PACKAGE_ROOT, **extra}


def xce_as(user: LocalUser, args: list[str], cwd: Path | str | None = None, timeout: float = 120,
           **extra: str) -> subprocess.CompletedProcess:
    """`xce ARGS` run by `user` in `cwd` (default: their home), `extra` added to their environment."""
    return subprocess.run(user.argv([sys.executable, "-m", "xce_lite", *args]), env=user_env(user, **extra),
                          cwd=cwd or user.home, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def user_shims(bin_dir: Path) -> Path:
    """`xce` and `xceadmin` for other users (0755 in a 0755 `bin_dir`), as a system-wide install gives
    them; they run under `LocalUser.argv`, which makes this interpreter and the tree reachable."""
    bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, module in (("xce", "-m xce_lite"), ("xceadmin", "-c 'from xce_lite.cli.admin import main; main()'")):
        shim = bin_dir / name
        run = f"PYTHONPATH={shlex.quote(PACKAGE_ROOT)} exec {shlex.quote(sys.executable)} {module}"
        shim.write_text(f'#!/bin/sh\n{run} "$@"\n')
        shim.chmod(0o755)
    return bin_dir
