"""A reused supervisor's host directory kept from job to job (pool.py): renamed, not made and removed.

Why: a job's host directory (XCE_JOB_HOST_DIR) made with mkdir and removed with rmdir allocates and
frees an inode and a data block per job (trimmed at the free, on a file system mounted `discard`),
and on an ext4 without a journal (this machine's /tmp) every inode allocation also steps over each
inode freed in the last 60 s (find_inode_bit's `recently_deleted`), so its cost grows with the job
rate: a loop of a job's directory steps at 2026-12-04 02:50 UTC, load ~7, cost ~180-320 us of CPU
per job with mkdir + rmdir against ~50-90 us with the directory renamed to and fro (bench/README.md,
"The host side's CPU per job: the host directory kept").

Invariants:
- a job is given the kept directory only if it is as a fresh one would be: the very directory this
  worker made (its inode; opened without following a symlink), ours, 0700, empty, without extended
  attributes. Anything else (a file the job left; one written by the agent into it by the old path
  as the job ended) has it removed as before (remove_unit_dir's careful walk), and the job gets a
  new one (mkdir). That is checked when it is given, after the last moment anything could reach it
  by the old job's path (the rename away from that path);
- a rename never replaces a non-empty directory: a unit directory the agent made first for tasks of
  `xce launch` (tasks.py) and put them in stays the job's and is listed for tasks, as before; an
  empty one is replaced by an empty one, as a mkdir that came first would have found none (tasks
  written into it later come with TASKS_SIGNAL);
- the leftover is SPOOL/units/.w-PID-START (no unit name starts with a dot), at most one per live
  worker, empty: the worker removes it when it exits, the zygote when it reaps a worker killed by
  a signal, and at its start those of workers no longer alive (an agent killed with its workers).
Standard library only: supervisors load it.
"""

from __future__ import annotations

import os
import stat

from .runas import remove_unit_dir
from .util import proc_stat

PREFIX = ".w-"
_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class KeptDir:
    """One worker's host directory: lent to its job (at the job's host_dir) or kept (at `path`)."""

    def __init__(self, units: str, pid: int, start: int):
        self.path = os.path.join(units, f"{PREFIX}{pid}-{start}")
        self.ino = 0  # the directory this worker made, lent or kept (0: none)
        self.kept = False  # it is at self.path, between two jobs

    def give(self, host_dir: str) -> bool:
        """Rename the kept directory to `host_dir`; True if the job has it (empty, as a mkdir's)."""
        if not self.kept:
            return False
        self.kept = False
        try:
            fd = os.open(self.path, _OPEN)
        except OSError:
            self.ino = 0
            return False
        try:
            st = os.fstat(fd)
            clean = (st.st_ino == self.ino and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
                     and not os.listdir(fd) and not _xattrs(fd))
        finally:
            os.close(fd)
        if clean:
            try:
                os.rename(self.path, host_dir)
                return True
            except OSError:  # the agent made host_dir first and put tasks in it: that one is the job's
                pass
        self.ino = 0
        remove_unit_dir(self.path)
        return False

    def lent(self, host_dir: str) -> None:
        """The job's host directory was made afresh (mkdir): keep it after the job."""
        try:
            self.ino = os.lstat(host_dir).st_ino
        except OSError:
            self.ino = 0

    def take(self, spec: dict) -> bool:
        """The job has ended (its result recorded): its host directory, the one lent, becomes the
        kept one (its hostfile unlinked); False if it is not that one (remove it as before)."""
        if not self.ino:
            return False
        path = spec["host_dir"]
        try:
            fd = os.open(path, _OPEN)  # the directory itself, never a symlink the job put there
            try:
                if os.fstat(fd).st_ino != self.ino:
                    raise OSError("not the directory lent")
                if spec.get("hostfile") is not None:
                    os.unlink("hostfile", dir_fd=fd)
            finally:
                os.close(fd)
            os.rename(path, self.path)
        except OSError:
            self.ino = 0
            return False
        self.kept = True
        return True

    def drop(self) -> None:
        """The worker leaves: remove the kept directory."""
        if self.kept:
            self.kept = False
            remove_unit_dir(self.path)


def _xattrs(fd: int) -> list[str]:
    try:
        return os.listxattr(fd)
    except OSError:  # a file system without them
        return []


def sweep(units: str, pid: int | None = None) -> None:
    """Remove the kept directories in `units` of workers no longer alive (only `pid`'s, with it)."""
    try:
        names = os.listdir(units)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            owner, start = (int(x) for x in name[len(PREFIX) :].split("-"))
        except ValueError:
            continue
        if pid is not None and owner != pid:
            continue
        fields = proc_stat(owner)
        if fields is None or fields[0] == b"Z" or int(fields[19]) != start:
            remove_unit_dir(os.path.join(units, name))
