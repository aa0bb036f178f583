"""Users for tests: a non-root user with lingering inside one systemd test host (in the host's mount
namespace only), and users of this machine, whom every test host knows (`add_local_users`).

A command run as a user of this machine (`LocalUser.argv`, the one way tests do it) sees the
interpreter and the tree under test even where they lie under a directory others may not enter
(pyenv and a clone under /root, 0700): it runs in a private mount namespace where a tmpfs covers
that directory and only those paths are bound back. Nothing else changes (/etc/passwd, /tmp, homes).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shlex
import subprocess
import sys
import time
from pathlib import Path

from xce_lite.testhosts.base import TestHost, TestHostError, _check_dir

# command line


@dataclasses.dataclass(frozen=True)
class HostUser:
    """A non-root user with a lingering systemd user manager, inside one systemd test host only."""

    __test__ = False  # not a pytest test class

    host: TestHost
    name: str
    uid: int
    home: str  # the home as the host sees it: /run/xce-home/NAME
    files: Path  # the same directory as this machine sees it (under the caller's directory)

    @property
    def runtime_dir(self) -> str:
        return f"/run/user/{self.uid}"

    def copy_in(self, source: Path | str) -> str:
        """A copy of this machine's file `source` that the user can read, in their home: its path as
        the host sees it. For what the user must run or read from this machine's tree (the agent):
        a checkout under a 0700 directory (a clone in /root) is out of their reach."""
        source = Path(source)
        folder = self.files / ".xce-copies"
        folder.mkdir(exist_ok=True)
        os.chown(folder, self.uid, self.uid)
        data = source.read_bytes()
        tmp = folder / f".{source.name}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.chown(tmp, self.uid, self.uid)
        os.chmod(tmp, 0o600)
        os.replace(tmp, folder / source.name)  # whole, whoever else copies it at the same time
        return f"{self.home}/.xce-copies/{source.name}"

    def argv(self, argv: list[str]) -> list[str]:
        """argv running `argv` inside the host as this user, with a login-like environment."""
        env = [f"HOME={self.home}", f"USER={self.name}", f"LOGNAME={self.name}", "PATH=/usr/bin:/bin",
               f"XDG_RUNTIME_DIR={self.runtime_dir}", "LANG=C.UTF-8"]
        return self.host.nsenter_argv(["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                                       "env", "-i", *env, *argv])


def add_lingering_user(host: TestHost, name: str, dir: Path | str, uid: int = 2001,
                       timeout: float = 30.0) -> HostUser:
    """Give the systemd test host `host` a user `name` (uid = gid = `uid`) whose systemd user manager
    lingers (`loginctl enable-linger`), for jobs in user units. Changes nothing on this machine.

    Inside the host's own mount namespace only, private copies (kept in `dir`) are bind-mounted over
    /etc/passwd, /etc/group and /etc/shadow, and an empty directory over /var/lib/systemd, where
    logind records lingering users. The home is `dir`/NAME-home, bind-mounted at /run/xce-home/NAME
    inside the host (its /run is private): a home under this machine's /root (mode 0700), where test
    directories usually are, would be out of the user's reach. `dir` must lie outside /tmp.
    Raises TestHostError if the user manager does not answer within `timeout` seconds.
    """
    if not host.systemd:
        raise TestHostError(f"{host.name} has no systemd: a lingering user needs a systemd host")
    dir = _check_dir(dir)
    dir.mkdir(parents=True, exist_ok=True)
    files, home = dir / f"{name}-home", f"/run/xce-home/{name}"
    files.mkdir(exist_ok=True)
    os.chown(files, uid, uid)
    lines = {
        "passwd": f"{name}:x:{uid}:{uid}:{name}:{home}:/bin/sh\n",
        "group": f"{name}:x:{uid}:\n",
        "shadow": f"{name}:*:19000:0:99999:7:::\n",
    }
    var_lib = dir / "var-lib-systemd"
    (var_lib / "linger").mkdir(parents=True, exist_ok=True)
    script = ["set -e"]
    for base, line in lines.items():
        copy = dir / f"{host.name}.{base}"
        text = Path(f"/etc/{base}").read_text()
        if not any(entry.split(":", 1)[0] == name for entry in text.splitlines()):
            text += line
        copy.write_text(text)
        os.chmod(copy, 0o640 if base == "shadow" else 0o644)
        script.append(f"mountpoint -q /etc/{base} || mount --bind {shlex.quote(str(copy))} /etc/{base}")
    script += [
        f"mountpoint -q /var/lib/systemd || mount --bind {shlex.quote(str(var_lib))} /var/lib/systemd",
        f"mkdir -p {home}",
        f"mountpoint -q {home} || mount --bind {shlex.quote(str(files))} {home}",
    ]
    for argv in (["sh", "-c", "\n".join(script)], ["loginctl", "enable-linger", name]):
        done = subprocess.run(host.nsenter_argv(argv), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise TestHostError(f"{host.name}: {shlex.join(argv[:2])} failed: {done.stderr.strip()}")
    user = HostUser(host, name, uid, home, files)
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(user.argv(["systemctl", "--user", "is-system-running"]), capture_output=True,
                              text=True, timeout=timeout)
        if done.stdout.strip() in ("running", "degraded"):
            return user
        if time.monotonic() > deadline:
            raise TestHostError(f"{host.name}: the user manager of {name} did not come up within {timeout:g} s "
                                f"({done.stdout.strip()} {done.stderr.strip()})")
        time.sleep(0.05)


# ---- users of this machine (the test hosts share its /etc/passwd) ---------------------------------


@dataclasses.dataclass(frozen=True)
class LocalUser:
    """A user made on this machine by `add_local_users` (a system user, no login shell)."""

    __test__ = False  # not a pytest test class

    name: str
    uid: int
    gid: int
    home: Path  # theirs, 0700: their jobs' cwd and outputs

    def argv(self, argv: list[str]) -> list[str]:
        """argv running `argv` as this user, with their groups (setpriv --init-groups), able to run this
        interpreter on the tree under test (PYTHONPATH=`PACKAGE_ROOT`). The caller's environment and
        cwd pass through unchanged."""
        setpriv = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups"]
        script = _reach_script()
        if not script:
            return [*setpriv, *argv]
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                "\n".join(["set -e", *script, 'exec "$@"']), "sh", *setpriv, *argv]


# The directory holding the package under test: what PYTHONPATH needs for `python -m xce_lite`.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_STAGE = "/srv"  # an empty directory to stage the bind mounts in (covered by a tmpfs, in the namespace only)


def _closed_ancestor(path: Path) -> Path | None:
    """The topmost directory above `path` that others may not pass through (no o+x), if any."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent
    return None


def _reach_script() -> list[str]:
    """Shell lines (run as root in a private mount namespace) making this interpreter and the tree
    under test reachable by any user: each closed directory above them becomes a tmpfs (0755) into
    which just they are bound back, at their own paths. Empty when nothing is out of reach."""
    needed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, PACKAGE_ROOT)}
    covers: dict[Path, list[Path]] = {}
    for path in sorted(needed):
        closed = _closed_ancestor(path)
        if closed is not None:
            covers.setdefault(closed, []).append(path)
    if not covers:
        return []
    q = shlex.quote
    staged = [path for paths in covers.values() for path in paths]
    lines = [f"mount -t tmpfs -o mode=755 tmpfs {_STAGE}"]
    for i, path in enumerate(staged):
        lines += [f"mkdir {_STAGE}/{i}", f"mount --bind {q(str(path))} {_STAGE}/{i}"]
    for closed in covers:
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {q(str(closed))}")
    for i, path in enumerate(staged):
        lines += [f"mkdir -p {q(str(path))}", f"mount --bind {_STAGE}/{i} {q(str(path))}"]
    return lines


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def add_local_users(names: list[str], dir: Path | str, group: str | None = None,
                    members: list[str] | None = None) -> list[LocalUser]:
    """Make users `names` on this machine (root only), each with a home `dir`/NAME (0700, theirs) and,
    if `group` is given, in that group (made too; only `members` of them if given). The test hosts
    see them (they share /etc/passwd and the file system; `dir` must lie outside /tmp and be
    reachable by them). A leftover user or group of that name (a killed run) is removed first.
    Raises TestHostError, having removed what it made."""
    dir = _check_dir(dir)
    remove_local_users(names, group)
    made: list[str] = []
    in_group = set(names if members is None else members)
    try:
        if group is not None:
            done = _run(["groupadd", "--system", group])
            if done.returncode != 0:
                raise TestHostError(f"groupadd {group} failed: {done.stderr.strip()}")
        users = []
        for name in names:
            home = dir / name
            done = _run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
                         "--shell", "/bin/sh", *(["-G", group] if group and name in in_group else []), name])
            if done.returncode != 0:
                raise TestHostError(f"useradd {name} failed: {done.stderr.strip()}")
            made.append(name)
            entry = pwd.getpwnam(name)
            home.mkdir(mode=0o700, exist_ok=True)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            users.append(LocalUser(name, entry.pw_uid, entry.pw_gid, home))
        return users
    except BaseException:
        remove_local_users(made, group)
        raise


def remove_local_users(names: list[str], group: str | None = None) -> None:
    """Remove these users (their own groups with them) and `group`; those that do not exist are skipped."""
    for name in names:
        _run(["userdel", name])
    if group is not None:
        _run(["groupdel", group])
