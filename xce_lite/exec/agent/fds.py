"""The agent's file descriptors: its limit, what its zygote keeps open, and fds passed on a socket
(SCM_RIGHTS: the zygote's new workers' sockets, a worker's spool lock).

A plain agent holds one socket per reused supervisor (pool.Workers), so `serve` raises its soft
RLIMIT_NOFILE to the hard one: else a host running ~1000 pooled jobs under the usual soft 1024
could make no socket for the next. Jobs keep the limit the agent was started with, as LSF's and
Slurm's jobs get the usual one, not their daemon's: what the agent forks (the zygote, a supervisor
it forks itself) puts it back at once, and the zygote's forks inherit it. Standard library only;
`resource` is imported only where the limit changes (units import this module for nothing else).
"""

from __future__ import annotations

import os
import stat
import sys

JOBS_LIMIT: tuple[int, int] | None = None  # (soft, hard) the agent was started with, while it runs raised


def raise_fd_limit() -> None:
    """In `serve`: the soft RLIMIT_NOFILE up to the hard one (JOBS_LIMIT keeps the old one for jobs)."""
    global JOBS_LIMIT
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):  # not allowed here (a container's seccomp): go on with the old one
        return
    JOBS_LIMIT = (soft, hard)


def restore_for_jobs() -> None:
    """In a child the agent forked: the fd limit the agent was started with, for the jobs it will
    start (once: its own children inherit it)."""
    global JOBS_LIMIT
    if JOBS_LIMIT is not None:
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, JOBS_LIMIT)
        except (OSError, ValueError):
            pass
        JOBS_LIMIT = None


def keep_only(fds: set[int]) -> None:
    """Close every fd above 2 but `fds`; 0 and 1 (the controller's pipes, which the agent's end
    must close) become /dev/null, and so does 2 unless it is a log file (an SSH session's stderr
    would be held open)."""
    low = 3
    for fd in sorted(fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if not stat.S_ISREG(os.fstat(2).st_mode):
        os.dup2(null, 2)
    os.close(null)


def send_with_fds(fd: int, data: bytes | memoryview, fds: list[int]) -> int:
    """sendmsg of `data` on the socket `fd` with `fds` (SCM_RIGHTS) on its first byte; bytes sent."""
    import _socket

    sock = _socket.socket(fileno=fd)
    try:
        return sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, pack_fds(fds))])
    finally:
        sock.detach()  # the fd stays the Zygote's


def pack_fds(fds: list[int]) -> bytes:
    """The data of an SCM_RIGHTS message passing `fds`."""
    return b"".join(f.to_bytes(4, sys.byteorder, signed=True) for f in fds)


def unpack_fds(anc: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds passed in recvmsg's ancillary data `anc` (SCM_RIGHTS), in order."""
    import _socket

    return [int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
            for level, kind, payload in anc if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
            for i in range(0, len(payload) - len(payload) % 4, 4)]
