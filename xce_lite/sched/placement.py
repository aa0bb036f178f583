"""Placement: where one job's tasks go now, why they cannot, and whether they ever could. Pure.

`place(job, hosts, shared_free)` answers for one job against one snapshot of hosts: a `Placement`
(hosts, tasks per host, what is reserved on each, GPU indices) or a `Refusal` (reasons per host and
per job, see `reasons.py`). `why_never(job, hosts)` says, at submit, whether no host could ever run
the job even with the whole cluster empty. No I/O, no clock; every value is a frozen, hashable,
picklable dataclass; the same input gives the same output (hosts are sorted, ties broken by name).

The rules, and the choices where LSF leaves room:

- Hosts: only hosts in state "ok". `select[...]` reads what a host IS, not what it has free now:
  its totals (also under LSF's `max<name>`: `maxmem`), its attributes and its tags (True). What a
  job needs free is `rusage`. So a select never flips with load, a pend reason names the short
  resource with needed vs free rather than "select is false", a scheduler may evaluate a select
  once per host, and `why_never` is exact. (LSF reads `mem` in a select as free memory; its users
  pair `select[mem>X]` with `rusage[mem=X]`, which behaves the same here.)
- Order: hosts sorted by the `order[...]` keys, read on the host's free amounts over its
  attributes (`order[-slots]` spreads, `order[slots]` packs); hosts without a numeric value for a
  key come after those with one; then by name. Without `order[]`, by name.
- Capacity: a task takes one slot; rusage is per task (x tasks), per host (once on each host the
  job uses) or per job (once, on the first host). `name=0` terms are ignored. A host can take k
  tasks when `per_task*k + per_host (+ per_job)` fits its free amount of every resource it is asked
  for; a resource the host lacks has 0 free. A name in `shared_free` is a cluster-wide counter
  instead: the job reserves `per_task*tasks + per_host*hosts + per_job` of it, checked once.
- Task range `-n min,max`: the MOST tasks that fit, never fewer than min; a job whose min fits now
  is placed now (the XCE bug-1931 pended a 2..5 task job while 2 slots were free).
- Packing: hosts are filled in order, each with as many tasks as it can take (fewest hosts).
- `span[ptile=p]`: exactly p tasks on every host but the last, which has 1..p (LSF's rule). A host
  with room for fewer than p can only be that last one. The first host (which holds the per-job
  rusage) is a full one unless the job fits on that one host alone.
- `span[hosts=1]`: every task on one host; the same as `span[maxhosts=1]`.
- `span[block=b]`: the task count is a multiple of b and every host takes whole blocks; a range
  with no multiple of b is refused (`NoTaskCount`).
- `span[maxhosts=m]` (ours; LSF's HOSTLIMIT_PER_JOB): the most tasks that fit on at most m hosts,
  then the earliest hosts in order that still reach that count (greedy with a look-ahead).
- `same[a:b]`: hosts are grouped by their values of a and b (a host lacking one joins no group);
  each group is placed alone; the group with the most tasks wins, ties to the group whose first
  host comes earliest in order.
- Per-job rusage on host resources: the first host must hold it; when it matters, every candidate
  for first host is tried, in order, and the first reaching the most tasks wins.
- GPUs: `gpus` is a resource like any other, counted in `total`/`free`; `gpu_free` lists the
  indices free, and a host gets its lowest free indices, as many as its `gpus` reservation.
- Output: hosts in the order the job uses them: the first one carries the per-job rusage (and
  runs the job script), then the rest in order; under ptile the partly filled host comes last.

Many jobs in turn: `session.Session` answers `place` for each job on what earlier placements left,
at the cost of what changed rather than of every host. The arithmetic is in `fit`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from xce_lite.errors import SpecError
from xce_lite.sched import resreq as rr
from xce_lite.sched.fit import GPUS, SLOTS, attributes, is_number, request_terms
from xce_lite.sched.reasons import NOTHING, FrozenMap, NoTaskCount, Placement, Refusal, format_amount
from xce_lite.sched.session import Session

HOST_STATES = ("ok", "closed", "unreachable")
_ANY = rr.ResReq()  # asks for nothing but one slot per task


def _check(condition: bool, message: str) -> None:
    if not condition:  # a programming error in building a snapshot, not a user's
        raise ValueError(message)


@dataclass(frozen=True, slots=True, init=False)
class HostView:
    """One host as the placement sees it. Amounts in base units (bytes for mem). `free` defaults to
    `total` and must have the same keys; when `gpus` is a resource, `free["gpus"]` is the number of
    indices in `gpu_free`. `attrs` are strings or numbers (type, model); `tags` are bare names."""

    name: str
    state: str
    total: Mapping[str, int | float]
    free: Mapping[str, int | float]
    gpu_free: tuple[int, ...]
    attrs: Mapping[str, str | int | float]
    tags: frozenset[str]

    # Written out, not generated: `free` may be given as None (then it is `total`), and the
    # attribute is always a mapping.
    def __init__(self, name: str, state: str = "ok", total: Mapping[str, int | float] = NOTHING,
                 free: Mapping[str, int | float] | None = None, gpu_free: Iterable[int] = (),
                 attrs: Mapping[str, str | int | float] = NOTHING, tags: Iterable[str] = frozenset()) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "state", state)
        total = FrozenMap(total)
        free = total if free is None else FrozenMap(free)
        gpu_free = tuple(sorted(gpu_free))
        _check(self.state in HOST_STATES, f"host {self.name}: state {self.state!r} is not one of {HOST_STATES}")
        _check(all(is_number(v) for v in (*total.values(), *free.values())),
               f"host {self.name}: amounts must be finite numbers")
        _check(set(free) == set(total), f"host {self.name}: free and total must name the same resources")
        _check(all(type(i) is int and i >= 0 for i in gpu_free) and len(set(gpu_free)) == len(gpu_free),
               f"host {self.name}: gpu_free holds distinct GPU indices")
        _check(float(total.get(GPUS, 0)).is_integer() and free.get(GPUS, 0) == len(gpu_free),
               f"host {self.name}: free gpus must equal the number of free GPU indices")
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "gpu_free", gpu_free)
        object.__setattr__(self, "attrs", FrozenMap(attrs))
        object.__setattr__(self, "tags", frozenset(tags))

    def with_free(self, free: Mapping[str, int | float], gpu_free: tuple[int, ...],
                  state: str | None = None) -> HostView:
        """This host with other free amounts (and state), the same as `replace(self, free=...,
        gpu_free=..., state=...)` but checking only what changes: what a host IS was checked when
        it was made."""
        state = self.state if state is None else state
        _check(state in HOST_STATES, f"host {self.name}: state {state!r} is not one of {HOST_STATES}")
        free = FrozenMap(free)
        gpu_free = tuple(sorted(gpu_free))
        _check(free.keys() == self.total.keys() and all(is_number(v) for v in free.values()),
               f"host {self.name}: free must name the same resources as total, with finite numbers")
        _check(free.get(GPUS, 0) == len(gpu_free), f"host {self.name}: free gpus must equal the free GPU indices")
        view = object.__new__(HostView)
        for name, value in (("name", self.name), ("state", state), ("total", self.total), ("free", free),
                            ("gpu_free", gpu_free), ("attrs", self.attrs), ("tags", self.tags)):
            object.__setattr__(view, name, value)
        return view

    def emptied(self) -> HostView:
        """The host open and with nothing reserved: what `why_never` measures against."""
        return replace(self, state="ok", free=self.total, gpu_free=tuple(range(int(self.total.get(GPUS, 0)))))


@dataclass(frozen=True, slots=True, init=False)
class JobRequest:
    """A job's effective request: `-n min_tasks,max_tasks` (max defaults to min) and the merged -R."""

    id: int
    min_tasks: int
    max_tasks: int
    resreq: rr.ResReq

    # Written out, not generated: `max_tasks` may be given as None (then it is `min_tasks`), and
    # the attribute is always an int.
    def __init__(self, id: int, min_tasks: int = 1, max_tasks: int | None = None, resreq: rr.ResReq = _ANY) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "min_tasks", min_tasks)
        object.__setattr__(self, "max_tasks", min_tasks if max_tasks is None else max_tasks)
        object.__setattr__(self, "resreq", resreq)
        low, high = self.min_tasks, self.max_tasks
        if type(low) is not int or type(high) is not int or low < 1:
            raise SpecError(f"-n {low},{high}: task counts are whole numbers, at least 1")
        if low > high:
            raise SpecError(f"-n {low},{high}: the minimum is more than the maximum; write -n {high},{low}")
        _check(isinstance(self.resreq, rr.ResReq), "JobRequest.resreq must be a ResReq")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled as its fields, restored without validating them again (they were valid when
        # built): the scheduler process receives 10,000s of requests at a time, and the default
        # for frozen slotted dataclasses (__getstate__/__setstate__ in Python) cost ~2 us a request
        # each way, more than a third of the pending set's pickling.
        return _restored_request, (self.id, self.min_tasks, self.max_tasks, self.resreq)


def _restored_request(id: int, min_tasks: int, max_tasks: int, resreq: rr.ResReq) -> JobRequest:
    request = object.__new__(JobRequest)
    object.__setattr__(request, "id", id)
    object.__setattr__(request, "min_tasks", min_tasks)
    object.__setattr__(request, "max_tasks", max_tasks)
    object.__setattr__(request, "resreq", resreq)
    return request


# ---------------------------------------------------------------- place


def place(job: JobRequest, hosts: Sequence[HostView],
          shared_free: Mapping[str, int | float] = NOTHING) -> Placement | Refusal:
    """Place `job` on `hosts` now (rules in the module docstring), or say why not.
    Preconditions: host names are distinct; amounts in base units."""
    return Session(hosts, shared_free).place(job)


# ---------------------------------------------------------------- why_never


def why_never(job: JobRequest, hosts_total: Sequence[HostView],
              shared_total: Mapping[str, int | float] = NOTHING) -> str | None:
    """Why no host could ever run `job`, even open and empty; None if some state of the cluster
    could. For rejecting at submit. Hosts count whatever their state (closed ones may reopen);
    `shared_total` are the cluster counters' totals. Checks, first failing one wins: unknown
    names, rusage of something not reservable, a block rule no count meets, a select no host
    matches, an amount more than any host (or the cluster) has, then a full placement."""
    r = job.resreq
    if not hosts_total:
        return "the cluster has no hosts"
    hosts = [h.emptied() for h in hosts_total]
    known: set[str] = set(shared_total)
    for host in hosts:
        known.update(attributes(host))
    rusage = [t for t in r.rusage if t.amount]
    used = rr.names(rr.ResReq(select=r.select, order=r.order, rusage=tuple(rusage), same=r.same))
    unknown = sorted(used - known)
    if unknown:
        hints = [f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, sorted(known), 1))
                 else name for name in unknown]
        return f"unknown resource {', '.join(hints)} in -R; the cluster knows: {', '.join(sorted(known))}"
    reservable = {k for h in hosts for k in h.total} | set(shared_total)
    for term in rusage:
        text = f"rusage[{rr.format_term(term)}]"
        if term.name not in reservable:
            return f"{text}: {term.name} is an attribute, not a resource a job can reserve"
        if term.name == SLOTS:
            return f"{text}: every task holds one slot; ask for more tasks with -n instead"
        if term.name == GPUS and not float(rr.amount_in_base_units(term, None)).is_integer():
            return f"{text}: GPUs are whole devices; ask for a whole number"
    unit = r.span.block if r.span and r.span.block else 1
    assert job.max_tasks is not None  # set by JobRequest
    if -(-job.min_tasks // unit) > job.max_tasks // unit:
        return NoTaskCount(job.min_tasks, job.max_tasks, unit).text()
    matching = [h for h in hosts if rr.evaluate(r.select, attributes(h))]
    if not matching:
        return f"no host matches select[{rr.format_expr(r.select)}]"  # type: ignore[arg-type]
    host_terms, shared_terms = request_terms(job, shared_total)
    for name, per_task, per_host, per_job in host_terms:
        need, most = per_task * 1 + (per_host + per_job), max(h.total.get(name, 0) for h in matching)
        if need > most:
            where = "the largest host that matches the select" if r.select is not None else "the largest host"
            return (f"needs {format_amount(name, need)} {name} on one host for one task, and "
                    f"{where} has {format_amount(name, most)}")
    for name, per_task, per_host, per_job in shared_terms:
        need, have = per_task * job.min_tasks + (per_host * 1 + per_job), shared_total.get(name, 0)
        if need > have:
            return f"needs {format_amount(name, need)} {name}, and the cluster has {format_amount(name, have)}"
    result = place(job, hosts, shared_total)
    if isinstance(result, Refusal):
        return f"can never start, even on an empty cluster: {result.summary()}"
    return None
