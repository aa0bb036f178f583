"""The store's reads for `xce hist` and `xce acct`: jobs and their events from the live tables and
the archive together (a job is in exactly one of them: retention moves it in one transaction), and
the inputs `accounting.summarise` sums. JobStore inherits them (`AccountingStore`).

Reads only, on the caller thread's read-only connection. A project is read through
usage.project_sql() (live jobs) and the archive's `project` column; a project filter takes the
path and its subtree (`lab` takes `lab/vision`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import apsw

from xce_lite.accounting import day_of, whole_days
from xce_lite.store.archive import WAIT_COLUMNS
from xce_lite.store.usage import FIRST_HOST, GPUS, SLOTS, project_sql

_LIVE_FIELDS = {
    "id": "id", "user": "user", "queue": "queue", "project": project_sql(), "name": "name", "state": "state",
    "array_id": "array_id", "array_index": "array_index", "submit_time": "submit_time",
    "start_time": "start_time", "end_time": "end_time", "exit_code": "exit_code", "exit_signal": "exit_signal",
    "reason": "reason", "slots": SLOTS, "gpus": GPUS, "hosts": "hosts", "cpu_time": "cpu_time",
    "max_rss": "max_rss", "attempt": "attempt", "retries": "retries",
    "command": ("json_extract(CASE WHEN jobs.array_id IS NULL THEN jobs.spec ELSE (SELECT ar.spec FROM arrays ar "
                "WHERE ar.id = jobs.array_id) END, '$.argv')"),
}
_KEYS = {"user": ("user", "user"), "queue": ("queue", "queue"),
         "project": (f"coalesce({project_sql()}, '')", "coalesce(project, '')"),
         "host": (f"coalesce({FIRST_HOST}, '')", "coalesce(json_extract(hosts, '$[0][0]'), '')")}
BY = tuple(_KEYS)
_SUMS = ("jobs", "done", "exit", "started", "wait_s", "run_s", "cpu_s", "cpu_slot_s", "slot_s", "gpu_s")


def _under(column: str, project: str) -> tuple[str, list]:
    """SQL and arguments for: `column` is the project or one below it."""
    return f"({column} = ? OR substr({column}, 1, ?) = ?)", [project, len(project) + 1, project + "/"]


class AccountingStore:
    def _reader(self) -> apsw.Connection:  # provided by JobStore
        raise NotImplementedError

    # ---- xce hist ------------------------------------------------------------------------------

    def history(self, ids: Sequence[int] = (), arrays: Sequence[int] = (),
                elements: Sequence[tuple[int, int]] = (), user: str | None = None,
                project: str | None = None, since: float | None = None, until: float | None = None,
                limit: int = 500) -> tuple[list[dict], bool]:
        """Jobs (live and archived, oldest id first), each with its `events` [(time, kind, data)],
        and whether more matched than `limit` (the newest `limit` are kept). Selected by id, by
        array (all its elements), by (array, index), or else by user, project and a window their life overlaps
        (submitted before `until`, not ended before `since`)."""
        con = self._reader()
        found: list[dict] = []
        for table, fields in (("jobs", _LIVE_FIELDS), ("jobs_archive", None)):
            names = list(_LIVE_FIELDS)  # jobs_archive has these columns, by these names
            columns = ", ".join(f"{expr} AS {name}" for name, expr in fields.items()) if fields else ", ".join(names)
            project_column = _LIVE_FIELDS["project"] if fields else "project"
            where: list[str] = []
            args: list[object] = []
            if ids or arrays or elements:
                chosen = [" OR ".join(["(array_id = ? AND array_index = ?)"] * len(elements))] if elements else []
                args.extend(n for pair in elements for n in pair)
                if ids:
                    chosen.append(f"id IN ({', '.join('?' * len(ids))})")
                    args.extend(ids)
                if arrays:
                    chosen.append(f"array_id IN ({', '.join('?' * len(arrays))})")
                    args.extend(arrays)
                where.append("(" + " OR ".join(chosen) + ")")
            if user is not None:
                where.append("user = ?")
                args.append(user)
            if project is not None:
                sql, under_args = _under(project_column, project)
                where.append(sql)
                args.extend(under_args)
            if until is not None:
                where.append("submit_time < ?")
                args.append(until)
            if since is not None:
                where.append("(end_time IS NULL OR end_time >= ?)")
                args.append(since)
            sql = f"SELECT {columns} FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
            cursor = con.execute(sql + " ORDER BY id DESC LIMIT ?", (*args, limit + 1))
            for row in cursor:
                job = dict(zip(names, row))
                job["hosts"] = json.loads(job["hosts"]) if job["hosts"] else []
                job["command"] = json.loads(job["command"]) if job["command"] else []
                job["archived"] = fields is None
                found.append(job)
        found.sort(key=lambda j: j["id"], reverse=True)
        more = len(found) > limit
        jobs = sorted(found[:limit], key=lambda j: j["id"])
        events = self._events_of([j["id"] for j in jobs])
        for job in jobs:
            job["events"] = events.get(job["id"], [])
        return jobs, more

    def _events_of(self, ids: list[int]) -> dict[int, list]:
        con = self._reader()
        found: dict[int, list] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ", ".join("?" * len(chunk))
            for table in ("events", "events_archive"):
                for job_id, t, kind, data in con.execute(
                        f"SELECT job_id, time, kind, data FROM {table} WHERE job_id IN ({marks}) ORDER BY seq", chunk):
                    found.setdefault(job_id, []).append((t, kind, json.loads(data) if data else None))
        return found

    # ---- xce acct -----------------------------------------------------------------------------

    def accounting_inputs(self, by: str, since: float, until: float, user: str | None = None,
                          project: str | None = None) -> tuple[list, list, list]:
        """What accounting.summarise sums for the jobs that ended in [since, until), as three lists:
        sums of finished jobs read one by one (key, row), their waits (key, wait), and the
        archive's day sums (key, row with `wait_hist`). SQLite does the sums; Python sees only
        the waits (for exact percentiles) and one row per key and source.

        Live jobs are read one by one; archived ones by their day sums for the local days wholly
        inside the window, one by one outside them. A user filter with another `by` than user (or
        a project filter with another than project) reads every archived job one by one (the day
        sums are per kind, not per combination), so such a query sees back to keep_archived only."""
        con = self._reader()
        live_key, archive_key = _KEYS[by]
        summed_before = float(con.execute("SELECT value FROM meta WHERE key = 'archive_summed_before'").get or 0)
        # a filter on the kind being summed reads the day sums of the keys it takes; any other
        # filter needs the combination, which only the per-job rows have
        on_key = {"user": user is not None, "project": project is not None}
        other = (user is not None and by != "user") or (project is not None and by != "project")
        days = None if other else whole_days(since, until, summed_before)
        sums: list[tuple[str, dict]] = []
        waits: list[tuple[str, float]] = []
        live_filter, live_args = _filters(user, project, project_sql())
        sources = [(f"jobs WHERE state IN ('DONE', 'EXIT') AND end_time >= ? AND end_time < ?{live_filter}",
                    live_key, SLOTS, GPUS, (since, until, *live_args))]
        archive_filter, archive_args = _filters(user, project, "project")
        for low, high in [(since, until)] if days is None else [(since, days[0]), (days[1], until)]:
            if low < high:
                sources.append((f"jobs_archive WHERE end_time >= ? AND end_time < ?{archive_filter}", archive_key,
                                "slots", "gpus", (low, high, *archive_args)))
        for where, key, slots, gpus, args in sources:
            run = "(CASE WHEN start_time IS NULL THEN 0.0 ELSE max(0.0, end_time - start_time) END)"
            for row in con.execute(
                    f"SELECT {key}, count(*), sum(state = 'DONE'), sum(state <> 'DONE'), count(start_time), "
                    f"total(max(0.0, start_time - submit_time)), total({run}), total(cpu_time), "
                    f"total(CASE WHEN cpu_time IS NULL THEN 0.0 ELSE {run} * {slots} END), total({run} * {slots}), "
                    f"total({run} * {gpus}), max(coalesce(max_rss, 0)) FROM {where} GROUP BY 1", args):
                sums.append((row[0], dict(zip(_SUMS, row[1:-1]), max_rss=row[-1])))
            waits.extend(con.execute(f"SELECT {key}, max(0.0, start_time - submit_time) FROM {where} "
                                     f"AND start_time IS NOT NULL", args))
        if days is None:
            return sums, waits, []
        key_filter = ""
        key_args: list = []
        if on_key.get(by):
            key_filter, key_args = _filters(user, project, "key", "key")
        return sums, waits, self._day_sums(by, days, key_filter, key_args)

    def _day_sums(self, by: str, days: tuple[float, float], key_filter: str = "",
                  key_args: Sequence = ()) -> list[tuple[str, dict]]:
        """Per key of kind `by`: the day sums of [first whole day, the day after the last)."""
        con = self._reader()
        window = (by, day_of(days[0]), day_of(days[1]), *key_args)
        where = f"dim = ? AND day >= ? AND day < ?{key_filter}"
        rows = {}
        sums = ", ".join(f"sum({c})" for c in (*_SUMS, *WAIT_COLUMNS.split(", ")))
        for row in con.execute(f"SELECT key, max(max_rss), {sums} FROM usage_daily WHERE {where} GROUP BY key",
                               window):
            n = len(_SUMS)
            rows[row[0]] = dict(zip(_SUMS, row[2:2 + n]), max_rss=row[1], wait_hist=list(row[2 + n:]))
        return list(rows.items())


def _filters(user: str | None, project: str | None, project_column: str,
             user_column: str = "user") -> tuple[str, list]:
    sql, args = "", []
    if user is not None:
        sql += f" AND {user_column} = ?"
        args.append(user)
    if project is not None:
        under, more = _under(project_column, project)
        sql += " AND " + under
        args.extend(more)
    return sql, args
