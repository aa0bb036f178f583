"""A shared lab's home (`xce init --shared`): one controller, run by root, for every user of this machine.

What it writes, and why:
- xce.yaml as `xce init` writes it, with `mode: shared`, `admins:`, `socket_group:` (if given) and
  `visibility:` at the top; 0644, root's: users read the cluster's settings (queues, hosts), only
  root changes them.
- the home itself 0711, root's (paths.SHARED_MODE): every user reaches the socket by its name, nobody
  lists the home; what the controller writes there (store, log, spool) stays 0600/0700, root's.
- every directory above the home must let others pass (o+x), or no user could reach the socket:
  refused at once, naming the directory.
- optionally the machine's default home (paths.default_file()): one line, the home's path, 0644,
  so that users need no XCE_HOME.
Invariants: nothing is written unless every check passed (root, users and groups exist, the path is
reachable, the default file is free); a refused init leaves no file behind.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from xce_lite.errors import HomeError
from xce_lite.home.paths import Home, default_file, machine_default

DEFAULT_ROOT = Path("/var/lib/xce_lite")  # the shared home when none is named (FHS: state of a service)
VISIBILITY = ("full", "summary")


def default_admins() -> list[str]:
    """Who administers when `--admin` is not given: the user who ran `sudo` (SUDO_USER), or the
    invoking user when not root; [] when root ran it directly (then the caller must name someone)."""
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user and sudo_user != "root":
        return [sudo_user]
    if os.geteuid() != 0:
        return [pwd.getpwuid(os.geteuid()).pw_name]
    return []


def check_admins(admins: list[str]) -> list[str]:
    """Each admin a user of this machine, or `@group` a group of it; HomeError names the unknown one."""
    if not admins:
        raise HomeError("a shared home needs at least one admin: name them with --admin NAME (a user) or "
                        "--admin @GROUP (a group's members), e.g. --admin teacher")
    for admin in admins:
        name = admin[1:] if admin.startswith("@") else admin
        try:
            grp.getgrnam(name) if admin.startswith("@") else pwd.getpwnam(name)
        except KeyError:
            kind = "group" if admin.startswith("@") else "user"
            raise HomeError(f"--admin {admin}: no {kind} {name!r} on this machine; create it first "
                            f"({'groupadd' if kind == 'group' else 'useradd'} {name}) or name another") from None
    return admins


def check_group(group: str | None) -> None:
    if group is None:
        return
    try:
        grp.getgrnam(group)
    except KeyError:
        raise HomeError(f"--socket-group {group}: no such group on this machine; create it first "
                        f"(groupadd {group}) and add the lab's users to it (usermod -aG {group} USER)") from None


def check_reachable(root: Path) -> None:
    """HomeError if a directory above `root` keeps other users out (no o+x): they could not reach
    its socket then. Directories that do not exist yet are made 0755 by the caller."""
    for parent in reversed(root.parents):
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            return
        if not mode & stat.S_IXOTH:
            raise HomeError(f"users could not reach a home in {root}: {parent} lets only its owner in (mode "
                            f"{stat.S_IMODE(mode):04o}); choose a home elsewhere, e.g. {DEFAULT_ROOT}")


def check_root() -> None:
    if os.geteuid() != 0:
        raise HomeError("a shared home is made by root (its controller runs as root, and only root may change "
                        "its settings): run `sudo xce init --shared ...`")


def config_block(admins: list[str], socket_group: str | None, visibility: str) -> str:
    """The shared-mode settings, as they head the xce.yaml of a shared home."""
    listed = ", ".join(f"'{a}'" for a in admins)
    who = (f"socket_group: '{socket_group}'     # only this group's members (and root) reach the controller"
           if socket_group else
           "# socket_group: students   # only this group's members reach the controller (default: every user)")
    return f"""\
# A shared lab (`xce init --shared`): one controller, run by root, for every user of this machine; each
# job runs as the user who submitted it. A user acts on their own jobs; admins on every job.
mode: shared
admins: [{listed}]      # user names, or '@group' for a group's members
{who}
# What users see of others' jobs: full, or summary (no command line, environment, cwd, output paths).
visibility: {visibility}
# A queue may say who may submit to it: `users: [alice]`, `groups: [students]` (default: everyone).

"""


def with_shared_block(text: str, block: str) -> str:
    """`xce init`'s xce.yaml with the shared settings after its header comment."""
    marker = "\n# The cluster's name"
    at = text.index(marker) + 1
    return text[:at] + block + text[at:]


def finish(home: Home) -> None:
    """Open the home as a shared one: the home 0711 and xce.yaml 0644 (both root's), the rest private."""
    home.make_private(shared=True)
    os.chmod(home.config, 0o644)


def check_register(home: Home) -> None:
    """HomeError if the machine's default names another home that still holds a cluster."""
    current = machine_default()
    if current is not None and os.path.abspath(current) != str(home.root) and (current / "xce.yaml").exists():
        raise HomeError(f"{default_file()} already names the home {current}; remove that file first if this "
                        f"home is to be the machine's default")


def register(home: Home) -> Path:
    """Write the machine's default home file (one line, 0644, in a 0755 directory), atomically."""
    path = default_file()
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(f"{home.root}\n", encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise HomeError(f"cannot write {path}: {err.strerror}") from None
    return path


def register_hint(home: Home) -> str:
    """The command that registers `home` as the machine's default, for an init without --register."""
    path = default_file()
    return f"mkdir -p {path.parent} && echo {home.root} > {path}"
