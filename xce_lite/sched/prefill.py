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
- At most one successor per running unit (`RunningUnit.taken`: it has one already), one unit per job.
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
host whose every slot is busy nothing is free, so none is named there.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from xce_lite.sched.core import Decisions, PendingJob, QueuePolicy, Snapshot, _within_limits, take
from xce_lite.sched.fit import GPUS
from xce_lite.sched.placement import HostView, place
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
               examined: int = EXAMINED) -> tuple[Successor, ...]:
    """The successors to name now for `running`'s free units, given the session `decisions` made on
    `snapshot` (its dispatched jobs are not candidates; their slots count for the queue limits)."""
    units = [u for u in sorted(running, key=lambda u: (u.host, u.job_id)) if not u.taken]
    if not units or not decisions.complete:
        return ()
    if snapshot.projects is not None and not snapshot.projects.open:
        return ()
    dispatched = {d.job_id for d in decisions.dispatches}
    # a job that holds a reservation says so in its reason, and so do the jobs behind it (core.py's
    # words): the session's few reasons are read, not its 10,000 jobs
    if snapshot.reserve_after > 0 and any(RESERVED in reason for reason, _ids in decisions.waiting):
        return ()
    queues = {q.name: q for q in snapshot.queues}
    no_policy = QueuePolicy("", priority=0)
    fair = {q.queue for q in snapshot.fairshare.queues} if snapshot.fairshare is not None else set()
    hosts = {h.name: h for h in snapshot.hosts}
    views = {u: _inside(hosts.get(u.host), u) for u in units}
    units = [u for u in units if views[u] is not None]

    queue_used: dict[str, int] = {}
    user_used: dict[tuple[str, str], int] = {}
    for queue, user, slots in snapshot.running:
        queue_used[queue] = queue_used.get(queue, 0) + slots
        user_used[(queue, user)] = user_used.get((queue, user), 0) + slots
    by_id = {j.id: j for j in snapshot.jobs} if decisions.dispatches else {}
    for d in decisions.dispatches:
        job = by_id.get(d.job_id)
        if job is not None:
            queue_used[job.queue] = queue_used.get(job.queue, 0) + d.placement.tasks
            user_used[(job.queue, job.user)] = user_used.get((job.queue, job.user), 0) + d.placement.tasks

    priority = {name: q.priority for name, q in queues.items()}

    def rank(job: PendingJob) -> tuple:  # a dispatch's order (core.schedule's rank)
        return (-priority.get(job.queue, 0), -job.priority, job.id)

    chosen: list[Successor] = []
    refused: set[tuple] = set()  # (shape, unit): refused there once, refused there again
    if len({j.queue for j in snapshot.jobs}) == 1 and len({j.priority for j in snapshot.jobs}) == 1:
        order = sorted(snapshot.jobs, key=_ID)  # one class: rank is id order (a key in C: a backlog's cost)
    else:
        order = sorted(snapshot.jobs, key=rank)
    looked = 0
    for job in order:
        if not units or looked >= examined:
            break
        if job.id in dispatched or job.blocked is not None or job.queue in fair:
            continue
        looked += 1
        policy = queues.get(job.queue, no_policy)
        for unit in units:
            if policy.hosts is not None and unit.host not in policy.hosts:
                continue
            key = (policy.hosts, job.request.min_tasks, job.request.max_tasks, job.request.resreq, unit)
            if key in refused:
                continue
            give_back = unit.reserved.get("slots", 0) if unit.queue == job.queue else 0
            give_back_user = give_back if unit.user == job.user else 0
            queue_room = dict(queue_used)
            queue_room[job.queue] = queue_room.get(job.queue, 0) - give_back
            user_room = dict(user_used)
            user_room[(job.queue, job.user)] = user_room.get((job.queue, job.user), 0) - give_back_user
            why, request = _within_limits(job, policy, queue_room, user_room)
            if why is not None:
                continue
            view = views[unit]
            assert view is not None  # units without a view were left out above
            result = place(request, (view,))
            if isinstance(result, Refusal) or result.shared:
                refused.add(key)
                continue
            chosen.append(Successor(job.id, unit.job_id, result, job.profile_hash))
            units.remove(unit)
            tasks = result.tasks - give_back
            queue_used[job.queue] = queue_used.get(job.queue, 0) + tasks
            user_used[(job.queue, job.user)] = user_used.get((job.queue, job.user), 0) + result.tasks \
                - give_back_user
            break
    return tuple(chosen)


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
