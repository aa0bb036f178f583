"""The WAL's checkpoints on a thread of their own, not inside a writer's commit (issue 18, branch post6).

Why: SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL past 1,000 pages: that
commit copies the WAL's pages into the database file and syncs both, under SQLite's write lock and
the store's own lock. About one one-job submit in 120 paid it (1.2 ms of CPU, ~6 ms of wall with jobs
beside), and so did the tick's commits, while the submit behind them waited for the store's lock.

Invariants:
- the writer connection never checkpoints (`wal_autocheckpoint(0)`); a thread of the store's with
  its own connection looks every PERIOD seconds, after commits (WalSync's count moved), at how many
  frames the WAL holds (`mxFrame` in the WAL-index header, the -shm file's first bytes: sqlite.org/
  walformat.html) and runs a PASSIVE checkpoint at PAGES or more, as often as SQLite's own would
  have (its default: 1,000). PASSIVE takes no lock a writer or a reader waits for: commits and
  reads go on beside it. What it copies is synced (its connection runs synchronous=FULL: the WAL
  before the copy, the database after), and SQLite restarts the WAL only after a checkpoint that
  copied all of it: a commit is never lost by a checkpoint, whichever connection runs it.
- the WAL restarts (is overwritten from its start, so the file stops growing) soon after PAGES
  frames, as with SQLite's own checkpoint, even behind writers that never pause: SQLite restarts it
  at a write that begins with all of it copied, and under load (the API's submits, the tick's and
  the agents' results) frames were always committed while a PASSIVE checkpoint copied, so the WAL
  grew through the whole run (34 MB after 3,000 one-POST jobs, every commit an append, whose
  fdatasync also writes the file's inode here). So a FULL checkpoint follows a PASSIVE one that left
  frames behind: it holds new writers back (SQLite's busy handler) only while it copies the few
  frames committed during the PASSIVE one. It waits CATCH_UP_WAIT_MS at most, for a writer's commit
  or for a reader still on an older snapshot (FULL waits for such a reader with SQLite's write lock
  held: a long read, `xceadmin check` beside the controller, would hold every submit back with it),
  then gives up and leaves those frames to a later checkpoint.
- the thread starts at the first commit (a store only read, or opened for a moment, has none) and
  `close` stops it, waiting for a checkpoint under way, before the store closes its connections.
- a checkpoint that fails (busy: another process checkpoints; an I/O error) loses nothing (the WAL
  keeps the pages): the next one tries again; the WAL grows meanwhile, as it would with SQLite's own.
- the WAL does not grow without end behind a writer that never pauses: a PASSIVE checkpoint copies
  what the WAL held when it began, and SQLite restarts the WAL only after one that copied all of it,
  so a writer that commits while each one runs (the thread starved of a CPU, seen under a loaded
  test run: the WAL at 875,000 frames after 60 s) keeps it growing. At BEHIND frames the checkpoint
  is FULL instead: new writers wait (SQLite's busy handler, a few ms) while it copies the rest, and
  the next commit restarts the WAL. It waits BEHIND_WAIT_MS at most, as the catch-up above waits
  CATCH_UP_WAIT_MS: a reader on an older snapshot keeps it from copying everything anyway.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import apsw

from xce_lite.store.walsync import WalSync

PERIOD = 0.05  # s; ~700 one-job commits a second (~8 pages each) add ~300 frames in a period
PAGES = 1000  # frames in the WAL that call for a checkpoint: SQLite's wal_autocheckpoint default
BEHIND = 8 * PAGES  # frames at which PASSIVE checkpoints have not kept up: a FULL one (~32 MB of WAL)
CATCH_UP_WAIT_MS = 5  # ms the FULL after a PASSIVE one waits at most (its writers wait as long): a few commits
BEHIND_WAIT_MS = 200  # ms the FULL at BEHIND waits at most: rare, and it must get in between a writer's commits


class Checkpointer:
    """See the module docstring. One per durable, writable JobStore."""

    def __init__(self, writer: apsw.Connection, path: Path, sync: WalSync,
                 connect: Callable[[Path], apsw.Connection]) -> None:
        """`sync`: the writer's (it counts its commits); `connect(path)`: a read-write connection
        of the store's (db.connect)."""
        writer.wal_autocheckpoint(0)
        self._path, self._sync, self._connect = path, sync, connect
        self._stop = threading.Event()
        self._mu = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shm: int | None = None  # the -shm file, read by the thread only
        self.checkpoints = self.failures = self.full = 0  # run so far, and of them FULL (tests, benches)
        self.catch_ups = 0  # FULL checkpoints run right after a PASSIVE one, for what was committed meanwhile
        self.full_busy = 0  # FULL ones (either kind) given up after their wait: a writer, a reader on an old snapshot

    def start(self) -> None:
        """Called at each write of the writer: starts the thread at the first one."""
        if self._thread is None:
            with self._mu:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="store-checkpoint", daemon=True)
                    self._thread.start()

    def close(self) -> None:
        with self._mu:
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join()
        if self._shm is not None:  # once the thread is gone
            os.close(self._shm)
            self._shm = None

    def _run(self) -> None:
        con = None
        seen = -1
        try:
            while not self._stop.wait(PERIOD):
                made = self._sync.committed
                if made == seen:
                    continue
                seen = made
                try:
                    if self._frames() < PAGES:  # (the writer's connection made the -shm file)
                        continue
                    if con is None:  # made when first needed: a store written a little holds none
                        con = self._connect(self._path)
                    self.checkpoint(con)
                except Exception:  # busy, I/O, the store gone: tried again later (the WAL keeps what it holds)
                    self.failures += 1
                    seen = -1
        finally:
            if con is not None:
                con.close()

    def checkpoint(self, con: apsw.Connection) -> None:
        """One checkpoint on `con` (a connection of the store's, not the writer's): PASSIVE, then FULL
        for what was committed while it copied; FULL at once when the WAL holds BEHIND frames. A FULL
        waits a bounded time (CATCH_UP_WAIT_MS, BEHIND_WAIT_MS), then is left to a later checkpoint
        (`full_busy`): see the module docstring."""
        if self._frames() >= BEHIND:
            self.full += self._full(con, BEHIND_WAIT_MS)
        else:
            con.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)  # takes no lock, waits for nobody
            if self._copied() < self._frames():
                self.catch_ups += self._full(con, CATCH_UP_WAIT_MS)
        self.checkpoints += 1

    def _full(self, con: apsw.Connection, wait_ms: int) -> bool:
        """A FULL checkpoint that waits `wait_ms` at most, for a writer's commit or for a reader still
        on an older snapshot (writers wait while it does); whether it ran."""
        con.set_busy_timeout(wait_ms)  # this connection only checkpoints: nothing else waits by it
        try:
            con.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_FULL)
            return True
        except apsw.BusyError:
            self.full_busy += 1
            return False

    def _frames(self) -> int:
        """The WAL's frames now (its WAL-index header's mxFrame, a native-order u32 at byte 16; read
        without SQLite's locks: a moment's estimate, all that deciding when to checkpoint needs)."""
        return self._shm_u32(16)

    def _copied(self) -> int:
        """Of those, the frames a checkpoint has copied into the database file (nBackfill, a u32 at
        byte 96: the WAL-index's checkpoint information follows its two 48-byte headers)."""
        return self._shm_u32(96)

    def _shm_u32(self, offset: int) -> int:
        if self._shm is None:
            self._shm = os.open(f"{self._path}-shm", os.O_RDONLY | os.O_CLOEXEC)
        return int.from_bytes(os.pread(self._shm, 4, offset), sys.byteorder)
