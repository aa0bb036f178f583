"""The writer connection's commits made durable outside its write lock (issue 18, branch post3).

Why: with `synchronous=FULL` SQLite fdatasyncs the WAL inside COMMIT, under its write lock and the
store's own lock. A one-job submit (`POST /jobs`) then waited for the tick's whole fdatasync (0.7-1
ms of wall while jobs run beside, bench/one_post.py --running) before its own transaction could
begin, and paid its own after. Here the writer connection runs `synchronous=NORMAL`: SQLite writes
a commit's frames without a sync (it still syncs the WAL before each checkpoint and a new WAL
header), and each writer fdatasyncs the WAL itself once it has let go of the lock, before `write()`
returns. The next writer's transaction runs meanwhile; its own fdatasync may overlap this one.

Invariants:
- a write returns (so its caller replies, launches, or changes the controller's memory) only once
  an fdatasync of the WAL that began after its COMMIT has returned: it is on disk, as with FULL.
  An fdatasync writes every frame the file got before it began, so it makes every earlier commit
  durable too (`synced` counts the commits known to be on disk; `committed` those made).
- no second fdatasync for commits one under way already takes (branch post4): a caller whose commits
  an fdatasync begun after them will cover (a reader's settle while a writer syncs, mostly) waits for
  that one to return instead of beginning its own; a caller with a commit made after every running
  fdatasync began begins one, at once, beside them (writers still do not wait for one another).
- what a reader may have seen is on disk before the API answers with it: between a COMMIT and its
  fdatasync, other connections can read the commit already (SQLite publishes it at COMMIT), so the
  API server calls `JobStore.settle_reads` after each handler that read the store, before it replies.
- the descriptor synced is the WAL the writer connection writes: opened by its path after a commit
  (so the file exists), and kept: SQLite does not replace the WAL while a connection has it open (it
  deletes it only when the last one closes; it restarts it in place). Not checked by a stat(2) at each
  sync: a stat of the WAL between its writes and the fdatasync cost ~30 us of CPU per commit here.
- the descriptor is closed (JobStore.close) only once no fdatasync uses it: its number, reused by
  another file, is never synced in its place; a sync after that fails.
- an fdatasync that fails leaves the commit's durability unknown (Linux may drop the pages it could
  not write, and a second fdatasync would then succeed): StoreError, and every later sync fails
  with it, so every later write is refused and the controller's next tick stops it on a fault; its
  restart reads what is on disk.
"""

from __future__ import annotations

import os
import threading

import apsw

from xce_lite.errors import StoreError


class WalSync:
    """See the module docstring. One per writer connection (JobStore's)."""

    def __init__(self, con: apsw.Connection, wal: str) -> None:
        """Take over the durability of `con`'s commits: from now on each must be passed to `through`."""
        con.execute("PRAGMA synchronous=NORMAL")
        self._wal = wal
        self._fd: int | None = None
        self._opened = False  # the descriptor was opened once (it is not opened again after close)
        self._mu = threading.Condition()  # guards the counters and the descriptor; close waits on it
        self._using = 0  # fdatasyncs under way: the descriptor is not closed (and its number not reused) meanwhile
        self._running: list[int] = []  # the `committed` each fdatasync under way began at (it covers those)
        self.committed = 0  # commits made on the writer connection (counted under its write lock)
        self.synced = 0  # of those, the first `synced` are known to be on disk
        self._failed: str | None = None

    def commit_made(self) -> int:
        """Count a COMMIT that has just returned (the caller still holds the write lock): its number."""
        with self._mu:
            self.committed += 1
            return self.committed

    def through(self, seq: int) -> None:
        """Return once commits 1..`seq` are on disk: at once if a sync since has made them so; after
        the end of an fdatasync under way that began after commit `seq` (it takes it with it); else
        after an fdatasync of the WAL begun now (it takes every commit counted so far with it)."""
        with self._mu:
            while True:
                if self._failed is not None:
                    raise StoreError(self._failed)
                if self.synced >= seq:
                    return
                if not any(target >= seq for target in self._running):
                    break
                self._mu.wait()  # its end (or failure) notifies
            target = self.committed  # each of these had written its frames before it was counted
            self._running.append(target)
        try:
            os.fdatasync(self._descriptor())
        except OSError as err:
            with self._mu:
                self._failed = (f"the job store's WAL could not be synced ({err}); what the last commits wrote "
                                f"may not be on disk, so the store takes no more writes: restart the "
                                f"controller, which reads what is on disk")
            raise StoreError(self._failed) from err
        else:
            with self._mu:
                self.synced = max(self.synced, target)
        finally:
            with self._mu:
                self._using -= 1
                self._running.remove(target)
                self._mu.notify_all()  # close, and the callers waiting for this one

    def settle(self) -> None:
        """Return once every commit made so far is on disk."""
        self.through(self.committed)

    def close(self) -> None:
        """Close the descriptor once no fdatasync uses it; a sync after this fails (StoreError)."""
        with self._mu:
            self._failed = self._failed or "the job store is closed"
            self._mu.wait_for(lambda: self._using == 0)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _descriptor(self) -> int:
        """The WAL's descriptor, opened at the first sync, counted as in use (`_using`); OSError if
        the store is closed."""
        with self._mu:
            self._using += 1
            if self._fd is None:
                if self._opened:
                    raise OSError("the job store is closed")
                self._fd, self._opened = os.open(self._wal, os.O_RDONLY | os.O_CLOEXEC), True
            return self._fd
