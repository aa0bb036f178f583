"""The rows of a submission: new jobs and arrays with their `submitted` events, inside the caller's
write transaction (JobStore._insert).

What is stored is what inserting each job alone stored (tests/controller/test_accept_bytes.py): a
job row per job and per array element (an element's spec is ELEMENT_SPEC, its array's row holds the
spec), one `submitted` event per row, events in the submission's order. It is only cheaper: each
distinct spec, dependency and event is encoded to JSON once, and rows that differ only in their id
(an array's elements; a batch's neighbouring jobs of one spec) go in as ONE statement that SQLite
repeats over a JSON list of the ids (`INSERT ... SELECT ... FROM json_each(?)`): no Python tuple, no
bound parameter per row. Arrays go in before the jobs that name them, jobs before their events.
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


# The last spec encoded, (spec, its JSON, its display name): specs submitted alike, one POST each,
# are one JobSpec object (the controller's admit memo), encoded once. Compared by identity (the
# spec is kept, so its id stays its own); inserts run one at a time, under the store's write lock.
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
