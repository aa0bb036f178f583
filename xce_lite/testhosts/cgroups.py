"""cgroups: each systemd host gets a subtree of its own, the root of its cgroup namespace."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import time
from pathlib import Path

from xce_lite.testhosts.base import TestHostError

# ---------------------------------------------------------------------------------------------------
# cgroups: each systemd host gets a subtree of its own, the root of its cgroup namespace


@dataclasses.dataclass(frozen=True)
class _Hierarchy:
    mountpoint: str  # where the caller sees it, e.g. /sys/fs/cgroup/memory
    fstype: str  # cgroup or cgroup2
    options: str  # for mounting it again inside the host (v1: its controllers or name=)
    path: str  # the caller's cgroup in it


def _hierarchies() -> list[_Hierarchy]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup, with the caller's cgroup in each."""
    mine: dict[frozenset[str], str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mine[frozenset(controllers.split(",")) if controllers else frozenset()] = path
    subsystems = {line.split()[0] for line in Path("/proc/cgroups").read_text().splitlines()[1:] if line.strip()}
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields = left.split()
        fstype, _source, super_opts = right.split()[:3]
        mountpoint = fields[4]
        if fstype not in ("cgroup", "cgroup2") or not mountpoint.startswith("/sys/fs/cgroup"):
            continue
        if fields[3] != "/":
            raise TestHostError(f"cgroup hierarchy {mountpoint} is not mounted at its root ({fields[3]})")
        if fstype == "cgroup2":
            key: frozenset[str] = frozenset()
            options = ""
        else:  # v1: the hierarchy is named by its controllers (or name=), which mounting it again needs
            key = frozenset(o for o in super_opts.split(",") if o in subsystems or o.startswith("name="))
            options = ",".join(sorted(key) + (["none"] if all(o.startswith("name=") for o in key) else []))
        if key in mine:
            found.append(_Hierarchy(mountpoint, fstype, options, mine[key]))
    if not found:
        raise TestHostError("no cgroup hierarchy is mounted under /sys/fs/cgroup")
    return found


def _make_cgroups(hierarchies: list[_Hierarchy], leaf: str) -> list[Path]:
    """Create BASE/xce-testhosts/`leaf` in each hierarchy, and return them.

    BASE is the caller's cgroup: the hosts stay within its limits and its bookkeeping. Except on a
    cgroup v2 hierarchy that has controllers: a cgroup with processes (the caller's) cannot hand
    controllers down, so there BASE is the root, and xce-testhosts delegates what it has to the hosts.
    """
    made: list[Path] = []
    try:
        for h in hierarchies:
            mount = Path(h.mountpoint)
            v2_controllers = h.fstype == "cgroup2" and (mount / "cgroup.controllers").read_text().split()
            if h.path.startswith("/..") and not v2_controllers:
                raise TestHostError(f"the caller's cgroup {h.path} lies outside its cgroup namespace")
            base = (mount if v2_controllers else mount / h.path.lstrip("/")) / "xce-testhosts"
            for d in (base, base / leaf):
                d.mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset takes no task before these are set
                    if (d / f).exists() and not (d / f).read_text().strip():
                        (d / f).write_text((d.parent / f).read_text())
                if v2_controllers and d == base:
                    for c in (base / "cgroup.controllers").read_text().split():
                        with contextlib.suppress(OSError):
                            (base / "cgroup.subtree_control").write_text(f"+{c}")
            made.append(base / leaf)
        return made
    except BaseException:
        _remove_cgroups(made, deadline=time.monotonic() + 2)
        raise


def _remove_cgroups(groups: list[Path], deadline: float) -> list[Path]:
    """Remove these cgroups with all under them (bottom up); return those still there at the deadline."""
    left = []
    for group in groups:
        while group.exists():
            try:
                for root, dirs, _files in os.walk(group, topdown=False):
                    for d in dirs:
                        with contextlib.suppress(FileNotFoundError):
                            os.rmdir(os.path.join(root, d))
                os.rmdir(group)
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                    left.append(group)
                    break
                time.sleep(0.02)
        with contextlib.suppress(OSError):  # the xce-testhosts parent, when no other host uses it
            group.parent.rmdir()
    return left
