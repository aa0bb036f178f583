"""This machine's processes as /proc shows them, read without psutil: a field of a process's stat
line, whether a process is done (a zombie, or gone), and what waits unread on its sockets. The pids
must be this machine's; a test host's own pids are read inside the host (agent_hosts.host_proc_state).
"""

from __future__ import annotations

import os
from pathlib import Path


def proc_field(pid: int, index: int) -> str | None:
    """Field `index + 3` of /proc/PID/stat, or None if the process is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()[index]


def zombie(pid: int) -> bool:
    """Whether `pid` has ended: a zombie not yet reaped, or no such process any more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


PIDFD_GETFD = 438  # the syscall's number, the same on every architecture (Linux 5.6)


def queued_on_sockets(pid: int) -> int:
    """Bytes sent to the sockets of process `pid` and not read yet (FIONREAD on a copy of each fd,
    taken with pidfd_getfd: root, or ptrace rights over `pid`). What a stopped process has been
    sent: a test that must know a request reached it reads this, not the sender's own records."""
    import ctypes
    import fcntl
    import struct
    import termios

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    pidfd = os.pidfd_open(pid)
    total = 0
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue  # closed meanwhile
            fd = syscall(PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                raise OSError(ctypes.get_errno(), f"pidfd_getfd of fd {name} of pid {pid}")
            try:
                total += struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
            finally:
                os.close(fd)
    finally:
        os.close(pidfd)
    return total
