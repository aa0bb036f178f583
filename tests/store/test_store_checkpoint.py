"""The WAL is checkpointed by the store's own thread, never inside a writer's commit (store/checkpoint.py):
a one-job submit never pays for copying the WAL into the database file and syncing it, under the
store's lock. Checkpoints still happen (the WAL does not grow without end), and lose nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.support.store import T, spec
from xce_lite.store.checkpoint import BEHIND, PAGES
from xce_lite.store.db import connect
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import NewJob


def _submit(store: JobStore, count: int) -> list[int]:
    ids = []
    for i in range(count):
        ids += store.submit([NewJob(spec("true", name=f"j{i}"), "normal")], "alice", T + i)
    return ids


def _reopened_ids(path: Path) -> list[int]:
    """The ids of every job in the store at `path`, opened afresh; its integrity check must pass."""
    again = JobStore(path)
    try:
        assert again.integrity() == "ok"
        return [j.id for j in again.jobs(include_finished=True)]
    finally:
        again.close()


def test_commits_never_checkpoint_however_long_the_wal(path: Path) -> None:
    store = JobStore(path)
    try:
        store._checkpoints.close()  # its thread never starts: only the writer's commits could checkpoint
        before = path.read_bytes()
        _submit(store, 300)  # ~2,400 pages of WAL: SQLite's own checkpoint would have run at 1,000
        assert store._checkpoints._frames() > PAGES
        assert path.read_bytes() == before  # nothing copied into the database file
    finally:
        store.close()


def test_the_thread_checkpoints_and_loses_nothing(path: Path) -> None:
    store = JobStore(path)
    ids: list[int] = []
    try:
        frames = [0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the WAL starts again (after a whole checkpoint)
            ids += store.submit([NewJob(spec("true", name=f"j{len(ids)}"), "normal")], "alice", T)
            frames.append(store._checkpoints._frames())
            if frames[-1] < frames[-2]:
                break
        assert frames[-1] < frames[-2] and max(frames) >= PAGES  # not before the WAL held PAGES frames
        assert store._checkpoints.checkpoints >= 1 and store._checkpoints.failures == 0
    finally:
        store.close()
    assert _reopened_ids(path) == ids  # what the checkpoints copied and what the WAL held: all of it


def test_a_store_only_read_or_closed_at_once_starts_no_thread(path: Path) -> None:
    JobStore(path).close()
    store = JobStore(path)
    try:
        store.jobs()
        assert store._checkpoints._thread is None
    finally:
        store.close()
    reader = JobStore(path, readonly=True)
    try:
        assert reader._checkpoints is None
    finally:
        reader.close()


def test_a_wal_behind_a_writer_that_never_pauses_restarts_after_one_checkpoint(path: Path) -> None:
    """The WAL at BEHIND frames, a writer committing without a pause beside: ONE checkpoint as the
    thread runs it (the thread itself stopped: the test runs it) makes the WAL start again. A PASSIVE
    one could not: the writer adds frames while it copies, and SQLite restarts the WAL only after a
    checkpoint that copied all of it (under a loaded test run the WAL grew to 875,000 frames so)."""
    store = JobStore(path)
    ids: list[int] = []
    stop = threading.Event()

    def write_on() -> None:
        while not stop.is_set():
            ids.extend(store.submit([NewJob(spec("true", name=f"j{len(ids)}"), "normal")], "alice", T))

    con = None
    writer = threading.Thread(target=write_on)
    try:
        store._checkpoints.close()  # no thread: only this test checkpoints
        while store._checkpoints._frames() < BEHIND:
            ids += store.submit([NewJob(spec("true", name=f"j{len(ids)}"), "normal")], "alice", T)
        writer.start()
        con = connect(path, create=False)
        before = store._checkpoints._frames()
        store._checkpoints.checkpoint(con)
        assert store._checkpoints.full == 1
        deadline = time.monotonic() + 10
        while store._checkpoints._frames() >= before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store._checkpoints._frames() < before, "the WAL did not start again behind the writer"
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        if con is not None:
            con.close()
        store.close()
    assert _reopened_ids(path) == ids  # nothing lost by the checkpoint or the restart


def test_the_wal_starts_again_at_pages_behind_writers_that_never_pause(path: Path) -> None:
    """Two writers commit without a pause (as the API's submits, the tick and the agents' results
    do under load): the thread's checkpoints catch up with what was committed while each copied,
    so the WAL starts again (is overwritten from its start, the file no longer grows) soon after
    PAGES frames, not at BEHIND by a FULL checkpoint that stalls every writer. With one PASSIVE
    checkpoint per look, the WAL grew through BEHIND under bench/one_post.py's load."""
    store = JobStore(path)
    ids: list[list[int]] = [[], []]
    stop = threading.Event()

    def write_on(mine: list[int]) -> None:
        while not stop.is_set():
            mine.extend(store.submit([NewJob(spec("true", name=f"j{len(mine)}"), "normal")], "alice", T))

    writers = [threading.Thread(target=write_on, args=(mine,)) for mine in ids]
    frames = [0]
    try:
        for writer in writers:
            writer.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            frames.append(store._checkpoints._frames())
            if frames[-1] < frames[-2]:
                break
            time.sleep(0.001)
        assert frames[-1] < frames[-2], f"the WAL did not start again (at {frames[-1]} frames after 30 s)"
        assert max(frames) < BEHIND // 2 and store._checkpoints.full == 0
        assert store._checkpoints.catch_ups >= 1
    finally:
        stop.set()
        for writer in writers:
            if writer.is_alive():
                writer.join()
        store.close()
    assert sorted(_reopened_ids(path)) == sorted(ids[0] + ids[1])


@pytest.mark.parametrize("wal", ["past PAGES", "at BEHIND"])
def test_a_reader_on_an_old_snapshot_holds_no_writer_back_behind_a_full_checkpoint(path: Path, wal: str) -> None:
    """A long read keeps the snapshot it began with (`xceadmin check` beside a running controller, a
    listing of a large store): no checkpoint can copy what was committed since. A FULL one (the
    catch-up after a PASSIVE one that left frames behind; the one at BEHIND) would wait for that
    reader with SQLite's write lock held, and every submit with it, up to the busy timeout (10 s).
    It gives up after its bounded wait instead and leaves those frames to a later checkpoint, which
    copies everything once the reader is done."""
    store = JobStore(path)
    reader = connect(path, create=False, readonly=True)
    con = connect(path, create=False)
    ids: list[int] = []
    try:
        store._checkpoints.close()  # no thread: only this test checkpoints
        ids += _submit(store, 50)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM jobs").fetchall()  # its snapshot: these 50 jobs
        ids += _submit(store, 50)  # frames past the reader's snapshot
        while wal == "at BEHIND" and store._checkpoints._frames() < BEHIND:
            ids += _submit(store, 50)
        checkpoint = threading.Thread(target=store._checkpoints.checkpoint, args=(con,))
        checkpoint.start()
        time.sleep(0.3)  # the PASSIVE checkpoint is done by now (~800 frames); the FULL runs
        t0 = time.monotonic()
        ids += _submit(store, 1)
        waited = time.monotonic() - t0
        checkpoint.join(15)
        assert waited < 1.0, f"a submit waited {waited:.1f} s behind a checkpoint that waited for a reader"
        assert not checkpoint.is_alive() and store._checkpoints.full_busy == 1
        reader.execute("COMMIT")  # the reader is done: the next checkpoint copies everything
        store._checkpoints.checkpoint(con)
        assert store._checkpoints._copied() == store._checkpoints._frames() > 0
    finally:
        reader.close()
        con.close()
        store.close()
    assert _reopened_ids(path) == ids
