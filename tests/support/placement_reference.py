"""The placement engine's reference: `reference_place`, `place` as it was before the session caches
(commit 4cef351), copied verbatim but for the names, and `reference_take`, core.take as it was. Slow
and obviously the rules (it sorts every host, reads `attributes` and the select afresh, caps every
host on every call); the placement and scheduler tests check that the optimised paths give exactly
what it gives.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from xce_lite.sched import resreq as rr
from xce_lite.sched.placement import GPUS, SLOTS, FrozenMap, HostView, JobRequest, Placement, attributes
from xce_lite.sched.reasons import (
    NOTHING,
    HostAlloc,
    HostDown,
    HostRefusal,
    NoFirstHost,
    NoHosts,
    NoTaskCount,
    NoValue,
    Refusal,
    SelectFalse,
    SharedShort,
    Short,
    TooFewTasks,
    format_amount,
)


def reference_take(hosts: list[HostView], shared: Mapping[str, Any],
                   placement: Placement) -> tuple[list[HostView], Mapping[str, Any]]:
    """The hosts and counters with `placement` taken out of what is free (core.take as it was)."""
    allocs = {a.host: a for a in placement.allocs}
    updated = []
    for h in hosts:
        alloc = allocs.get(h.name)
        if alloc is None:
            updated.append(h)
            continue
        free = {name: amount - alloc.reserved.get(name, 0) for name, amount in h.free.items()}
        gpu_free = tuple(i for i in h.gpu_free if i not in alloc.gpus)
        if GPUS in free:
            free[GPUS] = len(gpu_free)
        updated.append(dataclasses.replace(h, free=free, gpu_free=gpu_free))
    if placement.shared:
        shared = FrozenMap({name: amount - placement.shared.get(name, 0) for name, amount in shared.items()})
    return updated, shared


# ---------------------------------------------------------------- the reference: place() unoptimised

_PER_INDEX = {"task": 0, "host": 1, "job": 2}


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# A term is (name, per_task, per_host, per_job) in base units. Every check and every reservation
# uses the one expression `per_task * k + fixed`, so float rounding can never let them disagree.
ref_Term = tuple[str, Any, Any, Any]


def ref_terms(job: JobRequest, shared: Iterable[str]) -> tuple[list[ref_Term], list[ref_Term]]:
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


def ref_most(have: Any, per_task: Any, fixed: Any, limit: int) -> int:
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


def ref_cap(free: Mapping[str, Any], terms: list[ref_Term], first: bool, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = ref_most(free.get(name, 0), per_task, per_host + (per_job if first else 0), limit)
        if limit == 0:
            break
    return limit


def ref_order_key(host: HostView, keys: tuple[rr.OrderKey, ...]) -> tuple[object, ...]:
    values: dict[str, object] = {**attributes(host), **host.free} if keys else {}
    key: list[tuple[int, float]] = []
    for k in keys:
        v = values.get(k.name)
        key.append((0, -v if k.descending else v) if _is_number(v) else (1, 0))  # type: ignore[operator]
    return (*key, host.name)




def ref_topsum(values: Sequence[int], n: int) -> int:
    if n <= 0:
        return 0
    return sum(values) if n >= len(values) else sum(heapq.nlargest(n, values))


def ref_solve(caps: list[int], umax: int, ptile: int | None, limit: int | None,
           forced: bool) -> tuple[int, list[tuple[int, int]]]:
    """The most units (tasks, or blocks) up to `umax` on hosts with `caps` units each (in order),
    and where: [(index, units)], first host first. At most `limit` hosts (None: any); `forced`:
    caps[0] must be used, as the first host."""
    if not caps or umax <= 0:
        return 0, []
    m = len(caps) if limit is None else min(limit, len(caps))
    if ptile is None:
        goal = min(umax, caps[0] + ref_topsum(caps[1:], m - 1) if forced else ref_topsum(caps, m))
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
            if rest and m < len(caps) and not (forced and i == 0) \
                    and rest > ref_topsum(caps[i + 1:], m - len(alloc) - 1):
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


def ref_solve_with_first(caps_other: list[int], caps_first: list[int], umax: int, ptile: int | None,
                      limit: int | None, per_job: bool) -> tuple[int, list[tuple[int, int]]]:
    """`ref_solve`, where the first host must also hold the per-job rusage (`caps_first`) if any."""
    upper, alloc = ref_solve(caps_other, umax, ptile, limit, False)
    if not per_job:
        return upper, alloc
    best: tuple[int, list[tuple[int, int]]] = (0, [])
    for i, cap in enumerate(caps_first):
        if cap < 1:
            continue
        got, alloc = ref_solve([cap, *caps_other[:i], *caps_other[i + 1:]], umax, ptile, limit, True)
        if got > best[0]:
            best = (got, [(i if j == 0 else j - 1 if j <= i else j, units) for j, units in alloc])
        if got >= upper:
            break
    return best


class ref_Candidate(NamedTuple):
    host: HostView
    cap_other: int  # most tasks as a host other than the first
    cap_first: int  # most tasks as the first host (per-job rusage included)




def reference_place(job: JobRequest, hosts: Sequence[HostView],
          shared_free: Mapping[str, int | float] = NOTHING) -> Placement | Refusal:
    """Place `job` on `hosts` now (rules in the module docstring), or say why not.
    Preconditions: host names are distinct; amounts in base units."""
    _check(len({h.name for h in hosts}) == len(hosts), "host names must be distinct")
    r, shared_free = job.resreq, FrozenMap(shared_free)
    host_terms, shared_terms = ref_terms(job, shared_free)
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
    groups: dict[tuple[object, ...], list[ref_Candidate]] = {}
    select_text = rr.format_expr(r.select) if r.select is not None else ""
    for host in sorted(hosts, key=lambda h: ref_order_key(h, r.order)):
        if host.state != "ok":
            refused.append(HostRefusal(host.name, (HostDown(host.state),)))
            continue
        names = attributes(host) if r.select is not None or r.same else {}
        if not rr.evaluate(r.select, names):
            refused.append(HostRefusal(host.name, (SelectFalse(select_text),)))
            continue
        why: list[Any] = [NoValue(a) for a in r.same if a not in names]
        cap_other = ref_cap(host.free, host_terms, False, job.max_tasks)
        if cap_other == 0:
            for name, per_task, per_host, _ in host_terms:
                need, have = per_task * 1 + (per_host + 0), host.free.get(name, 0)
                if need > have:
                    why.append(Short(name, need, max(have, 0)))
        if why:
            refused.append(HostRefusal(host.name, tuple(why)))
            continue
        cap_first = ref_cap(host.free, host_terms, True, job.max_tasks) if per_job else cap_other
        groups.setdefault(tuple(names[a] for a in r.same), []).append(ref_Candidate(host, cap_other, cap_first))

    per_host_shared = any(t[2] for t in shared_terms)
    best: tuple[int, list[tuple[int, int]], list[ref_Candidate]] = (0, [], [])
    for members in groups.values():
        caps_other = [c.cap_other // unit for c in members]
        caps_first = [c.cap_first // unit for c in members]
        tops = [len(members) if limit is None else min(limit, len(members))]
        if per_host_shared:  # the count of hosts changes what the counters allow: try each, downwards
            tops = list(range(tops[0], 0, -1))
        for top in tops:
            allowed = ref_shared_most(shared_terms, shared_free, top, umax * unit) // unit
            got, alloc = ref_solve_with_first(caps_other, caps_first, allowed, ptile,
                                           top if per_host_shared else limit, per_job)
            if got > best[0]:
                best = (got, alloc, members)
            if got < allowed:  # capacity, not the counters, is the limit: fewer hosts cannot do better
                break

    got, alloc, members = best
    if got < umin:
        return ref_refusal(job, refused, groups, got * unit, host_terms, shared_terms, shared_free, per_job)
    return ref_placement(job, [(members[i], units * unit) for i, units in alloc], host_terms, shared_terms)


def ref_shared_most(terms: list[ref_Term], free: Mapping[str, Any], hosts: int, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = ref_most(free.get(name, 0), per_task, per_host * hosts + per_job, limit)
    return limit


def ref_placement(job: JobRequest, chosen: list[tuple[ref_Candidate, int]], host_terms: list[ref_Term],
               shared_terms: list[ref_Term]) -> Placement:
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


def ref_refusal(job: JobRequest, refused: list[HostRefusal], groups: dict[Any, list[ref_Candidate]], most: int,
             host_terms: list[ref_Term], shared_terms: list[ref_Term], shared_free: FrozenMap,
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
