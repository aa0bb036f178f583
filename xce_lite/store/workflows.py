"""The store's side of workflows: inserting flows (a submission's job and array rows: newjobs.py), and
the reads that dependencies, array summaries and flows need. JobStore inherits the reads (`WorkflowStore`).

An array is stored once (table `arrays`, with the spec and dependency its elements share) and as
one job row per element whose spec is ELEMENT_SPEC; the array's id is its first element's job id.
Ids are given explicitly, in the submit transaction, so a flow's dependencies can name the jobs of
the same submission. A job's `name` column holds the name users see (`-J`, else the command's
base name), which `-w done(name)` resolves against.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import apsw

from xce_lite.models import FINISHED_STATES, JobSpec

ELEMENT_SPEC = "{}"  # an element's own spec column: its spec is its array's
_FINISHED = tuple(sorted(FINISHED_STATES))


@dataclass(frozen=True)
class NewJob:
    """One job to submit, or one array (`indices` of its elements, ascending)."""

    spec: JobSpec
    queue: str
    indices: tuple[int, ...] = ()
    depend: dict | None = None  # resolved (deps.to_json)


@dataclass(frozen=True)
class FlowStep:
    step: str
    is_array: bool
    depend: str | None  # on step names, as written
    upstream: tuple[str, ...]


@dataclass(frozen=True)
class FlowRecord:
    """A flow's steps in dependency order: those in `kept` name the job they already have (a rescue
    keeps what finished DONE); the others take the submitted items' ids, in order."""

    name: str
    steps: tuple[FlowStep, ...]
    rescue_of: int | None = None
    kept: tuple[tuple[str, int], ...] = ()  # (step, its job or array id)


@dataclass(frozen=True)
class FlowView:
    id: int
    name: str
    user: str
    submit_time: float
    rescue_of: int | None
    steps: tuple[tuple[FlowStep, int], ...]  # (step, its job or array id), upstream first


def display_name(spec: JobSpec) -> str:
    """The `name` column of a job: -J, else its command's base name."""
    return storable(spec.name or (spec.argv[0].rsplit("/", 1)[-1] if spec.argv else ""))


def storable(name: str) -> str:
    """A name as the `name` column holds it: text SQLite accepts (an undecodable byte of argv[0],
    kept as a lone surrogate, becomes U+FFFD; lookups convert the same way)."""
    return name.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def insert_flow(con: apsw.Connection, flow: FlowRecord, ids: Sequence[int], user: str, now: float) -> int:
    con.execute("INSERT INTO flows(name, user, submit_time, rescue_of) VALUES (?, ?, ?, ?)",
                (flow.name, user, now, flow.rescue_of))
    flow_id = con.last_insert_rowid()
    kept, new_ids = dict(flow.kept), iter(ids)
    con.executemany("INSERT INTO flow_steps(flow_id, position, step, job_id, is_array, depend, upstream) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(flow_id, position, s.step, kept[s.step] if s.step in kept else next(new_ids), int(s.is_array),
                      s.depend, json.dumps(list(s.upstream))) for position, s in enumerate(flow.steps)])
    return flow_id


class WorkflowStore:
    """Reads for dependencies, arrays and flows; a mixin of JobStore (uses its `_reader`)."""

    def _reader(self) -> apsw.Connection:  # provided by JobStore
        raise NotImplementedError

    # ---- resolving names --------------------------------------------------------------------------

    def latest_named(self, user: str, name: str) -> tuple[int, int | None] | None:
        """(job id, its array's id or None) of the user's most recent job called `name`."""
        row = self._reader().execute("SELECT id, array_id FROM jobs WHERE user = ? AND name = ? "
                                     "ORDER BY id DESC LIMIT 1", (user, storable(name))).fetchone()
        return (row[0], row[1]) if row else None

    def named_like(self, user: str, pattern: str) -> list[tuple[str, int, int | None]]:
        """(name, job id, array id or None) of the user's most recent job of each name that matches
        `pattern`, where `*` is any text; by name."""
        glob = storable(pattern).replace("[", "[[]").replace("?", "[?]")
        rows = self._reader().execute("SELECT name, max(id), array_id FROM jobs WHERE user = ? AND name GLOB ? "
                                      "GROUP BY name ORDER BY name", (user, glob))
        return [(name, job_id, array_id) for name, job_id, array_id in rows]

    def element(self, array_id: int, index: int) -> int | None:
        return self._reader().execute("SELECT id FROM jobs WHERE array_id = ? AND array_index = ?",
                                      (array_id, index)).get

    def owner(self, job_id: int) -> tuple[str, int | None, int | None] | None:
        """(user, array id, array index) of a job, or None if there is no such job."""
        row = self._reader().execute("SELECT user, array_id, array_index FROM jobs WHERE id = ?",
                                     (job_id,)).fetchone()
        return tuple(row) if row else None

    def owners(self, job_ids: list[int]) -> dict[int, tuple[str, int | None, int | None]]:
        """`owner` of many jobs, a query per chunk (those with no such job are left out): one query
        per id cost ~10 us each, 12 ms of a `GET /jobs/wait` on 1,000 ids."""
        found: dict[int, tuple[str, int | None, int | None]] = {}
        for part in chunks(list(dict.fromkeys(job_ids))):
            rows = self._reader().execute(
                f"SELECT id, user, array_id, array_index FROM jobs WHERE id IN ({', '.join('?' * len(part))})", part)
            found.update((job_id, (user, array_id, index)) for job_id, user, array_id, index in rows)
        return found

    def array_size(self, array_id: int) -> int | None:
        return self._reader().execute("SELECT size FROM arrays WHERE id = ?", (array_id,)).get

    def element_ids(self, array_id: int) -> list[int]:
        return [i for (i,) in self._reader().execute("SELECT id FROM jobs WHERE array_id = ? ORDER BY array_index",
                                                     (array_id,))]

    # ---- what dependencies are evaluated against ------------------------------------------------------

    def group_rows(self, job_ids: Sequence[int], array_ids: Sequence[int]
                   ) -> dict[tuple[int, bool], list[tuple[str, int | None, bool, int]]]:
        """(id, is array) -> [(state, exit code, has started, how many)], for deps_eval.group_facts."""
        con = self._reader()
        found: dict[tuple[int, bool], list] = {}
        for chunk in chunks(list(job_ids)):
            for job_id, state, code, started in con.execute(
                    f"SELECT id, state, exit_code, start_time IS NOT NULL FROM jobs WHERE id IN "
                    f"({', '.join('?' * len(chunk))})", chunk):
                found[(job_id, False)] = [(state, code, bool(started), 1)]
        for chunk in chunks(list(array_ids)):
            for array_id, state, code, started, n in con.execute(
                    f"SELECT array_id, state, exit_code, start_time IS NOT NULL, count(*) FROM jobs WHERE array_id "
                    f"IN ({', '.join('?' * len(chunk))}) GROUP BY 1, 2, 3, 4", chunk):
                found.setdefault((array_id, True), []).append((state, code, bool(started), n))
        return found

    def kill_requested(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The jobs someone asked to kill since their last dispatch, each with the kill's reason
        (their failure is not retried, and they are never requeued)."""
        found: dict[int, str] = {}
        for chunk in chunks(list(job_ids)):
            for job_id, data in self._reader().execute(
                    f"SELECT k.job_id, k.data FROM events k WHERE k.kind = 'kill_requested' AND k.job_id IN "
                    f"({', '.join('?' * len(chunk))}) AND k.seq > (SELECT coalesce(max(d.seq), 0) FROM events d "
                    f"WHERE d.job_id = k.job_id AND d.kind = 'dispatched') ORDER BY k.seq", chunk):
                found[job_id] = kill_reason(data)
        return found

    # ---- arrays ---------------------------------------------------------------------------------------

    def array_summaries(self, ids: Sequence[int] | None = None, user: str | None = None,
                        include_finished: bool = False) -> list[dict]:
        """Per array: id, user, queue, name, indices, size, and its elements' count by state. Without
        `ids`: the user's (None: everyone's) arrays, those with unfinished elements unless
        `include_finished`."""
        con = self._reader()
        if ids is None:
            where, args = ["array_id IS NOT NULL"], []
            if user is not None:
                where.append("user = ?")
                args.append(user)
            if not include_finished:
                where.append(f"state NOT IN ({', '.join('?' * len(_FINISHED))})")
                args.extend(_FINISHED)
            ids = [i for (i,) in con.execute(f"SELECT DISTINCT array_id FROM jobs WHERE {' AND '.join(where)} "
                                             f"ORDER BY array_id", args)]
        summaries = []
        for chunk in chunks(list(ids)):
            marks = ", ".join("?" * len(chunk))
            counts: dict[int, dict[str, int]] = {}
            queues: dict[int, str] = {}
            for array_id, queue, state, n in con.execute(
                    f"SELECT array_id, queue, state, count(*) FROM jobs WHERE array_id IN ({marks}) GROUP BY 1, 2, 3",
                    chunk):
                counts.setdefault(array_id, {})[state] = n
                queues[array_id] = queue
            for array_id, user_name, spec, size, submit_time in con.execute(
                    f"SELECT id, user, spec, size, submit_time FROM arrays WHERE id IN ({marks}) ORDER BY id", chunk):
                data = json.loads(spec)
                summaries.append({"id": array_id, "user": user_name, "queue": queues.get(array_id, ""),
                                  "name": data.get("name") or "", "indices": data.get("array") or "",
                                  "size": size, "states": counts.get(array_id, {}), "submit_time": submit_time,
                                  "project": data.get("project")})
        return summaries

    # ---- flows ----------------------------------------------------------------------------------------

    def flow(self, user: str, name: str) -> FlowView | None:
        """The user's most recent flow called `name` (a rescue is a flow of the same name)."""
        con = self._reader()
        row = con.execute("SELECT id, name, user, submit_time, rescue_of FROM flows WHERE user = ? AND name = ? "
                          "ORDER BY id DESC LIMIT 1", (user, storable(name))).fetchone()
        if row is None:
            return None
        steps = tuple((FlowStep(step, bool(is_array), depend, tuple(json.loads(upstream))), job_id)
                      for step, is_array, depend, upstream, job_id in con.execute(
                          "SELECT step, is_array, depend, upstream, job_id FROM flow_steps WHERE flow_id = ? "
                          "ORDER BY position", (row[0],)))
        return FlowView(row[0], row[1], row[2], row[3], row[4], steps)

    def flow_names(self, user: str) -> list[str]:
        return [n for (n,) in self._reader().execute("SELECT DISTINCT name FROM flows WHERE user = ? ORDER BY name",
                                                     (user,))]


def kill_reason(data: str | None) -> str:
    """The reason a `kill_requested` event's data gives (older events name only who killed)."""
    fields = json.loads(data) if data else {}
    return fields.get("reason") or f"killed by {fields.get('by', 'someone')}"


def chunks(values: list[int], size: int = 500) -> list[list[int]]:
    """SQLite limits the variables of one statement (32,766): ask in chunks."""
    return [values[i:i + size] for i in range(0, len(values), size)]
