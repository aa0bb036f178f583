"""What each host has free, as each scheduling session reads it, rebuilt for the hosts that changed.

The allocations come grouped by host (active.py keeps them: the same tuple object for a host
nothing changed on), so a session finds the hosts to rebuild by identity, at C speed, and touches
no other: with 1,000 hosts and a few jobs ending per session, a walk over every host was the
larger part of the session's input (issue 15's simulator, issue 18's CPU per job).

Invariant: `of` returns views equal to `sched_view.host_now` of every host from scratch (the same
totals, states and allocations), in the order of `totals`.
"""

from __future__ import annotations

from collections.abc import Mapping

from xce_lite.config.sched_view import host_now
from xce_lite.sched.placement import HostView
from xce_lite.sched.reasons import HostAlloc

UNKNOWN = "unreachable"  # a host with no state yet (sched_view.hosts_now reads it so)


class HostViews:
    """See the module docstring. One per controller; `of` is called holding its lock."""

    def __init__(self) -> None:
        self._totals: tuple[HostView, ...] | None = None
        self._index: dict[str, int] = {}  # host name -> its place in `_totals`
        self._states: dict[str, str] = {}  # a copy of the last call's
        self._allocs: dict[str, tuple[HostAlloc, ...]] = {}  # a copy: the caller's dict changes in place
        self._views: tuple[HostView, ...] = ()

    def of(self, totals: tuple[HostView, ...], states: Mapping[str, str],
           allocs: Mapping[str, tuple[HostAlloc, ...]]) -> tuple[HostView, ...]:
        if totals is not self._totals:  # a new configuration (or pool view): every host anew
            self._totals = totals
            self._index = {h.name: i for i, h in enumerate(totals)}
            views = [host_now(h, states.get(h.name, UNKNOWN), allocs.get(h.name, ())) for h in totals]
        else:
            last = self._allocs
            changed = {name for name, mine in allocs.items() if last.get(name) is not mine}
            changed.update(last.keys() - allocs.keys())
            if states != self._states:
                was = self._states
                changed.update(name for name in was.keys() | states.keys() if was.get(name) != states.get(name))
            if not changed:
                return self._views
            views = list(self._views)
            for name in changed:
                i = self._index.get(name)
                if i is not None:  # else a host gone from the config while a job still held it
                    views[i] = host_now(totals[i], states.get(name, UNKNOWN), allocs.get(name, ()))
        self._states, self._allocs = dict(states), dict(allocs)
        self._views = tuple(views)
        return self._views
