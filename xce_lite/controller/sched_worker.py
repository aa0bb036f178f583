"""Running the pure scheduler core in its own process, fed with changes rather than snapshots.

The controller's tick must not stall on a big scheduling session, and must not pay for one it does
not need. A `multiprocessing.Pool` fails the second half: every session pickled the whole pending
set across (2-3 ms per session at 1,000 jobs, 40 ms at 10,000, measured by bench/ticktime.py) and
hopped through the pool's handler threads. So the scheduler lives in one long-lived worker process
(started with forkserver: no store connection or host channel is ever copied into it) that keeps
the pending set between sessions; each session sends only what changed since the last one, plus a
checksum of the whole set. On a mismatch, a timeout or a dead worker, the next session sends
everything again, so a lost change costs one full resend, never a wrong decision.

The answer's pend reasons go the same way: a session returns only the reasons that changed since
the last answer (sched/sent_reasons.py), and the controller applies them to its live map. A job
that left or joined the pending set, or was dispatched, has its reason sent again; a full resend
(a new worker, one out of step) and a controller that could not take an answer in
(`PendingSet.report_reasons_again`) have every reason sent again; the controller may also name the
jobs whose reasons it words anew (a pool's state changed: controller/pool_views.py), and only
those are sent again.

A session that could only repeat the last answer is not run at all (sched/settled.py): when the
last answer was settled and the new input is that one's with its dispatches taken out (and jobs
that waited gone from the set: prefill's successors), the answer is known to be "nothing new" (no
dispatch, no reason changed), and the worker is not woken.

The worker builds the same `Snapshot` value the core always takes and calls the same `schedule`,
so decisions are what the core alone would give; the simulator calls `schedule` directly. The
worker also keeps a `core.SessionCache` from one session to the next, so a session re-reads only the
hosts whose free amounts changed. The cache never changes a decision and is bounded (its docstring),
so the worker's memory stays that of one session on the largest cluster it has seen.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Collection
from typing import Any
from dataclasses import dataclass

from xce_lite.controller import sched_wire  # noqa: F401  (the pipe's reducers: registered on import)
from xce_lite.controller.pending_set import _MASK, _MIX, PendingSet
from xce_lite.sched.backlog import Backlog
from xce_lite.sched.core import Decisions, PendingJob, SessionCache, Snapshot, schedule
from xce_lite.sched.sent_reasons import SentReasons
from xce_lite.sched.settled import Expected, expect, moved_on, repeats

NOTHING_NEW = Decisions((), (), True)  # the answer of a session that would repeat the last one
PIECE_JOBS = 1000  # jobs per message to the worker at most (SchedulerProcess.send)


class _Shortcut:
    """A scheduler seam's memory of its last answer, to skip a session that would repeat it
    (sched/settled.py). Holds no job of its own: it asks the pending set."""

    def __init__(self) -> None:
        self._answered: tuple[Snapshot, Decisions, bool, int] | None = None
        self._expected: Expected | None = None
        # the pending set's `removed` dict the last skip read, and how many of its entries it found
        # left nothing behind (settled.repeats' `checked`): they are not walked again
        self._removed: object = None
        self._checked = 0

    def answered(self, base: Snapshot, decisions: Decisions, settled: bool, budget: int) -> None:
        self._answered, self._expected = (base, decisions, settled, budget), None

    def forget(self) -> None:
        self._answered = self._expected = None

    def skips(self, pending: PendingSet, base: Snapshot, budget: int) -> bool:
        """Whether the session on `base` with `pending`'s changes can be skipped (answer: NOTHING_NEW);
        when not, the caller sends it and gives its answer to `answered`."""
        removed = pending.removed
        if self._answered is not None:  # the dispatched jobs have left the pending set by now
            last, decisions, settled, last_budget = self._answered
            self._answered = None
            self._expected = expect(last, decisions, removed, last_budget, settled)
            self._removed = None
        if self._removed is not removed:  # a new dict: the changes were taken since
            self._removed, self._checked = removed, 0
        if self._expected is not None and repeats(self._expected, base, budget, removed, pending.has_added,
                                                  pending.reasons_asked, pending.waits_passing, self._checked):
            self._expected = moved_on(self._expected, base.now)
            self._checked = len(removed)
            return True
        self._expected = self._removed = None
        return False


@dataclass(frozen=True)
class _Session:
    full: bool  # the worker drops what it holds and takes `added` as the whole set
    base: Snapshot  # everything but the jobs, which the worker keeps
    added: tuple[PendingJob, ...]
    removed: tuple[int, ...]
    checksum: tuple[int, int]
    budget: int
    reasons_all: bool | tuple[int, ...] = False  # answer every reason (or these jobs'), not only the changed ones
    more: bool = False  # more of this session's jobs follow in the next message: take these, do not answer yet


def _apply_changes(sent: SentReasons, session: _Session) -> None:
    """Forget the reported reasons the controller may no longer hold (module docstring)."""
    if session.full or session.reasons_all is True:
        sent.clear()
        return
    if session.reasons_all:
        sent.ask_again(session.reasons_all)
    sent.forget(session.removed)
    sent.forget(job.id for job in session.added)


def _changed_reasons(sent: SentReasons, decisions: Decisions) -> Decisions:
    """`decisions` with only the reasons not answered yet; a dispatched job's is forgotten (a
    declined dispatch leaves it another one in the controller)."""
    sent.forget(d.job_id for d in decisions.dispatches)
    # built, not replace()d: replace() walks the fields, a fixed cost of every session
    return Decisions(decisions.dispatches, sent.delta(decisions.waiting), decisions.complete)


def _serve(conn) -> None:
    """The worker's loop: apply the changes, check the set, schedule, reply. Ends on None or EOF."""
    jobs: dict[int, PendingJob] = {}
    backlog = Backlog()  # the same jobs by class (sched/backlog.py): a session costs what can change
    count = total = 0  # the checksum of `jobs`, kept as they change
    cache = SessionCache()  # kept through full resends too: it holds what hosts are, no job
    sent = SentReasons()  # the reasons answered so far: a session answers what changed
    # What the process holds from its start (the preloaded modules) is never garbage: out of the
    # collector's sight, so its passes over what sessions leave do not walk it again and again.
    gc.collect()
    gc.freeze()
    while True:
        try:
            session: _Session | None = conn.recv()
        except EOFError:
            return
        if session is None:
            return
        if session.full:
            jobs, count, total = {}, 0, 0
            backlog.clear()
            backlog.rank_by({q.name: q.priority for q in session.base.queues})  # before the adds: ranked once
        for job_id in session.removed:
            if jobs.pop(job_id, None) is not None:
                count, total = count - 1, (total - job_id * _MIX) & _MASK
                backlog.discard(job_id)
        for job in session.added:
            if job.id not in jobs:
                count, total = count + 1, (total + job.id * _MIX) & _MASK
            jobs[job.id] = job
            backlog.add(job)
        _apply_changes(sent, session)
        if session.more:
            continue
        if (count, total) != session.checksum:
            conn.send(None)  # out of step: ask for everything
            continue
        # The jobs go in as the dict's view, not a tuple of them: the snapshot lives for this call
        # only, in this process (never pickled, kept or compared), and the core only takes its
        # length and iterates it. A tuple of 10,000s of jobs, made and freed per session, touched
        # every job twice: ~0.13 ms of each steady session's 0.56 (bench/sched_sides.py --no-add).
        decisions = _schedule_without_gc(_with_jobs(session.base, jobs.values()), session.budget, cache, backlog, sent)
        conn.send((_changed_reasons(sent, decisions), cache.settled))


def _with_jobs(base: Snapshot, jobs: Collection[PendingJob]) -> Snapshot:
    """`replace(base, jobs=jobs)`, without its walk over the fields (a session's fixed cost). `jobs`
    may be a sized view for a snapshot that lives for one call in this process (_serve)."""
    return Snapshot(**{**vars(base), "jobs": jobs})


def _schedule_without_gc(snapshot: Snapshot, budget: int, cache: SessionCache, backlog: Backlog,
                         sent: SentReasons) -> Decisions:
    """A session allocates many small objects and frees them by reference counting alone (it makes
    no cycles), so the cycle collector's passes over this process's heap (10,000s of pending jobs)
    would find nothing: paused for the call. Here, not in the core: the core stays a pure function
    with no effect on the interpreter."""
    gc.disable()
    try:
        return schedule(snapshot, budget, cache=cache, backlog=backlog, told=sent.tails)
    finally:
        gc.enable()


class SchedulerProcess:
    """The controller's handle on the worker. Not thread-safe: the tick alone calls it."""

    def __init__(self, timeout: float = 60.0, shortcut: bool = True):
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["xce_lite.sched.core", "xce_lite.controller.sched_worker"])
        self._timeout = timeout
        self._proc: Any = None
        self._conn: Any = None
        self._in_step = False  # False: the next session must send the whole pending set
        self._shortcut = _Shortcut() if shortcut else None  # None: every session runs (benches compare)
        self._sent: tuple[Snapshot, int] | None = None  # the session in flight; None: skipped
        self.skipped = 0  # sessions not run: they would have repeated the last answer

    def start(self) -> None:
        """Start the worker now, if it does not run (else the next send starts it, under the
        controller's lock: sched_switch.py calls this from a thread of its own instead)."""
        if self._proc is None or not self._proc.is_alive():
            self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child,), name="xce-scheduler", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        self._in_step = False

    def send(self, pending: PendingSet, base: Snapshot, budget: int) -> None:
        """Start a session on `base` (hosts, queues, usage, time: all but the jobs) with what changed
        in `pending` (everything, when out of step).

        Called under the controller's lock, so no change to the pending set slips between the
        changes taken and the checksum sent; `receive` then waits without the lock.
        """
        if self._in_step and self._shortcut is not None and self._shortcut.skips(pending, base, budget):
            self._sent = None
            self.skipped += 1
            return
        if self._proc is None or not self._proc.is_alive():
            self._start()
        full = not self._in_step
        added, removed, checksum = pending.take_changes(full)
        reasons_all = pending.take_reasons_again()
        self._in_step = False  # until the worker confirms
        if self._shortcut is not None:
            self._shortcut.forget()
        self._sent = (base, budget)
        # Many jobs go in pieces of PIECE_JOBS: pickling 10,000s at once (a whole set sent when the
        # worker takes over from the inline side, 4,000-6,000 jobs in run.py's rss run) holds the
        # pickler's memo of every object it wrote, ~0.8 kB a job, at the controller's peak RSS.
        try:
            while len(added) > PIECE_JOBS:
                self._conn.send(_Session(full, base, added[:PIECE_JOBS], removed, checksum, budget, more=True))
                full, added, removed = False, added[PIECE_JOBS:], ()
            self._conn.send(_Session(full, base, added, removed, checksum, budget, reasons_all))
        except (OSError, ValueError):  # it died just now (is_alive had not seen it yet): as in receive
            self.close()

    def resync(self) -> None:
        """The next session sends the whole pending set, and none is skipped on the memory of an
        earlier answer (sched_switch.py: this side takes over from the other)."""
        self._in_step = False
        if self._shortcut is not None:
            self._shortcut.forget()

    def receive(self) -> Decisions | None:
        """The session's decisions; None if the worker was out of step (the next send is full).

        TimeoutError if the worker does not answer in time: it is stopped, and the next send
        starts a new one.
        """
        if self._sent is None:
            return NOTHING_NEW
        base, budget = self._sent
        self._sent = None
        if self._conn is None:  # the send found it dead: the next send starts a new one, in full
            return None
        try:
            if not self._conn.poll(self._timeout):
                self.close()
                raise TimeoutError(f"the scheduler gave no answer within {self._timeout:g} s")
            reply = self._conn.recv()
        except (EOFError, OSError):  # the worker died: the next send starts a new one
            self.close()
            return None
        self._in_step = reply is not None
        if reply is None:
            return None
        decisions, settled = reply
        if self._shortcut is not None:
            self._shortcut.answered(base, decisions, settled, budget)
        return decisions

    def close(self) -> None:
        if self._shortcut is not None:
            self._shortcut.forget()
        self._in_step = False
        if self._conn is not None:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.join(2)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(2)
            self._proc = None


class InlineScheduler:
    """The scheduler seam in-process (tests, the simulator): the same `schedule` on the same
    snapshot the worker would build, on the caller's thread, and the same sessions skipped
    (`shortcut=False`: none, to compare)."""

    def __init__(self, shortcut: bool = True) -> None:
        self._cache = SessionCache()
        self._backlog = Backlog()  # fed with the set's changes, as the worker's is
        self._sent = SentReasons()  # and answering the changed reasons, as the worker does
        self._full = True
        self._session: Snapshot | None = None
        self._base: Snapshot | None = None
        self._budget = 0
        self._shortcut = _Shortcut() if shortcut else None
        self._skipped = False
        self.skipped = 0  # as SchedulerProcess.skipped

    def send(self, pending: PendingSet, base: Snapshot, budget: int) -> None:
        self._skipped = not self._full and self._shortcut is not None and self._shortcut.skips(pending, base, budget)
        if self._skipped:
            self.skipped += 1
            return
        added, removed, checksum = pending.take_changes(self._full)
        _apply_changes(self._sent, _Session(self._full, base, added, removed, checksum, budget,
                                            pending.take_reasons_again()))
        if self._full:
            self._backlog.clear()
            self._backlog.rank_by({q.name: q.priority for q in base.queues})  # before the adds: ranked once
            self._full = False
        for job_id in removed:
            self._backlog.discard(job_id)
        for job in added:
            self._backlog.add(job)
        self._session, self._base, self._budget = _with_jobs(base, tuple(pending.values())), base, budget

    def resync(self) -> None:
        """As SchedulerProcess.resync: the next session starts afresh (whole set, every reason)."""
        self._full = True
        if self._shortcut is not None:
            self._shortcut.forget()

    def let_go(self) -> None:
        """Drop what the inline side holds of the pending set (its backlog index and the reasons it
        told, a few hundred bytes a job): the worker took over (sched_switch.py), and the next
        session here starts afresh anyway. Kept, they held the set as it was at the switch, 4,000-
        6,000 jobs in run.py's rss run (sessions stay inline while the worker starts), ~2 MB of the
        controller's RSS for as long as the sessions stay in the worker."""
        self.resync()
        self._backlog, self._sent, self._cache = Backlog(), SentReasons(), SessionCache()
        self._session = self._base = None

    @property
    def full_next(self) -> bool:
        """Whether the next session takes the whole set (a full session's cost is not a small one's)."""
        return self._full

    def receive(self) -> Decisions | None:
        if self._skipped:
            self._skipped = False
            return NOTHING_NEW
        session, self._session = self._session, None
        if session is None:
            return None
        decisions = schedule(session, self._budget, cache=self._cache, backlog=self._backlog, told=self._sent.tails)
        if self._shortcut is not None and self._base is not None:
            self._shortcut.answered(self._base, decisions, self._cache.settled, self._budget)
        return _changed_reasons(self._sent, decisions)

    def close(self) -> None:
        pass
