"""The job store: every query xce_lite makes goes through JobStore; its writes of jobs are here, its
reads are mixins (job_reads.py, workflows.py, usage.py, archive.py, ...). The controller is its only writer.

Each state change is `UPDATE ... WHERE id = ? AND state = ?` and learns which rows it changed, so a
change based on a stale view is refused instead of applied twice; its event is written in the same
transaction (a tick's changes: one statement per kind over all its rows, transitions.py). Writes
take one lock (the controller's threads share one writer connection); reads use a read-only
connection per thread, which WAL lets run beside the writer. Read connections are
bounded by the threads alive: the one of a thread that ended is closed when the next is opened
(observed before: one kept per API connection's thread, forever: 2 fds and ~177 KB each).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import apsw

from xce_lite.models import JobSpec
from xce_lite.store.accounting import AccountingStore  # hist and acct: live and archived jobs
from xce_lite.store.archive import ArchiveStore, insert_event_anywhere  # retention
from xce_lite.store.checkpoint import Checkpointer
from xce_lite.store.db import connect, write, write_script
from xce_lite.store.db import insert_event as _event
from xce_lite.store.job_reads import JobReads  # jobs by id, user, project; events
from xce_lite.store.projects import ProjectStore
from xce_lite.store.requests import RequestStore  # request ids: idempotent submission
from xce_lite.store.usage import UsageStore  # metrics: the web's reads over time
from xce_lite.store.newjobs import ONE_JOB_PLAIN, insert_jobs, one_job, one_plain as _one_plain
from xce_lite.store.walsync import WalSync
from xce_lite.store import transitions
from xce_lite.store.transitions import cancel as _cancel
from xce_lite.store.transitions import finish as _finish
from xce_lite.store.transitions import pend_reasons as _pend_reasons
from xce_lite.store.transitions import started as _started
from xce_lite.store.workflows import FlowRecord, NewJob, WorkflowStore, insert_flow, kill_reason

IMPATIENT_MS = 1000


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
    retry: bool = False  # a failed attempt retried (--retry): counted in the job's `retries`
    result: dict | None = None  # how the attempt ended (a retry's exit code, ...), for the history


@dataclass(frozen=True)
class Plan:
    """A dispatch to record: the job, its next attempt, [[host, tasks]], its first unit's name, and
    the allocation and effective values (as in Job) it runs with."""

    job_id: int
    attempt: int
    hosts: list
    unit: str
    alloc: dict | None = None
    effective: dict | None = None
    reason: str | None = None  # a queued successor's pend reason (the session's); None for a dispatch
    queued: str | None = None  # a queued successor's "queued on H behind job N" (its dispatched event)


@dataclass(frozen=True)
class TickWrites:
    """Everything one controller tick learned and decided, for `record_tick`'s one transaction.
    `cancels`: (job id, its state, why) for pending jobs whose dependency can never hold; `events`:
    (job id, kind, data) of jobs in any state, stored as they are (`host_hooks`)."""

    now: float
    finishes: Sequence[tuple[Finish, str]] = ()
    started: Sequence[tuple[int, float]] = ()
    plans: Sequence[Plan] = ()
    reasons: dict[int, str | None] = field(default_factory=dict)
    requeues: Sequence[Requeue] = ()
    cancels: Sequence[tuple[int, str, str]] = ()
    events: Sequence[tuple[int, str, dict | None]] = ()

    def __bool__(self) -> bool:
        return bool(self.finishes or self.started or self.plans or self.reasons or self.requeues or self.cancels
                    or self.events)


@dataclass(frozen=True)
class TickRecord:
    """The ids each part of `record_tick` actually moved (the others had changed meanwhile)."""

    finished: tuple[int, ...]
    started: tuple[int, ...]
    dispatched: tuple[int, ...]
    requeued: tuple[int, ...] = ()
    cancelled: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()  # requeues refused because someone killed the job: they ended EXIT


# metrics: UsageStore; idempotent submission: RequestStore
class JobStore(JobReads, WorkflowStore, UsageStore, ArchiveStore, AccountingStore, ProjectStore, RequestStore):
    def __init__(self, path: Path, readonly: bool = False, durable: bool = True):
        """readonly: for tools beside a running controller (`xceadmin check`): reads only.
        durable=False: no fsync per commit, for the simulator's throwaway store (db.connect)."""
        self.path = path
        self._con = connect(path, create=not readonly, readonly=readonly, durable=durable)
        self._lock = threading.Lock()
        # commits synced outside the write lock, before each write returns (walsync.py)
        self._sync = WalSync(self._con, f"{path}-wal") if durable and not readonly else None
        # the WAL checkpointed by a thread of its own, not in a writer's commit (checkpoint.py)
        self._checkpoints = Checkpointer(self._con, path, self._sync, lambda p: connect(p, create=False)) \
            if self._sync is not None else None
        # Set by the controller while the store refuses its commits (busy): writers then wait
        # IMPATIENT_MS for another process's lock, not the full busy timeout, so that a submit is
        # refused in a second or two instead of queueing behind the tick's own long wait.
        self.impatient = False
        self._local = threading.local()
        self._readers: dict[threading.Thread, apsw.Connection] = {}
        # arrays never change: each one's (spec, dependency) is read and parsed once
        self._arrays: dict[int, tuple[JobSpec, dict | None]] = {}
        self._specs: dict[str, JobSpec] = {}  # spec texts parsed lately (job_reads.py)

    def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.close()
        with self._lock:
            for con in self._readers.values():
                con.close()
            self._readers.clear()
            if self._sync is not None:
                self._sync.close()
            self._con.close()

    def settle_reads(self) -> None:
        """If this thread has read the store since its last call: return once every commit made so
        far is on disk (walsync.py: another writer's commit is readable before its fdatasync). The
        API server calls it before each reply, so that no reply tells what a power loss could undo."""
        if getattr(self._local, "read", False):
            self._local.read = False
            if self._sync is not None:
                self._sync.settle()

    def _reader(self) -> apsw.Connection:
        """This thread's read connection (made at its first read, kept while it lives)."""
        self._local.read = True  # settle_reads
        con = getattr(self._local, "con", None)
        if con is None:
            con = connect(self.path, create=False, readonly=True)
            self._local.con = con
            with self._lock:
                ended = [t for t in self._readers if not t.is_alive()]
                for thread in ended:  # no thread can use these any more
                    self._readers.pop(thread).close()
                self._readers[threading.current_thread()] = con
        return con

    @contextlib.contextmanager
    def _writer_read(self) -> Iterator[apsw.Connection]:
        """The writer connection for a read, under the write lock (JobReads.jobs's `writer`)."""
        self._local.read = True  # settle_reads
        with self._lock:
            yield self._con

    def reader_count(self) -> int:
        """Read connections open now (one per thread that has read and still lives)."""
        with self._lock:
            return len(self._readers)

    def _write(self):
        if self._checkpoints is not None:
            self._checkpoints.start()
        return write(self._con, self._lock, IMPATIENT_MS if self.impatient else None, self._sync)

    def _write_script(self, script: str, bindings: dict) -> list[tuple]:
        if self._checkpoints is not None:
            self._checkpoints.start()
        return write_script(self._con, script, bindings, self._lock, IMPATIENT_MS if self.impatient else None,
                            self._sync)

    # ---- meta -------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        return self._reader().execute("SELECT value FROM meta WHERE key = ?", (key,)).get

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as con:
            con.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    # ---- host leases (controller/leases.py): meta rows `lease:HOST`, a JSON object each ----

    def host_leases(self) -> dict[str, dict]:
        """The lease last granted to each host, as set_host_leases stored it."""
        rows = self._reader().execute("SELECT key, value FROM meta WHERE key LIKE 'lease:%'")
        leases = {}
        for key, value in rows:
            try:
                leases[key[len("lease:"):]] = json.loads(value)
            except ValueError:
                continue  # unreadable: treated as no record (the start's own wait still holds)
        return leases

    def set_host_leases(self, leases: dict[str, dict]) -> None:
        """Store the lease granted to each host (one transaction), before it is sent."""
        with self._write() as con:
            for host, lease in leases.items():
                con.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                            (f"lease:{host}", json.dumps(lease, sort_keys=True)))

    # ---- writes -----------------------------------------------------------------------------

    def submit(self, jobs: Sequence[NewJob | tuple[JobSpec, str]], user: str, now: float,
               depends=None, flow: FlowRecord | None = None) -> list[int]:
        """Store new jobs and arrays in one transaction; the id of each (an array's is its first
        element's). `depends(ids) -> [resolved dependency or None]` computes the dependencies once
        the ids are known (a flow's steps depend on each other); `flow` records the steps too."""
        one = _one_plain(jobs, depends, flow)
        if one is not None:  # a one-POST submit: one call into SQLite (db.write_script)
            return [self._write_script(ONE_JOB_PLAIN, one_job(one, one.depend, user, now))[0][0]]
        with self._write() as con:
            return self._insert(con, jobs, user, now, depends, flow)

    @staticmethod
    def _insert(con: apsw.Connection, jobs: Sequence[NewJob | tuple[JobSpec, str]], user: str, now: float,
                depends, flow: FlowRecord | None) -> list[int]:
        items = [job if isinstance(job, NewJob) else NewJob(*job) for job in jobs]
        # after the highest id retention archived too (archive.py): an id is never given twice
        next_id = con.execute("SELECT max(coalesce(max(id), 0), coalesce((SELECT CAST(value AS INTEGER) FROM "
                              "meta WHERE key = 'job_id_floor'), 0)) + 1 FROM jobs").get
        ids = []
        for item in items:
            ids.append(next_id)
            next_id += max(1, len(item.indices))
        resolved = depends(ids) if depends is not None else [item.depend for item in items]
        insert_jobs(con, items, ids, resolved, user, now)
        if flow is not None:
            insert_flow(con, flow, ids, user, now)
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

    def dispatch(self, plans: Sequence[Plan | tuple], now: float) -> list[int]:
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

    def record_tick(self, w: TickWrites) -> TickRecord:
        """Everything one controller tick learned and decided (TickWrites), in ONE durable transaction.

        Order matters: a job may have started and finished since the last tick (DISP -> RUN ->
        DONE), a requeued job is pending again before the dispatches are stored, and a dispatch may
        use slots that a finish or a requeue freed. A cancel ends its pending job EXIT, with the
        event `dependency_failed`.
        """
        now = w.now
        with self._write() as con:
            started_ids, finished_ids = transitions.started_and_finished(con, w.started, w.finishes, now)
            requeued_ids, killed_ids = _requeue(con, w.requeues, now)
            cancelled_ids = _cancel(con, w.cancels, now)
            dispatched_ids = _dispatch(con, w.plans, now)
            _pend_reasons(con, w.reasons)
            for job_id, kind, data in w.events:  # a finished job's: it may be archived meanwhile
                insert_event_anywhere(con, job_id, now, kind, data)
        return TickRecord(tuple(finished_ids), tuple(started_ids), tuple(dispatched_ids), tuple(requeued_ids),
                          tuple(cancelled_ids), tuple(killed_ids))

    def requeue(self, items: Sequence[Requeue], now: float) -> list[int]:
        """Send dispatched or running jobs back to PEND (or PSUSP), in one transaction; the ids
        moved (a job someone killed is not requeued: it ends EXIT, see _requeue)."""
        with self._write() as con:
            return _requeue(con, items, now)[0]

    def record_event(self, job_id: int, kind: str, now: float, data: dict | None = None) -> None:
        with self._write() as con:
            _event(con, job_id, now, kind, data)

    def set_pend_reasons(self, reasons: dict[int, str | None]) -> None:
        """Store changed pend reasons only (the caller diffs), in one transaction."""
        if reasons:
            with self._write() as con:
                _pend_reasons(con, reasons)


def _requeue(con: apsw.Connection, items: Sequence[Requeue], now: float) -> tuple[list[int], list[int]]:
    """What the job held is cleared with the move: a pending job holds nothing and runs nowhere.

    Kill wins: a job with a `kill_requested` event since its last dispatch is never requeued,
    whatever asked (a lost host, a retry, a race with the kill); it ends EXIT with the kill's
    reason instead. Returns (ids requeued, ids ended so)."""
    moved, killed = [], []
    for r in items:
        kill = con.execute(
            "SELECT k.data FROM events k WHERE k.job_id = ? AND k.kind = 'kill_requested' AND k.seq > "
            "(SELECT coalesce(max(d.seq), 0) FROM events d WHERE d.job_id = k.job_id AND d.kind = 'dispatched') "
            "ORDER BY k.seq DESC LIMIT 1", (r.job_id,)).fetchall()
        if kill:
            reason = f"{kill_reason(text if isinstance(text := kill[0][0], str) else None)} (not requeued: {r.reason})"
            con.execute("UPDATE jobs SET state = 'EXIT', end_time = ?, reason = ? WHERE id = ? AND state = ?",
                        (now, reason, r.job_id, r.from_state))
            if con.changes() == 1:
                _event(con, r.job_id, now, "finished", {"state": "EXIT", "exit_code": None, "signal": None,
                                                        "reason": reason, "cpu_time": None, "max_rss": None,
                                                        "requeue_refused": True})
                killed.append(r.job_id)
            continue
        state = "PSUSP" if r.hold else "PEND"
        con.execute(
            "UPDATE jobs SET state = ?, hosts = NULL, unit = NULL, alloc = NULL, effective = NULL, "
            "start_time = NULL, pend_reason = NULL, reason = ?, retries = retries + ? WHERE id = ? AND state = ?",
            (state, r.reason, int(r.retry), r.job_id, r.from_state),
        )
        if con.changes() == 1:
            data: dict[str, object] = {"from": r.from_state, "to": state, "reason": r.reason}
            if r.retry:
                data.update(retry=True, result=r.result)
            _event(con, r.job_id, now, "requeued", data)
            moved.append(r.job_id)
    return moved, killed


def _dispatch(con: apsw.Connection, plans: Sequence[Plan | tuple], now: float) -> list[int]:
    """Plans, or tuples (job id, attempt, [[host, tasks]], unit[, alloc[, effective]]) in Plan's order."""
    return transitions.dispatch(con, plans, now, Plan)
