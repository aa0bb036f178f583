"""The controller's pending jobs as the scheduler worker is fed them (sched_worker.py): the set, what
changed in it since the last session, its checksum (kept on both sides of the pipe), the reasons the
next answer must give again, and the jobs' submit times in order (sched/settled.py asks whether a
wait passed a bound). Callers hold the controller's lock.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

from xce_lite.sched.core import PendingJob

# The pending set's checksum: (count, sum of id * _MIX mod 2**61), kept incrementally on both sides.
_MASK = (1 << 61) - 1
_MIX = 0x9E3779B97F4A7C15
_INSORT_MAX = 8  # add_all: up to this many submit times are inserted one by one, more are sorted in



class PendingSet:
    """The controller's pending jobs (PEND, not held), remembering what changed since the last
    session. Callers hold the controller's lock."""

    def __init__(self) -> None:
        self._jobs: dict[int, PendingJob] = {}
        self._added: dict[int, PendingJob] = {}
        self._removed: dict[int, PendingJob] = {}
        self._times: list[float] = []  # the jobs' submit times, sorted (sched/settled.py asks)
        self._count, self._sum = 0, 0
        self._reasons_all = False  # the next answer gives every waiting job's reason
        self._reasons_of: set[int] = set()  # and these jobs' reasons
        self._watchers: list[dict[int, PendingJob | None]] = []  # watch(): other readers of what changed

    def report_reasons_again(self, ids: Iterable[int] | None = None) -> None:
        """The controller's live reasons may differ from what the scheduler last answered (an
        answer not taken in): the next answer gives them all; or for the jobs `ids` only (their
        reasons are worded anew by the controller)."""
        if ids is None:
            self._reasons_all = True
        else:
            self._reasons_of.update(ids)

    def take_reasons_again(self) -> bool | tuple[int, ...]:
        """True if the next answer must give every reason, else the jobs whose reasons it must give
        (and no longer after this call)."""
        if self._reasons_all:
            self._reasons_all, self._reasons_of = False, set()
            return True
        out, self._reasons_of = tuple(self._reasons_of), set()
        return out

    @property
    def reasons_asked(self) -> bool:
        """Whether the next answer must give some reason again (take_reasons_again)."""
        return self._reasons_all or bool(self._reasons_of)

    def watch(self) -> dict[int, PendingJob | None]:
        """A dict that every later add, replacement and discard enters its job in: its id -> the job
        as it was before its first change since the reader last emptied it (None: not pending then).
        For a reader other than the session (prefilling.py's ranked index), which empties it itself."""
        before: dict[int, PendingJob | None] = {}
        self._watchers.append(before)
        return before

    def add(self, job: PendingJob) -> None:
        old = self._jobs.get(job.id)
        for before in self._watchers:
            before.setdefault(job.id, old)
        if old is None:
            self._count += 1
            self._sum = (self._sum + job.id * _MIX) & _MASK
        else:
            del self._times[bisect_left(self._times, old.submit_time)]
        insort(self._times, job.submit_time)
        self._jobs[job.id] = job
        self._added[job.id] = job
        self._removed.pop(job.id, None)

    def add_all(self, jobs: list[PendingJob]) -> None:
        """`add` each, in one step (a submission's 1,000 jobs)."""
        fresh = {job.id: job for job in jobs}
        # views on both sides: isdisjoint walks the smaller (given the dict itself, it walks every
        # pending job: a one-job submit would cost a pass over the backlog)
        if not fresh.keys().isdisjoint(self._jobs.keys()):  # replaced: rare, one at a time
            for job in fresh.values():
                self.add(job)
            return
        for before in self._watchers:  # none was pending: the ids `before` lacks enter it as None
            if len(fresh) < len(before):  # a set difference of the views would walk all of `before`
                for job_id in fresh:
                    before.setdefault(job_id, None)
            else:  # (a set difference: no Python step per job)
                before.update(dict.fromkeys(fresh.keys() - before.keys()))
        self._count += len(fresh)
        self._sum = (self._sum + sum(fresh) * _MIX) & _MASK
        if len(fresh) <= _INSORT_MAX:  # a few: each put in its place (a sort would pass over all)
            for job in fresh.values():
                insort(self._times, job.submit_time)
        else:
            self._times.extend(job.submit_time for job in fresh.values())
            self._times.sort()  # sorted runs: linear
        self._jobs.update(fresh)
        self._added.update(fresh)
        for job_id in fresh.keys() & self._removed.keys():
            del self._removed[job_id]

    def discard(self, job_id: int) -> PendingJob | None:
        job = self._jobs.pop(job_id, None)
        if job is not None:
            for before in self._watchers:
                before.setdefault(job_id, job)
            self._count -= 1
            self._sum = (self._sum - job_id * _MIX) & _MASK
            self._added.pop(job_id, None)
            self._removed[job_id] = job
            del self._times[bisect_left(self._times, job.submit_time)]
        return job

    def get(self, job_id: int) -> PendingJob | None:
        return self._jobs.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __iter__(self) -> Iterator[int]:
        return iter(self._jobs)

    def values(self) -> Iterable[PendingJob]:
        return self._jobs.values()

    def missing(self, ids: Iterable[int]) -> set[int]:
        """Those of `ids` not in the set (a set operation: no Python step per id)."""
        return set(ids).difference(self._jobs)

    @property
    def removed(self) -> dict[int, PendingJob]:
        """The jobs that left since the last `take_changes` (not to be changed by the caller)."""
        return self._removed

    @property
    def has_added(self) -> bool:
        """Whether jobs joined (or were replaced) since the last `take_changes`."""
        return bool(self._added)

    def waits_passing(self, after: float, upto: float) -> bool:
        """Whether a job here was submitted in (after, upto]: its wait passes a bound between two times."""
        i = bisect_right(self._times, after)
        return i < len(self._times) and self._times[i] <= upto

    def take_changes(self, full: bool) -> tuple[tuple[PendingJob, ...], tuple[int, ...], tuple[int, int]]:
        """(added, removed, checksum) since the last call; everything as added when `full`."""
        added = tuple(self._jobs.values()) if full else tuple(self._added.values())
        removed = () if full else tuple(self._removed)
        self._added, self._removed = {}, {}
        return added, removed, (self._count, self._sum)
