"""Migration 0012 (the jobs table's state rules as `=`/`<>` chains) on real SQLite files.

The rules judge every row as 0011's did; a store at 0011 with jobs in every state, and the v1
store, migrate with every row, index and trigger kept; a crash in the middle of the rebuild (the
migrating process killed with SIGKILL once the old table is dropped, its pages already in the WAL)
leaves the store at 0011, whole, and the next open migrates it.
"""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from tests.support.store import DATA, T, at_version, finish, raw, spec
from xce_lite.errors import StoreError
from xce_lite.models import DISP, DONE, PEND, RUN, STATES
from xce_lite.store import db
from xce_lite.store.jobs import JobStore

OLD = 11  # the schema before the rebuild


def fill(path: Path) -> None:
    """Jobs in every state (an array's elements among them), their events, a flow step naming a
    job, a request, an archived job: what a 0011 store holds after a while, written by raw SQL."""
    con = raw(path)
    con.execute("PRAGMA foreign_keys=ON")
    on = '[["h1", 2]]'
    rows = [  # id, state, hosts, unit, start, end, exit_code, reason, array_id, array_index, project
        (1, "PEND", None, None, None, None, None, None, None, None, None),
        (2, "PSUSP", None, None, None, None, None, "held at submission", None, None, "lab"),
        (3, "DISP", on, "xce-c-3-1-0", None, None, None, None, None, None, None),
        (4, "RUN", on, "xce-c-4-1-0", T + 2, None, None, None, None, None, None),
        (5, "USUSP", on, "xce-c-5-1-0", T + 2, None, None, "suspended by alice", None, None, None),
        (6, "SSUSP", on, "xce-c-6-1-0", T + 2, None, None, "load", None, None, None),
        (7, "DONE", on, "xce-c-7-1-0", T + 2, T + 9, 0, None, None, None, "lab/vision"),
        (8, "EXIT", None, None, None, T + 9, None, "killed by alice while pending", None, None, None),
        (9, "EXIT", on, "xce-c-9-1-0", T + 2, T + 9, 3, "exit code 3", 9, 1, None),
        (10, "RUN", on, "xce-c-10-1-0", T + 2, None, None, None, 9, 2, None),
        (11, "PEND", None, None, None, None, None, None, 9, 3, None),
    ]
    with con:
        con.execute("INSERT INTO meta VALUES ('cluster', 'c')")
        con.execute("INSERT INTO arrays VALUES (9, 'alice', ?, 3, NULL, ?)", (spec(array="1-3").to_json(), T))
        for (job_id, state, hosts, unit, start, end, code, reason, array_id, index, project) in rows:
            con.execute(
                "INSERT INTO jobs (id, user, queue, state, spec, slots, submit_time, attempt, hosts, unit, start_time, "
                "end_time, exit_code, reason, pend_reason, alloc, effective, array_id, array_index, name, depend, "
                "retries, project) VALUES (?, 'alice', 'normal', ?, ?, 2, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "?, ?, ?)",
                (job_id, state, "{}" if array_id else spec(f"j{job_id}").to_json(), T, 1 if hosts else 0, hosts, unit,
                 start, end, code, reason, "no slots" if state == "PEND" else None,
                 '{"h1": {"mem": 1}}' if hosts else None, '{"slots": 2}' if hosts else None, array_id, index,
                 f"n{job_id}", '{"op": "done", "ids": [1]}' if job_id == 11 else None, job_id % 2, project))
            con.execute("INSERT INTO events (job_id, time, kind, data) VALUES (?, ?, 'submitted', ?)",
                        (job_id, T, '{"user": "alice"}'))
            if hosts:
                con.execute("INSERT INTO events (job_id, time, kind, data) VALUES (?, ?, 'dispatched', NULL)",
                            (job_id, T + 1))
        con.execute("INSERT INTO flows VALUES (1, 'f', 'alice', ?, NULL)", (T,))
        con.execute("INSERT INTO flow_steps VALUES (1, 0, 'a', 1, 0, NULL, '[]')")
        con.execute("INSERT INTO submit_requests VALUES ('r1', 'alice', '[1]', ?, NULL)", (T,))
        con.execute("INSERT INTO jobs_archive (id, user, queue, state, submit_time, end_time, exit_code, slots) "
                    "VALUES (100, 'alice', 'normal', 'DONE', ?, ?, 0, 1)", (T, T + 1))
        con.execute("INSERT INTO events_archive VALUES (100, 1, ?, 'submitted', 1, NULL)", (T,))
    con.close()


def contents(path: Path) -> dict:
    """Every table's rows, and the schema: each object's SQL but the jobs table's, whose columns
    (name, type, not null, default, key) stand for it."""
    con = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        objects = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name").fetchall()
        tables = [name for kind, name, _, _ in objects if kind == "table" and not name.startswith("sqlite_")]
        return {"rows": {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}"))) for t in tables},
                "schema": [o for o in objects if o[1] != "jobs"],
                "jobs columns": con.execute("PRAGMA table_xinfo(jobs)").fetchall(),
                "version": con.execute("PRAGMA user_version").get,
                "jobs sql": con.execute("SELECT sql FROM sqlite_schema WHERE name = 'jobs'").get,
                "integrity": con.execute("PRAGMA integrity_check").get,
                "broken references": con.execute("PRAGMA foreign_key_check").fetchall()}
    finally:
        con.close()


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    path = tmp_path / "v11.db"
    at_version(path, OLD)
    fill(path)
    return path


# ---- the rules ---------------------------------------------------------------------------------

INSERT = ("INSERT INTO jobs (id, user, queue, state, spec, slots, submit_time, hosts, unit, start_time, end_time, "
          "exit_code) VALUES (1, 'alice', 'normal', ?, '{}', 1, 0, ?, ?, ?, ?, ?)")
UPDATE = "UPDATE jobs SET state = ?, hosts = ?, unit = ?, start_time = ?, end_time = ?, exit_code = ? WHERE id = 1"
CASES = list(itertools.product(
    sorted(STATES) + ["pend", "ZOMBIE", "", None],  # state
    [None, '[["h1", 1]]', "not json"],  # hosts
    [None, "u"],  # unit
    [None, 1.0],  # start_time
    [None, 2.0],  # end_time
    [None, 0, 1]))  # exit_code


RULES = {  # a phrase of each rule's text, as the message names it (0011's and 0012's), -> the rule
    "NOT NULL constraint failed: jobs.state": "state is not null",
    "state IN (": "a known state", "state = 'PEND' OR": "a known state",
    "hosts IS NOT NULL AND unit IS NOT NULL": "DISP..SSUSP have hosts and unit",
    "OR start_time IS NOT NULL": "RUN, USUSP, SSUSP have started",
    "OR end_time IS NOT NULL": "DONE, EXIT have ended",
    "state <> 'DONE' OR exit_code IS 0": "DONE has exit code 0",
    "json_valid(hosts)": "hosts is JSON",
}


def rule(message: str) -> str:
    [found] = {name for phrase, name in RULES.items() if phrase in message} or {message}
    return found


def verdicts(path: Path) -> list[tuple[str, str]]:
    """What the jobs table says to each case, as a new row and as a PEND row changed into it."""
    con = raw(path)
    try:
        out = []
        for case in CASES:
            for write in ("insert", "update"):
                con.execute("SAVEPOINT t")
                try:
                    if write == "update":
                        con.execute(INSERT, ("PEND", None, None, None, None, None))
                        con.execute(UPDATE, case)
                    else:
                        con.execute(INSERT, case)
                    out.append((write, "ok"))
                except apsw.ConstraintError as err:
                    out.append((write, rule(str(err))))
                con.execute("ROLLBACK TO t; RELEASE t")
        return out
    finally:
        con.close()


def test_the_rules_judge_every_combination_as_the_old_ones_did(tmp_path: Path) -> None:
    at_version(tmp_path / "old.db", OLD)
    JobStore(tmp_path / "new.db").close()
    old, new = verdicts(tmp_path / "old.db"), verdicts(tmp_path / "new.db")
    assert len(old) == 2 * len(CASES)
    assert old == new
    assert set(RULES.values()) | {"ok"} == {verdict for _, verdict in old}  # each rule judged some case
    jobs_sql = contents(tmp_path / "new.db")["jobs sql"]
    assert " IN (" not in jobs_sql and "state <> 'DONE' OR exit_code IS 0" in jobs_sql


# ---- migrating ---------------------------------------------------------------------------------

def test_a_0011_store_with_jobs_in_every_state_migrates_with_everything_kept(old_store: Path) -> None:
    before = contents(old_store)
    assert {row.split(", ")[3] for row in before["rows"]["jobs"]} == {repr(s) for s in STATES}
    store = JobStore(old_store)
    store.close()
    after = contents(old_store)
    assert after["version"] == db.latest_version() > OLD
    assert after["jobs sql"] != before["jobs sql"] and " IN (" not in after["jobs sql"]
    for key in ("rows", "jobs columns"):
        assert after[key] == before[key], key
    # every other object as it was; jobs_unfinished is 0013's to redefine (test_store_unfinished_index.py)
    assert [o for o in after["schema"] if o[1] != "jobs_unfinished"] == \
        [o for o in before["schema"] if o[1] != "jobs_unfinished"]
    assert [o[1] for o in after["schema"]] == [o[1] for o in before["schema"]]
    assert (after["integrity"], after["broken references"]) == ("ok", [])
    # and it works: the rules hold, and the store's writes go on
    store = JobStore(old_store)
    try:
        assert store.dispatch([(1, 1, [["h1", 1]], "xce-c-1-1-0")], T + 10) == [1]
        assert store.finish([finish(4, end_time=T + 11)], T + 11) == [4]
        assert store.submit([(spec("new"), "normal")], "bob", T + 12) == [12]
        assert (store.get(1).state, store.get(4).state, store.get(12).state) == (DISP, DONE, PEND)
        assert [kind for _, kind, _ in store.events(4)] == ["submitted", "dispatched", "finished"]
        with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed"), store._write() as con:
            con.execute("UPDATE jobs SET state = 'RUN', start_time = NULL WHERE id = 1")  # RUN never started
    finally:
        store.close()
    assert contents(old_store)["rows"]["flow_steps"] == before["rows"]["flow_steps"]


def test_the_v1_store_migrates_with_its_rows_kept(tmp_path: Path) -> None:
    copy = tmp_path / "store_v1.db"
    shutil.copyfile(DATA / "store_v1.db", copy)
    con = raw(copy)
    v1_rows = con.execute("SELECT * FROM jobs ORDER BY id").fetchall()
    v1_events = con.execute("SELECT * FROM events ORDER BY seq").fetchall()
    con.close()
    JobStore(copy).close()
    con = raw(copy)
    try:
        width = len(v1_rows[0])  # schema 1's columns come first, in their order
        assert [row[:width] for row in con.execute("SELECT * FROM jobs ORDER BY id")] == v1_rows
        assert con.execute("SELECT seq, job_id, time, kind, version, data FROM events ORDER BY seq").fetchall() \
            == v1_events
        assert " IN (" not in con.execute("SELECT sql FROM sqlite_schema WHERE name = 'jobs'").get
    finally:
        con.close()


CRASH = """
import os, signal, sys
from pathlib import Path
import apsw

def crash_in_the_rebuild(con):
    con.execute("PRAGMA cache_size=2")  # a small cache: the rebuild's pages spill into the WAL as it goes
    def trace(cursor, sql, bindings):
        if sql.lstrip().startswith("ALTER TABLE jobs_v12 RENAME"):  # the old table is dropped by now
            os.kill(os.getpid(), signal.SIGKILL)
        return True
    con.exec_trace = trace

apsw.connection_hooks.append(crash_in_the_rebuild)
from xce_lite.store.jobs import JobStore
JobStore(Path(sys.argv[1]))
"""


def test_a_crash_in_the_middle_of_the_rebuild_leaves_the_old_store_whole(old_store: Path) -> None:
    con = raw(old_store)  # many rows, so that the rebuild writes many pages
    with con:
        con.executemany("INSERT INTO jobs (id, user, queue, state, spec, slots, submit_time) "
                        "VALUES (?, 'bob', 'normal', 'PEND', ?, 1, ?)",
                        [(i, spec(env={"PAD": "x" * 200}).to_json(), T) for i in range(1000, 3000)])
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # an empty WAL: what grows next is the migration's
    con.close()
    before = contents(old_store)
    run = subprocess.run([sys.executable, "-c", CRASH, str(old_store)], capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert Path(f"{old_store}-wal").stat().st_size > 100 * 4096  # it died with the rebuild's pages written
    assert contents(old_store) == before  # version 11, the old rules, every row
    JobStore(old_store).close()  # the next open migrates it
    after = contents(old_store)
    assert after["version"] == db.latest_version()
    assert (after["rows"], after["integrity"]) == (before["rows"], "ok")


def test_a_migration_that_would_break_a_reference_changes_nothing(old_store: Path, monkeypatch) -> None:
    JobStore(old_store).close()  # at the latest version; then one more migration that breaks a reference
    shipped = db.migrations()
    breaking = (len(shipped) + 1, f"{len(shipped) + 1:04d}_breaking.sql",
                "DELETE FROM jobs WHERE id = (SELECT min(job_id) FROM events);")
    monkeypatch.setattr(db, "migrations", lambda: [*shipped, breaking])
    before = contents(old_store)
    with pytest.raises(StoreError, match=rf"migration {breaking[1]} would leave \d+ broken reference.*"
                                         r"nothing was changed"):
        JobStore(old_store)
    assert contents(old_store) == before


def test_a_reference_broken_before_a_migration_neither_blocks_it_nor_is_blamed_on_it(old_store: Path) -> None:
    con = raw(old_store)  # a dangling reference, which the store's own writes never make
    con.execute("INSERT INTO events (job_id, time, kind) VALUES (999, 0, 'submitted')")
    con.close()
    before = contents(old_store)
    JobStore(old_store).close()
    after = contents(old_store)
    assert after["version"] == db.latest_version()
    assert (after["rows"], after["integrity"]) == (before["rows"], "ok")
    assert len(before["broken references"]) == 1  # the one written above, still there, and no other
    assert after["broken references"] == before["broken references"]


def test_foreign_keys_are_on_again_after_migrating(old_store: Path) -> None:
    store = JobStore(old_store)
    try:
        with pytest.raises(apsw.ConstraintError, match="FOREIGN KEY"), store._write() as con:
            con.execute("INSERT INTO events (job_id, time, kind) VALUES (999, 0, 'submitted')")
        assert store.get(4).state == RUN
    finally:
        store.close()
