"""The scheduler core: a pure function from a snapshot to decisions.

No I/O, no clock, no SQL: frozen, picklable values in and out, so the call crosses a process
boundary and the simulator can run the very same function. The same snapshot gives the same
decisions.

Policy: jobs are taken by queue priority (higher first), then job priority (`-sp`, higher first),
then submit order (job id). A job first meets its queue's running limits (slots in use by the
queue, and by its user in the queue); its task range is cut to what the limits leave. Then it is
placed by `placement.place`, on its queue's hosts, against what is still free in this session (task
ranges, span, rusage, GPUs, select, same, order). A job that cannot start now pends with the full
reason, and later jobs may still start past it. A job marked `blocked` (its profile vanished, a
reconfig made it unrunnable) is not placed at all: it pends with that reason...

...until it has waited `reserve_after` seconds (the starvation guard, LSF's slot reservation
without backfill): then it holds a reservation, and every job after it in order waits, so running
jobs drain until it fits. Backfill by run limit (letting short jobs use the drain) is a later step.

Projects and fair share (sched/projects.py, sched/fairshare.py): a job also meets the limits of its
project and every ancestor (`Usage.room` cuts its task range to what they leave; the placement
itself is checked by `Usage.over`), each dispatch counting at once; a fair-share queue's jobs are
taken in `fairshare.Ordering`'s order, which a dispatch changes. Without projects or fair share
in the snapshot, the session is what it was, byte for byte.

Sessions: within one session, a request shape (task range and -R, on its queue's host set) proven
unplaceable is not searched again until a dispatch changes what is free; a cache hit returns the
FULL reason of the attempt that proved it, never an empty one. The searches themselves go through
one `session.Session`, which keeps each shape's candidate hosts current as dispatches take from
them, rather than scanning every host each time.

Carrying over (`SessionCache`): a caller that schedules again and again (the simulator, the
scheduler worker) passes the same cache to every call. The placement Session, its shapes and
their candidates, and the refusal texts then live from one call to the next, and a call reads
again only the hosts whose free amounts changed: a session costs what changed, not what exists.
A cache never changes a decision: the same snapshot gives the same decisions, byte for byte, with
a cache or without, warm or cold (the tests compare them after random changes).

A backlog (`schedule(..., backlog=)`, backlog.py): the same pending jobs grouped by class, kept by
the caller from one call to the next, so a session over a large backlog gives a class's waiting
jobs their common reason at once instead of examining each; the same decisions, byte for byte.
With `told=` too (backlog.py, Told tails), `waiting` leaves out the jobs told the same reason before:
for a caller that answers only the reasons that changed, which then answers the same.

Observing (the simulator's trace): `schedule(..., observe=f)` calls `f(Examined(...))` for every job
it examines, in order, with what it found: the plan, the search's full `Refusal` (per-host reasons
and the hosts with room), the job whose identical request proved unsatisfiable earlier this session
(a cache hit), or the limit or reservation that held it back. Observing only reads: the decisions
are the same with or without it, and without it the session pays one `is None` test per job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from xce_lite.sched.backlog import Backlog, Told
from xce_lite.sched.fairshare import FairShareInput, Ordering
from xce_lite.sched.fit import taken
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.projects import Projects, Usage, held
from xce_lite.sched.reasons import NOTHING, FrozenMap, Placement, Refusal
from xce_lite.sched.session import Session

HOST_OK = "ok"
SUMMARIES_KEPT = 256  # refusals kept per session to reuse their text (see schedule)


@dataclass(frozen=True)
class QueuePolicy:
    name: str
    priority: int = 30
    hosts: frozenset[str] | None = None  # None: every host
    running_limit: int | None = None  # slots the queue's jobs may hold at once
    user_running_limit: int | None = None  # slots one user's jobs in the queue may hold at once


@dataclass(frozen=True)
class PendingJob:
    id: int
    user: str
    queue: str
    request: JobRequest  # the effective request; request.id == id
    priority: int = 0  # -sp: among one queue's jobs, higher first
    submit_time: float = 0.0
    # The content hash of its application profile's version its request was merged with; carried
    # onto its Dispatch so the controller can refuse a decision made on a profile since changed.
    profile_hash: str = ""
    # Why it cannot be considered at all (its profile vanished, a reconfig made its request
    # unrunnable): it pends with this reason, unplaced, until a reconfig or a kill.
    blocked: str | None = None
    project: str | None = None  # its project's path (sched/projects.py); None: stored before projects

    @property
    def shape(self) -> tuple:
        """What placement depends on: jobs of one shape succeed or fail alike against one state."""
        return (self.request.min_tasks, self.request.max_tasks, self.request.resreq)


@dataclass(frozen=True)
class Snapshot:
    hosts: tuple[HostView, ...]  # free amounts: totals less what running jobs reserve
    jobs: tuple[PendingJob, ...]  # PEND jobs only; held ones are not candidates
    queues: tuple[QueuePolicy, ...]  # a job of a queue not listed gets priority 0 and no limits
    shared_free: FrozenMap = NOTHING  # cluster-wide counters (licenses) still free
    # (queue, user, slots) held by dispatched jobs: one per job, or summed per queue and user (the
    # controller's index keeps the sums: controller/active.py); the core only adds them up.
    running: tuple[tuple[str, str, int], ...] = ()
    now: float = 0.0  # time is an argument: the starvation guard compares it with submit times
    reserve_after: float = 0.0  # seconds; 0: no reservations
    # Projects and their limits (sched/projects.py); None or open mode: no project limits. And what
    # running jobs hold per project (the path they were submitted to; projects.held's amounts, summed).
    projects: Projects | None = None
    project_held: tuple[tuple[str | None, FrozenMap], ...] = ()
    # Fair-share queues, each entity's decayed usage and running slots (sched/fairshare.py).
    fairshare: FairShareInput | None = None


@dataclass(frozen=True)
class Dispatch:
    job_id: int
    placement: Placement
    profile_hash: str = ""  # the job's, as the decision saw it

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return self.placement.hosts


DISPATCHED, REFUSED, KNOWN_UNSAT, LIMITED, BLOCKED, BEHIND = (
    "dispatched", "refused", "known_unsat", "limited", "blocked", "behind")


@dataclass(frozen=True)
class Examined:
    """What one session did with one job (see the module docstring, Observing). `request` is the
    one placed: the job's, its task range cut to what its queue's running limits leave."""

    job_id: int
    kind: str  # DISPATCHED, REFUSED, KNOWN_UNSAT, LIMITED, BLOCKED or BEHIND
    request: JobRequest
    reason: str | None = None  # why it waits; None when dispatched
    outcome: Placement | Refusal | None = None  # the plan (DISPATCHED) or the search's refusal (REFUSED)
    proved_by: int | None = None  # KNOWN_UNSAT: the job whose search proved the request unsatisfiable
    reserved: bool = False  # it now holds a reservation: later jobs wait for it


class SessionCache:
    """What one `schedule` call leaves for the next, so that it costs what changed: the placement
    Session (see `session.Session.renew`) and the refusal texts. The caller owns it and passes it
    to each call, one call at a time (not thread-safe). It holds values derived from the hosts it
    has seen, never a decision, and it is bounded: at most `session.MAX_SHAPES` request shapes,
    each with its candidate hosts and their reasons, and SUMMARIES_KEPT refusal texts. A call that
    did not end (an exception) leaves it to be built afresh."""

    __slots__ = ("_busy", "_session", "settled", "summaries")

    def __init__(self) -> None:
        self._session: Session | None = None
        self._busy = False  # a call is using it; still True at the next: that one did not end
        # Whether the last call's answer is a fixed point (see `schedule`): a call on its snapshot
        # with its dispatches taken out (and its jobs gone, nothing else changed, no job coming to
        # hold a reservation meanwhile) dispatches nothing and gives every job the same reason.
        self.settled = False
        # (queue's hosts, task range, -R) -> its last refusal and that refusal's text (see _summary)
        self.summaries: dict[tuple, tuple[Refusal, str]] = {}

    def begin(self, hosts: tuple[HostView, ...], shared_free: FrozenMap) -> Session:
        """The Session for a call on `hosts` and `shared_free`: the last one, renewed."""
        if self._session is None or self._busy:
            self._session, self.summaries = Session(hosts, shared_free), {}
        else:
            self._session.renew(hosts, shared_free)
        self._busy = True
        return self._session

    def end(self) -> None:
        self._busy = False


@dataclass(frozen=True)
class Decisions:
    dispatches: tuple[Dispatch, ...]
    # Why the others wait, grouped: (reason, ids of the jobs it holds for), in first-seen order.
    # Grouped because many jobs share a reason: it keeps the reply across processes small.
    waiting: tuple[tuple[str, tuple[int, ...]], ...]
    complete: bool  # False when the budget ran out before every job was examined

    @property
    def pend_reasons(self) -> tuple[tuple[int, str], ...]:
        """(job id, why it waits) for every job examined and not dispatched."""
        return tuple((job_id, reason) for reason, ids in self.waiting for job_id in ids)


def schedule(snapshot: Snapshot, budget: int = 1_000_000, observe: Callable[[Examined], None] | None = None,
             cache: SessionCache | None = None, backlog: Backlog | None = None, told: Told | None = None) -> Decisions:
    """Decide which pending jobs start now and why the others wait.

    `budget` bounds the jobs examined in this session; the rest keep their previous reasons and
    `complete` says so, so a huge backlog can never stall the controller's tick. `observe`, if
    given, is told what was found for each job examined (module docstring); it cannot change a
    decision. `cache`, if given, carries what this call reads from the last call that had it to
    the next (module docstring, Carrying over); it cannot change a decision either. `backlog`, if
    given, holds the same jobs as `snapshot.jobs`, by class (backlog.py), so that a class's jobs
    that all wait for one reason are given it at once; it cannot change a decision either. `told`
    (with `backlog`; module docstring) leaves told jobs out of `waiting`, never out of a decision.
    """
    queues = {q.name: q for q in snapshot.queues}
    no_policy = QueuePolicy("", priority=0)

    def rank(job: PendingJob) -> tuple:
        return (-queues.get(job.queue, no_policy).priority, -job.priority, job.id)

    ordering = None
    if snapshot.fairshare is not None and snapshot.fairshare.queues:
        ordering = Ordering(snapshot.jobs, lambda q: queues.get(q, no_policy).priority, snapshot.fairshare)
        order: Iterable[PendingJob] | None = ordering
    else:  # Timsort: the controller sends jobs in id order, so this is close to linear (a backlog needs none).
        order = None
    usage = Usage(snapshot.projects, snapshot.project_held) \
        if snapshot.projects is not None and not snapshot.projects.open else None
    queue_used: dict[str, int] = {}
    user_used: dict[tuple[str, str], int] = {}
    for queue, user, slots in snapshot.running:
        queue_used[queue] = queue_used.get(queue, 0) + slots
        user_used[(queue, user)] = user_used.get((queue, user), 0) + slots
    # (queue's hosts, task range, -R) -> reason; valid until a dispatch changes what is free. Keyed by
    # the queue's host set, not its name: placement reads nothing else of the queue, so queues that
    # share their hosts share one search.
    refused: dict[tuple, str] = {}
    provers: dict[tuple, int] = {}  # observing only: shape -> the job whose search refused it
    # The same key -> its last refusal and that refusal's summary, for the last SUMMARIES_KEPT keys
    # met: a shape searched again after a dispatch that changed nothing it reads is refused alike,
    # and its text is not composed again. (Comparing is cheap: the session reuses the per-host
    # reasons.) Bounded: a refusal holds a reason for every host.
    if cache is None:
        summaries: dict[tuple, tuple[Refusal, str]] = {}
        session = Session(snapshot.hosts, snapshot.shared_free)
    else:
        session = cache.begin(snapshot.hosts, snapshot.shared_free)
        summaries = cache.summaries
    dispatches: list[Dispatch] = []
    waiting: dict[str, list[int]] = {}
    holder: PendingJob | None = None  # the job holding a reservation, once one does
    kind = ""  # the last job's outcome (see Examined.kind)
    changes = 0  # dispatches and reservations so far: what may change a later job's outcome
    # `changes` when the first job was given a reason that reads the state (not blocked): if no
    # change came after it, every reason was given on the state the dispatches leave (settled).
    first_wait: int | None = None

    def examine(job: PendingJob) -> str | None:
        """One job: None if it is dispatched, else why it waits (and it is added to `waiting`)."""
        nonlocal holder, kind, changes, first_wait
        policy = queues.get(job.queue, no_policy)
        request = job.request
        reason: str | None
        if job.blocked is not None:
            reason, kind = job.blocked, BLOCKED
        elif holder is not None:
            reason, kind = f"waiting behind job {holder.id}, which holds a reservation until it can start", BEHIND
        else:
            reason, request = _within_limits(job, policy, queue_used, user_used)
            kind = LIMITED
            if reason is None and usage is not None:
                reason, request = usage.room(job.project, request)
        result: Placement | Refusal | None = None
        reserved = False
        if reason is None:
            shape = (policy.hosts, request.min_tasks, request.max_tasks, request.resreq)
            reason = refused.get(shape)
            kind = KNOWN_UNSAT
            if reason is None:
                result = session.place(request, policy.hosts)
                amounts = held(result) if usage is not None and not isinstance(result, Refusal) else None
                over = usage.over(job.project, amounts) if usage is not None and amounts is not None else None
                if over is not None:  # the placement itself passes a project limit (per-host amounts)
                    kind = LIMITED
                    if observe is not None:
                        observe(Examined(job.id, LIMITED, request, over))
                    if first_wait is None:
                        first_wait = changes
                    waiting.setdefault(over, []).append(job.id)
                    return over
                if not isinstance(result, Refusal):
                    if usage is not None and amounts is not None:
                        usage.add(job.project, amounts)
                    if ordering is not None:
                        ordering.dispatched(job, result.tasks)
                    session.take(result)
                    refused.clear()
                    queue_used[job.queue] = queue_used.get(job.queue, 0) + result.tasks
                    user_used[(job.queue, job.user)] = user_used.get((job.queue, job.user), 0) + result.tasks
                    dispatches.append(Dispatch(job.id, result, job.profile_hash))
                    kind, changes = DISPATCHED, changes + 1
                    if observe is not None:
                        provers.clear()
                        observe(Examined(job.id, DISPATCHED, request, outcome=result))
                    return None
                reason = refused[shape] = _summary(result, shape, summaries)
                kind = REFUSED
                if observe is not None:
                    provers[shape] = job.id
            if snapshot.reserve_after > 0 and snapshot.now - job.submit_time >= snapshot.reserve_after:
                holder = job
                reserved = True
                changes += 1
                reason += "; it has waited long enough to hold a reservation: later jobs wait for it"
            if observe is not None:
                observe(Examined(job.id, kind, request, reason, result,
                                 provers.get(shape) if kind == KNOWN_UNSAT else None, reserved))
        elif observe is not None:
            observe(Examined(job.id, kind, request, reason))
        if first_wait is None and kind != BLOCKED:
            first_wait = changes
        waiting.setdefault(reason, []).append(job.id)
        return reason

    def may_reserve(oldest: Callable[[], float]) -> bool:
        """Whether a job of the class of the last job examined (`oldest()`: the class's earliest
        submit time), waiting as it does, could come to hold a reservation."""
        return kind in (REFUSED, KNOWN_UNSAT) and snapshot.reserve_after > 0 \
            and snapshot.now - oldest() >= snapshot.reserve_after

    complete = True
    if backlog is not None and ordering is None and observe is None and len(backlog) == len(snapshot.jobs) \
            and len(snapshot.jobs) <= budget:  # (fair share orders jobs as it goes; observing wants each)
        backlog.rank_by({q.name: q.priority for q in snapshot.queues})
        backlog.walk(examine, lambda: changes, waiting, may_reserve, lambda: kind == BLOCKED, told)
    else:
        if told is not None:  # every job gets its reason here: no tail stays told for a later call
            told.clear()
        for examined, job in enumerate(order if order is not None else sorted(snapshot.jobs, key=rank)):
            if examined >= budget:
                complete = False
                break
            examine(job)
    if cache is not None:
        cache.settled = complete and (first_wait is None or first_wait == changes)
        cache.end()
    return Decisions(tuple(dispatches), tuple((r, tuple(ids)) for r, ids in waiting.items()), complete)


def _summary(refusal: Refusal, shape: tuple, summaries: dict[tuple, tuple[Refusal, str]]) -> str:
    """`refusal.summary()`, reusing the text of the shape's last refusal when it is the same one."""
    last = summaries.pop(shape, None)  # put back last: the dict runs from least to most recently met
    if last is not None and (last[0].job_reasons, last[0].hosts, last[0].capacity) == \
            (refusal.job_reasons, refusal.hosts, refusal.capacity):
        text = last[1]
    else:
        text = refusal.summary()
        if len(summaries) >= SUMMARIES_KEPT:
            del summaries[next(iter(summaries))]
    summaries[shape] = (refusal, text)
    return text


def _within_limits(job: PendingJob, policy: QueuePolicy, queue_used: dict[str, int],
                   user_used: dict[tuple[str, str], int]) -> tuple[str | None, JobRequest]:
    """(why the queue's running limits hold the job back, or None; its request cut to what they leave)."""
    room = job.request.max_tasks
    if policy.running_limit is not None:
        left = policy.running_limit - queue_used.get(job.queue, 0)
        if left < job.request.min_tasks:
            return (f"queue {job.queue}: its running limit of {policy.running_limit} slots is reached "
                    f"({queue_used.get(job.queue, 0)} in use)"), job.request
        room = min(room, left)
    if policy.user_running_limit is not None:
        used = user_used.get((job.queue, job.user), 0)
        left = policy.user_running_limit - used
        if left < job.request.min_tasks:
            return (f"user {job.user}: the running limit of {policy.user_running_limit} slots per user in "
                    f"queue {job.queue} is reached ({used} in use)"), job.request
        room = min(room, left)
    if room < job.request.max_tasks:
        return None, replace(job.request, max_tasks=room)
    return None, job.request


def take(hosts: list[HostView], shared: FrozenMap, placement: Placement) -> tuple[list[HostView], FrozenMap]:
    """The hosts and shared counters with `placement`'s reservations taken out of what is free; only
    the allocated hosts are rebuilt. (`schedule` itself keeps what is free in its placement Session,
    which updates the allocated hosts in place: see `fit.taken`, the arithmetic both share.)"""
    allocs = {a.host: a for a in placement.allocs}
    updated = list(hosts)
    for i, host in enumerate(updated):
        alloc = allocs.get(host.name)
        if alloc is not None:
            free, gpu_free = taken(host.free, host.gpu_free, alloc)
            updated[i] = host.with_free(free, gpu_free)
    if placement.shared:
        shared = FrozenMap({name: amount - placement.shared.get(name, 0) for name, amount in shared.items()})
    return updated, shared
