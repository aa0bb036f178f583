"""Placing many jobs in turn: a `Session` holds one snapshot of hosts and answers `place` for each
job on what earlier placements (`Session.take`) left. Pure.

Its answers are exactly what `placement.place` gives on the hosts with those placements taken
out, but it keeps what does not change in a session (attributes, select verdicts, closed hosts)
and each request shape's candidates, so a search reads the hosts that changed and the few it
places on, not every host. `placement.place` itself is a one-job Session.

`Session.renew` carries all that to the next snapshot of the same hosts (core.SessionCache holds
the Session between `schedule` calls): only the hosts taken from or with other free amounts are
read again, and each shape catches up with them from a change log, as it does within a session.

Its working state (hosts and shapes) is in session_state.py, the answers it builds in
session_answers.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xce_lite.sched import resreq as rr
from xce_lite.sched.fit import demand_of, shared_most, solve_with_first, taken, tasks_fitting
from xce_lite.sched.reasons import (
    NOTHING,
    FrozenMap,
    HostRefusal,
    NoHosts,
    NoTaskCount,
    NoValue,
    Placement,
    Refusal,
    SelectFalse,
    Short,
)
from xce_lite.sched.session_answers import placement_of, refusal_of
from xce_lite.sched.session_state import SessionHost, Shape, compare, host_name, units_of

if TYPE_CHECKING:
    from xce_lite.sched.placement import HostView, JobRequest

# A Session's memory is bounded: it keeps at most MAX_SHAPES request shapes current (each holds
# its candidates), and the refused hosts' reasons of at most MAX_ASKS kinds of demand.
MAX_SHAPES = 256
MAX_ASKS = 64


class Session:
    """Placement of many jobs, one after another, against one snapshot of hosts: `place` a job,
    `take` what it got, place the next. The same answers as `place` on the hosts with every earlier
    placement taken out, at the cost of the hosts that changed rather than of every host.

    What a host IS (state, totals, attributes, tags) is fixed for the session, so its attributes,
    its select verdicts and its same[] values are read once; what a host has free only shrinks, so a
    request shape's candidate hosts, sorted once, only lose members or move under order[] (see
    `Shape`). A shape is keyed by (host set, task range, -R): jobs of queues sharing their hosts
    share it.

    From one snapshot to the next: `renew` starts a session on a new snapshot of the same hosts and
    keeps all of that, reading again only the hosts whose free amounts changed (or were taken from),
    so a session costs what changed since the last one, not what exists. Its answers are still
    exactly those of a new Session on that snapshot (the tests compare them, warm and cold).
    """

    def __init__(self, hosts: Sequence[HostView], shared_free: Mapping[str, int | float] = NOTHING) -> None:
        self._build(hosts, dict(FrozenMap(shared_free)))

    def _build(self, hosts: Sequence[HostView], shared: dict[str, Any]) -> None:
        if len({h.name for h in hosts}) != len(hosts):  # a programming error in building a snapshot
            raise ValueError("host names must be distinct")
        self._views = tuple(hosts)  # as given: `renew` compares the next snapshot's with them
        self.hosts = [SessionHost(h) for h in sorted(hosts, key=lambda h: h.name)]
        self._by_name = {h.name: h for h in self.hosts}
        self._open = [h for h in self.hosts if h.is_open]  # by name
        self.shared = shared  # sorted by name, as FrozenMap keeps it
        self._shapes: dict[tuple[object, ...], Shape] = {}
        self._matching: dict[object, set[SessionHost]] = {}  # select -> the open hosts it is true on
        self._unmatched: dict[object, dict[SessionHost, HostRefusal]] = {}  # select -> the others' reasons
        self._false: dict[object, tuple[SelectFalse]] = {}
        self._hosts_in: dict[frozenset[str], list[SessionHost]] = {}  # a queue's host set -> its hosts, by name
        # Every host whose free amounts changed, with the clock's value then, oldest change first:
        # a shape catches up with the hosts changed since it last looked, newest first, stopping at
        # the first it has seen. One entry per host, so it is bounded by the hosts.
        self._changes: dict[SessionHost, int] = {}
        self._clock = 0
        self._taken: list[SessionHost] = []  # the hosts taken from since the snapshot: `renew` resets them
        self._generation = 0  # how many snapshots this Session has had (renew's count)
        self._shared_taken = 0  # how many times the shared counters changed
        self._asks: dict[tuple[object, ...], int] = {}  # (host terms, same[]) -> a number, for SessionHost.refusals
        self._asks_made = 0

    def renew(self, hosts: Sequence[HostView], shared_free: Mapping[str, int | float] = NOTHING) -> bool:
        """Start a session on a new snapshot, as `Session(hosts, shared_free)` would, keeping what
        still holds: True if it did, False if it started afresh, because the hosts are not the same
        ones (names, states, totals, attributes, tags) or the shared counters' names changed.
        Hosts taken from in the last session, and hosts whose view has other free amounts, are
        read again; the rest cost a look each: an identity test when the caller passes the same
        view object again (the simulator does), a comparison when it is a new, equal one."""
        shared = dict(FrozenMap(shared_free))
        changed = self._reread(hosts) if shared.keys() == self.shared.keys() else None
        if changed is None:
            self._build(hosts, shared)
            return False
        self._taken, self._views = [], tuple(hosts)
        for host, view in changed.items():
            was_open = host.is_open
            host.reset(view)
            self._changed(host)
            if was_open != host.is_open:
                if was_open:
                    self._open.remove(host)
                else:
                    bisect.insort(self._open, host, key=host_name)
        if shared != self.shared:
            self.shared = shared
            self._shared_taken += 1
        self._generation += 1
        for memo in (self._matching, self._unmatched, self._false, self._hosts_in):
            if len(memo) > MAX_SHAPES:  # bounded across sessions; shapes keep what they hold
                memo.clear()
        return True

    def _reread(self, hosts: Sequence[HostView]) -> dict[SessionHost, HostView] | None:
        """The hosts to read again, with their new views: those taken from in the last session and
        those whose view has other free amounts (a view with equal ones is adopted on the spot).
        None if `hosts` are not the same hosts as the last snapshot's."""
        if len(hosts) != len(self._views):
            return None
        changed: dict[SessionHost, HostView] = {host: host.view for host in self._taken}
        by_name = self._by_name
        for view, last in zip(hosts, self._views):  # in the last snapshot's order, as callers keep it
            if view is last:
                continue
            if view.name != last.name:
                break
            if not compare(by_name[view.name], view, changed):
                return None
        else:
            return changed
        if {view.name for view in hosts} != by_name.keys():  # as many views: each name once
            return None
        for view in hosts:  # in another order: by name (what is done is done alike again)
            host = by_name[view.name]
            if view is not host.view and not compare(host, view, changed):
                return None
        return changed

    def _changed(self, host: SessionHost) -> None:
        self._changes.pop(host, None)
        self._changes[host] = self._clock
        self._clock += 1

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
        return placement_of(job, [(members[i], units * d.unit) for i, units in alloc], d.host_terms,
                          d.shared_terms)

    def take(self, placement: Placement) -> None:
        """Take `placement`'s reservations out of what is free, on its hosts only."""
        for alloc in placement.allocs:
            host = self._by_name[alloc.host]
            was_open = host.is_open
            host.free, host.gpu_free = taken(host.free, host.gpu_free, alloc)
            host.refusals.clear()
            self._changed(host)
            self._taken.append(host)
            if was_open and not host.is_open:
                self._open.remove(host)  # for the session: free amounts only shrink in it
        if placement.shared:
            self.shared = {name: amount - placement.shared.get(name, 0) for name, amount in self.shared.items()}
            self._shared_taken += 1

    # ---- shapes

    def _shape(self, job: JobRequest, allowed: frozenset[str] | None) -> Shape:
        key = (allowed, job.min_tasks, job.max_tasks, job.resreq)
        shape = self._shapes.pop(key, None)
        if shape is None:
            shape = self._new_shape(job, allowed)
            if len(self._shapes) >= MAX_SHAPES:  # drop the least recently met: it is rebuilt, as
                del self._shapes[next(iter(self._shapes))]  # things then stand, if met again
        elif shape.generation != self._generation:  # equal to what it was, read from this job (see Shape)
            shape.demand, shape.generation = demand_of(job, self.shared), self._generation
        self._shapes[key] = shape  # last: the most recently met
        return shape

    def _new_shape(self, job: JobRequest, allowed: frozenset[str] | None) -> Shape:
        r = job.resreq
        if allowed is None:
            hosts = self.hosts
        else:
            known = self._hosts_in.get(allowed)
            if known is None:
                known = self._hosts_in[allowed] = [h for h in self.hosts if h.name in allowed]
            hosts = known
        demand = demand_of(job, self.shared)
        asks = self._number_asks((tuple(demand.host_terms), r.same))
        shape = Shape(demand, r, hosts, allowed, self._select(r.select), self._clock, self._generation, asks)
        # Only open hosts with a free slot can take a task (every task holds a slot); the others'
        # reasons are built if a refusal needs them.
        for host in self._open if allowed is None else (h for h in self._open if h.name in allowed):
            if shape.refused_for_good(host) or not shape.admits(host):
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

    def _select(self, select: rr.Expr | None) -> set[SessionHost] | None:
        """The open hosts `select` is true on (None: no select, every host), evaluated once per
        session: a select reads only what a host is."""
        if select is None:
            return None
        matching = self._matching.get(select)
        if matching is None:
            matching = self._matching[select] = {h for h in self.hosts if h.view.state == "ok"
                                                 and rr.evaluate(select, h.names())}
        return matching

    def _catch_up(self, shape: Shape) -> None:
        """Bring `shape` up to date with the hosts whose free amounts changed since it last looked
        (taken from, or read again by `renew`): their room is read again (a member whose room
        reaches 0 leaves; after a renew, a host with room joins, in order), their order[] keys too,
        and the refusal reasons kept for them are dropped (they name free amounts). The shape's last
        refusal stays its answer only if none of that changed it."""
        if shape.seen == self._clock:
            return
        changes, changed = self._changes, []
        for host in reversed(changes):  # newest first, up to the first one the shape has seen
            if changes[host] < shape.seen:
                break
            changed.append(host)
        shape.seen = self._clock
        moved = False
        for host in changed:
            if shape.refused_for_good(host):
                continue  # its reason names nothing that is free
            old = shape.refused.pop(host, None)
            if host in shape.caps:
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
            elif shape.admits(host) and (room := shape.room(host))[0]:  # only after a renew: it joins
                shape.answer = None
                shape.caps[host] = room
                shape.members.append(host)
                if shape.order:
                    shape.keys[host] = host.order_key(shape.order)
                if shape.same:
                    shape.group[host] = tuple(host.names()[a] for a in shape.same)
                moved = True
            elif old is not None and shape.answer is not None:
                new = shape.refused[host] = self._host_refusal(shape, host)
                if new != old:
                    shape.answer = None
        if moved:
            shape.members.sort(key=shape.keys.__getitem__ if shape.order else host_name)

    # ---- solving and answering

    def _best(self, shape: Shape) -> tuple[int, list[tuple[int, int]], list[SessionHost]]:
        """The most units on one group of members (all of them without same[]), where, and the group:
        groups in the order of their first member, ties to the earlier group."""
        d = shape.demand
        if shape.group:
            by_value: dict[tuple[object, ...], list[SessionHost]] = {}
            for host in shape.members:
                by_value.setdefault(shape.group[host], []).append(host)
            groups = list(by_value.values())
        else:
            groups = [shape.members] if shape.members else []
        best: tuple[int, list[tuple[int, int]], list[SessionHost]] = (0, [], [])
        for members in groups:
            tops = [len(members) if d.limit is None else min(d.limit, len(members))]
            if d.per_host_shared:  # the count of hosts changes what the counters allow: try each, downwards
                tops = list(range(tops[0], 0, -1))
            caps_other: list[int] | None = None
            caps_first: list[int] = []
            for top in tops:
                allowed = shared_most(d.shared_terms, self.shared, top, d.umax * d.unit) // d.unit
                if caps_other is None:  # what the hosts can take does not depend on `top`: read it once
                    caps_other = units_of(shape, members, allowed)
                    caps_first = [shape.caps[h][1] // d.unit for h in members] if d.per_job else caps_other
                got, alloc = solve_with_first(caps_other, caps_first, allowed, d.ptile,
                                               top if d.per_host_shared else d.limit, d.per_job)
                if got > best[0]:
                    best = (got, alloc, members)
                if got < allowed:  # capacity, not the counters, is the limit: fewer hosts cannot do better
                    break
        return best

    def _refusal(self, job: JobRequest, shape: Shape, most: int) -> Refusal:
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
                    assert shape.select is not None  # `matching` is the hosts a select[] holds on
                    why = unmatched[host] = HostRefusal(host.name, self._select_false(shape.select))
                else:
                    why = shape.refused[host] = self._host_refusal(shape, host)
            refused.append(why)
        d = shape.demand
        no_first = d.per_job and bool(capacity) and not any(shape.caps[h][1] for h in shape.members)
        return refusal_of(job, refused, capacity, most, d, self.shared, no_first)

    def _select_false(self, select: rr.Expr) -> tuple[SelectFalse]:
        """The reason of a host `select` is false on, one value for the session."""
        why = self._false.get(select)
        if why is None:
            why = self._false[select] = (SelectFalse(rr.format_expr(select)),)
        return why

    @staticmethod
    def _host_refusal(shape: Shape, host: SessionHost) -> HostRefusal:
        """Why `host` (open, select true) cannot take one task: the same[] attributes it lacks, and
        when it has no room, every resource it is short of for one task."""
        why = host.refusals.get(shape.asks)
        if why is None:
            d = shape.demand
            reasons: list[Any] = [NoValue(a) for a in shape.same if a not in host.names()]
            if tasks_fitting(host.free, d.host_terms, False, d.max_tasks) == 0:  # the limit (>= 1) cannot make it 0
                for name, per_task, per_host, _ in d.host_terms:
                    need, have = per_task * 1 + (per_host + 0), host.free.get(name, 0)
                    if need > have:
                        reasons.append(Short(name, need, max(have, 0)))
            why = host.refusals[shape.asks] = HostRefusal(host.name, tuple(reasons))
        return why
