"""Running a job's processes as the user who submitted it (shared mode). The agent and its
supervisors stay root: they write the spool's journal and private files. What is the job's (its
command, its tasks, its hooks but those marked `as: root`, its output files, its directory) is
done with the user's own credentials, so the kernel checks the user's permissions, never root's.

Invariant: nothing of the job runs, and none of its files is made, with root's credentials; a
launch whose user cannot be switched to on this host is refused before anything is recorded.
"""

from __future__ import annotations

import os

JOB_DIR = "job"  # in a user's unit directory (0711, root's): XCE_JOB_HOST_DIR, the user's own (0700)


def can_switch_user() -> tuple[bool, str | None]:
    """(whether this agent can run jobs as other users, why not): it must be root."""
    if os.geteuid() == 0:
        return True, None
    return False, (f"the agent runs as uid {os.geteuid()}, not root, so every job here runs as that user; "
                   "connect to this host as root (`user: root` in its cluster entry) for a shared controller")


def resolve_user(user: dict, host_name: str) -> dict | None:
    """The launch spec's `user` checked against this host's passwd: {"name", "uid", "gid", "groups",
    "home"} to switch to, or None when the job runs as the agent's own user anyway (no switch).
    Raises Refused, naming the host and the user, where the user cannot be switched to."""
    import pwd

    from .validate import Refused  # here: validate imports hooks, which imports spawn, which imports this

    name, uid = user["name"], user["uid"]
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise Refused(f"host {host_name}: no user {name} here (uid {uid} where the job was submitted): "
                      f"add {name} with uid {uid} to this host, or run the job elsewhere") from None
    if entry.pw_uid != uid:
        raise Refused(f"host {host_name}: user {name} has uid {entry.pw_uid} here but {uid} where the job was "
                      f"submitted: give {name} the same uid on every host")
    if uid == os.geteuid() and (uid != 0 or user.get("gid") in (None, 0)):
        return None  # the agent's own user: today's way, unchanged
    ok, why = can_switch_user()
    if not ok:
        raise Refused(f"host {host_name}: cannot run a job as user {name}: {why}")
    gid = user.get("gid")
    gid = entry.pw_gid if gid is None else gid
    groups = user.get("groups")
    if groups is None:
        groups = os.getgrouplist(name, gid)
    return {"name": name, "uid": uid, "gid": gid, "groups": sorted(set(groups)), "home": entry.pw_dir}


def share_spool(spool: str) -> None:
    """Let other users pass through the spool (0711: no listing; every file in it stays 0600, every
    unit's directory 0700 or 0711) to their own job directories, SPOOL/units/UNIT/job, and find no
    SPOOL/bin at the end of their PATH closed to them. Done at the first job run as another user:
    an agent that never runs one keeps its spool as it always did (0700)."""
    from .util import BIN, SOCKET, UNITS

    for path in (spool, os.path.join(spool, UNITS), os.path.join(spool, BIN)):
        if os.stat(path).st_mode & 0o777 != 0o711:
            os.chmod(path, 0o711)
    # what jobs run as them need: a direct unit's ExecStart, the `xce` shim and the agent's code it
    # runs (`xce launch`), and the agent's socket (which checks who calls: tasks.py); none holds a secret
    for entry in os.scandir(os.path.join(spool, BIN)):
        if entry.name.startswith(("unit-exec-", "agent-")) and entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o644)
        elif entry.name == "xce" and entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o755)
    if os.path.exists(os.path.join(spool, SOCKET)):
        os.chmod(os.path.join(spool, SOCKET), 0o666)


def user_env(env: dict[str, str], user: dict | None) -> dict[str, str]:
    """`env` with HOME, USER and LOGNAME of the user a process runs as (from its passwd entry)."""
    if user is None:
        return env
    return {**env, "HOME": user["home"], "USER": user["name"], "LOGNAME": user["name"]}


class AsUser:
    """`with AsUser(user):` this (root) process's effective ids are the user's: files it makes are
    the user's, opened with the user's permissions. No-op for None. Not for threads."""

    def __init__(self, user: dict | None):
        self.user = user
        self.saved: tuple[int, list[int]] | None = None  # (egid, groups) to restore on exit

    def __enter__(self):
        if self.user is not None:
            self.saved = (os.getegid(), os.getgroups())
            os.setgroups(self.user["groups"])
            os.setegid(self.user["gid"])
            os.seteuid(self.user["uid"])
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            os.seteuid(0)  # first: back to root's capabilities, which the two calls below need
            os.setegid(self.saved[0])
            os.setgroups(self.saved[1])
        return False


def become(user: dict) -> None:
    """In a child about to exec the job: drop to the user for good (groups, gid, then uid)."""
    os.setgroups(user["groups"])
    os.setgid(user["gid"])
    os.setuid(user["uid"])


def chown_to(path: str, user: dict | None) -> None:
    if user is not None:
        os.chown(path, user["uid"], user["gid"])


def remove_unit_dir(host_dir: str) -> None:
    """rm -rf a unit's directory. A user's job directory in it is emptied as its owner: root
    walking a tree its user can change under it could be led, by a directory swapped for a
    symlink, to remove files elsewhere."""
    from .util import remove_tree

    job_dir = os.path.join(host_dir, JOB_DIR)
    try:
        st = os.lstat(job_dir)
    except OSError:
        st = None
    if st is not None and st.st_uid != os.geteuid() and os.geteuid() == 0:
        import stat

        if stat.S_ISDIR(st.st_mode):
            with AsUser({"uid": st.st_uid, "gid": st.st_gid, "groups": []}):
                remove_tree(job_dir)
    remove_tree(host_dir)
