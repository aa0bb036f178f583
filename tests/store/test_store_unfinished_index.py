"""Migration 0013: the index of unfinished jobs keyed by id, on real SQLite files.

A tick that moves neighbouring jobs through PEND -> DISP -> RUN -> DONE rewrites one page of
it, not one per state (read from the WAL's own frames); the reads of unfinished jobs that the
store really runs use it (their SQL caught by apsw's trace, then EXPLAIN QUERY PLAN), and the
queries that used an index before still do; an old store (v1, and one at 0012 with jobs in every
state) migrates to it with the same unfinished jobs read back, in the same order.
"""

from __future__ import annotations

import functools
import shutil
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.store import DATA, T, at_version, finish, raw, spec
from xce_lite.models import DISP, DONE, PEND, RUN
from xce_lite.store import archive, db
from xce_lite.store.jobs import JobStore, TickWrites

NEW_INDEX = "CREATE INDEX jobs_unfinished ON jobs (id) WHERE state NOT IN ('DONE', 'EXIT')"


def wal_pages(path: Path) -> list[int]:
    """The page number of every frame in the store's WAL (its header: 32 bytes; a frame: 24 + a page)."""
    data = Path(f"{path}-wal").read_bytes()
    if not data:  # truncated by a checkpoint
        return []
    size = struct.unpack(">I", data[8:12])[0]
    return [struct.unpack(">I", data[at:at + 4])[0] for at in range(32, len(data) - size - 23, 24 + size)]


def pages_of(store: JobStore, name: str) -> set[int]:
    return {page for (page,) in store._con.execute("SELECT pageno FROM dbstat WHERE name = ?", (name,))}


def written_by(store: JobStore, write: Callable[[], object]) -> Counter[str]:
    """The b-trees whose pages `write` (one commit) put into the WAL, emptied before it: frames of each."""
    store._con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert wal_pages(store.path) == []
    owners = {page: name for name, page in store._con.execute("SELECT name, pageno FROM dbstat")}
    write()
    return Counter(owners.get(page, "a new page") for page in wal_pages(store.path))


def test_a_tick_of_neighbouring_jobs_rewrites_one_page_of_the_index(store: JobStore) -> None:
    """With a backlog, a 2-slot tick (dispatch n, start n-1, finish n-2) wrote two of its pages
    keyed by (state, id) (PEND, DISP and RUN entries far apart), one keyed by id."""
    store._checkpoints.close()  # the WAL is this test's to checkpoint (store/checkpoint.py's thread would too)
    ids = store.submit([(spec(), "normal")] * 2000, "alice", T)
    assert len(pages_of(store, "jobs_unfinished")) > 2
    for i in range(20):
        finishes = [(finish(ids[i - 2], end_time=T + i), "finished")] if i >= 2 else []
        started = [(ids[i - 1], T + i)] if i >= 1 else []
        tick = TickWrites(T + i, finishes, started, [(ids[i], 1, [["h1", 1]], f"xce-t-{ids[i]}-1-0")])
        touched = written_by(store, functools.partial(store.record_tick, tick))
        assert touched["jobs_unfinished"] == 1, (i, touched)
    assert [j.state for j in store.jobs(ids[17:21])] == [DONE, RUN, DISP, PEND]
    assert [j.id for j in store.unfinished()] == ids[18:]


def plans_of(store: JobStore, read: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """(SQL, its query plan's steps) of each statement `read` runs on this thread's read connection."""
    con = store._reader()
    ran: list[tuple[str, tuple]] = []
    con.exec_trace = lambda _cursor, sql, bindings: ran.append((sql, bindings or ())) or True
    try:
        read()
    finally:
        con.exec_trace = None
    return [(sql, [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + sql, bindings)]) for sql, bindings in ran]


def assert_plans(store: JobStore) -> None:
    """The store's reads of unfinished jobs scan jobs_unfinished (in id order: no sort); those that
    searched another index before 0013 still do."""
    for read, uses in ((store.unfinished, "SCAN jobs USING INDEX jobs_unfinished"),
                       (store.jobs, "SCAN jobs USING INDEX jobs_unfinished"),
                       (store.counts_by_queue, "SCAN jobs USING INDEX jobs_unfinished"),
                       (store.counts_by_project, "SCAN jobs USING INDEX jobs_unfinished"),
                       (lambda: store.jobs(user="alice"), "SEARCH jobs USING INDEX jobs_user (user=?)"),
                       (lambda: store.jobs(project="lab"), "SEARCH jobs USING INDEX jobs_project (project=?)"),
                       (lambda: store.jobs([1, 2]), "SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)")):
        (sql, plan), = plans_of(store, read)
        assert uses in plan, (sql, plan)
        if "jobs_unfinished" in uses and "ORDER BY id" in sql:
            assert not any("TEMP B-TREE" in step for step in plan), plan
    # retention's candidates: the unfinished jobs' dependencies, through the index as before 0013
    plan = [row[3] for row in store._reader().execute("EXPLAIN QUERY PLAN " + archive._CANDIDATES, (T, 10))]
    assert "SCAN u USING INDEX jobs_unfinished" in plan
    assert "SEARCH j USING INDEX jobs_finished_end (end_time<?)" in plan


def test_the_reads_of_unfinished_jobs_use_the_index(store: JobStore) -> None:
    store.submit([(spec(project="lab"), "normal")] * 3, "alice", T)
    assert_plans(store)


def index_sql(path: Path) -> str:
    con = raw(path)
    try:
        return con.execute("SELECT sql FROM sqlite_schema WHERE name = 'jobs_unfinished'").get
    finally:
        con.close()


@pytest.mark.parametrize("old", ["v1", "0012"])
def test_an_old_store_migrates_to_the_index_with_its_unfinished_jobs_read_back(tmp_path: Path, old: str) -> None:
    path = tmp_path / "old.db"
    if old == "v1":
        shutil.copyfile(DATA / "store_v1.db", path)
    else:  # a store at 0012 with jobs in every state, written by raw SQL
        at_version(path, 12)
        con = raw(path)
        with con:
            for job_id, state in enumerate(("PEND", "PSUSP", "DISP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT",
                                            "PEND"), start=1):
                placed = state not in ("PEND", "PSUSP")
                con.execute(
                    "INSERT INTO jobs (id, user, queue, state, spec, slots, submit_time, hosts, unit, start_time, "
                    "end_time, exit_code, project) VALUES (?, 'alice', 'normal', ?, ?, 1, ?, ?, ?, ?, ?, ?, ?)",
                    (job_id, state, spec(f"j{job_id}").to_json(), T, '[["h1", 1]]' if placed else None,
                     f"xce-c-{job_id}-1-0" if placed else None, T + 1 if placed and state != "DISP" else None,
                     T + 2 if state in ("DONE", "EXIT") else None, 0 if state == "DONE" else None,
                     "lab" if job_id % 2 else None))
        con.close()
    assert index_sql(path).startswith("CREATE INDEX jobs_unfinished ON jobs (state, id)")
    con = raw(path)
    before = con.execute("SELECT id, state FROM jobs WHERE state NOT IN ('DONE', 'EXIT') ORDER BY id").fetchall()
    con.close()
    store = JobStore(path)
    try:
        assert index_sql(path) == NEW_INDEX
        assert store._con.execute("PRAGMA user_version").get == db.latest_version() >= 13
        assert store.integrity(full=True) == "ok"
        assert [(j.id, j.state) for j in store.unfinished()] == [tuple(row) for row in before]
        # the index holds exactly the unfinished jobs
        assert store._con.execute("SELECT id, state FROM jobs INDEXED BY jobs_unfinished "
                                  "WHERE state NOT IN ('DONE', 'EXIT') ORDER BY id").fetchall() == before
        assert_plans(store)
        pending = before[0][0]
        assert before[0][1] == PEND and store.dispatch([(pending, 9, [["h1", 1]], "xce-m-1-9-0")], T + 10) == [pending]
        assert store.get(pending).state == DISP
    finally:
        store.close()
