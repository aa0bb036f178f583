"""Real local users for shared-mode tests: made with useradd (and removed after), and the `xce` CLI
run as one of them.

This machine's Python and often the source tree live under /root (0700), out of a user's reach: a
command run as a user goes through a private mount namespace where a tmpfs covers /root and the
directories it needs (Python, the tree under test) are bound back at their own paths. Nothing else
changes: /etc/passwd, /tmp (the cluster's socket) and the rest are this machine's.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


@contextmanager
def local_users(names: list[str], group: str) -> Iterator[dict[str, pwd.struct_passwd]]:
    """Users `names` (system users, no home) and a group `group` the first of them is in; removed
    after, also after a failure. Yields name -> passwd entry."""
    for name in names:
        _run("userdel", name)  # leftovers of a killed run
    _run("groupdel", group)
    try:
        subprocess.run(["groupadd", "--system", group], check=True, capture_output=True)
        for index, name in enumerate(names):
            extra = ["-G", group] if index == 0 else []
            subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--home-dir",
                            f"/nonexistent/{name}", "--shell", "/usr/sbin/nologin", *extra, name],
                           check=True, capture_output=True)
        yield {name: pwd.getpwnam(name) for name in names}
    finally:
        for name in names:
            _run("userdel", name)
        _run("groupdel", group)


@contextmanager
def shared_work() -> Iterator[Path]:
    """A directory users can pass through (0711) that test hosts see too (outside /tmp)."""
    parent = Path("/var/lib/xce-tests")
    parent.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="shared-", dir=parent))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        try:
            parent.rmdir()
        except OSError:
            pass  # another test's directory is still there


def own_dir(base: Path, entry: pwd.struct_passwd) -> Path:
    """`entry`'s private directory under `base` (0700, theirs)."""
    path = base / entry.pw_name
    path.mkdir()
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o700)
    return path


def as_user(entry: pwd.struct_passwd, argv: list[str], env: dict[str, str], cwd: Path | str = "/",
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `argv` as `entry` (its uid, gid and groups: setpriv --init-groups), in `cwd`."""
    home = Path.home()
    needed = {sys.prefix, sys.base_prefix, SOURCE_ROOT}
    hidden = sorted(p for p in needed if not home.stat().st_mode & 0o001 and Path(p).is_relative_to(home))
    q = shlex.quote
    lines = ["set -e"]
    if hidden:
        lines.append("mount -t tmpfs -o mode=755 tmpfs /srv")
        for i, p in enumerate(hidden):
            lines += [f"mkdir /srv/{i}", f"mount --bind {q(p)} /srv/{i}"]
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {q(str(home))}")
        for i, p in enumerate(hidden):
            lines += [f"mkdir -p {q(p)}", f"mount --bind /srv/{i} {q(p)}"]
    lines += [f"cd {q(str(cwd))}",
              f"exec setpriv --reuid={entry.pw_uid} --regid={entry.pw_gid} --init-groups env -i "
              + " ".join(q(f"{k}={v}") for k, v in env.items()) + " " + shlex.join(argv)]
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def xce_env(entry: pwd.struct_passwd, home: Path) -> dict[str, str]:
    """The environment of a user's `xce` against the cluster home `home`."""
    return {"HOME": "/nonexistent", "USER": entry.pw_name, "LOGNAME": entry.pw_name, "LANG": "C.UTF-8",
            "PATH": "/usr/bin:/bin", "PYTHONPATH": SOURCE_ROOT,
            "XCE_HOME": str(home)}


def xce_as(entry: pwd.struct_passwd, home: Path, *args: str, cwd: Path | str = "/") -> subprocess.CompletedProcess:
    """`xce ARGS` run as `entry` against the cluster home `home`."""
    return as_user(entry, [sys.executable, "-m", "xce_lite", *args], xce_env(entry, home), cwd)


def group_id(name: str) -> int:
    return grp.getgrnam(name).gr_gid
