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

Many jobs in turn: a `Session` holds one snapshot of hosts and answers `place` for each job on
what earlier placements (`Session.take`) left, exactly as `place` would on the hosts with those
placements taken out, but it keeps what does not change in a session (attributes, select
verdicts, closed hosts) and each request shape's candidates, so a search reads the hosts that
changed and the few it places on, not every host. `place` itself is a one-job Session.
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
# A Session's memory is bounded: it keeps at most MAX_SHAPES request shapes current (each holds
# its candidates), and the refused hosts' reasons of at most MAX_ASKS kinds of demand.
MAX_SHAPES = 256
MAX_ASKS = 64
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

    def with_free(self, free: Mapping[str, int | float], gpu_free: tuple[int, ...],
                  state: str | None = None) -> HostView:
        """This host with other free amounts (and state), the same as `replace(self, free=...,
        gpu_free=..., state=...)` but checking only what changes: what a host IS was checked when
        it was made."""
        state = self.state if state is None else state
        _check(state in HOST_STATES, f"host {self.name}: state {state!r} is not one of {HOST_STATES}")
        free = FrozenMap(free)
        gpu_free = tuple(sorted(gpu_free))
        _check(free.keys() == self.total.keys() and all(_is_number(v) for v in free.values()),
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


def _cap(free: Mapping[str, Any], terms: list[_Term], first: bool, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = _most(free.get(name, 0), per_task, per_host + (per_job if first else 0), limit)
        if limit == 0:
            break
    return limit


def _order_key(name: str, values: Mapping[str, object], keys: tuple[rr.OrderKey, ...]) -> tuple[object, ...]:
    """Where host `name` goes under the order[] `keys`, read in `values` (its free amounts over its
    attributes): hosts without a numeric value for a key come after those with one; then by name."""
    key: list[tuple[int, float]] = []
    for k in keys:
        v = values.get(k.name)
        key.append((0, -v if k.descending else v) if _is_number(v) else (1, 0))  # type: ignore[operator]
    return (*key, name)


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
            # No host allowed after it (hosts=1): nothing carries the rest, and no need to copy caps.
            if rest and m < len(caps) and not (forced and i == 0):
                after = m - len(alloc) - 1
                if after <= 0 or rest > _topsum(caps[i + 1:], after):
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


def _shared_most(terms: list[_Term], free: Mapping[str, Any], hosts: int, limit: int) -> int:
    for name, per_task, per_host, per_job in terms:
        limit = _most(free.get(name, 0), per_task, per_host * hosts + per_job, limit)
    return limit


# ---------------------------------------------------------------- place


def place(job: JobRequest, hosts: Sequence[HostView],
          shared_free: Mapping[str, int | float] = NOTHING) -> Placement | Refusal:
    """Place `job` on `hosts` now (rules in the module docstring), or say why not.
    Preconditions: host names are distinct; amounts in base units."""
    return Session(hosts, shared_free).place(job)


def taken(free: Mapping[str, Any], gpu_free: tuple[int, ...],
          alloc: HostAlloc) -> tuple[dict[str, Any], tuple[int, ...]]:
    """A host's free amounts and GPU indices once `alloc` holds its share there. Every amount only
    shrinks (rusage amounts are >= 0), and free `gpus` counts the indices left."""
    free = {name: amount - alloc.reserved.get(name, 0) for name, amount in free.items()}
    gpu_free = tuple(i for i in gpu_free if i not in alloc.gpus)
    if GPUS in free:
        free[GPUS] = len(gpu_free)
    return free, gpu_free


class _Host:
    """A host during a session. What it IS (`view`: state, totals, attributes, tags) is fixed for the
    session; what it has free (`free`, a plain dict, and `gpu_free`) is replaced by `Session.take`."""

    __slots__ = ("_names", "down", "free", "gpu_free", "name", "refusals", "view")

    def __init__(self, view: HostView) -> None:
        self.view = view
        self.name = view.name
        # Never changed in place (Session.take replaces it with `taken`'s new dict), so it may be
        # the view's own: no copy per host per session.
        free = view.free
        self.free: dict[str, Any] = free.shared_dict() if isinstance(free, FrozenMap) else dict(free)
        self.gpu_free = view.gpu_free
        self._names: dict[str, object] | None = None
        # Closed or unreachable: the one reason it takes nothing, whatever the job.
        self.down = HostRefusal(view.name, (HostDown(view.state),)) if view.state != "ok" else None
        # Why it cannot take one task, by what the reasons read (see _Shape.asks): shapes that ask
        # the same share them. Emptied when the host is taken from.
        self.refusals: dict[int, HostRefusal] = {}

    def names(self) -> dict[str, object]:
        """`attributes(view)`: what select[], same[] and order[] read, built once per session."""
        if self._names is None:
            self._names = attributes(self.view)
        return self._names

    def order_key(self, keys: tuple[rr.OrderKey, ...]) -> tuple[object, ...]:
        return _order_key(self.name, {**self.names(), **self.free}, keys)


class _Demand(NamedTuple):
    """What one request asks of the hosts, read once per shape."""

    host_terms: list[_Term]  # what a task needs on a host, by name: a slot, and the rusage on hosts
    shared_terms: list[_Term]  # rusage on the cluster's shared counters
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


def _demand(job: JobRequest, shared_names: Iterable[str]) -> _Demand:
    host_terms, shared_terms = _terms(job, shared_names)
    span = job.resreq.span
    unit = (span.block or 1) if span else 1
    assert job.max_tasks is not None  # set by JobRequest
    per_job, per_host_shared = any(t[3] for t in host_terms), any(t[2] for t in shared_terms)
    ptile = span.ptile if span else None
    limit = (1 if span.one_host else span.max_hosts) if span else None
    looks_back = not per_job and not per_host_shared and (limit is None or (limit == 1 and ptile is None))
    return _Demand(host_terms, shared_terms, per_job, per_host_shared, unit, ptile, limit,
                   -(-job.min_tasks // unit), job.max_tasks // unit, job.max_tasks, looks_back)


class _Shape:
    """One request shape (task range and -R) on one set of hosts (`hosts`, by name), kept current
    through a session. Invariants, each checked against the unoptimised place() by the tests:

    - `members` are exactly the hosts that can take one task of the shape now, in placement order
      (order[] keys read on free amounts, then name), with their room in `caps`: (tasks as any
      host, tasks as the first host). What a full scan of `hosts` would find, in its order.
    - Every other host is refused: for good (closed, or select false, where `matching` says no), or
      by what it has free now or the same[] attributes it lacks. Those reasons are built only
      when a refusal needs them, and kept in `refused` until the host is taken from.
    - Free amounts only shrink in a session, so room only shrinks: a host leaves `members` when its
      room reaches 0 and never comes back. A host with no free slot can never take a task (every
      task holds a slot), so the full hosts of a busy cluster are never members at all.
    """

    __slots__ = ("answer", "asks", "caps", "demand", "group", "hosts", "keys", "matching", "members", "order",
                 "refused", "same", "seen", "select", "shared_seen")

    def __init__(self, demand: _Demand, r: rr.ResReq, hosts: list[_Host], matching: set[_Host] | None,
                 seen: int, asks: int) -> None:
        self.demand = demand
        self.order = r.order
        self.select = r.select
        self.asks = asks  # what a refused host's reasons read (host terms, same[]), as a number
        self.hosts = hosts
        self.matching = matching  # the open hosts the select is true on; None: no select
        self.same = r.same
        self.members: list[_Host] = []
        self.caps: dict[_Host, tuple[int, int]] = {}
        self.keys: dict[_Host, tuple[object, ...]] = {}  # order[] keys of the members, when order[] is given
        self.group: dict[_Host, tuple[object, ...]] = {}  # same[] values, when same[] is given
        self.refused: dict[_Host, HostRefusal] = {}
        self.seen = seen  # how far into the session's log of hosts taken from this shape is current
        # The last refusal, while nothing it reads has changed: no member's room, no refused host's
        # reasons, no shared counter it asks for (`shared_seen`: the session's count of placements
        # that took from the counters, at the time).
        self.answer: Refusal | None = None
        self.shared_seen = 0

    def refused_for_good(self, host: _Host) -> bool:
        """Closed, unreachable or select false: nothing free has a say."""
        return host.down is not None or (self.matching is not None and host not in self.matching)

    def room(self, host: _Host) -> tuple[int, int]:
        """(tasks `host` can take as any host, as the first host): the most up to the maximum."""
        d = self.demand
        other = _cap(host.free, d.host_terms, False, d.max_tasks)
        return other, _cap(host.free, d.host_terms, True, d.max_tasks) if d.per_job and other else other


def _units(shape: _Shape, members: list[_Host], allowed: int) -> list[int]:
    """The units each of `members` can take as any host, in order; when `shape.demand.looks_back`,
    only as far as the first members that already hold `allowed` units.

    That prefix is enough when the solver only looks back: with no host limit it fills hosts in
    order, under hosts=1 it takes the first host that holds it all, under ptile=p it takes the first
    full hosts and then the first host with room for the rest; in each case, once the hosts read so
    far reach `allowed` (the most the job may get), later hosts cannot change the answer. A busy
    session places small jobs on the first few of hundreds of hosts: this reads those few."""
    d = shape.demand
    if not d.looks_back:
        return [shape.caps[h][0] // d.unit for h in members]
    units: list[int] = []
    total = full = partial = 0  # sum of units; under ptile: hosts with a full tile, the largest other
    for host in members:
        u = shape.caps[host][0] // d.unit
        units.append(u)
        if d.limit == 1:
            reach = u
        elif d.ptile is None:
            total += u
            reach = total
        else:  # _solve's bound: whole tiles on full hosts, plus the largest part on one other host
            if u >= d.ptile:
                full += 1
            else:
                partial = max(partial, u)
            reach = d.ptile * full + (partial if full < len(units) else 0)
        if reach >= allowed:
            break
    return units


class Session:
    """Placement of many jobs, one after another, against one snapshot of hosts: `place` a job,
    `take` what it got, place the next. The same answers as `place` on the hosts with every earlier
    placement taken out, at the cost of the hosts that changed rather than of every host.

    What a host IS (state, totals, attributes, tags) is fixed for the session, so its attributes,
    its select verdicts and its same[] values are read once; what a host has free only shrinks, so a
    request shape's candidate hosts, sorted once, only lose members or move under order[] (see
    `_Shape`). A shape is keyed by (host set, task range, -R): jobs of queues sharing their hosts
    share it.
    """

    def __init__(self, hosts: Sequence[HostView], shared_free: Mapping[str, int | float] = NOTHING) -> None:
        _check(len({h.name for h in hosts}) == len(hosts), "host names must be distinct")
        self.hosts = [_Host(h) for h in sorted(hosts, key=lambda h: h.name)]
        self._by_name = {h.name: h for h in self.hosts}
        self._open = [h for h in self.hosts if h.down is None and h.free.get(SLOTS, 0) >= 1]  # by name
        self.shared: dict[str, Any] = dict(FrozenMap(shared_free))  # sorted by name, as FrozenMap keeps it
        self._shapes: dict[tuple[object, ...], _Shape] = {}
        self._matching: dict[object, set[_Host]] = {}  # select -> the open hosts it is true on
        self._unmatched: dict[object, dict[_Host, HostRefusal]] = {}  # select -> the others' reasons
        self._false: dict[object, tuple[SelectFalse]] = {}
        self._hosts_in: dict[frozenset[str], list[_Host]] = {}  # a queue's host set -> its hosts, by name
        self._taken: list[_Host] = []  # every host taken from, in order: shapes catch up from it
        self._shared_taken = 0  # how many placements took from the shared counters
        self._asks: dict[tuple[object, ...], int] = {}  # (host terms, same[]) -> a number, for _Host.refusals
        self._asks_made = 0

    def place(self, job: JobRequest, allowed: frozenset[str] | None = None) -> Placement | Refusal:
        """`place(job, the hosts named in allowed (None: all), shared_free)` as things stand now."""
        shape = self._shape(job, allowed)
        d = shape.demand
        if d.umin > d.umax:
            return Refusal(job.id, (NoTaskCount(job.min_tasks, d.max_tasks, d.unit),))
        if not shape.hosts:
            return Refusal(job.id, (NoHosts(),))
        self._catch_up(shape)
        if shape.demand.shared_terms and shape.shared_seen != self._shared_taken:
            shape.answer = None  # the counters it reads have changed
        if shape.answer is not None:  # nothing it reads has changed since it was refused: it still is
            return Refusal(job.id, shape.answer.job_reasons, shape.answer.hosts, shape.answer.capacity)
        got, alloc, members = self._best(shape)
        if got < d.umin:
            shape.answer, shape.shared_seen = self._refusal(job, shape, got * d.unit), self._shared_taken
            return shape.answer
        return _placement(job, [(members[i], units * d.unit) for i, units in alloc], d.host_terms,
                          d.shared_terms)

    def take(self, placement: Placement) -> None:
        """Take `placement`'s reservations out of what is free, on its hosts only."""
        for alloc in placement.allocs:
            host = self._by_name[alloc.host]
            was_open = host.down is None and host.free.get(SLOTS, 0) >= 1
            host.free, host.gpu_free = taken(host.free, host.gpu_free, alloc)
            host.refusals.clear()
            self._taken.append(host)
            if was_open and host.free.get(SLOTS, 0) < 1:
                self._open.remove(host)  # for good: free amounts only shrink
        if placement.shared:
            self.shared = {name: amount - placement.shared.get(name, 0) for name, amount in self.shared.items()}
            self._shared_taken += 1

    # ---- shapes

    def _shape(self, job: JobRequest, allowed: frozenset[str] | None) -> _Shape:
        key = (allowed, job.min_tasks, job.max_tasks, job.resreq)
        shape = self._shapes.pop(key, None)
        if shape is None:
            shape = self._new_shape(job, allowed)
            if len(self._shapes) >= MAX_SHAPES:  # drop the least recently met: it is rebuilt, as
                del self._shapes[next(iter(self._shapes))]  # things then stand, if met again
        self._shapes[key] = shape  # last: the most recently met
        return shape

    def _new_shape(self, job: JobRequest, allowed: frozenset[str] | None) -> _Shape:
        r = job.resreq
        if allowed is None:
            hosts = self.hosts
        elif (hosts := self._hosts_in.get(allowed)) is None:
            hosts = self._hosts_in[allowed] = [h for h in self.hosts if h.name in allowed]
        demand = _demand(job, self.shared)
        asks = self._number_asks((tuple(demand.host_terms), r.same))
        shape = _Shape(demand, r, hosts, self._select(r.select), len(self._taken), asks)
        # Only open hosts with a free slot can take a task (every task holds a slot); the others'
        # reasons are built if a refusal needs them.
        for host in self._open if allowed is None else (h for h in self._open if h.name in allowed):
            if shape.refused_for_good(host) or (r.same and any(a not in host.names() for a in r.same)):
                continue
            room = shape.room(host)
            if room[0]:
                shape.members.append(host)
                shape.caps[host] = room
        if r.order:
            shape.keys = {host: host.order_key(r.order) for host in shape.members}
            shape.members.sort(key=shape.keys.__getitem__)
        if r.same:
            shape.group = {host: tuple(host.names()[a] for a in r.same) for host in shape.members}
        return shape

    def _number_asks(self, asks: tuple[object, ...]) -> int:
        """A number for what a refused host's reasons read (host terms, same[]): hosts keep their
        reasons by it. Past MAX_ASKS kinds, every host forgets its reasons and numbering goes on:
        a number is never reused, so no shape can meet reasons built for another kind."""
        number = self._asks.get(asks)
        if number is None:
            if len(self._asks) >= MAX_ASKS:
                self._asks.clear()
                for host in self.hosts:
                    host.refusals.clear()
            number = self._asks[asks] = self._asks_made
            self._asks_made += 1
        return number

    def _select(self, select: rr.Expr | None) -> set[_Host] | None:
        """The open hosts `select` is true on (None: no select, every host), evaluated once per
        session: a select reads only what a host is."""
        if select is None:
            return None
        matching = self._matching.get(select)
        if matching is None:
            matching = self._matching[select] = {h for h in self.hosts if h.view.state == "ok"
                                                 and rr.evaluate(select, h.names())}
        return matching

    def _catch_up(self, shape: _Shape) -> None:
        """Bring `shape` up to date with the hosts taken from since it last looked: their room is
        read again (a member whose room reaches 0 leaves), their order[] keys too, and the refusal
        reasons kept for them are dropped (they name free amounts). The shape's last refusal stays
        its answer only if none of that changed it."""
        if shape.seen == len(self._taken):
            return
        changed = dict.fromkeys(self._taken[shape.seen:])
        shape.seen = len(self._taken)
        moved = False
        for host in changed:
            if shape.refused_for_good(host):
                continue  # its reason names nothing that is free
            old = shape.refused.pop(host, None)
            if host not in shape.caps:  # not a member (or not in the shape's hosts): room only shrinks,
                if old is not None and shape.answer is not None:  # so it never becomes one
                    new = shape.refused[host] = self._host_refusal(shape, host)
                    if new != old:
                        shape.answer = None
                continue
            room = shape.room(host)
            if room != shape.caps[host]:
                shape.answer = None
            if room[0] == 0:
                del shape.caps[host]
                shape.members.remove(host)
                shape.keys.pop(host, None)
            else:
                shape.caps[host] = room
                if shape.order:
                    shape.keys[host] = host.order_key(shape.order)
                    moved = True
        if moved:
            shape.members.sort(key=shape.keys.__getitem__)

    # ---- solving and answering

    def _best(self, shape: _Shape) -> tuple[int, list[tuple[int, int]], list[_Host]]:
        """The most units on one group of members (all of them without same[]), where, and the group:
        groups in the order of their first member, ties to the earlier group."""
        d = shape.demand
        if shape.group:
            by_value: dict[tuple[object, ...], list[_Host]] = {}
            for host in shape.members:
                by_value.setdefault(shape.group[host], []).append(host)
            groups = list(by_value.values())
        else:
            groups = [shape.members] if shape.members else []
        best: tuple[int, list[tuple[int, int]], list[_Host]] = (0, [], [])
        for members in groups:
            tops = [len(members) if d.limit is None else min(d.limit, len(members))]
            if d.per_host_shared:  # the count of hosts changes what the counters allow: try each, downwards
                tops = list(range(tops[0], 0, -1))
            caps_other: list[int] | None = None
            caps_first: list[int] = []
            for top in tops:
                allowed = _shared_most(d.shared_terms, self.shared, top, d.umax * d.unit) // d.unit
                if caps_other is None:  # what the hosts can take does not depend on `top`: read it once
                    caps_other = _units(shape, members, allowed)
                    caps_first = [shape.caps[h][1] // d.unit for h in members] if d.per_job else caps_other
                got, alloc = _solve_with_first(caps_other, caps_first, allowed, d.ptile,
                                               top if d.per_host_shared else d.limit, d.per_job)
                if got > best[0]:
                    best = (got, alloc, members)
                if got < allowed:  # capacity, not the counters, is the limit: fewer hosts cannot do better
                    break
        return best

    def _refusal(self, job: JobRequest, shape: _Shape, most: int) -> Refusal:
        refused: list[HostRefusal] = []
        capacity: list[tuple[str, int]] = []
        unmatched = self._unmatched.setdefault(shape.select, {}) if shape.matching is not None else {}
        for host in shape.hosts:  # by name
            room = shape.caps.get(host)
            if room is not None:
                capacity.append((host.name, room[0]))
                continue
            why = host.down or shape.refused.get(host) or unmatched.get(host)
            if why is None:
                if shape.matching is not None and host not in shape.matching:
                    why = unmatched[host] = HostRefusal(host.name, self._select_false(shape.select))
                else:
                    why = shape.refused[host] = self._host_refusal(shape, host)
            refused.append(why)
        d = shape.demand
        no_first = d.per_job and bool(capacity) and not any(shape.caps[h][1] for h in shape.members)
        return _refusal(job, refused, capacity, most, d, self.shared, no_first)

    def _select_false(self, select: rr.Expr) -> tuple[SelectFalse]:
        """The reason of a host `select` is false on, one value for the session."""
        why = self._false.get(select)
        if why is None:
            why = self._false[select] = (SelectFalse(rr.format_expr(select)),)
        return why

    @staticmethod
    def _host_refusal(shape: _Shape, host: _Host) -> HostRefusal:
        """Why `host` (open, select true) cannot take one task: the same[] attributes it lacks, and
        when it has no room, every resource it is short of for one task."""
        why = host.refusals.get(shape.asks)
        if why is None:
            d = shape.demand
            reasons: list[Any] = [NoValue(a) for a in shape.same if a not in host.names()]
            if _cap(host.free, d.host_terms, False, d.max_tasks) == 0:  # the limit (>= 1) cannot make it 0
                for name, per_task, per_host, _ in d.host_terms:
                    need, have = per_task * 1 + (per_host + 0), host.free.get(name, 0)
                    if need > have:
                        reasons.append(Short(name, need, max(have, 0)))
            why = host.refusals[shape.asks] = HostRefusal(host.name, tuple(reasons))
        return why


def _placement(job: JobRequest, chosen: list[tuple[_Host, int]], host_terms: list[_Term],
               shared_terms: list[_Term]) -> Placement:
    allocs = []
    for position, (host, tasks) in enumerate(chosen):
        first = position == 0
        reserved = {name: amount for name, per_task, per_host, per_job in host_terms
                    if (amount := per_task * tasks + (per_host + (per_job if first else 0)))}
        gpus = host.gpu_free[:math.ceil(reserved.get(GPUS, 0))]
        allocs.append(HostAlloc(host.name, tasks, FrozenMap(reserved), gpus))
    tasks, count = sum(a.tasks for a in allocs), len(allocs)
    shared = {name: amount for name, per_task, per_host, per_job in shared_terms
              if (amount := per_task * tasks + (per_host * count + per_job))}
    return Placement(job.id, tuple(allocs), FrozenMap(shared))


def _refusal(job: JobRequest, refused: list[HostRefusal], capacity: list[tuple[str, int]], most: int,
             demand: _Demand, shared_free: Mapping[str, Any], no_first: bool) -> Refusal:
    """The Refusal: `refused` and `capacity` (the hosts with room) by host name; `no_first`: hosts
    have room but none for the per-job rusage too."""
    reasons: list[Any] = []
    if no_first:
        reasons.append(NoFirstHost(", ".join(f"{name}={format_amount(name, j)}/job"
                                             for name, _, _, j in demand.host_terms if j)))
    for name, per_task, per_host, per_job_amount in demand.shared_terms:
        need, have = per_task * job.min_tasks + (per_host * 1 + per_job_amount), shared_free.get(name, 0)
        if need > have:
            reasons.append(SharedShort(name, need, max(have, 0)))
    if capacity:
        span = rr.format_span(job.resreq.span) if job.resreq.span else ""
        reasons.insert(0, TooFewTasks(job.min_tasks, most, span, job.resreq.same))
    return Refusal(job.id, tuple(reasons), tuple(refused), tuple(capacity))


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
