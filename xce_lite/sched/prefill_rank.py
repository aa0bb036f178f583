"""The pending jobs in a dispatch's order, kept from one session to the next for prefill (issue 18).

sched/prefill.py's successors() and outranked() take pending jobs best-ranked first and stop after
a few: sorting the whole backlog for them at every session (and the passes that chose the sort's
key) cost ~1 ms of the tick's CPU at 10,000 pending. `Ranked` keeps the order instead: the caller
names the jobs that changed since its last `sync` (added, replaced or removed:
controller/pending_set.PendingSet.watch collects them) and only those are put in or taken out,
one bisect each; many changes at once (a submission of 1,000 jobs) or new queue priorities sort
everything again, once.

Pure, like the rest of sched/: values in, no clock, no I/O.

Invariant: after `sync(jobs, changed, priority)`, where `changed` holds every id added to, replaced
in or removed from `jobs` since the previous sync (and `reset()` was called when that was not
known), iterating yields exactly `sorted(jobs.values(), key=rank)` with rank = (-queue priority,
-job priority, id): a dispatch's order, as prefill._Room.rank. `jobs` is read, never copied: it must
not change while the order is iterated.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Protocol

from xce_lite.sched.core import PendingJob

REBUILD = 64  # more changes than this (plus 1/8 of the jobs) at once: one sort beats a bisect each

Rank = tuple[int, int, int]


class Jobs(Protocol):
    """What Ranked reads of the pending jobs (a dict, or the controller's PendingSet)."""

    def get(self, job_id: int) -> PendingJob | None: ...

    def values(self) -> Iterable[PendingJob]: ...


def rank_of(job: PendingJob, priority: Mapping[str, int]) -> Rank:
    """A dispatch's order (core.schedule's rank; prefill._Room.rank)."""
    return (-priority.get(job.queue, 0), -job.priority, job.id)


class Ranked:
    """The pending jobs in a dispatch's order (see the module docstring)."""

    def __init__(self) -> None:
        self._ranks: list[Rank] = []  # sorted; each ends with its job's id
        self._rank_of: dict[int, Rank] = {}
        self._jobs: Jobs = {}
        self._priority: dict[str, int] | None = None  # None: sort everything at the next sync

    def reset(self) -> None:
        """What changed is not known (changes went uncounted): the next sync sorts everything."""
        self._priority = None

    def sync(self, jobs: Jobs, changed: Collection[int], priority: Mapping[str, int]) -> None:
        """Bring the order up to `jobs`, given the ids that `changed` since the last sync and the
        queues' priorities now."""
        self._jobs = jobs
        if priority != self._priority or len(changed) > REBUILD + len(self._ranks) // 8:
            self._priority = dict(priority)
            self._rank_of = {job.id: rank_of(job, priority) for job in jobs.values()}
            self._ranks = sorted(self._rank_of.values())
            return
        ranks, rank_of_id = self._ranks, self._rank_of
        for job_id in changed:
            old = rank_of_id.pop(job_id, None)
            if old is not None:
                del ranks[bisect_left(ranks, old)]
            job = jobs.get(job_id)
            if job is not None:
                new = rank_of_id[job_id] = rank_of(job, priority)
                insort(ranks, new)

    def get(self, job_id: int) -> PendingJob | None:
        return self._jobs.get(job_id)

    def __len__(self) -> int:
        return len(self._ranks)

    def __iter__(self) -> Iterator[PendingJob]:
        """The jobs, best-ranked first (lazily: a caller that stops early pays for what it read)."""
        get = self._jobs.get
        for rank in self._ranks:
            job = get(rank[2])
            if job is not None:  # (always, by the invariant: none is named that is not pending)
                yield job
