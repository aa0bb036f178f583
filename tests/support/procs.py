"""This machine's processes as /proc shows them, read without psutil: a field of a process's stat
line, and whether a process is done (a zombie, or gone). The pids must be this machine's; a test
host's own pids are read inside the host (agent_hosts.host_proc_state).
"""

from __future__ import annotations

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
