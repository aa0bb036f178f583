"""The arithmetic placement rests on: what a request asks per task, per host and per job, how many
of its tasks fit in what a host has free, and how units spread over hosts in order. Pure.

Every check and every reservation uses the one expression `per_task * k + fixed` (`most_fitting`),
so float rounding can never let them disagree. The rules these serve are in `placement`'s
docstring; the session that keeps their results current is `session.Session`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import HostAlloc

if TYPE_CHECKING:
    from xce_lite.sched.placement import HostView, JobRequest

SLOTS, GPUS = "slots", "gpus"
_PER_INDEX = {"task": 0, "host": 1, "job": 2}


def is_number(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def attributes(host: HostView) -> dict[str, object]:
    """What select[] and same[] read on a host: totals (also as `max<name>`), attrs, tags as True."""
    names: dict[str, object] = {"max" + k: v for k, v in host.total.items()}
    names.update((tag, True) for tag in host.tags)
    names.update(host.attrs)
    names.update(host.total)
    return names


def taken(free: Mapping[str, Any], gpu_free: tuple[int, ...],
          alloc: HostAlloc) -> tuple[dict[str, Any], tuple[int, ...]]:
    """A host's free amounts and GPU indices once `alloc` holds its share there. Every amount only
    shrinks (rusage amounts are >= 0), and free `gpus` counts the indices left."""
    free = {name: amount - alloc.reserved.get(name, 0) for name, amount in free.items()}
    gpu_free = tuple(i for i in gpu_free if i not in alloc.gpus)
    if GPUS in free:
        free[GPUS] = len(gpu_free)
    return free, gpu_free


# ---------------------------------------------------------------- demand and capacity

# A term is (name, per_task, per_host, per_job) in base units. Every check and every reservation
# uses the one expression `per_task * k + fixed`, so float rounding can never let them disagree.
Term = tuple[str, Any, Any, Any]


def request_terms(job: JobRequest, shared: Iterable[str]) -> tuple[list[Term], list[Term]]:
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


def most_fitting(have: Any, per_task: Any, fixed: Any, limit: int) -> int:
    """The largest k in [0, limit] with `per_task * k + fixed <= have` (0 when fixed alone is too big)."""
    if fixed > have:
        return 0
    if per_task <= 0:
        return limit
    if type(have) is int and type(per_task) is int and type(fixed) is int:
        q = (have - fixed) // per_task  # exact, and >= 0 since fixed <= have: the answer up to the limit
        return limit if q >= limit else q
    q = (have - fixed) / per_task  # floats round: start near the answer, then check it exactly
    k = limit if q >= limit else max(0, math.floor(q))
    while k > 0 and per_task * k + fixed > have:
        k -= 1
    while k < limit and per_task * (k + 1) + fixed <= have:
        k += 1
    return k


def tasks_fitting(free: Mapping[str, Any], terms: list[Term], first: bool, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = most_fitting(free.get(name, 0), per_task, per_host + (per_job if first else 0), limit)
        if limit == 0:
            break
    return limit


def order_key(name: str, values: Mapping[str, object], keys: tuple[rr.OrderKey, ...]) -> tuple[object, ...]:
    """Where host `name` goes under the order[] `keys`, read in `values` (its free amounts over its
    attributes): hosts without a numeric value for a key come after those with one; then by name."""
    key: list[tuple[int, float]] = []
    for k in keys:
        v = values.get(k.name)
        key.append((0, -v if k.descending else v) if is_number(v) else (1, 0))
    return (*key, name)


class Demand(NamedTuple):
    """What one request asks of the hosts, read once per shape."""

    host_terms: list[Term]  # what a task needs on a host, by name: a slot, and the rusage on hosts
    shared_terms: list[Term]  # rusage on the cluster's shared counters
    per_job: bool  # some host resource is asked per job: the first host must hold it too
    per_host_shared: bool  # some shared counter is asked per host: the count of hosts matters
    unit: int  # the solver counts units: blocks of b tasks under span[block=b], else tasks
    ptile: int | None
    limit: int | None  # the most hosts (span[hosts=1], span[maxhosts=m]); None: any
    umin: int  # the task range, in units
    umax: int
    max_tasks: int  # no host is capped above it
    # The solver only looks back along the hosts (see _units): no per-job rusage (any host may be
    # first), no per-host counter (each host count is tried), and no host limit but hosts=1 without
    # ptile (the look-ahead of maxhosts reads the hosts after).
    looks_back: bool


def demand_of(job: JobRequest, shared_names: Iterable[str]) -> Demand:
    host_terms, shared_terms = request_terms(job, shared_names)
    span = job.resreq.span
    unit = (span.block or 1) if span else 1
    assert job.max_tasks is not None  # set by JobRequest
    per_job, per_host_shared = any(t[3] for t in host_terms), any(t[2] for t in shared_terms)
    ptile = span.ptile if span else None
    limit = (1 if span.one_host else span.max_hosts) if span else None
    looks_back = not per_job and not per_host_shared and (limit is None or (limit == 1 and ptile is None))
    return Demand(host_terms, shared_terms, per_job, per_host_shared, unit, ptile, limit,
                   -(-job.min_tasks // unit), job.max_tasks // unit, job.max_tasks, looks_back)


# ---------------------------------------------------------------- partitioning


def topsum(values: Sequence[int], n: int) -> int:
    if n <= 0:
        return 0
    return sum(values) if n >= len(values) else sum(heapq.nlargest(n, values))


def solve(caps: list[int], umax: int, ptile: int | None, limit: int | None,
           forced: bool) -> tuple[int, list[tuple[int, int]]]:
    """The most units (tasks, or blocks) up to `umax` on hosts with `caps` units each (in order),
    and where: [(index, units)], first host first. At most `limit` hosts (None: any); `forced`:
    caps[0] must be used, as the first host."""
    if not caps or umax <= 0:
        return 0, []
    m = len(caps) if limit is None else min(limit, len(caps))
    if ptile is None:
        goal = min(umax, caps[0] + topsum(caps[1:], m - 1) if forced else topsum(caps, m))
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
            # No host allowed after it (hosts=1): nothing carries the rest, and no need to copy caps.
            if rest and m < len(caps) and not (forced and i == 0):
                after = m - len(alloc) - 1
                if after <= 0 or rest > topsum(caps[i + 1:], after):
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


def solve_with_first(caps_other: list[int], caps_first: list[int], umax: int, ptile: int | None,
                      limit: int | None, per_job: bool) -> tuple[int, list[tuple[int, int]]]:
    """`solve`, where the first host must also hold the per-job rusage (`caps_first`) if any."""
    upper, alloc = solve(caps_other, umax, ptile, limit, False)
    if not per_job:
        return upper, alloc
    best: tuple[int, list[tuple[int, int]]] = (0, [])
    for i, cap in enumerate(caps_first):
        if cap < 1:
            continue
        got, alloc = solve([cap, *caps_other[:i], *caps_other[i + 1:]], umax, ptile, limit, True)
        if got > best[0]:
            best = (got, [(i if j == 0 else j - 1 if j <= i else j, units) for j, units in alloc])
        if got >= upper:
            break
    return best


def shared_most(terms: list[Term], free: Mapping[str, Any], hosts: int, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = most_fitting(free.get(name, 0), per_task, per_host * hosts + per_job, limit)
    return limit
