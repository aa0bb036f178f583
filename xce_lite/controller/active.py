"""The controller's active jobs (DISP or RUN, and suspended): a mapping job id -> Active that keeps,
as jobs are added, removed or change holding, what every scheduling session reads of them, so a
session's inputs cost what changed since the last one, not the whole running set:

- per host, the allocations held there, in the order of the jobs in the mapping (host views are
  summed in that order: config/sched_view.host_now);
- per (queue, user), the tasks held (the core's running limits sum them: sched/core.py);
- the jobs that hold shared counters (licenses), in order (`shared_free` subtracts them in order).

Invariant (checked by `problems`, which controller/invariants.py runs, and by a property test):
each of these equals its computation from scratch over the mapping's values, in the mapping's
order. A job's queue, user and holding are read when it is added; a holding that changes goes
through `rehold`. Callers hold the controller's lock, as for any of its state.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any, Self

from xce_lite.config.sched_view import Holding, less_shared
from xce_lite.sched.reasons import FrozenMap, HostAlloc

_NONE: tuple = ()


class ActiveJobs(dict[int, Any]):
    """See the module docstring. A dict (reads at C speed); every way to change it is overridden."""

    def __init__(self) -> None:
        super().__init__()
        self._on_host: dict[str, dict[tuple[int, int], HostAlloc]] = {}  # host -> (job, unit index) -> alloc
        self._tuples: dict[str, tuple[HostAlloc, ...]] = {}  # host -> its allocs as a tuple, made once
        self._stale: set[str] = set()  # hosts whose tuple is to be made again
        self._tasks: dict[tuple[str, str], int] = {}  # (queue, user) -> tasks held
        self._running: tuple[tuple[str, str, int], ...] | None = ()  # made from _tasks; None: to make
        self._shared: dict[int, Holding] = {}  # jobs holding shared counters, in order
        self._keys: dict[int, tuple[str, str, Holding]] = {}  # job id -> what it was indexed with

    # ---- changes --------------------------------------------------------------------------------

    def __setitem__(self, job_id: int, job: Any) -> None:
        replaced = job_id in self
        if replaced:
            self._unindex(job_id)
        super().__setitem__(job_id, job)
        self._index(job_id, job)
        if replaced:  # it keeps its place in the mapping: the per-host orders are made again
            self._reorder()

    def __delitem__(self, job_id: int) -> None:
        super().__delitem__(job_id)
        self._unindex(job_id)

    _MISSING = object()

    def pop(self, job_id: int, default: Any = _MISSING) -> Any:
        if job_id not in self:
            if default is ActiveJobs._MISSING:
                raise KeyError(job_id)
            return default
        job = super().pop(job_id)
        self._unindex(job_id)
        return job

    def popitem(self) -> tuple[int, Any]:
        job_id, job = super().popitem()
        self._unindex(job_id)
        return job_id, job

    def clear(self) -> None:
        super().clear()
        self._on_host, self._tuples, self._stale = {}, {}, set()
        self._tasks, self._running, self._shared, self._keys = {}, (), {}, {}

    def setdefault(self, job_id: int, default: Any = None) -> Any:
        if job_id not in self:
            self[job_id] = default
        return self[job_id]

    def update(self, *args: Any, **kw: Any) -> None:
        for job_id, job in dict(*args, **kw).items():
            self[job_id] = job

    # dict's `|` makes a plain dict; `|=` must keep the index (mypy wants the two alike)
    def __ior__(self, other: Any) -> Self:  # type: ignore[override, misc]
        self.update(other)
        return self

    def rehold(self, job_id: int, holding: Holding) -> None:
        """The job now holds `holding` (a resize): its Active and the index change together."""
        job = self[job_id]
        job.holding = holding
        self[job_id] = job

    def _index(self, job_id: int, job: Any) -> None:
        holding: Holding = job.holding
        self._keys[job_id] = (job.queue, job.user, holding)
        for index, alloc in enumerate(holding.allocs):
            self._on_host.setdefault(alloc.host, {})[(job_id, index)] = alloc
            self._stale.add(alloc.host)
        key = (job.queue, job.user)
        tasks = holding.tasks
        if tasks:
            self._tasks[key] = self._tasks.get(key, 0) + tasks
            self._running = None
        if holding.shared:
            self._shared[job_id] = holding

    def _unindex(self, job_id: int) -> None:
        queue, user, holding = self._keys.pop(job_id)
        for index, alloc in enumerate(holding.allocs):
            on = self._on_host[alloc.host]
            del on[(job_id, index)]
            if not on:
                del self._on_host[alloc.host]
            self._stale.add(alloc.host)
        tasks = holding.tasks
        if tasks:
            left = self._tasks[(queue, user)] - tasks
            if left:
                self._tasks[(queue, user)] = left
            else:
                del self._tasks[(queue, user)]
            self._running = None
        self._shared.pop(job_id, None)

    def _reorder(self) -> None:
        """Make the per-host and shared orders again from the mapping's order (a job replaced in
        place keeps its place; rare: a resize)."""
        self._on_host, self._shared = {}, {}
        for job_id in self:
            holding = self._keys[job_id][2]
            for index, alloc in enumerate(holding.allocs):
                self._on_host.setdefault(alloc.host, {})[(job_id, index)] = alloc
            if holding.shared:
                self._shared[job_id] = holding
        self._tuples, self._stale = {}, set(self._on_host)

    # ---- what a session reads -------------------------------------------------------------------

    def allocs_by_host(self, closing: Collection[int] = (), live: Callable[[Any, int], bool] | None = None,
                       draining: Iterable[tuple[int, HostAlloc]] = ()) -> dict[str, tuple[HostAlloc, ...]]:
        """Host -> the allocations held there: of the active jobs, in order (of a job in `closing`
        only the units `live(job, index)` says still run), then the `draining` (job id, alloc)
        pairs, in their order. The same tuple object for a host as long as nothing on it changed.
        The dict returned is the caller's to read, not to change."""
        for host in self._stale:
            on = self._on_host.get(host)
            if on:
                self._tuples[host] = tuple(on.values())
            else:
                self._tuples.pop(host, None)
        self._stale.clear()
        touched: set[str] = set()
        for job_id in closing:
            key = self._keys.get(job_id)
            if key is not None:
                touched.update(a.host for a in key[2].allocs)
        drains: dict[str, list[HostAlloc]] = {}
        for _job_id, alloc in draining:
            drains.setdefault(alloc.host, []).append(alloc)
        if not touched and not drains:
            return self._tuples
        out = dict(self._tuples)
        for host in touched | drains.keys():
            mine = [alloc for (job_id, index), alloc in self._on_host.get(host, {}).items()
                    if job_id not in closing or (live is not None and live(self[job_id], index))]
            mine.extend(drains.get(host, ()))
            if mine:
                out[host] = tuple(mine)
            else:
                out.pop(host, None)
        return out

    def running(self, closing: Collection[int] = ()) -> tuple[tuple[str, str, int], ...]:
        """(queue, user, tasks) summed per queue and user over the active jobs not in `closing`
        (Snapshot.running: a job ending in this tick holds nothing in its session)."""
        if self._running is None:
            self._running = tuple((queue, user, tasks) for (queue, user), tasks in self._tasks.items())
        ending = [self._keys[job_id] for job_id in closing if job_id in self._keys and self._keys[job_id][2].tasks]
        if not ending:
            return self._running
        tasks = dict(self._tasks)
        for queue, user, holding in ending:  # a few jobs a tick: cheaper than a sum over all of them
            tasks[(queue, user)] -= holding.tasks
        return tuple((queue, user, n) for (queue, user), n in tasks.items() if n)

    def shared_free(self, shared: FrozenMap | dict, closing: Collection[int] = ()) -> FrozenMap:
        """`shared` (the cluster's counters) less what the active jobs not in `closing` hold."""
        return less_shared(shared, (h for job_id, h in self._shared.items() if job_id not in closing))

    # ---- the invariant --------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Where the index differs from its computation from scratch (module docstring), as sentences."""
        found = []
        fresh: dict[str, list[HostAlloc]] = {}
        tasks: dict[tuple[str, str], int] = {}
        for job_id, job in self.items():
            if self._keys.get(job_id, (None, None, None))[2] is not job.holding \
                    or self._keys[job_id][:2] != (job.queue, job.user):
                found.append(f"job {job_id}: its queue, user or holding changed without rehold")
            for alloc in job.holding.allocs:
                fresh.setdefault(alloc.host, []).append(alloc)
            tasks[(job.queue, job.user)] = tasks.get((job.queue, job.user), 0) + job.holding.tasks
        indexed = self.allocs_by_host()
        for host in sorted(fresh.keys() | indexed.keys()):
            if tuple(fresh.get(host, ())) != indexed.get(host, _NONE):
                found.append(f"host {host}: the index holds {indexed.get(host, _NONE)}, "
                             f"the active jobs {tuple(fresh.get(host, ()))}")
        summed = {key: n for key, n in tasks.items() if n}
        got = {(q, u): n for q, u, n in self.running()}
        if got != summed:
            found.append(f"running tasks per (queue, user): the index holds {got}, the active jobs {summed}")
        holders = [job.holding for job in self.values() if job.holding.shared]
        if holders != list(self._shared.values()):
            found.append("the jobs holding shared counters differ from the index's")
        return found

