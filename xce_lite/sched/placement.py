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
"""

from __future__ import annotations

import difflib
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from xce_lite.errors import SpecError
from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import (
    NOTHING,
    FrozenMap,
    HostAlloc,
    HostDown,
    HostRefusal,
    NoFirstHost,
    NoHosts,
    NoTaskCount,
    NoValue,
    Placement,
    Refusal,
    SelectFalse,
    SharedShort,
    Short,
    TooFewTasks,
    format_amount,
)

SLOTS, GPUS = "slots", "gpus"
HOST_STATES = ("ok", "closed", "unreachable")
_PER_INDEX = {"task": 0, "host": 1, "job": 2}
_ANY = rr.ResReq()  # asks for nothing but one slot per task


def _check(condition: bool, message: str) -> None:
    if not condition:  # a programming error in building a snapshot, not a user's
        raise ValueError(message)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, slots=True)
class HostView:
    """One host as the placement sees it. Amounts in base units (bytes for mem). `free` defaults to
    `total` and must have the same keys; when `gpus` is a resource, `free["gpus"]` is the number of
    indices in `gpu_free`. `attrs` are strings or numbers (type, model); `tags` are bare names."""

    name: str
    state: str = "ok"
    total: Mapping[str, int | float] = NOTHING
    free: Mapping[str, int | float] | None = None
    gpu_free: tuple[int, ...] = ()
    attrs: Mapping[str, str | int | float] = NOTHING
    tags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        total = FrozenMap(self.total)
        free = total if self.free is None else FrozenMap(self.free)
        gpu_free = tuple(sorted(self.gpu_free))
        _check(self.state in HOST_STATES, f"host {self.name}: state {self.state!r} is not one of {HOST_STATES}")
        _check(all(_is_number(v) for v in (*total.values(), *free.values())),
               f"host {self.name}: amounts must be finite numbers")
        _check(set(free) == set(total), f"host {self.name}: free and total must name the same resources")
        _check(all(type(i) is int and i >= 0 for i in gpu_free) and len(set(gpu_free)) == len(gpu_free),
               f"host {self.name}: gpu_free holds distinct GPU indices")
        _check(float(total.get(GPUS, 0)).is_integer() and free.get(GPUS, 0) == len(gpu_free),
               f"host {self.name}: free gpus must equal the number of free GPU indices")
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "gpu_free", gpu_free)
        object.__setattr__(self, "attrs", FrozenMap(self.attrs))
        object.__setattr__(self, "tags", frozenset(self.tags))

    def emptied(self) -> HostView:
        """The host open and with nothing reserved: what `why_never` measures against."""
        return replace(self, state="ok", free=self.total, gpu_free=tuple(range(int(self.total.get(GPUS, 0)))))


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job's effective request: `-n min_tasks,max_tasks` (max defaults to min) and the merged -R."""

    id: int
    min_tasks: int = 1
    max_tasks: int | None = None
    resreq: rr.ResReq = _ANY

    def __post_init__(self) -> None:
        if self.max_tasks is None:
            object.__setattr__(self, "max_tasks", self.min_tasks)
        low, high = self.min_tasks, self.max_tasks
        if type(low) is not int or type(high) is not int or low < 1:
            raise SpecError(f"-n {low},{high}: task counts are whole numbers, at least 1")
        if low > high:
            raise SpecError(f"-n {low},{high}: the minimum is more than the maximum; write -n {high},{low}")
        _check(isinstance(self.resreq, rr.ResReq), "JobRequest.resreq must be a ResReq")


def attributes(host: HostView) -> dict[str, object]:
    """What select[] and same[] read on a host: totals (also as `max<name>`), attrs, tags as True."""
    names: dict[str, object] = {"max" + k: v for k, v in host.total.items()}
    names.update((tag, True) for tag in host.tags)
    names.update(host.attrs)
    names.update(host.total)
    return names


# ---------------------------------------------------------------- demand and capacity

# A term is (name, per_task, per_host, per_job) in base units. Every check and every reservation
# uses the one expression `per_task * k + fixed`, so float rounding can never let them disagree.
_Term = tuple[str, Any, Any, Any]


def _terms(job: JobRequest, shared: Iterable[str]) -> tuple[list[_Term], list[_Term]]:
    """The job's demand by resource name, split into host terms (with one slot per task) and the
    terms on shared counters (names in `shared`)."""
    acc: dict[str, list[Any]] = {SLOTS: [1, 0, 0]}
    for term in job.resreq.rusage:
        if term.amount:
            amounts = acc.setdefault(term.name, [0, 0, 0])
            amounts[_PER_INDEX[term.per]] += rr.amount_in_base_units(term, rr.default_unit(term.name))
    shared = set(shared) - {SLOTS}
    terms = [(name, *amounts) for name, amounts in sorted(acc.items())]
    return [t for t in terms if t[0] not in shared], [t for t in terms if t[0] in shared]


def _most(have: Any, per_task: Any, fixed: Any, limit: int) -> int:
    """The largest k in [0, limit] with `per_task * k + fixed <= have` (0 when fixed alone is too big)."""
    if fixed > have:
        return 0
    if per_task <= 0:
        return limit
    both_int = type(have) is int and type(per_task) is int and type(fixed) is int
    q = (have - fixed) // per_task if both_int else (have - fixed) / per_task
    k = limit if q >= limit else max(0, math.floor(q))
    while k > 0 and per_task * k + fixed > have:
        k -= 1
    while k < limit and per_task * (k + 1) + fixed <= have:
        k += 1
    return k


def _cap(free: Mapping[str, Any], terms: list[_Term], first: bool, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = _most(free.get(name, 0), per_task, per_host + (per_job if first else 0), limit)
        if limit == 0:
            break
    return limit


def _order_key(host: HostView, keys: tuple[rr.OrderKey, ...]) -> tuple[object, ...]:
    values: dict[str, object] = {**attributes(host), **host.free} if keys else {}
    key: list[tuple[int, float]] = []
    for k in keys:
        v = values.get(k.name)
        key.append((0, -v if k.descending else v) if _is_number(v) else (1, 0))  # type: ignore[operator]
    return (*key, host.name)


# ---------------------------------------------------------------- partitioning


def _topsum(values: Sequence[int], n: int) -> int:
    if n <= 0:
        return 0
    return sum(values) if n >= len(values) else sum(heapq.nlargest(n, values))


def _solve(caps: list[int], umax: int, ptile: int | None, limit: int | None,
           forced: bool) -> tuple[int, list[tuple[int, int]]]:
    """The most units (tasks, or blocks) up to `umax` on hosts with `caps` units each (in order),
    and where: [(index, units)], first host first. At most `limit` hosts (None: any); `forced`:
    caps[0] must be used, as the first host."""
    if not caps or umax <= 0:
        return 0, []
    m = len(caps) if limit is None else min(limit, len(caps))
    if ptile is None:
        goal = min(umax, caps[0] + _topsum(caps[1:], m - 1) if forced else _topsum(caps, m))
        alloc: list[tuple[int, int]] = []
        left = goal
        for i, c in enumerate(caps):
            if left == 0:
                break
            take = min(c, left)
            if take == 0:  # under block=b a host with room for fewer than b tasks holds no block
                continue
            rest = left - take
            # Look ahead (only under a host limit): skip this host when the hosts still allowed
            # after it could not carry the rest. Taking whenever possible keeps the earliest hosts.
            if rest and m < len(caps) and not (forced and i == 0) and rest > _topsum(caps[i + 1:], m - len(alloc) - 1):
                continue
            alloc.append((i, take))
            left = rest
        return goal, alloc
    if forced and caps[0] < ptile:  # a first host short of a full tile can only be the only host
        goal = min(umax, caps[0])
        return goal, [(0, goal)]
    full = [i for i, c in enumerate(caps) if c >= ptile]
    if len(full) >= m:
        bound = ptile * m
    else:
        bound = ptile * len(full) + max((c for c in caps if c < ptile), default=0)
    goal = min(umax, bound)
    whole, part = divmod(goal, ptile)
    alloc = [(i, ptile) for i in full[:whole]]
    if part:
        used = set(full[:whole])
        alloc.append(next((i, part) for i, c in enumerate(caps) if i not in used and c >= part))
    return goal, alloc


def _solve_with_first(caps_other: list[int], caps_first: list[int], umax: int, ptile: int | None,
                      limit: int | None, per_job: bool) -> tuple[int, list[tuple[int, int]]]:
    """`_solve`, where the first host must also hold the per-job rusage (`caps_first`) if any."""
    upper, alloc = _solve(caps_other, umax, ptile, limit, False)
    if not per_job:
        return upper, alloc
    best: tuple[int, list[tuple[int, int]]] = (0, [])
    for i, cap in enumerate(caps_first):
        if cap < 1:
            continue
        got, alloc = _solve([cap, *caps_other[:i], *caps_other[i + 1:]], umax, ptile, limit, True)
        if got > best[0]:
            best = (got, [(i if j == 0 else j - 1 if j <= i else j, units) for j, units in alloc])
        if got >= upper:
            break
    return best


class _Candidate(NamedTuple):
    host: HostView
    cap_other: int  # most tasks as a host other than the first
    cap_first: int  # most tasks as the first host (per-job rusage included)


# ---------------------------------------------------------------- place


def place(job: JobRequest, hosts: Sequence[HostView],
          shared_free: Mapping[str, int | float] = NOTHING) -> Placement | Refusal:
    """Place `job` on `hosts` now (rules in the module docstring), or say why not.
    Preconditions: host names are distinct; amounts in base units."""
    _check(len({h.name for h in hosts}) == len(hosts), "host names must be distinct")
    r, shared_free = job.resreq, FrozenMap(shared_free)
    host_terms, shared_terms = _terms(job, shared_free)
    per_job = any(t[3] for t in host_terms)
    span = r.span
    unit = (span.block or 1) if span else 1  # under block=b the solver counts blocks, not tasks
    ptile = span.ptile if span else None
    limit = (1 if span.one_host else span.max_hosts) if span else None
    assert job.max_tasks is not None  # set by JobRequest
    umin, umax = -(-job.min_tasks // unit), job.max_tasks // unit
    if umin > umax:
        return Refusal(job.id, (NoTaskCount(job.min_tasks, job.max_tasks, unit),))
    if not hosts:
        return Refusal(job.id, (NoHosts(),))

    refused: list[HostRefusal] = []
    groups: dict[tuple[object, ...], list[_Candidate]] = {}
    select_text = rr.format_expr(r.select) if r.select is not None else ""
    for host in sorted(hosts, key=lambda h: _order_key(h, r.order)):
        if host.state != "ok":
            refused.append(HostRefusal(host.name, (HostDown(host.state),)))
            continue
        names = attributes(host) if r.select is not None or r.same else {}
        if not rr.evaluate(r.select, names):
            refused.append(HostRefusal(host.name, (SelectFalse(select_text),)))
            continue
        why: list[Any] = [NoValue(a) for a in r.same if a not in names]
        cap_other = _cap(host.free, host_terms, False, job.max_tasks)
        if cap_other == 0:
            for name, per_task, per_host, _ in host_terms:
                need, have = per_task * 1 + (per_host + 0), host.free.get(name, 0)
                if need > have:
                    why.append(Short(name, need, max(have, 0)))
        if why:
            refused.append(HostRefusal(host.name, tuple(why)))
            continue
        cap_first = _cap(host.free, host_terms, True, job.max_tasks) if per_job else cap_other
        groups.setdefault(tuple(names[a] for a in r.same), []).append(_Candidate(host, cap_other, cap_first))

    per_host_shared = any(t[2] for t in shared_terms)
    best: tuple[int, list[tuple[int, int]], list[_Candidate]] = (0, [], [])
    for members in groups.values():
        caps_other = [c.cap_other // unit for c in members]
        caps_first = [c.cap_first // unit for c in members]
        tops = [len(members) if limit is None else min(limit, len(members))]
        if per_host_shared:  # the count of hosts changes what the counters allow: try each, downwards
            tops = list(range(tops[0], 0, -1))
        for top in tops:
            allowed = _shared_most(shared_terms, shared_free, top, umax * unit) // unit
            got, alloc = _solve_with_first(caps_other, caps_first, allowed, ptile,
                                           top if per_host_shared else limit, per_job)
            if got > best[0]:
                best = (got, alloc, members)
            if got < allowed:  # capacity, not the counters, is the limit: fewer hosts cannot do better
                break

    got, alloc, members = best
    if got < umin:
        return _refusal(job, refused, groups, got * unit, host_terms, shared_terms, shared_free, per_job)
    return _placement(job, [(members[i], units * unit) for i, units in alloc], host_terms, shared_terms)


def _shared_most(terms: list[_Term], free: Mapping[str, Any], hosts: int, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = _most(free.get(name, 0), per_task, per_host * hosts + per_job, limit)
    return limit


def _placement(job: JobRequest, chosen: list[tuple[_Candidate, int]], host_terms: list[_Term],
               shared_terms: list[_Term]) -> Placement:
    allocs = []
    for position, (candidate, tasks) in enumerate(chosen):
        first = position == 0
        reserved = {name: amount for name, per_task, per_host, per_job in host_terms
                    if (amount := per_task * tasks + (per_host + (per_job if first else 0)))}
        gpus = candidate.host.gpu_free[:math.ceil(reserved.get(GPUS, 0))]
        allocs.append(HostAlloc(candidate.host.name, tasks, FrozenMap(reserved), gpus))
    tasks, count = sum(a.tasks for a in allocs), len(allocs)
    shared = {name: amount for name, per_task, per_host, per_job in shared_terms
              if (amount := per_task * tasks + (per_host * count + per_job))}
    return Placement(job.id, tuple(allocs), FrozenMap(shared))


def _refusal(job: JobRequest, refused: list[HostRefusal], groups: dict[Any, list[_Candidate]], most: int,
             host_terms: list[_Term], shared_terms: list[_Term], shared_free: FrozenMap,
             per_job: bool) -> Refusal:
    candidates = sorted((c for members in groups.values() for c in members), key=lambda c: c.host.name)
    reasons: list[Any] = []
    if per_job and candidates and not any(c.cap_first for c in candidates):
        reasons.append(NoFirstHost(", ".join(f"{name}={format_amount(name, j)}/job"
                                             for name, _, _, j in host_terms if j)))
    for name, per_task, per_host, per_job_amount in shared_terms:
        need, have = per_task * job.min_tasks + (per_host * 1 + per_job_amount), shared_free.get(name, 0)
        if need > have:
            reasons.append(SharedShort(name, need, max(have, 0)))
    if candidates:
        span = rr.format_span(job.resreq.span) if job.resreq.span else ""
        reasons.insert(0, TooFewTasks(job.min_tasks, most, span, job.resreq.same))
    return Refusal(job.id, tuple(reasons), tuple(sorted(refused, key=lambda h: h.host)),
                   tuple((c.host.name, c.cap_other) for c in candidates))


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
    host_terms, shared_terms = _terms(job, shared_total)
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
