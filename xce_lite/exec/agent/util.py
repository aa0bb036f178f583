"""Small helpers of every mode (files, processes, results, the spool's fixed names) and the
protocol's version. Standard library only: this package is shipped to hosts as one file (see
docs/agent-protocol.md); imports stay cheap, for the unit interpreters that load this module."""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    from typing import Any

import errno
import os
import time

from .jsonl import dumps, loads

VERSION = 3  # of the JSON-lines protocol `serve` speaks (docs/agent-protocol.md)
SOCKET = "agent.sock"  # in the spool: requests from jobs (`xce launch`) and pokes from supervisors
UNITS = "units"  # in the spool: one host directory per unit, while it runs
BIN = "bin"  # in the spool: the `xce` shim for jobs, and the agent compiled for units to run
# The agent's own files are its user's alone (0600, directories 0700): specs and journals hold jobs'
# environments. Only a job's own output files follow the umask its submitter had (job_umask below).
AGENT_UMASK = 0o077
DEFAULT_JOB_UMASK = 0o022  # a job whose submitter's umask is not known (an older controller)
LETTERS_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def format_size(size: int) -> str:
    """The largest binary unit that keeps one decimal honest: 2147483648 -> '2G', 1536M -> '1.5G'."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size}B"


def format_limit(seconds: float) -> str:
    """HH:MM:SS with hours zero-padded to two digits: 600 -> '00:10:00'."""
    total = round(seconds)
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def proc_stat(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat (index 0 is field 3, the state), or None if there is no such pid.

    Parsed after the last ')' because the command name (field 2) may itself contain spaces or ')'.
    Index 2 = pgrp, 3 = session, 19 = starttime (field 22), 21 = rss in pages (field 24).
    """
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[data.rindex(b")") + 2 :].split()


def is_alive(pid: int, starttime: int | None) -> bool:
    """True if `pid` runs and is the same process as the one recorded with `starttime` (None, not
    known: never the same).

    A zombie counts as dead: an orphan's zombie may linger where PID 1 is slow to reap.
    """
    fields = proc_stat(pid)
    return fields is not None and int(fields[19]) == starttime and fields[0] not in (b"Z", b"X")


def child_exited(pid: int) -> bool:
    """Whether our child `pid` has exited (a zombie, or reaped already), without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def boot_id() -> str:
    """This boot's random id: a pid and start time recorded in another boot name no process now."""
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def write_file(path: str, data: bytes, durable: bool = False, mode: int = 0o600) -> None:
    """Replace `path` atomically (tmp + rename); with `durable`, fsync the data and the directory.
    Private by default (0600): specs, results and hostfiles hold the job's environment and paths."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data, tmp)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path))


def private_file(path: str) -> str:
    """`path`, made (0600) if it is not there: for a log that a process with a job's umask appends
    to with open(path, "a"), which would make it as the umask says."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError:
        pass  # the caller's open says why
    return path


def write_all(fd: int, data: bytes, path: str) -> None:
    """One write(2) of all of `data`. On a regular file a short write means the disk is full."""
    if os.write(fd, data) != len(data):
        raise OSError(errno.ENOSPC, "short write: no space left on the device?", path)


def fsync_dir(path: str) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_text(path: str) -> str | None:
    """The file's text, or None if it does not exist. Plain os calls (open, read to EOF, close),
    not io's stack of objects: supervisors read the lease this way once per job."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def read_json(path: str) -> Any:
    """The JSON value in the file, or None if it does not exist."""
    text = read_text(path)
    return None if text is None else loads(text)


def remove_tree(path: str) -> None:
    """rm -rf `path`, never following a symlink (`path` itself one included: it is unlinked, what it
    names is left alone); what cannot be removed stays (it is only clean-up)."""
    if os.path.islink(path):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return
    except OSError:
        entries = None
    if entries is not None:
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(entry.path)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def make_result(start_time: float, reason: str | None, exit_code: int | None = None, **usage) -> dict:
    """A result for a job that never ran (or whose end is unknown): no usage, `reason` says why."""
    return {
        "exit_code": exit_code,
        "signal": None,
        "start_time": start_time,
        "end_time": time.time(),
        "cpu_time": 0.0,
        "max_rss": 0,
        "reason": reason,
        "service_result": None,
        "mode": "plain",
        **usage,
    }


def unix_address(path: str) -> tuple[str, int]:
    """(an address for bind/connect naming `path`, an fd to close afterwards or -1).

    sun_path holds 108 bytes: a longer path is reached through /proc/self/fd of its directory.
    """
    if len(os.fsencode(path)) < 100:
        return path, -1
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def poke(spool: str, **fields: object) -> None:
    """Tell the agent serving `spool` to read its journal now. Best effort and never blocking: the
    agent reads it every WATCH_INTERVAL anyway, and there may be no agent (the controller is away)."""
    import _socket  # the C module: `socket` imports enum (see signals.py)

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        address, fd = unix_address(os.path.join(spool, SOCKET))
        try:
            sock.connect(address)
        finally:
            if fd >= 0:
                os.close(fd)
        sock.send(dumps({"op": "poke", **fields}))
    except OSError:
        pass
    finally:
        sock.close()


def job_umask(spec: dict) -> int:
    """The umask the job's own processes (and the output files made for it) get: its submitter's."""
    mask = spec.get("umask")
    return mask if isinstance(mask, int) and not isinstance(mask, bool) and 0 <= mask <= 0o777 else DEFAULT_JOB_UMASK


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
