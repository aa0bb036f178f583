"""The job store's reads of jobs: the working set, listings by id, user or project, a job's events,
counts per queue; JobStore inherits them (`JobReads`) and provides `_reader`, a read-only
connection per thread (WAL lets it run beside the writer).

An array element's row holds no spec of its own (ELEMENT_SPEC): it takes its array's spec and
dependency, which never change, so each array's are read and parsed once (`_arrays`). A spec text
seen lately is parsed once too (`_specs`, bounded): jobs submitted alike share one JobSpec (a
frozen value, shared as an array's elements share theirs), and the controller's merge memo with it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager

import apsw

from xce_lite.models import FINISHED_STATES, Job, JobSpec
from xce_lite.store.workflows import ELEMENT_SPEC, chunks

_COLUMNS = ("id, user, queue, state, spec, submit_time, attempt, hosts, unit, start_time, end_time, "
            "exit_code, exit_signal, cpu_time, max_rss, reason, pend_reason, alloc, effective, "
            "array_id, array_index, depend, retries")
_FINISHED = tuple(sorted(FINISHED_STATES))
# The jobs_unfinished index's own condition (sql/0013), written as literals: a query that says it so
# can read that index (unfinished jobs only, in id order); with the states bound as parameters
# SQLite cannot prove the query within the partial index and scans the whole table.
UNFINISHED = "state NOT IN ('DONE', 'EXIT')"
assert f"state NOT IN ({', '.join(repr(s) for s in _FINISHED)})" == UNFINISHED


SPECS_KEPT = 4096  # distinct spec texts kept parsed (~1 KB each)


class JobReads:
    _arrays: dict[int, tuple[JobSpec, dict | None]]  # array id -> (spec, dependency): set by JobStore
    _specs: dict[str, JobSpec]  # spec text -> its JobSpec, the latest SPECS_KEPT: set by JobStore

    def _reader(self) -> apsw.Connection:  # provided by JobStore
        raise NotImplementedError

    def _writer_read(self) -> AbstractContextManager[apsw.Connection]:  # provided by JobStore
        raise NotImplementedError

    # ---- reads ------------------------------------------------------------------------------

    def unfinished(self) -> list[Job]:
        """Every job not DONE or EXIT, in id order (the controller's working set at start)."""
        rows = self._reader().execute(f"SELECT {_COLUMNS} FROM jobs WHERE {UNFINISHED} ORDER BY id")
        return self._jobs_of(rows)

    def jobs(self, ids: Sequence[int] | None = None, user: str | None = None,
             include_finished: bool = False, limit: int | None = None, elements: bool = True,
             project: str | None = None, writer: bool = False, states: Sequence[str] = ()) -> list[Job]:
        """Jobs by id, or a user's (unfinished unless `include_finished`); `elements` False leaves
        out array elements (the listing shows their arrays instead); `project`: of that project only;
        `states`: in one of these only.
        `writer`: read through the writer connection, under the write lock (the controller's tick
        reads the rows it dispatches so): SQLite drops a connection's whole page cache when another
        connection has committed since its last read, so the tick's own read connection read every
        page of the path again after each of the tick's commits; the writer's cache outlives them.
        Many ids: a query per chunk (`xce wait` on four arrays of 10,000 had one of 40,000 parameters,
        which SQLite refuses)."""
        parts = chunks(list(dict.fromkeys(ids))) if ids else []
        if len(parts) > 1:
            found = [job for part in parts for job in self.jobs(part, user=user, include_finished=include_finished,
                                                                elements=elements, project=project, writer=writer,
                                                                states=states)]
            found.sort(key=lambda job: job.id)
            return found if limit is None else found[:limit]
        where: list[str] = []
        args: list[object] = []
        if ids:
            where.append(f"id IN ({', '.join('?' * len(ids))})")
            args.extend(ids)
        if user is not None:
            where.append("user = ?")
            args.append(user)
        if project is not None:
            where.append("project = ?")
            args.append(project)
        if not include_finished and not ids:
            where.append(UNFINISHED)
        if not elements:
            where.append("array_id IS NULL")
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(states)
        sql = f"SELECT {_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        if writer:
            with self._writer_read() as con:
                return self._jobs_of(con.execute(sql, args))
        return self._jobs_of(self._reader().execute(sql, args))

    def _jobs_of(self, rows: Iterable[tuple]) -> list[Job]:
        rows = list(rows)
        missing = {row[19] for row in rows if row[19] is not None and row[19] not in self._arrays}
        if missing:
            found = self._reader().execute(
                f"SELECT id, spec, depend FROM arrays WHERE id IN ({', '.join('?' * len(missing))})", list(missing))
            self._arrays.update((array_id, (JobSpec.from_json(spec), json.loads(depend) if depend else None))
                                for array_id, spec, depend in found)
        if len(self._specs) > SPECS_KEPT:
            self._specs.clear()  # a plain bound: texts come and go with the backlog
        return [_job(row, self._arrays, self._specs) for row in rows]

    def get(self, job_id: int) -> Job | None:
        found = self.jobs([job_id])
        return found[0] if found else None

    def events(self, job_id: int) -> list[tuple[float, str, dict | None]]:
        rows = self._reader().execute("SELECT time, kind, data FROM events WHERE job_id = ? ORDER BY seq",
                                      (job_id,))
        return [(time, kind, json.loads(data) if data else None) for time, kind, data in rows]

    def states_of(self, ids: Sequence[int]) -> dict[tuple[int | None, str], int]:
        """(array id, or None for a job of its own; state) -> how many of the jobs `ids` are there
        (each id once; an unknown id is in none)."""
        counts = Counter[tuple[int | None, str]]()
        for part in chunks(list(dict.fromkeys(ids))):
            counts.update({(array_id, state): n for array_id, state, n in self._reader().execute(
                f"SELECT array_id, state, count(*) FROM jobs WHERE id IN ({', '.join('?' * len(part))}) "
                "GROUP BY array_id, state", part)})
        return dict(counts)

    def counts_by_queue(self) -> dict[tuple[str, str], int]:
        """(queue, state) -> number of unfinished jobs."""
        rows = self._reader().execute(
            f"SELECT queue, state, count(*) FROM jobs WHERE {UNFINISHED} GROUP BY queue, state")
        return {(queue, state): n for queue, state, n in rows}

    def event_kinds(self) -> set[str]:
        """The event kinds the store accepts (migrations add to them)."""
        return {kind for (kind,) in self._reader().execute("SELECT kind FROM event_kinds")}

    def integrity(self, full: bool = False) -> str:
        """"ok", or what SQLite found wrong; `full` runs integrity_check (indexes against their
        tables too, slower) instead of quick_check."""
        return self._reader().execute("PRAGMA integrity_check" if full else "PRAGMA quick_check").get


def _job(row: tuple, arrays: dict[int, tuple[JobSpec, dict | None]], specs: dict[str, JobSpec]) -> Job:
    """A Job from its row; an element takes its spec and dependency from its array; a spec text
    already in `specs` is not parsed again."""
    (job_id, user, queue, state, spec, submit_time, attempt, hosts, unit, start_time, end_time,
     exit_code, exit_signal, cpu_time, max_rss, reason, pend_reason, alloc, effective,
     array_id, array_index, depend, retries) = row
    if array_id is not None and spec == ELEMENT_SPEC:
        job_spec, depend_data = arrays[array_id]
    else:
        parsed = specs.get(spec)
        if parsed is None:
            parsed = specs[spec] = JobSpec.from_json(spec)
        job_spec = parsed
        depend_data = json.loads(depend) if depend else None
    return Job(
        id=job_id, user=user, queue=queue, state=state, spec=job_spec,
        submit_time=submit_time, attempt=attempt,
        hosts=tuple((h, n) for h, n in json.loads(hosts)) if hosts else (),
        unit=unit, start_time=start_time, end_time=end_time, exit_code=exit_code, exit_signal=exit_signal,
        cpu_time=cpu_time, max_rss=max_rss, reason=reason, pend_reason=pend_reason,
        alloc=json.loads(alloc) if alloc else None, effective=json.loads(effective) if effective else None,
        array_id=array_id, array_index=array_index, depend=depend_data, retries=retries,
    )
