"""The spool's journal: every unit's life as records appended one after the other, and its fold.

The format and its rules are in docs/agent-protocol.md ("The journal"). Each record is ONE write(2)
of newline + ASCII JSON + newline to the file opened O_APPEND; readers skip torn lines and take
lines up to the last newline only. Writers other than the serving agent append under a shared
flock, to the file the path names (the agent renames a compacted journal over it).
"""

from __future__ import annotations

import fcntl
import os

from .jsonl import dumps, encode, loads
from .util import fsync_dir, write_all

JOURNAL = "journal"  # in the spool
JOURNAL_VERSION = 1
JOURNAL_LIMIT = 1 << 20  # bytes: a journal that grows past this is compacted


def record(event: str, **fields: object) -> bytes:
    """One journal record as it is written: newline, ASCII JSON, newline."""
    return b"\n" + dumps({"event": event, **fields})


def parse_records(data: bytes, offset: int):
    """Yield (record, offset just past it) for each readable line of `data`, read at `offset`.

    `data` must end at a newline; empty lines and lines that are not a JSON object (a record torn
    by a crash) are skipped.
    """
    end = offset
    for line in data.split(b"\n"):
        end += len(line) + 1
        if line:
            try:
                rec = loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec, end


def append_shared(path: str, data: bytes, sync: bool) -> tuple[int, int]:
    """Append records to the journal from a process that does not compact it (a supervisor, `post`);
    (the journal's inode, the offset just past them).

    Under a shared flock, and to the file that the path names at that moment: the agent renames a
    compacted journal over the path while it holds an exclusive flock on the old one, so a writer
    that opened the old file finds out here and writes to the new one. That the file is still the
    journal is its link count (renamed over or removed: 0), from the fstat taken anyway, not a
    stat of the path (one path walk fewer per record). With `sync`, the records are on disk
    (fdatasync) when this returns, and so is the file's name if this made the file (only if
    someone removed the journal under running jobs).
    """
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            held = os.fstat(fd)
            if held.st_nlink == 0:
                continue  # compacted (or removed) since we opened it
            write_all(fd, data, path)
            end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: just past our write
            if sync:
                os.fdatasync(fd)
                if held.st_size == 0:
                    fsync_dir(os.path.dirname(path))
            return held.st_ino, end
        finally:
            os.close(fd)


class SharedAppender:
    """append_shared for a process that appends for job after job (a reused supervisor, pool.py):
    the journal stays open between appends (close-on-exec: no job inherits it), and is opened
    again only when the path names another file (compacted meanwhile). Same rules, same lock:
    each append holds the shared flock from the check of the file (its link count, as there) to the
    write (and its sync): flock, fstat, write[, fdatasync], unlock per record. What is appended
    without a sync is made durable by `sync` (a worker's exit) or by the agent (pool.py)."""

    def __init__(self, path: str):
        self.path, self.fd = path, -1
        self.made = False  # an append without a sync made the file: its name is not durable yet

    def append(self, data: bytes, sync: bool) -> int:
        """As append_shared(self.path, data, sync); the journal's inode (no offset: nobody asks)."""
        while True:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fd = self.fd
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                held = os.fstat(fd)
                if held.st_nlink == 0:  # compacted (renamed over) or removed: the path names another file, or none
                    self.close()  # unlocks it
                    continue
                write_all(fd, data, self.path)
                self.made = self.made or held.st_size == 0
                if sync:
                    self.sync()
                return held.st_ino
            finally:
                if self.fd == fd:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def sync(self) -> None:
        """Make what was appended without a sync durable (fdatasync; and the file's name, if an
        append made it). The file this fd names: if the agent compacted the journal since, its
        copy is durable already (state.py syncs a compacted file before it renames it)."""
        if self.fd >= 0:
            os.fdatasync(self.fd)
            if self.made:
                fsync_dir(os.path.dirname(self.path))
        self.made = False

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def journal_kill_reason(path: str, unit: str) -> str | None:
    """The reason of `unit`'s last `kill_requested` record since its last `launched`, in the journal."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    name = encode(unit).encode("ascii")
    launched, killed = b'"event":"launched","unit":' + name, b'"event":"kill_requested","unit":' + name
    reason = None
    for line in data.split(b"\n"):
        if launched in line:
            reason = None
        elif killed in line:
            try:
                reason = loads(line)["reason"]
            except (ValueError, KeyError, TypeError):
                pass
    return reason


class Unit:
    """What the journal says of one unit: one launch of it, from `launched` until `forgotten`."""

    __slots__ = (
        "boot", "direct", "durable", "job", "kill", "mode", "pid", "reread", "result", "result_end",
        "start_time", "starttime", "uid",
    )

    def __init__(self, start_time: float | None, mode: str = "plain", direct: dict | None = None,
                 uid: int | None = None, reread: float | None = None):
        self.start_time = start_time
        # its supervisor looks at SPOOL/lease this often (lease.py); None: launched by an older
        # agent, whose supervisor reads it only when the lease it read runs out
        self.reread = reread
        self.uid = uid  # the user it runs as (runas.py); None: the agent's own
        self.mode = mode  # how it runs: "plain" (a forked supervisor), "systemd" or "user" (a unit)
        self.direct = direct  # a direct unit's {"stdout", "stderr", "grace"}; None: it has a supervisor
        self.pid: int | None = None  # the supervisor, once `started`
        self.starttime: int | None = None
        self.boot: str | None = None
        self.job: int | None = None
        self.kill: str | None = None  # the last kill reason requested
        self.result: dict | None = None
        self.result_end = 0  # where its `finished` record ends in the journal file
        self.durable = False  # the result is known to be on disk (besides result_end <= synced)


def fold(units: dict[str, Unit], data: bytes, offset: int, news: list | None = None,
         queued: dict[str, dict] | None = None, left: dict[str, str] | None = None) -> None:
    """Apply the journal records in `data` (read at `offset`, ending at a newline) to `units`; the
    records that change what the agent must do (a unit's first `finished`, `started`,
    `task_finished`) are appended to `news`, if given. `queued`, if given, is kept as the queue of
    successors (successors.py): unit -> its launch request, from `queued` to `launched` or `dequeued`;
    and `left` (with it) as the units that left it unstarted: unit -> the `after` it had there, so
    that a follower naming it follows that one instead (successors.py, chains)."""
    for rec, end in parse_records(data, offset):
        try:
            event = rec["event"]
            if event == "launched":
                units[rec["unit"]] = Unit(rec["start_time"], rec.get("mode", "plain"), rec.get("direct"),
                                          rec.get("uid"), rec.get("reread"))
                if queued is not None:
                    queued.pop(rec["unit"], None)
            elif event == "queued" or event == "dequeued":
                if queued is not None:
                    if event == "queued":
                        queued[rec["unit"]] = rec["spec"]
                        if left is not None:
                            left.pop(rec["unit"], None)  # queued again (after a drop): no leaver now
                    else:
                        spec = queued.pop(rec["unit"], None)
                        after = spec.get("after") if isinstance(spec, dict) else None
                        if left is not None and isinstance(after, str):
                            left[rec["unit"]] = after
            elif event == "forgotten":
                for name in rec["units"]:
                    units.pop(name, None)
            elif event != "journal":
                u = units.get(rec["unit"])
                if u is None:
                    continue  # cannot happen: a unit's records come between launched and forgotten
                if event == "started":
                    u.pid, u.starttime, u.boot, u.job = rec["pid"], rec["starttime"], rec["boot"], rec["job"]
                elif event == "kill_requested":
                    u.kill = rec["reason"]
                    continue
                elif event == "finished":
                    if u.result is not None:
                        continue  # the first result is the result
                    u.result, u.result_end, u.durable = rec["result"], end, False
                elif event != "task_finished":
                    continue
                if news is not None:
                    news.append(rec)
        except (KeyError, TypeError, AttributeError):
            continue  # not a record this agent wrote or knows: skipped like a torn one


def read_journal(spool: str) -> dict[str, Unit]:
    """The units SPOOL's journal knows, read-only (for tools; a serving agent keeps its own fold)."""
    units: dict[str, Unit] = {}
    try:
        with open(os.path.join(spool, JOURNAL), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return units
    fold(units, data[: data.rfind(b"\n") + 1], 0)
    return units
