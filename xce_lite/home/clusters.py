"""Cluster names unique on this machine, for `xce init` (and a check for `xce lab up`).

A cluster's name is part of its unit names and of its hosts' agent directories
(`~/.xce-agent/CLUSTER-HOST`): two homes of one name collide there (one agent serves a directory,
a second is refused, and the second home's hosts stay `unreach`). So `xce init` picks a name no
other home of this user uses, `xce`, else `xce2`, `xce3`..., and claims it in a small registry:
`$XDG_STATE_HOME/xce/clusters/NAME` (default `~/.local/state/xce/clusters/`), a file holding the
home's path.

A name is taken when
- its registry file names another home whose xce.yaml still says that name (a home removed since,
  or renamed, frees it), or
- an agent directory `~/.xce-agent/NAME-*` exists (hosts of a home made before the registry, or
  not cleaned up: `xce lab down` removes its hosts' directories), or
- the default home `~/.xce` says that name.
Light: the standard library only (xce.yaml's `cluster:` line is read with a regex, no YAML).
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

from xce_lite.errors import HomeError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_CLUSTER_LINE = re.compile(r"""^cluster:\s*['"]?([A-Za-z0-9][A-Za-z0-9_.-]*)['"]?\s*(?:#.*)?$""", re.M)
BASE = "xce"
MAX_TRIES = 1000


def registry() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "xce" / "clusters"


def user_home(user: str | None = None) -> Path:
    """A user's home directory as the password database has it (what an SSH login gets), not $HOME."""
    try:
        entry = pwd.getpwnam(user) if user else pwd.getpwuid(os.getuid())
        return Path(entry.pw_dir)
    except KeyError:
        return Path(os.path.expanduser("~"))


def agent_root(user: str | None = None) -> Path:
    """Where agents keep their directories (`~/.xce-agent`) on hosts that share this machine's home
    directories: the home an SSH login of `user` (default: this user) gets."""
    return user_home(user) / ".xce-agent"


def cluster_of(home_root: Path) -> str | None:
    """The `cluster:` an xce.yaml says, or None (no file, unreadable, no such line)."""
    try:
        text = (home_root / "xce.yaml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _CLUSTER_LINE.search(text)
    return match[1] if match else None


def owner(name: str, home_root: Path, homes_only: bool = False) -> str | None:
    """Who else uses cluster name `name` (a home's path, or an agent directory), or None if nobody
    but `home_root` does. `homes_only`: only other homes count (for a home that already has the
    name, whose own hosts' directories are no one else's)."""
    here = os.path.abspath(home_root)
    try:
        recorded = (registry() / name).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    if recorded and os.path.abspath(recorded) != here and cluster_of(Path(recorded)) == name:
        return f"the cluster home {recorded}"
    default = os.path.join(os.path.expanduser("~"), ".xce")
    if os.path.abspath(default) != here and cluster_of(Path(default)) == name:
        return f"the cluster home {default}"
    if homes_only:
        return None
    try:
        spools = sorted(p.name for p in agent_root().iterdir() if p.name.startswith(name + "-") and p.is_dir())
    except OSError:
        spools = []
    if spools and not (recorded and os.path.abspath(recorded) == here):
        return f"the hosts' agent directories {agent_root()}/{spools[0]}" + (" and others" if len(spools) > 1 else "")
    return None


def pick(home_root: Path) -> str:
    """A name nobody else uses, claimed for `home_root`: xce, xce2, xce3, ..."""
    for i in range(1, MAX_TRIES + 1):
        name = BASE if i == 1 else f"{BASE}{i}"
        if owner(name, home_root) is None:
            claim(name, home_root)
            return name
    raise HomeError(f"no free cluster name from {BASE} to {BASE}{MAX_TRIES}; give one with `xce init --cluster NAME`")


def check(name: str, home_root: Path) -> None:
    """HomeError unless `name` is a valid cluster name that no other home uses."""
    if not NAME.fullmatch(name):
        raise HomeError(f"cluster name {name!r} is not valid: letters, digits, _ . - (at most 63), starting with a "
                        f"letter or digit")
    other = owner(name, home_root)
    if other is not None:
        raise HomeError(f"the cluster name {name!r} is already used by {other}: two clusters of one name collide on "
                        f"their hosts. Choose another with --cluster, or leave it out and `xce init` picks a free one")


def claim(name: str, home_root: Path) -> None:
    """Record that `home_root` uses `name` (best effort: a registry that cannot be written only
    loses the check for later homes, never this one)."""
    folder = registry()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.{os.getpid()}"
        tmp.write_text(str(os.path.abspath(home_root)) + "\n", encoding="utf-8")
        os.replace(tmp, folder / name)
    except OSError:
        pass
