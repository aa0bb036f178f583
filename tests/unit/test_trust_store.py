"""The store's side of trust, on real SQLite files: read connections do not grow with the threads
that come and go, a request id stores its jobs once (whatever order the repeats come in), and an
old store gains the request table when opened."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from tests.support import paths
from tests.support.store import T
from xce_lite.errors import SpecError
from xce_lite.models import JobSpec
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import NewJob


def _job(name: str, indices: tuple[int, ...] = ()) -> NewJob:
    return NewJob(JobSpec(argv=("true",), cwd="/tmp", name=name, array="1-3" if indices else None), "normal", indices)


def _fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def test_read_connections_of_ended_threads_are_closed(store: JobStore):
    """Observed before: one read connection per thread, kept after the thread ended (the API made
    a thread per connection): 2 fds and ~177 KB each, forever."""
    store.submit([_job("a")], "alice", T)
    store.jobs()
    before = _fds()
    for _ in range(200):  # as the old server did: a thread per request, each reading once
        reader = threading.Thread(target=store.jobs)
        reader.start()
        reader.join()
    assert store.reader_count() <= 2  # this thread's, and at most the last ended thread's
    assert _fds() <= before + 4


def test_a_request_id_stores_its_jobs_once(store: JobStore):
    jobs = [_job("sweep", (1, 2, 3)), _job("after")]
    ids, new = store.submit_once(jobs, "alice", T, "req-0001")
    again, new_again = store.submit_once(jobs, "alice", T + 1, "req-0001")
    assert new and not new_again and again == ids == [1, 4]
    assert store.submitted("req-0001", "alice") == ids and store.submitted("req-0002", "alice") is None
    assert [j.id for j in store.jobs(include_finished=True)] == [1, 2, 3, 4]
    with pytest.raises(SpecError, match="another user"):
        store.submit_once(jobs, "bob", T, "req-0001")


def test_concurrent_repeats_of_one_request_store_one_copy(store: JobStore):
    results, start = [], threading.Barrier(8)

    def send() -> None:
        start.wait()
        results.append(store.submit_once([_job("same")], "alice", T, "req-race"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(new for _ids, new in results) == [False] * 7 + [True]
    assert {tuple(ids) for ids, _new in results} == {(1,)}
    assert len(store.jobs(include_finished=True)) == 1


def test_an_old_store_opens_with_the_request_table(tmp_path: Path):
    copy = tmp_path / "xce.db"
    shutil.copy(paths.DATA / "store_v1.db", copy)
    old = JobStore(copy)
    try:
        before = len(old.jobs(include_finished=True))
        _ids, new = old.submit_once([_job("x")], "alice", T, "req-old-store")
        assert new and len(old.jobs(include_finished=True)) == before + 1
        assert old.integrity(full=True) == "ok"
    finally:
        old.close()
