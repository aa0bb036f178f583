"""The scheduler core: a pure function from a snapshot to decisions.

No I/O, no clock, no SQL: frozen, picklable values in and out, so the call crosses a process pool and
the simulator can run the very same function. The same snapshot gives the same decisions.

Policy (slots only for now; the resource language plugs in behind `_fit`): jobs are taken by queue
priority (higher first), then submit order (job id). Each job goes to the first host, in snapshot
order, with enough free slots for all its tasks (one host per job for now). A job that does not fit
now pends with a reason; later, smaller jobs may still start (no reservation yet).
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_OK = "ok"


@dataclass(frozen=True)
class HostState:
    name: str
    slots: int  # total
    used: int  # held by dispatched and running jobs
    state: str = HOST_OK  # ok | closed | unreachable

    @property
    def free(self) -> int:
        return self.slots - self.used if self.state == HOST_OK else 0


@dataclass(frozen=True)
class PendingJob:
    id: int
    user: str
    queue: str
    slots: int


@dataclass(frozen=True)
class Snapshot:
    hosts: tuple[HostState, ...]
    jobs: tuple[PendingJob, ...]  # PEND jobs only; held ones are not candidates
    queue_priority: tuple[tuple[str, int], ...]  # (queue, priority)


@dataclass(frozen=True)
class Dispatch:
    job_id: int
    hosts: tuple[tuple[str, int], ...]  # (host, tasks)


@dataclass(frozen=True)
class Decisions:
    dispatches: tuple[Dispatch, ...]
    # Why the others wait, grouped: (reason, ids of the jobs it holds for), in first-seen order.
    # Grouped because many jobs share a reason: it keeps the reply across the process pool small.
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
    free = {h.name: h.free for h in snapshot.hosts}
    largest_total = max((h.slots for h in snapshot.hosts if h.state == HOST_OK), default=0)
    dispatches: list[Dispatch] = []
    waiting: dict[str, list[int]] = {}
    why_cache: dict[int, str] = {}  # slots -> reason; valid while `free` is unchanged
    most_free = max(free.values(), default=0)
    complete = True
    for examined, job in enumerate(order):
        if examined >= budget:
            complete = False
            break
        # Once every host is full (the usual state of a busy cluster) no search is needed.
        host = _fit(job, snapshot.hosts, free) if job.slots <= most_free else None
        if host is None:
            reason = why_cache.get(job.slots)
            if reason is None:
                reason = why_cache[job.slots] = _why_not(job, free, largest_total)
            waiting.setdefault(reason, []).append(job.id)
            continue
        free[host] -= job.slots
        most_free = max(free.values())
        why_cache.clear()
        dispatches.append(Dispatch(job.id, ((host, job.slots),)))
    return Decisions(tuple(dispatches), tuple((r, tuple(ids)) for r, ids in waiting.items()), complete)


def _fit(job: PendingJob, hosts: tuple[HostState, ...], free: dict[str, int]) -> str | None:
    for host in hosts:
        if free[host.name] >= job.slots:
            return host.name
    return None


def _why_not(job: PendingJob, free: dict[str, int], largest_total: int) -> str:
    if largest_total == 0:
        return "no host is open: every host is closed or unreachable"
    if job.slots > largest_total:
        return f"needs {job.slots} slots on one host; the largest open host has {largest_total}"
    most = max(free.values(), default=0)
    return f"not enough free slots: needs {job.slots}, at most {most} free on any host"
