"""The store under faults, on real SQLite files: a write lock held by another process, a full file
system (a tmpfs of our own), and kill wins (a killed job is never requeued, whatever asks)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.support.faults import small_tmpfs, write_lock_held
from tests.support.store import T, running, spec
from xce_lite.errors import StoreError, StoreUnavailable
from xce_lite.models import DISP, EXIT, PEND, RUN
from xce_lite.store.jobs import JobStore, Requeue, TickWrites


def test_a_requeue_of_a_killed_job_ends_it_exit_with_the_kill_reason(store: JobStore) -> None:
    a, b = running(store, count=2)
    store.record_event(a, "kill_requested", T + 3, {"by": "alice", "reason": "killed by alice"})
    record = store.record_tick(TickWrites(T + 5, requeues=[Requeue(a, RUN, "host h1 lost: no agent for 5m"),
                                                           Requeue(b, RUN, "host h1 lost: no agent for 5m")]))
    assert (record.requeued, record.killed) == ((b,), (a,))
    job = store.get(a)
    assert job.state == EXIT and job.reason == "killed by alice (not requeued: host h1 lost: no agent for 5m)"
    assert store.events(a)[-1][1] == "finished"
    assert store.get(b).state == PEND


def test_a_kill_before_the_last_dispatch_does_not_hold_the_next_attempt(store: JobStore) -> None:
    (a,) = running(store)
    store.record_event(a, "kill_requested", T + 3, {"by": "bob"})  # an old event names only who killed
    assert store.kill_requested([a]) == {a: "killed by bob"}
    store.change_state([a], RUN, PEND, "requeued", T + 4)  # as a controller before kill-wins could
    assert store.dispatch([(a, 2, [["h1", 1]], "xce-t-1-2-0")], T + 5) == [a]
    assert store.kill_requested([a]) == {}
    assert store.requeue([Requeue(a, DISP, "host h1 lost")], T + 6) == [a]


def test_a_write_lock_held_by_another_process_is_store_unavailable_and_writes_nothing(store: JobStore) -> None:
    store.impatient = True  # as the controller sets it once a commit failed: 1 s, not 10
    with write_lock_held(store.path):
        with pytest.raises(StoreUnavailable, match="locked by another process"):
            store.submit([(spec(), "normal")], "alice", T)
        assert store.jobs(None, user="alice") == []  # reads go on
    assert store.submit([(spec(), "normal")], "alice", T) == [1]


def test_a_full_file_system_is_store_unavailable_and_the_store_carries_on_when_space_is_back(tmp_path: Path):
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        store = JobStore(fs / "xce.db")
        try:
            (a,) = running(store)
            filler = fs / "filler"
            with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
                while f.write(b"\0" * 4096):
                    pass
            big = spec("echo", "x" * 200_000)  # more than the last free pages
            with pytest.raises(StoreUnavailable, match="FullError") as caught:
                store.submit([(big, "normal")] * 4, "alice", T)
            assert isinstance(caught.value, StoreError) and "free disk space" in str(caught.value)
            assert [j.id for j in store.jobs(None, user="alice")] == [a]  # nothing half-written; reads go on
            filler.unlink()
            assert len(store.submit([(big, "normal")] * 4, "alice", T)) == 4
            assert store.integrity() == "ok"
        finally:
            store.close()
