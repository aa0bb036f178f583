"""The job store: every query xce_lite makes. The controller is its only writer.

Each state change is `UPDATE ... WHERE id = ? AND state = ?` and counts the rows it changed, so a
change based on a stale view is refused instead of applied twice; its event is written in the same
transaction. Writes take one lock (the controller's threads share one writer connection); reads use
a read-only connection per thread, which WAL lets run beside the writer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import apsw

from xce_lite.models import FINISHED_STATES, Job, JobSpec
from xce_lite.store.db import connect, write

_COLUMNS = ("id, user, queue, state, spec, submit_time, attempt, hosts, unit, start_time, end_time, "
            "exit_code, exit_signal, cpu_time, max_rss, reason, pend_reason, alloc, effective")
_FINISHED = tuple(sorted(FINISHED_STATES))


@dataclass(frozen=True)
class Finish:
    """How a job's unit ended, as the controller records it."""

    job_id: int
    from_state: str
    state: str  # DONE or EXIT
    start_time: float | None
    end_time: float
    exit_code: int | None
    exit_signal: int | None
    cpu_time: float | None
    max_rss: int | None
    reason: str | None
    hooks: tuple[dict, ...] = ()  # each hook the unit ran, as its host reported it (in the event only)


@dataclass(frozen=True)
class Requeue:
    """A dispatched or running job going back to PEND (its host was lost, or by hand). It keeps its
    attempt number; the next dispatch takes the next one."""

    job_id: int
    from_state: str
    reason: str
    hold: bool = False  # back to PSUSP instead of PEND


@dataclass(frozen=True)
class TickRecord:
    """The ids each part of `record_tick` actually moved (the others had changed meanwhile)."""

    finished: tuple[int, ...]
    started: tuple[int, ...]
    dispatched: tuple[int, ...]
    requeued: tuple[int, ...] = ()


class JobStore:
    def __init__(self, path: Path, readonly: bool = False):
        """readonly: for tools beside a running controller (`xceadmin check`): reads only."""
        self.path = path
        self._con = connect(path, create=not readonly, readonly=readonly)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[apsw.Connection] = []

    def close(self) -> None:
        with self._lock:
            for con in self._readers:
                con.close()
            self._con.close()

    def _reader(self) -> apsw.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = connect(self.path, create=False, readonly=True)
            self._local.con = con
            with self._lock:
                self._readers.append(con)
        return con

    def _write(self):
        return write(self._con, self._lock)

    # ---- meta -------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        return self._reader().execute("SELECT value FROM meta WHERE key = ?", (key,)).get

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as con:
            con.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    # ---- writes -----------------------------------------------------------------------------

    def submit(self, jobs: Sequence[tuple[JobSpec, str]], user: str, now: float) -> list[int]:
        """Store (spec, queue) pairs as new jobs in one transaction; their ids, in order."""
        ids = []
        with self._write() as con:
            for spec, queue in jobs:
                state = "PSUSP" if spec.hold else "PEND"
                con.execute(
                    "INSERT INTO jobs(user, queue, state, spec, slots, submit_time, reason) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (user, queue, state, spec.to_json(), spec.slots or 1, now,
                     "held at submission" if spec.hold else None),
                )
                job_id = con.last_insert_rowid()
                _event(con, job_id, now, "submitted", {"user": user, "queue": queue, "held": spec.hold})
                ids.append(job_id)
        return ids

    def change_state(self, ids: Iterable[int], from_state: str, to_state: str, event: str, now: float,
                     reason: str | None = None, data: dict | None = None, **columns) -> list[int]:
        """Move each job still in `from_state` to `to_state`; the ids that moved."""
        sets = ["state = ?", "reason = ?"] + [f"{name} = ?" for name in columns]
        values = [to_state, reason, *columns.values()]
        moved = []
        with self._write() as con:
            for job_id in ids:
                con.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND state = ?",
                            (*values, job_id, from_state))
                if con.changes() == 1:
                    _event(con, job_id, now, event, dict(data or {}, reason=reason) if reason else data)
                    moved.append(job_id)
        return moved

    def dispatch(self, plans: Sequence[tuple], now: float) -> list[int]:
        """Record intent before acting: (job id, attempt, [[host, tasks]], unit) -> DISP."""
        with self._write() as con:
            return _dispatch(con, plans, now)

    def started(self, items: Sequence[tuple[int, float]], now: float) -> list[int]:
        """(job id, start time) for jobs whose unit is running: DISP -> RUN."""
        with self._write() as con:
            return _started(con, items, now)

    def finish(self, items: Sequence[Finish], now: float, event: str = "finished") -> list[int]:
        """Record how units ended, in one transaction; the ids recorded (others were not active)."""
        with self._write() as con:
            return _finish(con, [(f, event) for f in items], now)

    def record_tick(self, finishes: Sequence[tuple[Finish, str]], started: Sequence[tuple[int, float]],
                    plans: Sequence[tuple], reasons: dict[int, str | None],
                    now: float, requeues: Sequence[Requeue] = ()) -> TickRecord:
        """Everything one controller tick learned and decided, in ONE durable transaction.

        Order matters: a job may have started and finished since the last tick (DISP -> RUN ->
        DONE), a requeued job is pending again before the dispatches are stored, and a dispatch may
        use slots that a finish or a requeue freed.
        """
        with self._write() as con:
            started_ids = _started(con, started, now)
            finished_ids = _finish(con, finishes, now)
            requeued_ids = _requeue(con, requeues, now)
            dispatched_ids = _dispatch(con, plans, now)
            _pend_reasons(con, reasons)
        return TickRecord(tuple(finished_ids), tuple(started_ids), tuple(dispatched_ids), tuple(requeued_ids))

    def requeue(self, items: Sequence[Requeue], now: float) -> list[int]:
        """Send dispatched or running jobs back to PEND (or PSUSP), in one transaction."""
        with self._write() as con:
            return _requeue(con, items, now)

    def record_event(self, job_id: int, kind: str, now: float, data: dict | None = None) -> None:
        with self._write() as con:
            _event(con, job_id, now, kind, data)

    def set_pend_reasons(self, reasons: dict[int, str | None]) -> None:
        """Store changed pend reasons only (the caller diffs), in one transaction."""
        if reasons:
            with self._write() as con:
                _pend_reasons(con, reasons)

    # ---- reads ------------------------------------------------------------------------------

    def unfinished(self) -> list[Job]:
        """Every job not DONE or EXIT, in id order (the controller's working set at start)."""
        rows = self._reader().execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE state NOT IN (?, ?) ORDER BY id", _FINISHED)
        return [_job(row) for row in rows]

    def jobs(self, ids: Sequence[int] | None = None, user: str | None = None,
             include_finished: bool = False, limit: int | None = None) -> list[Job]:
        where, args = [], []
        if ids:
            where.append(f"id IN ({', '.join('?' * len(ids))})")
            args.extend(ids)
        if user is not None:
            where.append("user = ?")
            args.append(user)
        if not include_finished and not ids:
            where.append("state NOT IN (?, ?)")
            args.extend(_FINISHED)
        sql = f"SELECT {_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_job(row) for row in self._reader().execute(sql, args)]

    def get(self, job_id: int) -> Job | None:
        found = self.jobs([job_id])
        return found[0] if found else None

    def events(self, job_id: int) -> list[tuple[float, str, dict | None]]:
        rows = self._reader().execute("SELECT time, kind, data FROM events WHERE job_id = ? ORDER BY seq",
                                      (job_id,))
        return [(time, kind, json.loads(data) if data else None) for time, kind, data in rows]

    def counts_by_queue(self) -> dict[tuple[str, str], int]:
        """(queue, state) -> number of unfinished jobs."""
        rows = self._reader().execute(
            "SELECT queue, state, count(*) FROM jobs WHERE state NOT IN (?, ?) GROUP BY queue, state", _FINISHED)
        return {(queue, state): n for queue, state, n in rows}

    def event_kinds(self) -> set[str]:
        """The event kinds the store accepts (migrations add to them)."""
        return {kind for (kind,) in self._reader().execute("SELECT kind FROM event_kinds")}

    def integrity(self) -> str:
        return self._reader().execute("PRAGMA quick_check").get


def _dispatch(con: apsw.Connection, plans: Sequence[tuple], now: float) -> list[int]:
    """Plans are (job id, attempt, [[host, tasks]], unit[, alloc[, effective]]): alloc and effective as
    in Job; the dispatched event carries the profile's name and hash from `effective`."""
    moved = []
    for job_id, attempt, hosts, unit, *rest in plans:
        alloc = json.dumps(rest[0], ensure_ascii=True) if rest and rest[0] is not None else None
        effective = rest[1] if len(rest) > 1 else None
        con.execute(
            "UPDATE jobs SET state = 'DISP', attempt = ?, hosts = ?, unit = ?, alloc = ?, effective = ?, "
            "pend_reason = NULL WHERE id = ? AND state = 'PEND'",
            (attempt, json.dumps(hosts), unit, alloc,
             json.dumps(effective, ensure_ascii=True) if effective is not None else None, job_id),
        )
        if con.changes() == 1:
            data = {"attempt": attempt, "hosts": hosts, "unit": unit}
            if effective is not None:
                data.update(app=effective.get("app"), profile_hash=effective.get("profile_hash"))
            _event(con, job_id, now, "dispatched", data)
            moved.append(job_id)
    return moved


def _started(con: apsw.Connection, items: Sequence[tuple[int, float]], now: float) -> list[int]:
    moved = []
    for job_id, start_time in items:
        con.execute("UPDATE jobs SET state = 'RUN', start_time = ? WHERE id = ? AND state = 'DISP'",
                    (start_time, job_id))
        if con.changes() == 1:
            _event(con, job_id, now, "started", {"start_time": start_time})
            moved.append(job_id)
    return moved


def _finish(con: apsw.Connection, items: Sequence[tuple[Finish, str]], now: float) -> list[int]:
    moved = []
    for f, event in items:
        con.execute(
            "UPDATE jobs SET state = ?, start_time = coalesce(start_time, ?), end_time = ?, "
            "exit_code = ?, exit_signal = ?, cpu_time = ?, max_rss = ?, reason = ? "
            "WHERE id = ? AND state = ?",
            (f.state, f.start_time, f.end_time, f.exit_code, f.exit_signal, f.cpu_time, f.max_rss,
             f.reason, f.job_id, f.from_state),
        )
        if con.changes() == 1:
            data = {"state": f.state, "exit_code": f.exit_code, "signal": f.exit_signal,
                    "reason": f.reason, "cpu_time": f.cpu_time, "max_rss": f.max_rss}
            if f.hooks:
                data["hooks"] = list(f.hooks)
            _event(con, f.job_id, now, event, data)
            moved.append(f.job_id)
    return moved


def _requeue(con: apsw.Connection, items: Sequence[Requeue], now: float) -> list[int]:
    """What the job held is cleared with the move: a pending job holds nothing and runs nowhere."""
    moved = []
    for r in items:
        state = "PSUSP" if r.hold else "PEND"
        con.execute(
            "UPDATE jobs SET state = ?, hosts = NULL, unit = NULL, alloc = NULL, effective = NULL, "
            "start_time = NULL, pend_reason = NULL, reason = ? WHERE id = ? AND state = ?",
            (state, r.reason, r.job_id, r.from_state),
        )
        if con.changes() == 1:
            _event(con, r.job_id, now, "requeued", {"from": r.from_state, "to": state, "reason": r.reason})
            moved.append(r.job_id)
    return moved


def _pend_reasons(con: apsw.Connection, reasons: dict[int, str | None]) -> None:
    con.executemany("UPDATE jobs SET pend_reason = ? WHERE id = ? AND state = 'PEND'",
                    [(reason, job_id) for job_id, reason in reasons.items()])


def _event(con: apsw.Connection, job_id: int, now: float, kind: str, data: dict | None) -> None:
    con.execute("INSERT INTO events(job_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (job_id, now, kind, json.dumps(data, ensure_ascii=True) if data is not None else None))


def _job(row: tuple) -> Job:
    (job_id, user, queue, state, spec, submit_time, attempt, hosts, unit, start_time, end_time,
     exit_code, exit_signal, cpu_time, max_rss, reason, pend_reason, alloc, effective) = row
    return Job(
        id=job_id, user=user, queue=queue, state=state, spec=JobSpec.from_json(spec),
        submit_time=submit_time, attempt=attempt,
        hosts=tuple((h, n) for h, n in json.loads(hosts)) if hosts else (),
        unit=unit, start_time=start_time, end_time=end_time, exit_code=exit_code, exit_signal=exit_signal,
        cpu_time=cpu_time, max_rss=max_rss, reason=reason, pend_reason=pend_reason,
        alloc=json.loads(alloc) if alloc else None, effective=json.loads(effective) if effective else None,
    )
