"""A Session's working state (session.py): each host as a session sees it (`SessionHost`: what it
IS stays, what it has free is replaced as placements take from it) and each request shape's
candidates (`Shape`), with the invariants the Session keeps; and the comparison `Session.renew`
makes of a new snapshot's hosts with the ones held. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xce_lite.sched import resreq as rr
from xce_lite.sched.fit import SLOTS, Demand, attributes, order_key, tasks_fitting
from xce_lite.sched.reasons import FrozenMap, HostDown, HostRefusal, Refusal

if TYPE_CHECKING:
    from xce_lite.sched.placement import HostView


class SessionHost:
    """A host during a session. What it IS (`view`: state, totals, attributes, tags) is fixed for the
    session, and for as long as the Session keeps it (see `Session.renew`); what it has free (`free`,
    a plain dict, and `gpu_free`) is replaced by `Session.take`, and by `reset` for a new snapshot."""

    __slots__ = ("_names", "down", "free", "gpu_free", "name", "refusals", "view")

    def __init__(self, view: HostView) -> None:
        self._names: dict[str, object] | None = None
        # Closed or unreachable: the one reason it takes nothing, whatever the job.
        self.down = HostRefusal(view.name, (HostDown(view.state),)) if view.state != "ok" else None
        # Why it cannot take one task, by what the reasons read (see Shape.asks): shapes that ask
        # the same share them. Emptied when the host is taken from.
        self.refusals: dict[int, HostRefusal] = {}
        self.adopt(view)

    def adopt(self, view: HostView) -> None:
        """Read the host from `view`: at first, or a view of the same host (state, totals,
        attributes, tags) with the free amounts `self.view` has, in new objects (the Session reads
        the snapshot it was given)."""
        self.view, self.name = view, view.name
        # Never changed in place (Session.take replaces it with `taken`'s new dict), so it may be
        # the view's own: no copy per host per session.
        free = view.free
        self.free: dict[str, Any] = free.shared_dict() if isinstance(free, FrozenMap) else dict(free)
        self.gpu_free = view.gpu_free

    def reset(self, view: HostView) -> None:
        """The host as `view` has it: the same host, with what `view` has free (which may differ from
        what it had). Its reasons go: they name free amounts."""
        self.adopt(view)
        self.refusals.clear()

    @property
    def is_open(self) -> bool:
        """It can take a task of some job: up, with a free slot (every task holds one)."""
        return self.down is None and self.free.get(SLOTS, 0) >= 1

    def names(self) -> dict[str, object]:
        """`attributes(view)`: what select[], same[] and order[] read, built once per host."""
        if self._names is None:
            self._names = attributes(self.view)
        return self._names

    def order_key(self, keys: tuple[rr.OrderKey, ...]) -> tuple[object, ...]:
        return order_key(self.name, {**self.names(), **self.free}, keys)


class Shape:
    """One request shape (task range and -R) on one set of hosts (`hosts`, by name), kept current
    through a session. Invariants, each checked against the unoptimised place() by the tests:

    - `members` are exactly the hosts that can take one task of the shape now, in placement order
      (order[] keys read on free amounts, then name), with their room in `caps`: (tasks as any
      host, tasks as the first host). What a full scan of `hosts` would find, in its order.
    - Every other host is refused: for good (closed, or select false, where `matching` says no), or
      by what it has free now or the same[] attributes it lacks. Those reasons are built only
      when a refusal needs them, and kept in `refused` until the host is taken from.
    - Free amounts only shrink in a session, so room only shrinks: a host leaves `members` when its
      room reaches 0 and comes back only with a new snapshot (`Session.renew`), where what is free
      may grow. A host with no free slot can never take a task (every task holds a slot), so the
      full hosts of a busy cluster are never members at all.
    """

    __slots__ = ("allowed", "answer", "asks", "caps", "demand", "generation", "group", "hosts", "keys", "matching",
                 "members", "order", "refused", "same", "seen", "select", "shared_seen")

    def __init__(self, demand: Demand, r: rr.ResReq, hosts: list[SessionHost], allowed: frozenset[str] | None,
                 matching: set[SessionHost] | None, seen: int, generation: int, asks: int) -> None:
        self.demand = demand
        # The snapshot (Session.renew's count) `demand` was read in: it is read again from the first
        # job met in each snapshot, so placements carry that job's own values (names included), as
        # a fresh Session's would.
        self.generation = generation
        self.order = r.order
        self.select = r.select
        self.asks = asks  # what a refused host's reasons read (host terms, same[]), as a number
        self.hosts = hosts
        self.allowed = allowed  # the names of `hosts`; None: every host
        self.matching = matching  # the open hosts the select is true on; None: no select
        self.same = r.same
        self.members: list[SessionHost] = []
        self.caps: dict[SessionHost, tuple[int, int]] = {}
        self.keys: dict[SessionHost, tuple[object, ...]] = {}  # order[] keys of the members, when order[] is given
        self.group: dict[SessionHost, tuple[object, ...]] = {}  # same[] values, when same[] is given
        self.refused: dict[SessionHost, HostRefusal] = {}
        self.seen = seen  # the Session's clock when this shape last caught up with the hosts that changed
        # The last refusal, while nothing it reads has changed: no member's room, no refused host's
        # reasons, no shared counter it asks for (`shared_seen`: the session's count of placements
        # that took from the counters, at the time).
        self.answer: Refusal | None = None
        self.shared_seen = 0

    def refused_for_good(self, host: SessionHost) -> bool:
        """Closed, unreachable or select false: nothing free has a say."""
        return host.down is not None or (self.matching is not None and host not in self.matching)

    def admits(self, host: SessionHost) -> bool:
        """`host` is one of the shape's hosts, with every same[] attribute: it may be a member."""
        return (self.allowed is None or host.name in self.allowed) and \
            not (self.same and any(a not in host.names() for a in self.same))

    def room(self, host: SessionHost) -> tuple[int, int]:
        """(tasks `host` can take as any host, as the first host): the most up to the maximum."""
        d = self.demand
        other = tasks_fitting(host.free, d.host_terms, False, d.max_tasks)
        return other, tasks_fitting(host.free, d.host_terms, True, d.max_tasks) if d.per_job and other else other


def host_name(host: SessionHost) -> str:
    return host.name


def same_map(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a is b:
        return True
    if isinstance(a, FrozenMap) and isinstance(b, FrozenMap):
        return a.shared_dict() == b.shared_dict()
    return a == b


def same_host(a: HostView, b: HostView) -> bool:
    """`a` and `b` are the same host, whatever each has free: name, state, totals, attributes, tags."""
    return a.name == b.name and a.state == b.state and same_map(a.total, b.total) and \
        same_map(a.attrs, b.attrs) and a.tags == b.tags


def compare(host: SessionHost, view: HostView, changed: dict[SessionHost, HostView]) -> bool:
    """For `Session.renew`: False if `view` is not `host` any more (what it is changed); else True,
    with `host` in `changed` if `view` has other free amounts, or adopting `view` if it has equal ones
    and `host` is not to be read again anyway."""
    old = host.view
    if not same_host(old, view):
        return False
    if host not in changed and view.gpu_free == old.gpu_free and same_map(view.free, old.free):
        host.adopt(view)  # an equal view: what the host holds stays true of it
    else:
        changed[host] = view
    return True


def units_of(shape: Shape, members: list[SessionHost], allowed: int) -> list[int]:
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
        else:  # solve's bound: whole tiles on full hosts, plus the largest part on one other host
            if u >= d.ptile:
                full += 1
            else:
                partial = max(partial, u)
            reach = d.ptile * full + (partial if full < len(units) else 0)
        if reach >= allowed:
            break
    return units
