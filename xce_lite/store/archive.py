"""Retention: finished jobs older than `controller.keep_finished` leave the live tables for the
archive (sql/0009_archive.sql) in bounded batches, each ONE transaction; archived rows older than
`controller.keep_archived` leave too, their usage kept as day sums. JobStore inherits this.

Invariants:
- Only DONE and EXIT jobs move, and only those that nothing live still reads: not an element of an
  array with an unfinished element, not a step of a flow that is kept (a flow goes, steps and
  all, once every job of it is finished and old and a newer flow exists: flow ids are max + 1 too),
  not the target of an unfinished job's dependency. A pending or running job is never touched.
- A job moves whole: its archive row, its events (copied, then deleted through the one path the
  events trigger allows), its array row once no element is left, its usage added to its day's sum.
- Job ids never repeat: the highest id archived is kept in meta (`job_id_floor`), which `submit`
  counts from. Event seqs order one job's events; SQLite may hand out an archived seq again (max +
  1), so the archive keys events by (job, seq). An event that comes for a job already archived (a
  host's hooks, reported late) goes to the archive (`insert_event_anywhere`).
"""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Sequence
from dataclasses import dataclass

import apsw

from xce_lite.accounting import BUCKETS, Tally
from xce_lite.store.db import insert_event
from xce_lite.store.usage import DAY, GPUS, SLOTS, project_sql

_DONE_EXIT = "('DONE', 'EXIT')"
# every job id an unfinished job's dependency names (an element's dependency is its array's)
_DEPENDED = (
    "SELECT t.value FROM jobs u, json_tree(u.depend) t WHERE u.state NOT IN " + _DONE_EXIT +
    " AND u.depend IS NOT NULL AND t.key = 'id' "
    "UNION SELECT t.value FROM arrays ar, json_tree(ar.depend) t WHERE ar.depend IS NOT NULL AND t.key = 'id' "
    "AND EXISTS (SELECT 1 FROM jobs e WHERE e.array_id = ar.id AND e.state NOT IN " + _DONE_EXIT + ")")
_CANDIDATES = (
    "WITH depended(id) AS (" + _DEPENDED + ") "
    "SELECT j.id FROM jobs j WHERE j.state IN " + _DONE_EXIT + " AND j.end_time < ? "
    "AND NOT EXISTS (SELECT 1 FROM flow_steps s WHERE s.job_id = j.id) "
    "AND (j.array_id IS NULL OR (NOT EXISTS (SELECT 1 FROM flow_steps s WHERE s.job_id = j.array_id) "
    "     AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.array_id = j.array_id AND e.state NOT IN " + _DONE_EXIT + ") "
    "     AND j.array_id NOT IN depended)) "
    "AND j.id NOT IN depended "
    "ORDER BY j.end_time LIMIT ?")
# flows whose every job is finished and ended before the cutoff (the newest flow stays: ids)
_OLD_FLOWS = (
    "SELECT f.id FROM flows f WHERE f.submit_time < ?1 AND f.id < (SELECT max(id) FROM flows) "
    "AND NOT EXISTS (SELECT 1 FROM flow_steps s JOIN jobs j ON j.id = s.job_id WHERE s.flow_id = f.id "
    "                AND (j.state NOT IN " + _DONE_EXIT + " OR j.end_time >= ?1)) "
    "AND NOT EXISTS (SELECT 1 FROM flow_steps s JOIN jobs j ON j.array_id = s.job_id WHERE s.flow_id = f.id "
    "                AND (j.state NOT IN " + _DONE_EXIT + " OR j.end_time >= ?1)) "
    "ORDER BY f.id LIMIT ?2")
_ARCHIVE_COLUMNS = ("id, user, queue, project, name, state, array_id, array_index, submit_time, start_time, end_time, "
                    "exit_code, exit_signal, reason, slots, gpus, hosts, cpu_time, max_rss, attempt, retries, command")
_USAGE_COLUMNS = ("jobs", "done", "exit", "started", "wait_s", "run_s", "cpu_s", "cpu_slot_s", "slot_s", "gpu_s",
                  "max_rss")
WAIT_COLUMNS = ", ".join(f"w{i}" for i in range(BUCKETS))  # the wait histogram, a column per bucket


@dataclass(frozen=True)
class Retained:
    """What one retention batch did; `more`: the batch was full, so more may be waiting."""

    jobs: int
    flows: int
    more: bool


class ArchiveStore:
    def _write(self):  # provided by JobStore
        raise NotImplementedError

    def retain(self, cutoff: float, batch: int) -> Retained:
        """Move at most `batch` finished jobs that ended before `cutoff` (and the flows all of whose
        jobs did) into the archive, in one transaction. See the module docstring."""
        with self._write() as con:
            flows = [i for (i,) in con.execute(_OLD_FLOWS, (cutoff, batch))]
            _drop_flows(con, flows)
            ids = [i for (i,) in con.execute(_CANDIDATES, (cutoff, batch))]
            if ids:
                _move(con, ids)
        return Retained(len(ids), len(flows), len(ids) == batch or len(flows) == batch)

    def prune_archive(self, cutoff: float, batch: int) -> int:
        """Delete at most `batch` archived jobs that ended before `cutoff`, and their events (their
        usage stays in usage_daily); remember the cutoff (accounting reads day sums before it)."""
        with self._write() as con:
            ids = [i for (i,) in con.execute("SELECT id FROM jobs_archive WHERE end_time < ? ORDER BY end_time "
                                             "LIMIT ?", (cutoff, batch))]
            marks = ", ".join("?" * len(ids))
            if ids:
                con.execute(f"DELETE FROM jobs_archive WHERE id IN ({marks})", ids)
                con.execute(f"DELETE FROM events_archive WHERE job_id IN ({marks})", ids)
            con.execute("INSERT INTO meta(key, value) VALUES ('archive_summed_before', ?) ON CONFLICT(key) DO "
                        "UPDATE SET value = max(CAST(value AS REAL), CAST(excluded.value AS REAL))", (str(cutoff),))
        return len(ids)

    def add_archived(self, rows: Sequence[dict], events: Sequence[tuple] = ()) -> None:
        """Write archive rows (and their events) directly, with their day sums: for benchmarks and
        for importing history. Each row has the jobs_archive columns (hosts as a list)."""
        with self._write() as con:
            _insert_archived(con, rows)
            if events:
                con.executemany("INSERT INTO events_archive (job_id, seq, time, kind, version, data) "
                                "VALUES (?, ?, ?, ?, ?, ?)", events)


def insert_event_anywhere(con: apsw.Connection, job_id: int, now: float, kind: str, data: dict | None) -> None:
    """An event for a job that may have been archived since (inside the caller's transaction): to
    `events` while the job is live, else after its archived events; dropped if the job is in neither."""
    if con.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).get is not None:
        insert_event(con, job_id, now, kind, data)
        return
    con.execute("INSERT INTO events_archive (job_id, seq, time, kind, version, data) SELECT ?1, "
                "(SELECT coalesce(max(seq), 0) + 1 FROM events_archive WHERE job_id = ?1), ?2, ?3, 1, ?4 "
                "WHERE EXISTS (SELECT 1 FROM jobs_archive WHERE id = ?1)",
                (job_id, now, kind, json.dumps(data, ensure_ascii=True) if data is not None else None))


def _drop_flows(con: apsw.Connection, flows: list[int]) -> None:
    """Flows whose jobs all go: their steps and themselves; a rescue of one forgets what it rescued."""
    if not flows:
        return
    marks = ", ".join("?" * len(flows))
    con.execute(f"UPDATE flows SET rescue_of = NULL WHERE rescue_of IN ({marks})", flows)
    con.execute(f"DELETE FROM flow_steps WHERE flow_id IN ({marks})", flows)
    con.execute(f"DELETE FROM flows WHERE id IN ({marks})", flows)


def _move(con: apsw.Connection, ids: list[int]) -> None:
    marks = ", ".join("?" * len(ids))
    rows = con.execute(
        f"SELECT id, user, queue, {project_sql()}, name, state, array_id, array_index, submit_time, start_time, "
        f"end_time, exit_code, exit_signal, reason, {SLOTS}, {GPUS}, hosts, cpu_time, max_rss, attempt, retries, "
        f"json_extract(CASE WHEN jobs.array_id IS NULL THEN jobs.spec ELSE (SELECT ar.spec FROM arrays ar "
        f"WHERE ar.id = jobs.array_id) END, '$.argv') FROM jobs WHERE id IN ({marks})", ids).fetchall()
    names = _ARCHIVE_COLUMNS.split(", ")
    archived = []
    for row in rows:
        item: dict[str, Any] = dict(zip(names, row))
        item["hosts"] = json.loads(item["hosts"]) if item["hosts"] else None
        item["command"] = json.loads(item["command"]) if item["command"] else None
        archived.append(item)
    _insert_archived(con, archived)
    con.execute("INSERT INTO events_archive (job_id, seq, time, kind, version, data) SELECT job_id, seq, time, "
                f"kind, version, data FROM events WHERE job_id IN ({marks})", ids)
    con.execute(f"DELETE FROM events WHERE job_id IN ({marks})", ids)
    con.execute(f"DELETE FROM jobs WHERE id IN ({marks}) AND state IN {_DONE_EXIT}", ids)
    if con.changes() != len(ids):  # a job changed under us: the writer lock makes this a bug
        raise RuntimeError(f"retention moved {con.changes()} of {len(ids)} jobs")
    arrays = sorted({r["array_id"] for r in archived if r["array_id"] is not None})
    if arrays:
        con.execute(f"DELETE FROM arrays WHERE id IN ({', '.join('?' * len(arrays))}) AND NOT EXISTS "
                    f"(SELECT 1 FROM jobs e WHERE e.array_id = arrays.id)", arrays)


DIMS = ("user", "project", "queue", "host", "user_queue")  # the kinds of day sums (sql/0009_archive.sql)


def _insert_archived(con: apsw.Connection, rows: Sequence[dict]) -> None:
    """Archive rows, and their usage added to the day sums of each kind (DIMS); new jobs are
    numbered after them (`job_id_floor`)."""
    if not rows:
        return
    names = _ARCHIVE_COLUMNS.split(", ")
    con.execute("INSERT INTO meta(key, value) VALUES ('job_id_floor', ?) ON CONFLICT(key) DO UPDATE SET "
                "value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                (str(max(r["id"] for r in rows)),))
    con.executemany(
        f"INSERT INTO jobs_archive ({_ARCHIVE_COLUMNS}) VALUES ({', '.join('?' * len(names))})",
        [tuple(json.dumps(r[n]) if n in ("hosts", "command") and r[n] is not None else r[n] for n in names)
         for r in rows])
    groups: dict[tuple[str, str, str], Tally] = {}
    # each row's day as SQLite says it (usage_by_day counts live jobs so): one idea of local time
    ends = json.dumps([r["end_time"] for r in rows])
    day_of = [d for (d,) in con.execute(f"SELECT {DAY.format('value')} FROM json_each(?) ORDER BY key", (ends,))]
    for r, day in zip(rows, day_of):
        host = r["hosts"][0][0] if r["hosts"] else ""
        keys = (r["user"], r["project"] or "", r["queue"], host, f"{r['user']}\t{r['queue']}")
        for dim, key in zip(DIMS, keys):
            tally = groups.get((dim, day, key))
            if tally is None:
                tally = groups[(dim, day, key)] = Tally()
            tally.add_job(
                r["state"], r["submit_time"], r["start_time"], r["end_time"], r["slots"], r["gpus"], r["cpu_time"],
                r["max_rss"])
    for group, tally in groups.items():
        old = con.execute(f"SELECT {', '.join(_USAGE_COLUMNS)}, {WAIT_COLUMNS} FROM usage_daily "
                          "WHERE dim = ? AND day = ? AND key = ?", group).fetchone()
        if old is not None:
            n = len(_USAGE_COLUMNS)
            tally.add_day(dict(zip(_USAGE_COLUMNS, old[:n]), wait_hist=list(old[n:])))
        row = tally.day_row()
        values = [row[c] for c in _USAGE_COLUMNS] + row["wait_hist"]
        con.execute(f"INSERT OR REPLACE INTO usage_daily (dim, day, key, {', '.join(_USAGE_COLUMNS)}, {WAIT_COLUMNS}) "
                    f"VALUES ({', '.join('?' * (3 + len(values)))})", (*group, *values))
