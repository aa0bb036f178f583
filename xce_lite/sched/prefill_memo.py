"""Placements inside a unit, remembered from one prefill call to the next (issue 18, branch ctlcpu3).

Why: prefill (prefill.py) tries each candidate inside a unit's view of its host with a full `place`
(a Session built per call, ~160 us of CPU for a one-slot job on a small host), and builds that view
anew for every unit at every call (`HostView.with_free`, ~30 us); the controller calls it after each
tick that refills a chain, a round per link. The inputs repeat: a unit's view is what it holds on
its host, and the jobs of an array (or any jobs of one shape) ask alike. `place` is pure
(placement.py: the same input gives the same output), so a placement found for one request on one
view is the answer for every request of the same task range and -R on that view, but for its job id.

Invariants:
- every answer is exactly what the plain call gives: `inside` is prefill's `_inside`, `place` is
  `placement.place(request, (view,))` with the request's own job id (tests/sched/test_prefill_memo.py);
- views are remembered by value (the host view, frozen and hashable, and the unit's holding), and a
  view handed out is one object for equal inputs, so a placement is remembered by the identity of
  its view and of its request's -R, each entry keeping both (an id is never reused while remembered);
- refusals are not remembered (prefill remembers those itself, per call and shape);
- bounded: past KEPT entries each map starts afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xce_lite.sched.placement import HostView, JobRequest, place
from xce_lite.sched.reasons import Placement, Refusal

KEPT = 512  # entries per map at most (views, placements)


class PlaceMemo:
    """See the module docstring. One per caller that keeps it between calls (the controller's Prefill)."""

    def __init__(self) -> None:
        self._views: dict[tuple, HostView | None] = {}
        # (id of the view, id of the -R, min tasks, max tasks) -> (the view, the -R, the placement)
        self._placed: dict[tuple[int, int, int, int], tuple[HostView, Any, Placement]] = {}

    def inside(self, host: HostView | None, unit: Any, make: Callable[[HostView | None, Any], HostView | None]
               ) -> HostView | None:
        """`make(host, unit)` (prefill's `_inside`: the host as a successor of `unit` sees it), the same
        object for equal hosts and holdings."""
        if host is None:
            return make(host, unit)
        key = (host, unit.reserved, unit.gpus)
        try:
            return self._views[key]
        except KeyError:
            pass
        view = make(host, unit)
        if len(self._views) >= KEPT:
            self._views.clear()
            self._placed.clear()  # (keyed by views no longer handed out)
        self._views[key] = view
        return view

    def place(self, request: JobRequest, view: HostView) -> Placement | Refusal:
        """`place(request, (view,))`."""
        key = (id(view), id(request.resreq), request.min_tasks, request.max_tasks)
        found = self._placed.get(key)
        if found is not None and found[0] is view and found[1] is request.resreq:
            placed = found[2]
            return placed if placed.job_id == request.id else Placement(request.id, placed.allocs, placed.shared)
        result = place(request, (view,))
        if isinstance(result, Placement):
            if len(self._placed) >= KEPT:
                self._placed.clear()
            self._placed[key] = (view, request.resreq, result)
        return result
