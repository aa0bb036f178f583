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

Told tails (`walk(..., told=)`): with a backlog, a session ends with each waiting class's tail given
one reason, and the next session gives most of those tails the same reason again: 10,000s of ids
copied into the answer only for the caller to find them all told already (sent_reasons.py). A
caller that answers only what changed keeps `told` (SentReasons.tails) between sessions: per class,
the rank from which its jobs were given a reason in the last session, and that reason. A later tail
of the class with the same reason then gives only the jobs the told part lacks: those ranked before
it (the walk stopped earlier this time) and those added to the class since (`_Class.fresh`: every
job of a class emptied and made again, or re-ranked, is one of them). Every other job of
the tail was told that reason then and nothing told it another since, so leaving it out of the answer
changes nothing the caller reports (the caller drops `told` whenever it may hold another reason for
a job: sent_reasons.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xce_lite.sched.core import PendingJob

Rank = tuple[int, int, int]
CUTS_FREE, CUTS_PER_JOB = 64, 4  # see Backlog.walk
FRESH_MAX = 1024  # jobs added to a class since its tail was told, remembered one by one at most
Told = dict[tuple, tuple[Rank, str]]  # class -> (the rank its told tail starts at, the reason it was told)


def rank_of(job: PendingJob, priority: Mapping[str, int]) -> Rank:
    """A dispatch's order: queue priority, then job priority, then id (core's `rank`); prefill
    (sched/prefill.py, prefill_rank.py) ranks by it too."""
    return (-priority.get(job.queue, 0), -job.priority, job.id)


def class_of(job: PendingJob) -> tuple:
    request = job.request
    return (job.queue, job.user, job.project, request.min_tasks, request.max_tasks, request.resreq, job.blocked)


class _Class:
    __slots__ = ("fresh", "ids", "jobs", "ranks", "times")

    def __init__(self) -> None:
        self.ranks: list[Rank] = []  # its jobs' ranks, in order; then the jobs and their ids alike
        self.jobs: list[PendingJob] = []
        self.ids: list[int] = []
        self.times: list[float] = []  # its jobs' submit times (the jobs' own float objects), earliest first
        # The ranks of the jobs added since its tail was last told (module docstring, Told tails);
        # None: more than FRESH_MAX, the next tail is given whole.
        self.fresh: list[Rank] | None = []

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
        key, rank = class_of(job), rank_of(job, self._priority)
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = _Class()
        i = bisect_left(cls.ranks, rank)
        cls.ranks.insert(i, rank)
        cls.jobs.insert(i, job)
        cls.ids.insert(i, job.id)
        cls.times.insert(bisect_left(cls.times, job.submit_time), job.submit_time)
        if cls.fresh is not None:
            cls.fresh.append(rank)
            if len(cls.fresh) > FRESH_MAX:
                cls.fresh = None
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
             lasting: Callable[[], bool], told: Told | None = None) -> None:
        """Examine the jobs in rank order, as `schedule` does one by one, but give a class's jobs
        the reason of the first of them that waits, at once, until the state changes.

        `examine(job)`: the core's step for one job: None if dispatched, else why it waits (it
        appends the job to `waiting` itself); `changed()`: a counter of dispatches and
        reservations so far; `may_reserve(oldest)`: whether a job of the class waiting as the
        last one examined could come to hold a reservation (`oldest()`: the class's earliest
        submit time); `lasting()`: whether the last wait holds whatever else changes (blocked).

        Each change sends the frozen classes back to be examined; a session of many changes over
        many small classes would pay that again and again, so past CUTS_PER_JOB such returns per
        job (and CUTS_FREE in all) the rest is examined one job at a time, as without classes.

        `told` (module docstring, Told tails): the last session's told tails, replaced by this
        session's; a tail's jobs already told its reason are left out of `waiting`."""
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
        tails: Told = {}
        for fkey, (fpos, freason) in (*frozen.items(), *kept.items()):
            cls = classes[fkey]
            last = told.get(fkey) if told is not None else None
            if last is None or last[1] != freason or cls.fresh is None:
                give(cls, fpos, None, freason)
            else:
                _give_untold(cls, fpos, last[0], freason, give)
            if told is not None:
                tails[fkey] = (cls.ranks[fpos], freason)
                cls.fresh = []
        if told is not None:  # a class with no tail now: whatever it told may have changed
            told.clear()
            told.update(tails)
        for reason in unordered:  # a reason several classes met: their ids in rank order, as one by one
            waiting[reason].sort(key=lambda job_id: entries[job_id][2])

    def __iter__(self) -> Iterator[PendingJob]:
        return (entry[0] for entry in self._jobs.values())


def _give_untold(cls: _Class, start: int, told_from: Rank, reason: str,
                 give: Callable[[_Class, int, int | None, str], None]) -> None:
    """Give the jobs of `cls`'s tail from `start` that were not told `reason` with the tail told from
    rank `told_from`: those ranked before it, and those added since (`cls.fresh`), in rank order."""
    end = bisect_left(cls.ranks, told_from, start)
    if end > start:
        give(cls, start, end, reason)
    for rank in sorted(set(cls.fresh or ())):
        i = bisect_left(cls.ranks, rank, end)  # (one ranked before `end`, given above or examined, is not found)
        if i < len(cls.ranks) and cls.ranks[i] == rank:  # (nor one discarded since)
            give(cls, i, i + 1, reason)
