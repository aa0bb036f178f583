"""The rows of a submission: new jobs and arrays with their `submitted` events, inside the caller's
write transaction (JobStore._insert).

What is stored is what inserting each job alone stored (tests/controller/test_accept_bytes.py): a
job row per job and per array element (an element's spec is ELEMENT_SPEC, its array's row holds the
spec), one `submitted` event per row, events in the submission's order. It is only cheaper: each
distinct spec, dependency and event is encoded to JSON once, and rows that differ only in their id
(an array's elements; a batch's neighbouring jobs of one spec) go in as ONE statement that SQLite
repeats over a JSON list of the ids (`INSERT ... SELECT ... FROM json_each(?)`): no Python tuple, no
bound parameter per row. Arrays go in before the jobs that name them, jobs before their events.
A submission of one plain job (every one-POST submit) goes in by ONE_JOB_* instead: the same rows
(tests/store/test_store_one_job.py) as one script that db.write_script runs by one call into SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import apsw

from xce_lite.models import JobSpec
from xce_lite.store.workflows import ELEMENT_SPEC, NewJob, display_name

_JOBS = "jobs(id, user, queue, state, spec, slots, submit_time, reason, name, depend, array_id, array_index, project)"
_EVENTS = "events(job_id, time, kind, data)"

# ?1..?9 and ?10: a row's shared values (user .. depend, project); ?11: the JSON list. json_each
# gives the list's items in order (key: 0, 1, ...), so ids and events' seq ascend as they did when
# each row was inserted alone.
_SHARED = "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9"
_PLAIN_JOBS = f"INSERT INTO {_JOBS} SELECT value, {_SHARED}, NULL, NULL, ?10 FROM json_each(?11)"
_ELEMENTS = f"INSERT INTO {_JOBS} SELECT ?12 + key, {_SHARED}, ?12, value, ?10 FROM json_each(?11)"  # ?12: the array
_PLAIN_EVENTS = f"INSERT INTO {_EVENTS} SELECT value, ?1, 'submitted', ?2 FROM json_each(?3)"
_ELEMENT_EVENTS = f"INSERT INTO {_EVENTS} SELECT ?4 + key, ?1, 'submitted', ?2 FROM json_each(?3)"


# One plain job (a one-POST submit) as one script (db.write_script): its id is the next one (after
# the highest retention archived too, as JobStore._insert), its event names it by last_insert_rowid()
# (jobs.id is the rowid); with a request id the claim is a plain INSERT, so a repeat fails on the
# key (ConstraintError) and the whole transaction is rolled back.
_NEXT_ID = ("max(coalesce(max(id), 0), coalesce((SELECT CAST(value AS INTEGER) FROM meta "
            "WHERE key = 'job_id_floor'), 0)) + 1")
ONE_JOB = (f"BEGIN IMMEDIATE; INSERT INTO {_JOBS} SELECT {_NEXT_ID}, :user, :queue, :state, :spec, :slots, :now, "
           f":reason, :name, :depend, NULL, NULL, :project FROM jobs RETURNING id; "
           f"INSERT INTO {_EVENTS} VALUES (last_insert_rowid(), :now, 'submitted', :data); ")
ONE_JOB_PLAIN = ONE_JOB + "COMMIT"
ONE_JOB_CLAIMED = (ONE_JOB + "INSERT INTO submit_requests(request_id, user, job_ids, submit_time) "
                   "VALUES (:request_id, :user, '[' || (SELECT max(id) FROM jobs) || ']', :now); COMMIT")


# The last spec encoded, (spec, its JSON, its display name): specs submitted alike, one POST each,
# are one JobSpec object (the controller's admit memo), encoded once. Compared by identity (the
# spec is kept, so its id stays its own). Each memo is one tuple, read once and replaced whole, so
# threads that encode at once (one_job runs outside the store's lock) each get a matching pair.
_last_text: tuple[JobSpec, str, str] | None = None
_last_event: tuple[tuple, str] | None = None  # (user, queue, held, project) -> a plain job's event data


def insert_jobs(con: apsw.Connection, items: Sequence[NewJob], ids: Sequence[int], depends: Sequence[dict | None],
                user: str, now: float) -> None:
    """Each item (a job, or an array and its elements) under its id, with its resolved dependency."""
    texts: dict[int, tuple[str, str]] = {}  # id(spec) -> (its JSON, its display name): specs are shared
    depend_texts: dict[int, str] = {}  # id(dependency) -> its JSON
    events: dict[tuple, str] = {}  # (queue, held, project) -> the plain job's event data
    array_rows: list[tuple] = []
    # Runs of rows that differ only in their id: [array id or None, shared values, event data, ids or indices]
    runs: list[list] = []
    for item, job_id, depend in zip(items, ids, depends):
        spec = item.spec
        encoded = texts.get(id(spec))
        if encoded is None:
            encoded = texts[id(spec)] = _texts_of(spec)
        spec_text, name = encoded
        depend_text = None
        if depend is not None:
            depend_text = depend_texts.get(id(depend))
            if depend_text is None:
                depend_text = depend_texts[id(depend)] = json.dumps(depend, ensure_ascii=True)
        state = "PSUSP" if spec.hold else "PEND"
        reason = "held at submission" if spec.hold else None
        slots = spec.slots or 1
        if not item.indices:
            key = (item.queue, spec.hold, spec.project)
            data = events.get(key)
            if data is None:
                data = events[key] = _event_text(user, item.queue, spec)
            shared = (user, item.queue, state, spec_text, slots, now, reason, name, depend_text, spec.project)
            last = runs[-1] if runs else None
            if last is not None and last[0] is None and last[1] == shared and last[2] == data \
                    and last[3][-1] == job_id - 1:
                last[3].append(job_id)
            else:
                runs.append([None, shared, data, [job_id]])
            continue
        array_rows.append((job_id, user, spec_text, len(item.indices), depend_text, now))
        data = json.dumps({**_event(user, item.queue, spec), "array": job_id}, ensure_ascii=True)
        runs.append([job_id, (user, item.queue, state, ELEMENT_SPEC, slots, now, reason, name, None, spec.project),
                     data, item.indices])
    if array_rows:
        con.executemany("INSERT INTO arrays(id, user, spec, size, depend, submit_time) VALUES (?, ?, ?, ?, ?, ?)",
                        array_rows)
    listed = [_listed(values) for _, _, _, values in runs]
    for (array_id, shared, _, _), values in zip(runs, listed):
        if array_id is None:
            con.execute(_PLAIN_JOBS, (*shared, values))
        else:
            con.execute(_ELEMENTS, (*shared, values, array_id))
    for (array_id, _, data, _), values in zip(runs, listed):
        if array_id is None:
            con.execute(_PLAIN_EVENTS, (now, data, values))
        else:
            con.execute(_ELEMENT_EVENTS, (now, data, values, array_id))


def one_plain(jobs: Sequence, depends, flow) -> NewJob | None:
    """The one plain job (not an array) of a submission without a flow or dependencies computed
    from ids, which ONE_JOB_* store; None for any other submission (insert_jobs stores it)."""
    if len(jobs) != 1 or depends is not None or flow is not None:
        return None
    item = jobs[0]
    return item if isinstance(item, NewJob) and not item.indices else None


def one_job(item: NewJob, depend: dict | None, user: str, now: float) -> dict:
    """The bindings of ONE_JOB_* for one plain job (no array): what insert_jobs stores for it."""
    spec = item.spec
    spec_text, name = _texts_of(spec)
    return {"user": user, "queue": item.queue, "state": "PSUSP" if spec.hold else "PEND", "spec": spec_text,
            "slots": spec.slots or 1, "now": now, "reason": "held at submission" if spec.hold else None,
            "name": name, "depend": json.dumps(depend, ensure_ascii=True) if depend is not None else None,
            "project": spec.project, "data": _event_text(user, item.queue, spec)}


def _texts_of(spec: JobSpec) -> tuple[str, str]:
    global _last_text
    last = _last_text
    if last is not None and last[0] is spec:
        return last[1], last[2]
    text, name = spec.to_json(), display_name(spec)
    _last_text = (spec, text, name)
    return text, name


def _event_text(user: str, queue: str, spec: JobSpec) -> str:
    """A plain job's `submitted` data, encoded once for the same (user, queue, held, project)."""
    global _last_event
    key = (user, queue, spec.hold, spec.project)
    last = _last_event
    if last is not None and last[0] == key:
        return last[1]
    text = json.dumps(_event(user, queue, spec), ensure_ascii=True)
    _last_event = (key, text)
    return text


def _listed(values: Sequence[int]) -> str:
    """Whole numbers as a JSON list, for json_each."""
    return "[" + ",".join(map(str, values)) + "]"


def _event(user: str, queue: str, spec) -> dict:
    event = {"user": user, "queue": queue, "held": spec.hold}
    if spec.project is not None:
        event["project"] = spec.project
    return event
