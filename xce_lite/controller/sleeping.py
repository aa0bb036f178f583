"""`serve`'s sleep between ticks (core.Controller.serve), and whether the tick after it is quiet.

Invariants:
- it ends when woken (`state.wake`), or at `wait`: the tick period, a lease's renewal, a retry;
- a submit deferred while every slot is taken (submit_wake.py) ends it within DEFER_BOUND: while
  every slot is taken it sleeps in steps of DEFER_BOUND, so that one deferred during the sleep still
  has its session within that bound (`deferrable`: not while the store refuses commits). The price:
  while every slot is taken, up to 10 wake-ups a second (a lock, a clock read; no tick);
- while pend reasons are held back (dispatching.Dispatching.quiet_wait: QUIET) it ends QUIET after
  it began, unless a submit was deferred meanwhile: then submits are arriving, and their bound rules;
- quiet ends (quiet_ends.py) end it END_WAIT after the first came, at most (one that comes during
  the sleep: its timer wakes it);
- the tick after it is quiet (returns False) only if nothing woke it, no quiet end waits and no
  submit waits for a session: then, and only then, it stores the reasons held back (a backlog's reasons are written
  while the controller is idle, not in the tick that next has work; a stream of one-POST submits
  into a full cluster keeps the once-a-second bound);
- woken by a submit of a stream (submit_wake.py: `streaming`), it waits GATHER more before the tick,
  whatever else woke it meanwhile (an end, a kill: GATHER later at most).
"""

from __future__ import annotations

import time
from typing import Any

from xce_lite.controller import submit_wake


def sleep(state: Any, clock: Any, wait: float, deferrable: bool, quiet_wait: float, ends: Any = None) -> bool:
    """Sleep as the module docstring says; True if the next tick is not quiet (woken, or a submit
    waits for its session, or an event that did not wake it: `ends`, quiet_ends.QuietEnds)."""
    begun = clock.time()
    end, quiet_end = begun + wait, begun + quiet_wait
    while True:
        with state.mu:
            now = clock.time()
            left = submit_wake.bounded(state, end - now, now) if deferrable else end - now
            if state.deferred_since is None:  # no submit waits: the reasons held back want a quiet tick
                left = min(left, quiet_end - now)
            step = min(left, submit_wake.DEFER_BOUND) if deferrable and state.full else left
        if ends is not None:  # quiet ends: taken END_WAIT after the first at most
            left, step = ends.bound(left), ends.bound(step)
        if (woken := state.wake.wait(max(0.0, step))) or left <= 0:
            break
    if woken:
        with state.mu:
            streaming, state.streaming = state.streaming, False
        if streaming:
            time.sleep(submit_wake.GATHER)  # the stream's next submits join this tick's session
    state.wake.clear()
    return woken or state.deferred_since is not None or (ends is not None and ends.since is not None)
