"""The pending jobs in a dispatch's order, kept from one session to the next for prefill (issue 18).

sched/prefill.py's successors() and outranked() take pending jobs best-ranked first and stop after
a few: sorting the whole backlog for them at every session (and the passes that chose the sort's
key) cost ~1 ms of the tick's CPU at 10,000 pending. `Ranked` keeps the order instead: the caller
names the jobs that changed since its last `sync` (added, replaced or removed, each with the job as
it was at that sync: controller/pending_set.PendingSet.watch collects them) and only those are
taken out and put in, one bisect each; many changes at once (a submission of 1,000 jobs) or new
queue priorities sort everything again, once. A rank is (class, id), the class (-queue priority,
-job priority): each class keeps its jobs' ids sorted (the ids the jobs hold: 8 bytes a job), the
classes are read best first.

Pure, like the rest of sched/: values in, no clock, no I/O.

Invariant: after `sync(jobs, changed, priority)`, where `changed` maps every id added to, replaced
in or removed from `jobs` since the previous sync to its job as it was then (None: not in `jobs`),
and `reset()` was called when that was not known, iterating yields exactly
`sorted(jobs.values(), key=rank)` with rank = (-queue priority, -job priority, id): a dispatch's
order (sched/backlog.rank_of). A job told as left that is not where it was kept (changes went
untold without a reset) makes the sync sort everything rather than take out another. `jobs` is
read, never copied: it must not change while the order is iterated.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from xce_lite.sched.core import PendingJob

REBUILD = 64  # more changes than this (plus 1/8 of the jobs) at once: one sort beats a bisect each

Class = tuple[int, int]  # (-queue priority, -job priority): a rank less its id


class Jobs(Protocol):
    """What Ranked reads of the pending jobs (a dict, or the controller's PendingSet)."""

    def get(self, job_id: int) -> PendingJob | None: ...

    def values(self) -> Iterable[PendingJob]: ...


def _class_of(job: PendingJob, priority: Mapping[str, int]) -> Class:
    return (-priority.get(job.queue, 0), -job.priority)


class Ranked:
    """The pending jobs in a dispatch's order (see the module docstring)."""

    def __init__(self) -> None:
        self._ids: dict[Class, list[int]] = {}  # each class's job ids, sorted; no class is empty
        self._classes: list[Class] = []  # sorted
        self._count = 0
        self._jobs: Jobs = {}
        self._priority: dict[str, int] | None = None  # None: sort everything at the next sync

    def reset(self) -> None:
        """What changed is not known (changes went uncounted): the next sync sorts everything."""
        self._priority = None

    def sorts_anyway(self, changes: int) -> bool:
        """Whether the next sync, told this many changes, sorts everything (the caller may drop
        them and `reset()` instead of keeping them)."""
        return self._priority is None or changes > REBUILD + self._count // 8

    def sync(self, jobs: Jobs, changed: Mapping[int, PendingJob | None], priority: Mapping[str, int]) -> None:
        """Bring the order up to `jobs`, given what `changed` since the last sync (id -> the job as
        it was then, or None) and the queues' priorities now."""
        self._jobs = jobs
        if priority != self._priority or self.sorts_anyway(len(changed)):
            self._rebuild(jobs, priority)
            return
        for job_id, before in changed.items():
            if before is not None and not self._take_out(before, priority):
                self._rebuild(jobs, priority)  # not kept: what changed was not all said
                return
            job = jobs.get(job_id)
            if job is not None:
                cls = _class_of(job, priority)
                ids = self._ids.get(cls)
                if ids is None:
                    ids = self._ids[cls] = []
                    insort(self._classes, cls)
                insort(ids, job.id)
                self._count += 1

    def _take_out(self, job: PendingJob, priority: Mapping[str, int]) -> bool:
        cls = _class_of(job, priority)
        ids = self._ids.get(cls, [])
        at = bisect_left(ids, job.id)
        if at == len(ids) or ids[at] != job.id:
            return False
        del ids[at]
        self._count -= 1
        if not ids:
            del self._ids[cls]
            self._classes.remove(cls)
        return True

    def _rebuild(self, jobs: Jobs, priority: Mapping[str, int]) -> None:
        self._priority = dict(priority)
        self._ids, self._count = {}, 0
        for job in jobs.values():
            cls = _class_of(job, priority)
            ids = self._ids.get(cls)
            if ids is None:
                ids = self._ids[cls] = []
            ids.append(job.id)
            self._count += 1
        for ids in self._ids.values():
            ids.sort()  # (ids come mostly in order: a run or two)
        self._classes = sorted(self._ids)

    def get(self, job_id: int) -> PendingJob | None:
        return self._jobs.get(job_id)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[PendingJob]:
        """The jobs, best-ranked first (lazily: a caller that stops early pays for what it read)."""
        get = self._jobs.get
        for cls in self._classes:
            for job_id in self._ids[cls]:
                job = get(job_id)
                if job is not None:  # (always, by the invariant: none is named that is not pending)
                    yield job
