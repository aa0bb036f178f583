"""A write is on disk before it returns, and a writer does not wait for another's fdatasync (store/
walsync.py): the writer connection runs synchronous=NORMAL and each write fdatasyncs the WAL once it
has let go of the write lock. What a reader may have seen is on disk before `settle_reads` returns.
os.fdatasync is watched (or held, or failed) in walsync's module only: SQLite's own syncs are C calls."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from tests.support.store import T, spec
from xce_lite.errors import StoreError
from xce_lite.store import walsync
from xce_lite.store.jobs import JobStore


class Syncs:
    """os.fdatasync as walsync calls it: each call's file and what a separate connection could read
    then; calls while `hold` is set wait for `release` (one call at a time is held: the first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: list[tuple[int, int]] = []  # (inode synced, jobs readable at that moment)
        self.threads: list[int] = []  # the thread of each call
        self.hold = False
        self.held = threading.Event()
        self.release = threading.Event()
        self.fail: OSError | None = None
        self.real = os.fdatasync

    def __call__(self, fd: int) -> None:
        reader = JobStore(self.path, readonly=True)
        try:
            readable = len(reader.jobs(user="alice"))
        finally:
            reader.close()
        self.calls.append((os.fstat(fd).st_ino, readable))
        self.threads.append(threading.get_ident())
        if self.fail is not None:
            raise self.fail
        if self.hold:
            self.hold = False
            self.held.set()
            assert self.release.wait(10)
            if self.fail is not None:  # set while it was held: this one fails too
                raise self.fail
        self.real(fd)


@pytest.fixture
def syncs(path: Path, monkeypatch: pytest.MonkeyPatch) -> Syncs:
    watched = Syncs(path)
    monkeypatch.setattr(walsync.os, "fdatasync", watched)
    return watched


@pytest.fixture
def writer(path: Path, syncs: Syncs):
    """The store as the controller opens it (its writer connection synced by walsync), closed after."""
    store = JobStore(path)
    yield store
    syncs.release.set()  # a test that failed holding a sync lets its thread go
    store.close()


def _submit(store: JobStore, name: str) -> list[int]:
    return store.submit([(spec(name), "normal")], "alice", T)


def _in_thread(call) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def test_a_submit_returns_after_an_fdatasync_of_the_wal_begun_after_its_commit(path: Path, syncs: Syncs,
                                                                               writer: JobStore) -> None:
    assert writer._con.execute("PRAGMA synchronous").get == 1  # NORMAL: SQLite does not sync the commit
    for n in range(1, 4):
        _submit(writer, "true")
        # the last sync began once the job was committed (readable), on the store's own WAL
        assert syncs.calls[-1] == (os.stat(f"{path}-wal").st_ino, n)


def test_a_writer_does_not_wait_for_another_writers_fdatasync_and_neither_returns_before_its_own(
        syncs: Syncs, writer: JobStore) -> None:
    _submit(writer, "true")  # the WAL exists, and is synced once
    syncs.hold = True
    first, first_ids = _in_thread(lambda: _submit(writer, "one"))
    assert syncs.held.wait(10)  # the first has committed and is in its fdatasync
    second = _submit(writer, "two")  # under FULL: behind the first's sync
    assert second and first.is_alive() and not first_ids  # the first is not acknowledged before its sync
    syncs.release.set()
    first.join(10)
    assert first_ids and first_ids[0][0] < second[0]


def test_settle_reads_returns_once_what_this_thread_may_have_read_is_on_disk(syncs: Syncs, writer: JobStore) -> None:
    _submit(writer, "true")
    syncs.hold = True
    first, _ = _in_thread(lambda: _submit(writer, "one"))
    assert syncs.held.wait(10)  # committed, its fdatasync not yet done
    idle, _ = _in_thread(writer.settle_reads)  # a thread that has not read waits for nothing, syncs nothing
    idle.join(10)
    assert not idle.is_alive() and len(syncs.calls) == 2

    def read_then_settle() -> int:
        seen = len(writer.jobs(user="alice"))  # the commit is readable before its sync...
        writer.settle_reads()
        return seen

    reader, seen = _in_thread(read_then_settle)
    reader.join(0.3)
    # ...so the reader's settle returns only once an fdatasync begun after that commit has: the one
    # under way (the writer's), which it waits for instead of beginning a second (branch post4)
    assert reader.is_alive() and len(syncs.calls) == 2
    syncs.release.set()
    reader.join(10)
    first.join(10)
    assert seen == [2] and len(syncs.calls) == 2 and syncs.calls[-1][1] == 2
    assert writer._sync is not None and writer._sync.synced == writer._sync.committed == 2


def test_a_settle_begins_its_own_fdatasync_when_none_under_way_covers_what_was_committed(
        syncs: Syncs, writer: JobStore) -> None:
    _submit(writer, "true")
    sync = writer._sync
    assert sync is not None and len(syncs.calls) == 1
    sync.commit_made()  # a commit whose writer has not begun its sync yet: readable, not on disk
    writer.jobs(user="alice")
    writer.settle_reads()
    assert len(syncs.calls) == 2 and syncs.threads[-1] == threading.get_ident()
    assert sync.synced == sync.committed == 2


def test_callers_waiting_for_an_fdatasync_that_fails_are_refused_not_left_waiting(
        syncs: Syncs, writer: JobStore) -> None:
    _submit(writer, "true")
    syncs.hold = True
    refused: list[str] = []

    def refused_or_none(call) -> None:
        try:
            call()
        except StoreError as err:
            refused.append(str(err))

    first, _ = _in_thread(lambda: refused_or_none(lambda: _submit(writer, "one")))
    assert syncs.held.wait(10)
    reader, _ = _in_thread(lambda: refused_or_none(lambda: (writer.jobs(user="alice"), writer.settle_reads())))
    reader.join(0.3)
    assert reader.is_alive()  # waits for the writer's fdatasync
    syncs.fail = OSError(errno.EIO, "Input/output error")
    syncs.release.set()
    reader.join(10)
    first.join(10)
    assert not reader.is_alive() and len(refused) == 2 and all("could not be synced" in e for e in refused)
    assert len(syncs.calls) == 2  # the reader began none of its own: that one was the first to fail


def test_a_failed_fdatasync_refuses_that_write_and_every_later_one(syncs: Syncs, writer: JobStore) -> None:
    _submit(writer, "true")
    syncs.fail = OSError(errno.EIO, "Input/output error")
    with pytest.raises(StoreError, match="could not be synced"):
        _submit(writer, "one")
    syncs.fail = None  # a second fdatasync may succeed though the pages are lost: not trusted
    with pytest.raises(StoreError, match="could not be synced"):
        _submit(writer, "two")


def test_closing_the_store_waits_for_an_fdatasync_under_way_and_later_syncs_fail(path: Path, syncs: Syncs) -> None:
    """The WAL's descriptor is not closed under a sync (its number could be another file's by then)."""
    store = JobStore(path)
    _submit(store, "true")
    syncs.hold = True
    writing, ids = _in_thread(lambda: _submit(store, "one"))
    assert syncs.held.wait(10)
    closing, _ = _in_thread(store.close)
    closing.join(0.3)
    assert closing.is_alive()  # waits for the sync under way
    syncs.release.set()
    writing.join(10)
    closing.join(10)
    assert len(ids) == 1 and not closing.is_alive()
    assert store._sync is not None
    with pytest.raises(StoreError, match="closed"):
        store._sync.through(store._sync.committed + 1)  # a commit made after: its sync is refused


def test_a_store_without_durability_or_a_read_only_one_syncs_nothing(path: Path, syncs: Syncs) -> None:
    JobStore(path).close()
    throwaway = JobStore(path, durable=False)  # the simulator's: synchronous=OFF
    try:
        _submit(throwaway, "true")
        assert throwaway._con.execute("PRAGMA synchronous").get == 0
    finally:
        throwaway.close()
    reader = JobStore(path, readonly=True)
    try:
        reader.jobs(user="alice")
        reader.settle_reads()
    finally:
        reader.close()
    assert syncs.calls == []
