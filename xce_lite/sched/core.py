"""The scheduler core: a pure function from a snapshot to decisions.

No I/O, no clock, no SQL: frozen, picklable values in and out, so the call crosses a process
boundary and the simulator can run the very same function. The same snapshot gives the same
decisions.

Policy: jobs are taken by queue priority (higher first), then submit order (job id). Each job is
placed by `placement.place` against what is still free in this session (its rules: task ranges,
span, rusage, GPUs, select, same, order). A job that cannot start now pends with the full reason;
later jobs may still start (no reservation yet: a large job can wait behind a stream of small ones).

Sessions: within one session, a request shape (task range and -R) proven unplaceable is not
searched again until a dispatch changes what is free; a cache hit returns the FULL reason of the
attempt that proved it, never an empty one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from xce_lite.sched.placement import GPUS, HostView, JobRequest, place
from xce_lite.sched.reasons import NOTHING, FrozenMap, Placement, Refusal

HOST_OK = "ok"


@dataclass(frozen=True)
class PendingJob:
    id: int
    user: str
    queue: str
    request: JobRequest  # the effective request; request.id == id

    @property
    def shape(self) -> tuple:
        """What placement depends on: jobs of one shape succeed or fail alike against one state."""
        return (self.request.min_tasks, self.request.max_tasks, self.request.resreq)


@dataclass(frozen=True)
class Snapshot:
    hosts: tuple[HostView, ...]  # free amounts: totals less what running jobs reserve
    jobs: tuple[PendingJob, ...]  # PEND jobs only; held ones are not candidates
    queue_priority: tuple[tuple[str, int], ...]  # (queue, priority)
    shared_free: FrozenMap = NOTHING  # cluster-wide counters (licenses) still free


@dataclass(frozen=True)
class Dispatch:
    job_id: int
    placement: Placement

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return self.placement.hosts


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


def schedule(snapshot: Snapshot, budget: int = 1_000_000) -> Decisions:
    """Decide which pending jobs start now and why the others wait.

    `budget` bounds the jobs examined in this session; the rest keep their previous reasons and
    `complete` says so, so a huge backlog can never stall the controller's tick.
    """
    priority = dict(snapshot.queue_priority)
    # Timsort: the controller sends jobs in id order, so this is close to linear.
    order = sorted(snapshot.jobs, key=lambda j: (-priority.get(j.queue, 0), j.id))
    hosts = list(snapshot.hosts)
    shared = snapshot.shared_free
    refused: dict[tuple, str] = {}  # shape -> reason; valid until a dispatch changes what is free
    dispatches: list[Dispatch] = []
    waiting: dict[str, list[int]] = {}
    complete = True
    for examined, job in enumerate(order):
        if examined >= budget:
            complete = False
            break
        reason = refused.get(job.shape)
        if reason is None:
            result = place(job.request, hosts, shared)
            if isinstance(result, Refusal):
                reason = refused[job.shape] = result.summary()
            else:
                hosts, shared = take(hosts, shared, result)
                refused.clear()
                dispatches.append(Dispatch(job.id, result))
                continue
        waiting.setdefault(reason, []).append(job.id)
    return Decisions(tuple(dispatches), tuple((r, tuple(ids)) for r, ids in waiting.items()), complete)


def take(hosts: list[HostView], shared: FrozenMap, placement: Placement) -> tuple[list[HostView], FrozenMap]:
    """The hosts and shared counters with `placement`'s reservations taken out of what is free."""
    allocs = {a.host: a for a in placement.allocs}
    updated = []
    for host in hosts:
        alloc = allocs.get(host.name)
        if alloc is None:
            updated.append(host)
            continue
        free = {name: amount - alloc.reserved.get(name, 0) for name, amount in host.free.items()}
        gpu_free = tuple(i for i in host.gpu_free if i not in alloc.gpus)
        if GPUS in free:
            free[GPUS] = len(gpu_free)
        updated.append(replace(host, free=free, gpu_free=gpu_free))
    if placement.shared:
        shared = FrozenMap({name: amount - placement.shared.get(name, 0) for name, amount in shared.items()})
    return updated, shared
