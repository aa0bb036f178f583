"""Opening the job store: identity checks, explicit pragmas, migrations, and the write transaction.

Invariants:
- A file that is not ours (not SQLite, corrupt, another application's database, or a store newer
  than this code) is refused with a message and never written to: every check runs before the
  first statement that could change the file (even `journal_mode=WAL` writes the header).
- Pragmas are set by hand, not by apsw.bestpractice: its 100 ms busy timeout and `PRAGMA optimize`
  on open raised BusyError while another process held the write lock.
- Writers take the lock up front (`BEGIN IMMEDIATE`): a deferred transaction that reads, then
  writes after another commit fails at once whatever the busy timeout.
- `synchronous=FULL`: with NORMAL a committed dispatch can vanish after power loss and a job could
  run twice. It costs ~0.15 ms a commit here. JobStore's writer connection keeps that promise
  another way (walsync.py): NORMAL, and an fdatasync of the WAL once the write lock is let go,
  before `write` returns.
- The store is 0600, and so are its WAL and shared-memory files (SQLite makes them with the mode of
  the database file): it holds every job's environment, secrets included. A store an older version
  left open to others is closed (0600) when it is opened for writing.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any
from collections.abc import Iterator
from pathlib import Path

import apsw

from xce_lite.errors import HomeError, StoreError, StoreUnavailable
from xce_lite.shipped import shipped
from xce_lite.store.walsync import WalSync

APPLICATION_ID = 0x58434531  # "XCE1" in the database header: marks the file as an xce_lite store
BUSY_TIMEOUT_MS = 10_000


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) for every `sql/NNNN_name.sql`, in order. Version N is file N."""
    found = []
    for entry in shipped("sql").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    found.sort()
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise StoreError(f"migration {name} is out of sequence: expected number {expected:04d}")
    return found


def latest_version() -> int:
    return len(migrations())


def _one_int(con: apsw.Connection, sql: str) -> int:
    value = con.execute(sql).fetchall()[0][0]
    assert isinstance(value, int)  # these PRAGMAs and count(*) give integers
    return value


def _identify(con: apsw.Connection, path: Path) -> tuple[int, int, int]:
    """(application_id, user_version, number of schema objects) without writing anything."""
    try:
        app_id = _one_int(con, "PRAGMA application_id")
        version = _one_int(con, "PRAGMA user_version")
        objects = _one_int(con, "SELECT count(*) FROM sqlite_schema")
    except (apsw.NotADBError, apsw.CorruptError) as err:
        raise HomeError(
            f"{path} is not an xce_lite job store ({err.__class__.__name__}: {err}); it was left "
            f"untouched. Move it away, or choose another home with --home or XCE_HOME"
        ) from None
    return app_id, version, objects


def connect(path: Path, create: bool = True, readonly: bool = False, durable: bool = True) -> apsw.Connection:
    """An open, checked, migrated connection to the store at `path`. `durable=False` (the simulator's
    throwaway store only) commits without fsync: a power loss may lose it, which it may."""
    if readonly:
        flags = apsw.SQLITE_OPEN_READONLY
    elif create:
        flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    else:
        flags = apsw.SQLITE_OPEN_READWRITE
    if create and not readonly:
        _create_private(path)
    try:
        con = apsw.Connection(str(path), flags=flags)
    except apsw.CantOpenError:
        raise HomeError(f"cannot open the job store {path}; does its folder exist and is it writable?") from None
    con.set_busy_timeout(BUSY_TIMEOUT_MS)
    # double-quoted string literals off: a misspelt column is an error, not a string
    con.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    con.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
    try:
        app_id, version, objects = _identify(con, path)
    except HomeError:
        con.close()
        raise
    latest = latest_version()
    if app_id != APPLICATION_ID and (app_id != 0 or objects > 0 or version != 0):
        con.close()
        raise HomeError(
            f"{path} is an SQLite database of another application (application_id {app_id:#x}); "
            f"it was left untouched. Move it away, or choose another home with --home or XCE_HOME"
        )
    if version > latest:
        con.close()
        raise StoreError(
            f"{path} was written by a newer xce_lite (schema {version}, this one knows {latest}); "
            f"upgrade xce_lite (pip install -U xce_lite) to open it"
        )
    if not readonly:
        _close_to_others(path)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=OFF")
    con.execute("PRAGMA foreign_keys=ON")
    if not readonly and version < latest:
        try:
            _migrate(con, version)
        except BaseException:
            con.close()
            raise
    return con


def _create_private(path: Path) -> None:
    """Make a missing store as an empty file, 0600 (SQLite takes an empty file as a new database);
    where that fails, apsw's open says why."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError:
        pass


def _close_to_others(path: Path) -> None:
    """Close a store (and its WAL and shared-memory files) that an older version left open to other
    users: 0600. Only once the file is known to be ours; a file we may not change is left as it is."""
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        try:
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)
        except OSError:
            pass


def _migrate(con: apsw.Connection, current: int) -> None:
    """Apply every migration above `current`, each in one transaction with its version bump.

    Foreign keys are off while they run (SQLite ignores that pragma inside a transaction, so it is
    set around them): a migration that rebuilds a table (0012) drops the old one, whose implicit
    DELETE would break every reference to it. Each migration's references are checked before it
    commits instead (the documented procedure), and one that broke any commits nothing. A reference
    broken before the migration ran (written by hand, or by a tool with foreign keys off) is not the
    migration's doing: it neither blocks the migration nor is blamed on it."""
    con.execute("PRAGMA foreign_keys=OFF")
    try:
        for version, name, sql in migrations():
            if version <= current:
                continue
            with write(con):
                already = set(map(tuple, con.execute("PRAGMA foreign_key_check").fetchall()))
                con.execute(sql)
                broken = [row for row in con.execute("PRAGMA foreign_key_check").fetchall()
                          if tuple(row) not in already]
                if broken:
                    raise StoreError(
                        f"migration {name} would leave {len(broken)} broken reference(s) (first: table "
                        f"{broken[0][0]}, row {broken[0][1]}, to {broken[0][2]}); nothing was changed. "
                        f"Report this with the store file")
                con.execute(f"PRAGMA application_id={APPLICATION_ID}")
                con.execute(f"PRAGMA user_version={version}")
    finally:
        con.execute("PRAGMA foreign_keys=ON")


@contextlib.contextmanager
def write(con: apsw.Connection, lock: threading.Lock | None = None,
          busy_ms: int | None = None, sync: WalSync | None = None) -> Iterator[apsw.Connection]:
    """One write transaction, lock taken up front; commits on success, rolls back on error. With
    `sync` (the connection runs synchronous=NORMAL: walsync.py), the commit is made durable after
    the lock is let go, before this returns: the next writer need not wait for this one's fdatasync.

    apsw's `with con:` would open a deferred savepoint. On disk full SQLite has already rolled
    back, so our ROLLBACK fails too; the real cause (FullError, IOError) is reported as
    StoreUnavailable, as is a write lock that another process held past the busy timeout: both
    pass, and nothing was written.
    """
    with lock if lock is not None else contextlib.nullcontext():
        try:
            if busy_ms is not None:  # this write waits less for another process's lock
                con.set_busy_timeout(busy_ms)
            con.execute("BEGIN IMMEDIATE")
        except apsw.BusyError:
            raise StoreUnavailable(
                f"the job store is locked by another process (it held the write lock for more than "
                f"{(busy_ms or BUSY_TIMEOUT_MS) / 1000:g} s; see `fuser {con.filename}`)") from None
        except (apsw.FullError, apsw.IOError) as err:
            _raise_store_error(err)
            raise
        finally:
            if busy_ms is not None:
                con.set_busy_timeout(BUSY_TIMEOUT_MS)
        try:
            yield con
        except BaseException as err:
            with contextlib.suppress(apsw.SQLError):
                con.execute("ROLLBACK")
            _raise_store_error(err)
            raise
        try:
            con.execute("COMMIT")
        except apsw.Error as err:
            with contextlib.suppress(apsw.SQLError):
                con.execute("ROLLBACK")
            _raise_store_error(err)
            raise
        made = sync.commit_made() if sync is not None else 0
    if sync is not None:
        sync.through(made)  # on disk before the caller goes on (replies, launches, changes its memory)


def write_script(con: apsw.Connection, script: str, bindings: dict, lock: threading.Lock | None = None,
                 busy_ms: int | None = None, sync: WalSync | None = None) -> list[tuple]:
    """`write` of a whole transaction given as ONE script, "BEGIN IMMEDIATE; ...; COMMIT", run by
    one call into SQLite; the rows its statements return (RETURNING). Same promises as `write`
    (lock up front, rolled back on any error, durable before it returns, errors as StoreUnavailable
    or StoreError). Why (branch post6): a one-job submit as five calls (BEGIN, the next id, the job,
    its event, COMMIT) held the store's lock across four returns to Python, each of which could
    lose the GIL to the tick's thread (apsw lets it go in every call) and wait for it with the lock
    held; one call returns to Python once."""
    with lock if lock is not None else contextlib.nullcontext():
        if busy_ms is not None:
            con.set_busy_timeout(busy_ms)
        try:
            rows = list(con.execute(script, bindings))
        except BaseException as err:
            if con.in_transaction:
                with contextlib.suppress(apsw.SQLError):
                    con.execute("ROLLBACK")
            elif isinstance(err, apsw.BusyError):  # BEGIN IMMEDIATE waited out the busy timeout: as `write` says
                raise StoreUnavailable(
                    f"the job store is locked by another process (it held the write lock for more than "
                    f"{(busy_ms or BUSY_TIMEOUT_MS) / 1000:g} s; see `fuser {con.filename}`)") from None
            _raise_store_error(err)
            raise
        finally:
            if busy_ms is not None:
                con.set_busy_timeout(BUSY_TIMEOUT_MS)
        made = sync.commit_made() if sync is not None else 0
    if sync is not None:
        sync.through(made)  # on disk before the caller goes on, as `write`
    return rows


def _raise_store_error(err: BaseException) -> None:
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, apsw.BusyError):
            raise StoreUnavailable(f"the job store is locked by another process ({cause})") from err
        if isinstance(cause, (apsw.CorruptError, apsw.NotADBError)):
            raise StoreError(f"the job store is damaged ({cause.__class__.__name__}: {cause})") from err
        if isinstance(cause, (apsw.FullError, apsw.IOError)):
            raise StoreUnavailable(f"the job store cannot be written ({cause.__class__.__name__}: {cause}); "
                                   f"free disk space on its file system") from err
        cause = cause.__context__


def damaged(err: BaseException) -> bool:
    """Whether `err` (or what it arose from) says that the store's file is damaged."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, (apsw.CorruptError, apsw.NotADBError)):
            return True
        cause = cause.__context__
    return False


_INSERT_EVENT = "INSERT INTO events(job_id, time, kind, data) VALUES (?, ?, ?, ?)"


def insert_event(con: apsw.Connection, job_id: int, now: float, kind: str, data: dict | None) -> None:
    """Append one event to a job's history (inside the caller's write transaction)."""
    con.execute(_INSERT_EVENT, (job_id, now, kind, json.dumps(data, ensure_ascii=True) if data is not None else None))


def insert_events(con: apsw.Connection, rows: list[tuple[int, float, str, Any]]) -> None:
    """Append (job id, time, kind, data) events, data None or a JSON-able value, as one statement
    run over all of them (inside the caller's write transaction)."""
    if rows:
        con.executemany(_INSERT_EVENT, [(job_id, now, kind, json.dumps(data, ensure_ascii=True) if data is not None
                                         else None) for job_id, now, kind, data in rows])
