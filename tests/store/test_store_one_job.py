"""A one-job submit (one POST per job) is ONE call into SQLite (store/newjobs.py ONE_JOB_*, db.write_script):
the store's lock is held across no return to Python, and what it stores is what the general path
stores for the same job (every column but the id, the same `submitted` event). An error anywhere in
the script leaves nothing of it, and the ids go on after the highest retention archived."""

from __future__ import annotations

import apsw
import pytest

from tests.support.store import T, raw, spec
from xce_lite.errors import StoreUnavailable
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import NewJob


class _Calls:
    """The writer connection, counting the calls handed to it (and failing one that names `fail`)."""

    def __init__(self, con, fail: str | None = None) -> None:
        self.con, self.calls, self.fail = con, [], fail

    def execute(self, sql, *args, **kw):
        self.calls.append(sql)
        if self.fail is not None and self.fail in sql:
            raise apsw.FullError("database or disk is full")
        return self.con.execute(sql, *args, **kw)

    def executemany(self, sql, *args, **kw):
        self.calls.append(sql)
        return self.con.executemany(sql, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.con, name)


def _rows(store: JobStore, job_id: int) -> tuple[tuple, list[tuple]]:
    con = raw(store.path)
    try:
        job = con.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchall()[0]
        events = con.execute("SELECT time, kind, version, data FROM events WHERE job_id = ?", (job_id,)).fetchall()
    finally:
        con.close()
    return job[1:], events


@pytest.mark.parametrize("request_id", [None, "req-one-0001"])
def test_one_job_is_one_call_and_stores_what_the_general_path_stores(store: JobStore, request_id) -> None:
    job = NewJob(spec("echo", "hi", name="one", project="p1", stdout="/tmp/o"), "normal", (), {"all": [[7, "done"]]})
    held = NewJob(spec("true", hold=True), "normal")
    calls = store._con = _Calls(store._con)
    mine = []
    for item in (job, held):
        before = len(calls.calls)
        if request_id is None:
            ids = store.submit([item], "alice", T)
        else:
            ids, new = store.submit_once([item], "alice", T, f"{request_id}-{len(mine)}")
            assert new
        assert len(calls.calls) - before == 1  # BEGIN ... COMMIT in one call
        mine += ids
    # the general path for the same jobs (a `depends` computed from the ids takes it)
    theirs = [store.submit([item], "alice", T, depends=lambda ids, d=item.depend: [d])[0] for item in (job, held)]
    assert len(calls.calls) - 2 > 2 * 2  # it took several calls each
    for a, b in zip(mine, theirs):
        assert _rows(store, a) == _rows(store, b)
    assert mine == [1, 2] and theirs == [3, 4] and store.integrity() == "ok"
    assert store.jobs([2])[0].state == "PSUSP" and store.jobs([1])[0].spec.name == "one"


def test_a_failed_script_leaves_nothing_and_ids_go_on_after_the_archived(store: JobStore) -> None:
    store.submit([NewJob(spec("true"), "normal")], "alice", T)
    store.set_meta("job_id_floor", "41")  # retention archived up to job 41
    real = store._con
    store._con = _Calls(real, fail="INSERT INTO events")  # the disk full before the script began
    with pytest.raises(StoreUnavailable, match="cannot be written"):
        store.submit([NewJob(spec("true"), "normal")], "alice", T + 1)
    store._con = real
    # and in its middle: the job's row is in, its event is refused (a trigger of this connection alone)
    real.execute("CREATE TEMP TRIGGER refuse BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'refused'); END")
    with pytest.raises(apsw.ConstraintError, match="refused"):
        store.submit([NewJob(spec("true"), "normal")], "alice", T + 1)
    with pytest.raises(apsw.ConstraintError, match="refused"):
        store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 1, "req-one-0001")
    real.execute("DROP TRIGGER temp.refuse")
    assert not real.in_transaction and [j.id for j in store.jobs(include_finished=True)] == [1]
    assert store.request_count() == 0
    assert store.submit([NewJob(spec("true"), "normal")], "alice", T + 2) == [42]
    assert store.submit_once([NewJob(spec("true"), "normal")], "alice", T + 3, "req-one-0002") == ([43], True)
    assert store.integrity() == "ok"
