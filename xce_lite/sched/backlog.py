"""The pending jobs by class, kept as they come and go, so a session over a large backlog touches
the jobs whose outcome can differ, not every job (sched/core.py `schedule(..., backlog=)`).

A class is what a job's outcome in a session depends on besides the session's state: its queue,
user, project, task range and -R, and why it is blocked. Each class holds its jobs in the order a
session takes them (queue priority, then job priority, then id: core's `rank`). Within a session,
state changes only when a job is dispatched or comes to hold a reservation; between two such
events, jobs of one class that cannot start all wait for the same reason, so once one of them is
refused the rest of its class is given that reason at once (`walk`), unless one of them could
come to hold a reservation (it has waited `reserve_after`): then they are examined one by one.

Invariant: walking the classes gives the decisions the plain walk over every job in order gives,
byte for byte (a property test compares them). Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xce_lite.sched.core import PendingJob

Rank = tuple[int, int, int]
CUTS_FREE, CUTS_PER_JOB = 64, 4  # see Backlog.walk


def class_of(job: PendingJob) -> tuple:
    request = job.request
    return (job.queue, job.user, job.project, request.min_tasks, request.max_tasks, request.resreq, job.blocked)


class _Class:
    __slots__ = ("ids", "jobs", "ranks", "times")

    def __init__(self) -> None:
        self.ranks: list[Rank] = []  # its jobs' ranks, in order; then the jobs and their ids alike
        self.jobs: list[PendingJob] = []
        self.ids: list[int] = []
        self.times: list[float] = []  # its jobs' submit times (the jobs' own float objects), earliest first

    def oldest_submit(self) -> float:
        return self.times[0]


class Backlog:
    """The pending set (PendingJobs by id) indexed by class; see the module docstring. The caller
    keeps it equal to the session's `Snapshot.jobs` (the scheduler worker applies the same changes
    to both). Not thread-safe."""

    def __init__(self) -> None:
        self._jobs: dict[int, tuple[PendingJob, tuple, Rank]] = {}  # id -> (job, its class, its rank)
        self._classes: dict[tuple, _Class] = {}
        self._priority: dict[str, int] = {}  # the queue priorities the ranks were made with

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: PendingJob) -> None:
        if job.id in self._jobs:
            self.discard(job.id)
        key, rank = class_of(job), (-self._priority.get(job.queue, 0), -job.priority, job.id)
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = _Class()
        i = bisect_left(cls.ranks, rank)
        cls.ranks.insert(i, rank)
        cls.jobs.insert(i, job)
        cls.ids.insert(i, job.id)
        cls.times.insert(bisect_left(cls.times, job.submit_time), job.submit_time)
        self._jobs[job.id] = (job, key, rank)

    def discard(self, job_id: int) -> None:
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        job, key, rank = entry
        cls = self._classes[key]
        i = bisect_left(cls.ranks, rank)
        del cls.ranks[i], cls.jobs[i], cls.ids[i]
        del cls.times[bisect_left(cls.times, job.submit_time)]  # one of the equal times: all alike
        if not cls.ranks:
            del self._classes[key]

    def clear(self) -> None:
        self._jobs, self._classes = {}, {}

    def rank_by(self, priority: dict[str, int]) -> None:
        """Rank by these queue priorities from now on (the classes are re-ranked when they changed)."""
        if priority == self._priority:
            return
        self._priority = dict(priority)
        jobs = [entry[0] for entry in self._jobs.values()]
        self.clear()
        for job in jobs:
            self.add(job)

    def walk(self, examine: Callable[[PendingJob], str | None], changed: Callable[[], int],
             waiting: dict[str, list[int]], may_reserve: Callable[[Callable[[], float]], bool],
             lasting: Callable[[], bool]) -> None:
        """Examine the jobs in rank order, as `schedule` does one by one, but give a class's jobs
        the reason of the first of them that waits, at once, until the state changes.

        `examine(job)`: the core's step for one job: None if dispatched, else why it waits (it
        appends the job to `waiting` itself); `changed()`: a counter of dispatches and
        reservations so far; `may_reserve(oldest)`: whether a job of the class waiting as the
        last one examined could come to hold a reservation (`oldest()`: the class's earliest
        submit time); `lasting()`: whether the last wait holds whatever else changes (blocked).

        Each change sends the frozen classes back to be examined; a session of many changes over
        many small classes would pay that again and again, so past CUTS_PER_JOB such returns per
        job (and CUTS_FREE in all) the rest is examined one job at a time, as without classes."""
        heap: list[tuple[Rank, int, tuple]] = [(cls.ranks[0], 0, key) for key, cls in self._classes.items()]
        heapify(heap)
        frozen: dict[tuple, tuple[int, str]] = {}  # class -> (from which of its jobs, the reason they get)
        unordered: set[str] = set()  # reasons whose ids came in out of rank order: sorted at the end
        classes, entries = self._classes, self._jobs

        def give(cls: _Class, start: int, end: int | None, reason: str) -> None:
            ids = waiting[reason]
            if ids and entries[ids[-1]][2] > cls.ranks[start]:
                unordered.add(reason)
            ids.extend(cls.ids[start:end])

        kept: dict[tuple, tuple[int, str]] = {}  # frozen for good: blocked, whatever changes
        cuts_left = CUTS_FREE + len(self._jobs) // CUTS_PER_JOB
        while heap:
            rank, pos, key = heappop(heap)
            cls = classes[key]
            job = cls.jobs[pos]
            before = changed()
            reason = examine(job)
            if changed() != before and frozen:  # jobs after this one may now wait for other reasons
                cuts_left -= len(frozen)
                for fkey, (fpos, freason) in frozen.items():
                    fcls = classes[fkey]
                    end = bisect_left(fcls.ranks, rank, fpos)
                    if end > fpos:
                        give(fcls, fpos, end, freason)
                    if end < len(fcls.ranks):
                        heappush(heap, (fcls.ranks[end], end, fkey))
                frozen = {}
            nxt = pos + 1
            if nxt == len(cls.ranks):
                continue
            if reason is not None and lasting():
                kept[key] = (nxt, reason)
            elif reason is not None and cuts_left > 0 and not may_reserve(cls.oldest_submit):
                frozen[key] = (nxt, reason)
            else:
                heappush(heap, (cls.ranks[nxt], nxt, key))
        for fkey, (fpos, freason) in (*frozen.items(), *kept.items()):
            give(classes[fkey], fpos, None, freason)
        for reason in unordered:  # a reason several classes met: their ids in rank order, as one by one
            waiting[reason].sort(key=lambda job_id: entries[job_id][2])

    def __iter__(self) -> Iterator[PendingJob]:
        return (entry[0] for entry in self._jobs.values())
