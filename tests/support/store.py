"""Builders for the store's tests: a fixed clock value `T`, job specs, finishes, jobs taken to RUN,
raw connections that skip the store's checks, and what the old store tests/data/store_v1.db holds
(`V1_JOBS`, which every future schema must still read back exactly)."""

from __future__ import annotations

from pathlib import Path

import apsw

from tests.support import paths
from xce_lite.models import DISP, DONE, EXIT, PEND, PSUSP, RUN, JobSpec
from xce_lite.store import db
from xce_lite.store.jobs import Finish, JobStore

T = 1_700_000_000.0
DATA = paths.DATA


def spec(*argv: str, **fields) -> JobSpec:
    return JobSpec(argv=argv or ("sleep", "1"), cwd="/home/alice", **fields)


def finish(job_id: int, from_state: str = RUN, state: str = DONE, exit_code: int | None = 0, **fields) -> Finish:
    values = {"start_time": None, "end_time": T + 10, "exit_code": exit_code, "exit_signal": None,
              "cpu_time": 1.5, "max_rss": 4096, "reason": None}
    values.update(fields)
    return Finish(job_id=job_id, from_state=from_state, state=state, **values)


def raw(path: Path) -> apsw.Connection:
    """A plain apsw connection, none of the store's checks: for writing what the store never would."""
    return apsw.Connection(str(path))


def at_version(path: Path, version: int) -> None:
    """A new store at schema `version`, made as store/db.py made it then: each migration in one
    transaction with its version bump."""
    con = raw(path)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        for number, _name, sql in db.migrations()[:version]:
            con.execute("BEGIN IMMEDIATE")
            con.execute(sql)
            con.execute(f"PRAGMA application_id={db.APPLICATION_ID}; PRAGMA user_version={number}")
            con.execute("COMMIT")
    finally:
        con.close()


def running(store: JobStore, count: int = 1, slots: int = 1) -> list[int]:
    """`count` jobs taken through submit, dispatch and started: RUN on h1."""
    ids = store.submit([(spec(slots=slots), "normal")] * count, "alice", T)
    store.dispatch([(i, 1, [["h1", slots]], f"xce-t-{i}-1-0") for i in ids], T + 1)
    store.started([(i, T + 2) for i in ids], T + 2)
    return ids


# What data/store_v1.db holds. It was made once, through JobStore at schema 1, by submitting twelve
# jobs as alice at T and moving them with the store's own writes: never regenerate it, add a new
# fixture for a new schema instead. (USUSP and SSUSP have no event kind in schema 1, so no job is in
# either.)  id: (state, queue, argv, hosts, unit, start_time, end_time, exit_code, reason, events)
V1_JOBS = {
    1: (PEND, "normal", ("sleep", "60"), (), None, None, None, None, None, ["submitted"]),
    2: (PEND, "normal", ("sleep", "61"), (), None, None, None, None, None, ["submitted"]),
    3: (PSUSP, "normal", ("sleep", "62"), (), None, None, None, None, "held at submission", ["submitted"]),
    4: (PSUSP, "normal", ("sleep", "63"), (), None, None, None, None, "held by alice", ["submitted", "held"]),
    5: (DISP, "high", ("./big.sh",), (("h1", 2),), "xce-fixture-5-1-0", None, None, None, None,
        ["submitted", "dispatched"]),
    6: (RUN, "normal", ("./run.sh",), (("h1", 1),), "xce-fixture-6-1-0", T + 3, None, None, None,
        ["submitted", "dispatched", "started", "kill_requested"]),
    7: (DONE, "normal", ("true",), (("h1", 1),), "xce-fixture-7-1-0", T + 3, T + 5, 0, None,
        ["submitted", "dispatched", "started", "finished"]),
    8: (EXIT, "normal", ("false",), (("h1", 1),), "xce-fixture-8-1-0", T + 3, T + 5, 3, "exit code 3",
        ["submitted", "dispatched", "started", "finished"]),
    9: (EXIT, "normal", ("sleep", "64"), (), None, None, T + 6, None, "killed by alice while pending",
        ["submitted", "killed_pending"]),
    10: (EXIT, "normal", ("/no/such",), (("h1", 1),), "xce-fixture-10-1-0", None, T + 6, None,
         "no such file: /no/such", ["submitted", "dispatched", "launch_failed"]),
    11: (EXIT, "normal", ("sleep", "65"), (("h1", 1),), "xce-fixture-11-1-0", T + 3, T + 7, None, "host h1 lost",
         ["submitted", "dispatched", "started", "lost"]),
    12: (PEND, "normal", ("printf", "a\nb", "'\"", "é☃", "\udcff"), (), None, None, None, None, None,
         ["submitted"]),
}
