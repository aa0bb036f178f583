"""Fair share: decayed past usage orders the jobs of a queue's priority level. Pure: no I/O and no
clock (`now` is an argument); the controller and the simulator feed it the same way.

Usage is what an entity (a user, or a project, as the queue's `by` says) held over time, decayed
with a half-life: a slot held for one second `t` seconds ago counts 2^(-t/half_life) slot-seconds
now, a GPU the same times `gpu_weight`. `Book` keeps it per entity for finished work (added as
jobs finish); the running jobs' time so far is added at each session (`accrued`).

Dynamic priority (LSF's fair share, with its RUN_JOB_FACTOR of one slot-hour per running slot):

    priority = share / (1 + usage in slot-hours + slots running now)

Within a queue priority level, a fair-share queue's jobs go entity by entity, the highest priority
first, each entity's jobs in its own order (job priority `-sp`, then submit order). A dispatch
counts at once: the entity's running slots grow within the session, so one user's backlog cannot
take a whole session. Queues of one priority level that have no fair share come first in that
level, in their usual order; fair-share queues of one level share one ordering. Ties go to the
lower job id. The same inputs give the same order, byte for byte.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from xce_lite.sched.reasons import NOTHING, FrozenMap

USER, PROJECT = "user", "project"
_LN2 = math.log(2)


@dataclass(frozen=True)
class FairShare:
    """A queue's fair-share policy: who competes (`by`), how fast usage is forgotten, the shares."""

    by: str = USER
    half_life: float = 7 * 86400.0
    shares: FrozenMap = NOTHING  # entity -> its share; others get `default_share`
    default_share: float = 1.0
    gpu_weight: float = 1.0  # a GPU-second counts this many slot-seconds

    def share(self, entity: str) -> float:
        return self.shares.get(entity, self.default_share)


@dataclass(frozen=True)
class QueueShare:
    """What one session reads of a fair-share queue: its policy and each entity's decayed usage now
    (weighted slot-seconds)."""

    queue: str
    policy: FairShare
    usage: FrozenMap = NOTHING


@dataclass(frozen=True)
class FairShareInput:
    queues: tuple[QueueShare, ...]
    running: FrozenMap = NOTHING  # "user" / "project" -> FrozenMap(entity -> slots running now)


def accrued(rate: float, start: float, end: float, now: float, half_life: float) -> float:
    """The decayed value at `now` of holding `rate` (slots) from `start` to `end` (<= now)."""
    if end <= start or rate == 0:
        return 0.0
    k = _LN2 / half_life
    # expm1: exact for short runs and long half-lives, where a plain difference of exponentials cancels
    return rate / k * math.exp(-k * (now - end)) * -math.expm1(-k * (end - start))


def priority(share: float, usage: float, running: float) -> float:
    return share / (1.0 + usage / 3600.0 + running)


class Book:
    """Decayed usage of finished work per (by, entity): slot-seconds and GPU-seconds, kept as values
    at a reference time and moved forward when read (`at`)."""

    def __init__(self, half_life: float, now: float) -> None:
        self.half_life = half_life
        self.ref = now
        self.values: dict[tuple[str, str], list[float]] = {}  # (by, entity) -> [slot-s, gpu-s] at ref

    def add(self, user: str, project: str | None, start: float, end: float, slots: float, gpus: float) -> None:
        """A finished job's run (or a day's aggregate, as start == end - its seconds)."""
        slot_s = accrued(slots, start, end, self.ref, self.half_life)
        gpu_s = accrued(gpus, start, end, self.ref, self.half_life)
        for key in ((USER, user), (PROJECT, project or "")):
            value = self.values.setdefault(key, [0.0, 0.0])
            value[0] += slot_s
            value[1] += gpu_s

    def at(self, now: float) -> dict[tuple[str, str], tuple[float, float]]:
        """Every entity's (slot-seconds, GPU-seconds) decayed to `now`."""
        if now > self.ref:
            factor = math.exp(-_LN2 * (now - self.ref) / self.half_life)
            for value in self.values.values():
                value[0] *= factor
                value[1] *= factor
            self.ref = now
        return {key: (v[0], v[1]) for key, v in self.values.items()}


def usage_now(policy: FairShare, book: Mapping[tuple[str, str], tuple[float, float]],
              running: Iterable[tuple[str, str | None, float, float, float]], now: float) -> FrozenMap:
    """Each entity's weighted usage at `now` under `policy`: the book's (already at `now`) plus the
    running jobs' time so far. `running`: (user, project, since, slots, gpus) per running job."""
    usage: dict[str, float] = {}
    for (by, entity), (slot_s, gpu_s) in book.items():
        if by == policy.by:
            usage[entity] = slot_s + policy.gpu_weight * gpu_s
    for user, project, since, slots, gpus in running:
        entity = user if policy.by == USER else project or ""
        usage[entity] = usage.get(entity, 0.0) + accrued(slots + policy.gpu_weight * gpus, since, now, now,
                                                         policy.half_life)
    return FrozenMap(usage)


def entity_of(by: str, user: str, project: str | None) -> str:
    return user if by == USER else project or ""


def standing(share: QueueShare, entity: str, running: float) -> dict:
    """What `xce why` and `xce jobs -l` show of an entity in a fair-share queue."""
    usage = share.usage.get(entity, 0.0)
    return {"queue": share.queue, "by": share.policy.by, "entity": entity, "share": share.policy.share(entity),
            "usage_slot_hours": round(usage / 3600.0, 3), "running_slots": running,
            "priority": round(priority(share.policy.share(entity), usage, running), 6)}


class Ordering:
    """The session's order of examining jobs (see the module docstring). Iterate it; after a job is
    dispatched, and before asking for the next, call `dispatched` with its task count."""

    def __init__(self, jobs: Iterable, queue_priority: Callable[[str], int], fair: FairShareInput) -> None:
        shares = {q.queue: q for q in fair.queues}
        self._running = {by: dict(m) for by, m in fair.running.items()}
        self._changed: dict[tuple[str, str], int] = {}  # (by, entity) -> dispatches this session
        # per queue: (its level, its QueueShare or None); per (queue, entity): ((by, entity), share, usage)
        queues: dict[str, tuple[int, QueueShare | None]] = {}
        self._keys: dict[tuple[str, str], tuple[tuple[str, str], float, float]] = {}
        plain: dict[int, list] = {}
        fairs: dict[int, dict[tuple[str, str], list]] = {}
        # one sort for all: each entity's jobs then come in their own order (-sp, then submit order)
        for job in sorted(jobs, key=lambda j: (-j.priority, j.id)):
            known = queues.get(job.queue)
            if known is None:
                known = queues[job.queue] = (queue_priority(job.queue), shares.get(job.queue))
            level, share = known
            if share is None:
                plain.setdefault(level, []).append(job)
                continue
            by = share.policy.by
            entity = job.user if by == USER else job.project or ""
            key = (job.queue, entity)
            group = fairs.setdefault(level, {}).get(key)
            if group is None:
                group = fairs[level][key] = []
                self._keys[key] = ((by, entity), share.policy.share(entity), share.usage.get(entity, 0.0))
            group.append(job)
        self._levels = sorted(set(plain) | set(fairs), reverse=True)
        self._plain = plain
        self._fairs = fairs
        self._shares = shares

    def _priority(self, key: tuple[str, str]) -> float:
        (by, entity), share, usage = self._keys[key]
        return priority(share, usage, self._running.get(by, {}).get(entity, 0))

    def dispatched(self, job, tasks: int) -> None:
        share = self._shares.get(job.queue)
        if share is not None:
            by = share.policy.by
            entity = job.user if by == USER else job.project or ""
            running = self._running.setdefault(by, {})
            running[entity] = running.get(entity, 0) + tasks
            self._changed[(by, entity)] = self._changed.get((by, entity), 0) + 1

    def __iter__(self) -> Iterator:
        changed, keys = self._changed, self._keys
        for level in self._levels:
            yield from self._plain.get(level, ())
            groups = self._fairs.get(level)
            if not groups:
                continue
            heap = [(-self._priority(key), jobs[0].id, key, changed.get(keys[key][0], 0), 0)
                    for key, jobs in groups.items()]
            heapq.heapify(heap)
            while heap:
                neg, first, key, seen, at = heapq.heappop(heap)
                ident = keys[key][0]
                now = changed.get(ident, 0)
                if now != seen:  # it dispatched in another queue since: look again
                    heapq.heappush(heap, (-self._priority(key), first, key, now, at))
                    continue
                jobs = groups[key]
                yield jobs[at]
                at += 1
                if at < len(jobs):
                    now = changed.get(ident, 0)
                    heapq.heappush(heap, (neg if now == seen else -self._priority(key), jobs[at].id, key, now, at))
