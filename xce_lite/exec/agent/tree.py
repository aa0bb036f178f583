"""A plain supervisor owns its job's whole process tree.

It makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a process of the job that is
orphaned (a shell's `cmd &` once the shell exits, a `setsid` child, a daemon's double fork) is
re-parented to the supervisor rather than to PID 1. So the supervisor's descendants are exactly
what its unit started, in whatever process group or session, and a supervisor with no child has
none. When the job has ended (by itself, killed, or at a limit) stop_leftovers() walks /proc for
the descendants left, TERMs them, KILLs them after the grace period, and reaps them: nothing of
a job outlives it, and the job's result says how many were killed.

A supervisor killed -9 cannot: the agent that finds it lost kills its session (kill_lost_session).
Under systemd the unit's cgroup does this already (the unit's end kills everything in it); a
supervisor there is a fresh interpreter per unit and skips the subreaper (and ctypes' import).
Standard library only: prctl is called through ctypes.
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import Any

import os
import time

from .signals import signal
from .util import proc_stat

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
POLL = 0.1  # seconds between walks while leftovers die: a grandchild's end does not wake us
GIVE_UP = 30.0  # seconds after KILL: a process stuck in the kernel (D state) must not hold the result
_prctl: Any = None  # libc's prctl, False if it cannot be had, None before the first try


def load_prctl():
    """libc's prctl, loaded once (before the agent forks its supervisors: ctypes' import is ~5-10
    ms, paid once per agent, not per job); None where it cannot be had."""
    global _prctl
    if _prctl is None:
        try:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (ImportError, OSError, AttributeError):
            _prctl = False
    return _prctl or None


def become_subreaper() -> bool:
    """Make this process a child subreaper; False where the kernel (before 3.4) or libc refuse."""
    prctl = load_prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def has_children() -> bool:
    """True while this process has a child, running or not yet reaped."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def descendants(root: int, groups: frozenset[int] = frozenset()) -> dict[int, list[bytes]]:
    """pid -> proc_stat fields of every live descendant of `root` (zombies left out), and of every
    process in one of `groups`, from one walk of /proc. A process that forks meanwhile may be
    missed: callers walk again until none is left."""
    parent_of: dict[int, list[int]] = {}
    stat_of: dict[int, list[bytes]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_stat(int(name))
        if fields is None:
            continue
        pid = int(name)
        parent_of.setdefault(int(fields[1]), []).append(pid)
        if fields[0] not in (b"Z", b"X"):
            stat_of[pid] = fields
    found, todo = {pid: f for pid, f in stat_of.items() if groups and int(f[2]) in groups}, [root]
    while todo:
        for child in parent_of.get(todo.pop(), ()):
            if child in stat_of:
                found[child] = stat_of[child]
            todo.append(child)
    return found


def stop_leftovers(grace: float, reap, signalled: frozenset[int] = frozenset()) -> int:
    """Stop every descendant of this process and wait until none is left; how many were leftovers.

    A leftover gets TERM (and CONT, in case it is stopped), then KILL once `grace` seconds have
    passed. Processes of the groups in `signalled` had their TERM already (a killed job's group,
    its ending tasks'): they get KILL at once, as the job's kill would have given them, and are not
    counted. `reap()` collects ended children (the caller's, so that their usage is counted).
    A process that KILL has not ended GIVE_UP seconds later is left (stuck in the kernel).
    """
    me = os.getpid()
    counted: set[int] = set()
    termed: set[int] = set()
    kill_at = time.monotonic() + max(0.0, grace)
    while True:
        reap()
        now = time.monotonic()
        if not has_children() or now >= kill_at + GIVE_UP:
            return len(counted)
        for pid, fields in descendants(me).items():
            group = int(fields[2])
            if group in signalled or now >= kill_at:
                _signal(pid, signal.SIGKILL)
            elif pid not in termed:
                termed.add(pid)
                _signal(pid, signal.SIGTERM)
                _signal(pid, signal.SIGCONT)
            if group not in signalled:
                counted.add(pid)
        signal.sigtimedwait((signal.SIGCHLD,), max(0.0, min(POLL, kill_at - now)) if now < kill_at else POLL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def kill_lost_session(sid: int, starttime: int | None) -> int:
    """KILL every process of the session a dead supervisor made (`sid`, its pid; `starttime`, its
    start time): its job, tasks and what they left, but those that made sessions of their own; how
    many. Only while pid `sid` is free or still the supervisor's (its zombie): a session's id is
    its leader's pid, which the kernel does not reuse while the session has members, so then every
    process in session `sid` is the dead supervisor's."""
    leader = proc_stat(sid)
    if leader is not None and int(leader[19]) != starttime:
        return 0  # the pid is someone's again: its session may be theirs
    killed = 0
    for name in os.listdir("/proc"):
        fields = proc_stat(int(name)) if name.isdigit() else None
        if fields is not None and fields[3] == str(sid).encode() and fields[0] not in (b"Z", b"X"):
            _signal(int(name), signal.SIGKILL)
            killed += 1
    return killed


def leftovers_text(count: int) -> str | None:
    """The words a job's result carries: '2 leftover processes killed' (None for none)."""
    if not count:
        return None
    return f"{count} leftover process{'es' if count != 1 else ''} killed"
