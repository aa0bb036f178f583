"""Prefill (issue 18): after a session, name for a running unit the pending job that will take its
allocation over the moment it ends, so that the host starts it without waiting for the controller
(HyperQueue assigns tasks beyond a worker's free resources for the same reason).

Pure, like core.py: values in, values out, no clock. The caller (the controller; never the
simulator, whose hashes stay as they are) decides whether to call it at all.

Invariants:
- A successor fits INSIDE its predecessor's allocation on that one host: its placement is searched
  on a view of the host whose free amounts are exactly what the unit holds (slots, mem, every other
  consumable, its GPU indices), with the host's own attributes, tags and state, so its -R select,
  same, order and span rules hold as for a dispatch, and its queue's hosts must name the host.
  Shared counters (licenses) are not taken over: a job that asks for one is never a successor.
- At most one successor per unit (`RunningUnit.taken`: it has one already), one unit per job. A
  unit is one that runs, or a queued successor the caller lets have one (a chain, the controller's
  `prefill_depth`): its successor fits inside what it holds, as for any unit.
- Jobs are taken in a dispatch's order (queue priority, job priority, id), each meeting its queue's
  running limits as if its predecessor's slots were already given back when they are of the same
  queue (and user).
- It names none where the order could not be kept or a rule is not modelled here: while some job
  is old enough to hold a reservation (a successor would take what it waits for), for jobs of
  fair-share queues (their order moves with each dispatch) and while project limits apply.

Withdrawal (`withdrawals`, HyperQueue retracts prefilled tasks the same way): a queued successor
that a dispatch could place NOW on what is free once the session's dispatches are taken (another
host, or a free slot of its own host) should not wait behind a unit that may run for hours. It is
named for withdrawal; the host's answer decides (dropped: PEND again; started first: it runs). On a
host whose every slot is busy nothing is free, so none is named there. And (`outranked`) a queued
successor gives way to a pending job of higher rank that successors() would name behind its unit
instead (LSF users expect priority order): it is withdrawn the same way, and the next session names
that job there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

from xce_lite.sched.core import Decisions, PendingJob, QueuePolicy, Snapshot, _within_limits, take
from xce_lite.sched.fit import GPUS
from xce_lite.sched.placement import HostView, place
from xce_lite.sched.backlog import rank_of
from xce_lite.sched.prefill_memo import PlaceMemo
from xce_lite.sched.prefill_rank import Ranked
from xce_lite.sched.reasons import FrozenMap, Placement, Refusal

EXAMINED = 1_000  # pending jobs looked at per call at most: a backlog costs no more than this
RESERVED = "a reservation"  # in core.schedule's reasons of a job that holds one, and of those behind it


@dataclass(frozen=True)
class RunningUnit:
    """A running job's unit on one host and what it holds there (base units, `slots` included)."""

    job_id: int
    host: str
    queue: str
    user: str
    reserved: FrozenMap
    gpus: tuple[int, ...] = ()
    taken: bool = False  # it has a successor already


@dataclass(frozen=True)
class Successor:
    job_id: int
    after: int  # the job whose unit it follows
    placement: Placement
    profile_hash: str = ""

    @property
    def host(self) -> str:
        return self.placement.allocs[0].host

    @property
    def reason(self) -> str:
        """Its reason while it waits (stored with the DISP job, shown like any pend reason)."""
        return queued_reason(self.host, self.after)


@dataclass(frozen=True)
class QueuedSuccessor:
    """A successor waiting in its host's queue: the job as it was dispatched, where, and behind whom."""

    job: PendingJob
    host: str
    after: int


_ID = attrgetter("id")


def queued_reason(host: str, after: int) -> str:
    return f"queued on {host} behind job {after}"


def successors(snapshot: Snapshot, decisions: Decisions, running: tuple[RunningUnit, ...],
               examined: int = EXAMINED, ranked: Ranked | None = None,
               memo: PlaceMemo | None = None) -> tuple[Successor, ...]:
    """The successors to name now for `running`'s free units, given the session `decisions` made on
    `snapshot` (its dispatched jobs are not candidates; their slots count for the queue limits).
    `ranked`: the pending jobs kept in order by the caller (prefill_rank.py, synced with
    `snapshot.queues`' priorities), read instead of `snapshot.jobs` (then left empty): the same
    answer without a pass over the backlog. `memo`: placements and views kept by the caller from
    call to call (prefill_memo.py), which give the same answer."""
    units = [u for u in sorted(running, key=lambda u: (u.host, u.job_id)) if not u.taken]
    if not units or not _may_name(snapshot, decisions):
        return ()
    hosts = {h.name: h for h in snapshot.hosts}
    inside = _inside if memo is None else lambda host, unit: memo.inside(host, unit, _inside)
    views = {u: inside(hosts.get(u.host), u) for u in units}
    units = [u for u in units if views[u] is not None]
    room = _Room(snapshot, decisions, ranked, memo)
    dispatched = {d.job_id for d in decisions.dispatches}
    chosen: list[Successor] = []
    looked = 0
    for job in room.order(snapshot.jobs):
        if not units or looked >= examined:
            break
        if job.id in dispatched or job.blocked is not None or job.queue in room.fair:
            continue
        looked += 1
        if room.hopeless(job):
            continue
        for unit in units:
            result = room.behind(job, unit, views[unit])
            if result is None:
                continue
            chosen.append(Successor(job.id, unit.job_id, result, job.profile_hash))
            units.remove(unit)
            room.take(job, unit, result)
            break
        else:
            room.refused_by_all(job, [u.job_id for u in units])
    return tuple(chosen)


def outranked(snapshot: Snapshot, decisions: Decisions, queued: tuple[QueuedSuccessor, ...],
              units: tuple[RunningUnit, ...], placed: frozenset[int] = frozenset(),
              examined: int = EXAMINED, ranked: Ranked | None = None,
              memo: PlaceMemo | None = None) -> tuple[tuple[int, int], ...]:
    """(queued successor, the pending job it gives way to) for each queued successor S that a
    pending job J of higher rank (a dispatch's order) could replace behind S's unit, as
    successors() would name it there: J fits inside the unit, its rules and limits hold, and it is
    neither dispatched by the session nor in `placed` (named a successor elsewhere now).

    `units` are the predecessors (`QueuedSuccessor.after`); `snapshot.jobs` the pending jobs. Jobs
    are taken in rank order and each gives way to one successor, the last-ranked it can replace, so
    the next session names J there (its unit is the only free one J fits) and S, pending, ranks
    after J: no thrash, and each withdrawal puts a job of higher rank in a place, so it ends.
    The same guards as successors(), and `ranked` and `memo` as there; at most `examined` pending jobs looked at."""
    if not queued or not _may_name(snapshot, decisions):
        return ()
    room = _Room(snapshot, decisions, ranked, memo)
    by_id = {u.job_id: u for u in units}
    hosts = {h.name: h for h in snapshot.hosts}
    waiting: list[tuple[tuple, QueuedSuccessor, RunningUnit, HostView]] = []  # (rank of S, S, its unit, view)
    for q in queued:
        unit = by_id.get(q.after)
        if unit is None or unit.host != q.host:
            continue
        view = _inside(hosts.get(q.host), unit) if memo is None else memo.inside(hosts.get(q.host), unit, _inside)
        if view is not None:
            waiting.append((room.rank(q.job), q, unit, view))
    if not waiting:
        return ()
    waiting.sort(key=lambda w: w[0])
    dispatched = {d.job_id for d in decisions.dispatches}
    out: list[tuple[int, int]] = []
    looked = 0
    for job in room.order(snapshot.jobs):
        if not waiting or looked >= examined or room.rank(job) >= waiting[-1][0]:
            break  # (no queued successor ranks after the jobs still to come)
        if job.id in dispatched or job.id in placed or job.blocked is not None or job.queue in room.fair:
            continue
        looked += 1
        if room.hopeless(job):
            continue
        rank = room.rank(job)
        for index in range(len(waiting) - 1, -1, -1):  # the last-ranked successor first
            s_rank, q, unit, view = waiting[index]
            if s_rank <= rank:
                break
            result = room.behind(job, unit, view)
            if result is None:
                continue
            out.append((q.job.id, job.id))
            del waiting[index]
            room.take(job, unit, result)
            break
        else:
            room.refused_by_all(job, [w[2].job_id for w in waiting])
    return tuple(out)


def _may_name(snapshot: Snapshot, decisions: Decisions) -> bool:
    """Whether successors may be named after this session: it is complete, no project limits
    apply, and no job holds a reservation (a job that holds one says so in its reason, and so do
    the jobs behind it, core.py's words: the session's few reasons are read, not its 10,000 jobs)."""
    if not decisions.complete:
        return False
    if snapshot.projects is not None and not snapshot.projects.open:
        return False
    return not (snapshot.reserve_after > 0 and any(RESERVED in reason for reason, _ids in decisions.waiting))


class _Room:
    """The queues' running limits as successors meet them (the session's dispatches count), the
    rank of a dispatch, and each job's fit behind a unit."""

    def __init__(self, snapshot: Snapshot, decisions: Decisions, ranked: Ranked | None = None,
                 memo: PlaceMemo | None = None) -> None:
        self.queues = {q.name: q for q in snapshot.queues}
        self.priority = {name: q.priority for name, q in self.queues.items()}
        self.fair = {q.queue for q in snapshot.fairshare.queues} if snapshot.fairshare is not None else set()
        self.queue_used: dict[str, int] = {}
        self.user_used: dict[tuple[str, str], int] = {}
        for queue, user, slots in snapshot.running:
            self._add(queue, user, slots, slots)
        self.ranked, self.memo = ranked, memo
        by_id = ranked if ranked is not None else {j.id: j for j in snapshot.jobs} if decisions.dispatches else {}
        for d in decisions.dispatches:
            job = by_id.get(d.job_id)
            if job is not None:
                self._add(job.queue, job.user, d.placement.tasks, d.placement.tasks)
        self.refused: set[tuple[int, int]] = set()  # (shape, unit id): refused there once, refused there again
        # each shape (queue hosts, tasks, -R) as a small number, the last job's kept: a job is
        # tried against many units, and hashing its -R each time was most of a backlog's cost
        self.shapes: dict[tuple, int] = {}
        self._last: tuple[PendingJob | None, int] = (None, 0)
        self.dead: set[int] = set()  # shapes refused inside every unit still free: their jobs are skipped

    def shape_of(self, job: PendingJob) -> int:
        """`job`'s shape (queue hosts, tasks, -R) as a small number."""
        if self._last[0] is not job:
            policy = self.queues.get(job.queue, _NO_POLICY)
            shape = (policy.hosts, job.request.min_tasks, job.request.max_tasks, job.request.resreq)
            self._last = (job, self.shapes.setdefault(shape, len(self.shapes)))
        return self._last[1]

    def hopeless(self, job: PendingJob) -> bool:
        """Whether `job`'s shape was refused inside every unit still free (refused_by_all): a
        backlog of jobs too big for the units is passed over without a try per unit."""
        return bool(self.dead) and self.shape_of(job) in self.dead

    def refused_by_all(self, job: PendingJob, units: list[int]) -> None:
        """After `job` found no place in `units` (the ids of those still free): if placement refused
        its shape in each one, every job of that shape is hopeless for the rest of this call
        (a refusal there is for good within a call, and units are only taken away, never added)."""
        shape = self.shape_of(job)
        if all((shape, unit) in self.refused for unit in units):
            self.dead.add(shape)

    def _add(self, queue: str, user: str, tasks: int, user_tasks: int) -> None:
        self.queue_used[queue] = self.queue_used.get(queue, 0) + tasks
        self.user_used[(queue, user)] = self.user_used.get((queue, user), 0) + user_tasks

    def rank(self, job: PendingJob) -> tuple:  # a dispatch's order (core.schedule's rank)
        return rank_of(job, self.priority)

    def order(self, jobs: tuple[PendingJob, ...]) -> Iterable[PendingJob]:
        if self.ranked is not None:  # kept in this order by the caller: nothing to sort
            return self.ranked
        # one class: rank is id order (a key in C: a backlog's cost)
        one_class = len({j.queue for j in jobs}) == 1 and len({j.priority for j in jobs}) == 1
        return sorted(jobs, key=_ID) if one_class else sorted(jobs, key=self.rank)

    def _give_back(self, job: PendingJob, unit: RunningUnit) -> tuple[int, int]:
        """The unit's slots, given back for `job`'s limits when of its queue (and user)."""
        slots = unit.reserved.get("slots", 0) if unit.queue == job.queue else 0
        return slots, slots if unit.user == job.user else 0

    def behind(self, job: PendingJob, unit: RunningUnit, view: HostView | None) -> Placement | None:
        """Where `job` goes inside `unit`, or None: its queue's hosts, limits and rules must hold."""
        policy = self.queues.get(job.queue, _NO_POLICY)
        if view is None or (policy.hosts is not None and unit.host not in policy.hosts):
            return None
        key = (self.shape_of(job), unit.job_id)
        if key in self.refused:
            return None
        give_back, give_back_user = self._give_back(job, unit)
        queue_room = dict(self.queue_used)
        queue_room[job.queue] = queue_room.get(job.queue, 0) - give_back
        user_room = dict(self.user_used)
        user_room[(job.queue, job.user)] = user_room.get((job.queue, job.user), 0) - give_back_user
        why, request = _within_limits(job, policy, queue_room, user_room)
        if why is not None:
            return None
        result = place(request, (view,)) if self.memo is None else self.memo.place(request, view)
        if isinstance(result, Refusal) or result.shared:
            self.refused.add(key)
            return None
        return result

    def take(self, job: PendingJob, unit: RunningUnit, result: Placement) -> None:
        give_back, give_back_user = self._give_back(job, unit)
        self._add(job.queue, job.user, result.tasks - give_back, result.tasks - give_back_user)


_NO_POLICY = QueuePolicy("", priority=0)


def _inside(host: HostView | None, unit: RunningUnit) -> HostView | None:
    """The host as a successor of `unit` sees it: free is what the unit holds; None if the host
    takes no new work (closed, unreachable, unknown)."""
    if host is None or host.state != "ok":
        return None
    free = {name: min(unit.reserved.get(name, 0), total) for name, total in host.total.items()}
    if GPUS in free:
        free[GPUS] = len(unit.gpus)  # its own indices, which it passes on
    return host.with_free(FrozenMap(free), unit.gpus)


def withdrawals(snapshot: Snapshot, decisions: Decisions | None,
                queued: tuple[QueuedSuccessor, ...]) -> tuple[tuple[int, Placement], ...]:
    """(job id, where a dispatch could place it now) for each queued successor to withdraw.

    `snapshot.hosts` are the session's views (a queued successor holds nothing of its own in them);
    `decisions` the session's own (None: no session ran), whose dispatches take what they use first.
    Successors are taken in a dispatch's order, each taking what it would use, so two are never
    named for one free slot. None while a reservation is held (the free room is kept for the job
    that holds it), nor after an incomplete session (its dispatches are not all known)."""
    if not queued or (decisions is not None and not decisions.complete):
        return ()
    if decisions is not None and snapshot.reserve_after > 0 and any(
            RESERVED in reason for reason, _ids in decisions.waiting):
        return ()
    hosts = [h for h in snapshot.hosts if h.state == "ok"]
    shared = snapshot.shared_free
    for d in decisions.dispatches if decisions is not None else ():
        hosts, shared = take(hosts, shared, d.placement)
    queues = {q.name: q for q in snapshot.queues}
    priority = {name: q.priority for name, q in queues.items()}
    out: list[tuple[int, Placement]] = []
    for q in sorted(queued, key=lambda q: (-priority.get(q.job.queue, 0), -q.job.priority, q.job.id)):
        policy = queues.get(q.job.queue)
        allowed = [h for h in hosts if policy is None or policy.hosts is None or h.name in policy.hosts]
        result = place(q.job.request, allowed, shared) if allowed else None
        if result is None or isinstance(result, Refusal):
            continue
        out.append((q.job.id, result))
        hosts, shared = take(hosts, shared, result)
    return tuple(out)
