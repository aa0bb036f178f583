"""Idempotent submission: the store's side of request ids (sql/0008, sql/0011). JobStore inherits it.

A client sends a request id with a submission; the ids of the jobs it stored are written under it in
the SAME transaction as the jobs, so a repeat after a lost reply finds them and stores nothing. A
job submission's reply is rebuilt from its ids; a flow's (submit or rescue) is kept whole in `reply`,
because its steps' names may be archived with the flow before the request is forgotten.

Invariants: a request id names one user's one submission of one kind (jobs, or a flow); a repeat of
another kind or by another user is refused, never answered with someone else's ids. Rows older than
`controller.keep_requests` are deleted oldest first, in bounded batches (`prune_requests`), so the
table holds about that window's submissions; a client retries for seconds, so a far shorter window
would do, and a repeat inside it is still answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import apsw

from xce_lite.errors import SpecError, StoreUnavailable
from xce_lite.store.newjobs import ONE_JOB_CLAIMED, one_job, one_plain
from xce_lite.store.workflows import FlowRecord, NewJob

JOBS, FLOW = "jobs", "flow"  # what a request id was used for: a reply is stored for a flow only


class RequestStore:
    def _write(self):  # provided by JobStore
        raise NotImplementedError

    def _reader(self) -> apsw.Connection:  # provided by JobStore
        raise NotImplementedError

    def _insert(self, con, jobs, user, now, depends, flow) -> list[int]:  # provided by JobStore
        raise NotImplementedError

    def _write_script(self, script: str, bindings: dict) -> list[tuple]:  # provided by JobStore
        raise NotImplementedError

    def submit_once(self, jobs: Sequence[NewJob], user: str, now: float, request_id: str,
                    depends=None) -> tuple[list[int], bool]:
        """`submit`, remembering `request_id` in the same transaction: (ids, True) when stored now;
        (the ids stored the first time, False) when the request id was seen before, storing nothing.
        SpecError if another user sent that request id, or sent it with a flow.

        A new request id (nearly every one) costs no lookup: the jobs are inserted and the id claimed
        (`_claim`; for one plain job, all of it in one call into SQLite: newjobs.ONE_JOB_CLAIMED, whose
        claim of an id seen before fails on its key and rolls back the job); only an id that is
        already there rolls that back and is looked up, under the write lock as before, so a repeat
        stores nothing and is answered (or refused) as before."""
        one = one_plain(jobs, depends, None)
        while True:
            try:
                if one is not None:  # one call into SQLite (db.write_script); a repeat fails on the claim's key
                    rows = self._write_script(ONE_JOB_CLAIMED, {**one_job(one, one.depend, user, now),
                                                                "request_id": request_id})
                    return [rows[0][0]], True
                with self._write() as con:
                    ids = self._insert(con, jobs, user, now, depends, None)
                    if not _claim(con, request_id, user, ids, now):
                        raise _Seen  # rolls the jobs back: the first submission stored them
                return ids, True
            except _Seen:
                pass
            except apsw.ConstraintError as err:  # rolled back; the one-job script's claim of an id seen before?
                if one is None or _CLAIMED not in str(err):
                    raise
            except StoreUnavailable:  # a repeat needs no write: answered while the store refuses them
                found = _request(self._reader(), request_id, user, JOBS)
                if found is None:
                    raise
                return found[0], False
            with self._write() as con:
                found = _request(con, request_id, user, JOBS)
            if found is not None:
                return found[0], False
            # forgotten in between (prune_requests): a new submission after all

    def submitted(self, request_id: str, user: str) -> list[int] | None:
        """The ids a job submission with this request id stored, or None if none did."""
        found = _request(self._reader(), request_id, user, JOBS)
        return found[0] if found is not None else None

    def submit_flow_once(self, jobs: Sequence[NewJob], user: str, now: float, request_id: str, depends,
                         flow: FlowRecord, reply: Callable[[list[int]], dict]) -> tuple[dict, bool]:
        """`submit` of a flow, remembering `request_id` and the reply (`reply(ids)`) in the same
        transaction: (that reply, True) when stored now; (the first reply, False) when the request
        id was seen before, storing nothing."""
        with self._write() as con:
            found = _request(con, request_id, user, FLOW)
            if found is not None and found[1] is not None:  # a flow's row always has its reply
                return found[1], False
            ids = self._insert(con, jobs, user, now, depends, flow)
            answer = reply(ids)
            _remember(con, request_id, user, ids, now, answer)
        return answer, True

    def flow_submitted(self, request_id: str, user: str) -> dict | None:
        """The reply a flow submission with this request id got, or None if there was none."""
        found = _request(self._reader(), request_id, user, FLOW)
        return found[1] if found is not None else None

    def prune_requests(self, cutoff: float, batch: int) -> int:
        """Forget at most `batch` request ids sent before `cutoff`, oldest first (one transaction);
        how many went. A full batch means more may be waiting."""
        with self._write() as con:
            con.execute("DELETE FROM submit_requests WHERE request_id IN (SELECT request_id FROM submit_requests "
                        "WHERE submit_time < ? ORDER BY submit_time LIMIT ?)", (cutoff, batch))
            return con.changes()

    def request_count(self) -> int:
        """Request ids remembered now (for tests and `xceadmin`-style checks)."""
        return self._reader().execute("SELECT count(*) FROM submit_requests").get


def _request(con: apsw.Connection, request_id: str, user: str, kind: str) -> tuple[list[int], dict | None] | None:
    row = con.execute("SELECT user, job_ids, reply FROM submit_requests WHERE request_id = ?",
                      (request_id,)).fetchone()
    if row is None:
        return None
    if row[0] != user:
        raise SpecError(f"request id {request_id!r} was used by another user's submission; send a new one")
    used = FLOW if row[2] is not None else JOBS
    if used != kind:
        raise SpecError(f"request id {request_id!r} was used for a {'flow' if used == FLOW else 'job'} submission, "
                        f"not this {'flow' if kind == FLOW else 'job'} submission; send a new one")
    return json.loads(row[1]), (json.loads(row[2]) if row[2] is not None else None)


_CLAIMED = "submit_requests.request_id"  # the key a repeat's claim fails on (a UNIQUE constraint's message)


class _Seen(Exception):
    """The request id is in submit_requests already: the transaction that found it is rolled back."""


def _claim(con: apsw.Connection, request_id: str, user: str, ids: list[int], now: float) -> bool:
    """Remember a job submission's request id, unless it is there already: whether it was new. One
    statement for a new id (no SELECT before it: one-POST-per-job submits are mostly new ones)."""
    con.execute("INSERT INTO submit_requests(request_id, user, job_ids, submit_time) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(request_id) DO NOTHING",
                (request_id, user, _ids_text(ids), now))
    return con.changes() == 1


def _remember(con: apsw.Connection, request_id: str, user: str, ids: list[int], now: float,
              reply: dict | None) -> None:
    con.execute("INSERT INTO submit_requests(request_id, user, job_ids, submit_time, reply) VALUES (?, ?, ?, ?, ?)",
                (request_id, user, _ids_text(ids), now,
                 json.dumps(reply, ensure_ascii=True) if reply is not None else None))


def _ids_text(ids: list[int]) -> str:
    """The ids as JSON: json.dumps' text, without it."""
    return "[" + ", ".join(map(str, ids)) + "]"
