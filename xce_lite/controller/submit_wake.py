"""Whether a submit wakes the controller's tick at once, or its session waits a little (issue 18).

Why: a one-POST submit woke the tick, whose scheduling session (0.3-0.4 ms of the main thread per
POST) can only write the new job's pend reason when no slot is free: every task holds a slot
(sched/placement.py), and the scheduler never preempts.

Invariants:
- a submit always marks the state dirty: ANY tick that runs afterwards (a job ending, a host
  event, a kill, the tick period) schedules the new jobs with the rest;
- it leaves the tick asleep only if the last session's hosts had no free slot on any host that
  takes jobs (state "ok"), and no pools are configured (a session may grow one). `full` is decided
  afresh each time the tick takes `dirty`; what frees a slot or brings a host (a unit's end, a
  host's event, a reconfig) wakes the tick itself, which then schedules the deferred jobs too;
- the sessions of DEFER_JOBS jobs at most wait together: the next session's changes (pickled to
  the scheduler's worker in one message) stay that small, and so does the controller's peak memory;
- a deferred submit waits DEFER_BOUND at most: `serve` sleeps no longer (`bounded`), so its job's
  pend reason shows within that bound (while the store refuses commits, submits are refused too, and
  `serve` waits for the retry). A restart loses nothing: the jobs are stored, and the first
  session after the load takes every pending job;
- a submit that wakes the tick within STREAM_GAP of the one before (a stream: one POST per job from
  a loop) marks `streaming`, and the woken tick first waits GATHER (sleeping.py): the submits that
  come meanwhile share its session and its commit. A lone submit wakes it with no wait (submit ->
  start unchanged). Why: in a stream that the jobs keep up with, a slot is free at most submits,
  and each woke a tick of its own; that tick's CPU slowed the stream further (bench/README, "Session
  20": 0.37 against 0.10-0.14 ticks per job in such runs; gathering 4 ms, one POST per job +4-10%).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xce_lite.sched.fit import SLOTS
from xce_lite.sched.placement import HostView

DEFER_BOUND = 0.1  # seconds a submit's session may wait while no slot is free
STREAM_GAP = 0.01  # seconds from one submit to the next that make them a stream
GATHER = 0.004  # seconds a tick woken by a stream's submit waits for the next ones
DEFER_JOBS = 1000  # jobs whose session may wait together: the next session's changes stay this small


def no_room(hosts: Iterable[HostView]) -> bool:
    """Whether no host that takes jobs has a free slot: then no job can be placed."""
    return not any(h.state == "ok" and h.free.get(SLOTS, 0) >= 1 for h in hosts)


def taken(state: Any, hosts: tuple[HostView, ...] | None) -> None:
    """The tick took `dirty` (holding the lock): the deferral ends, and `full` is what `hosts` (this
    session's, None: no session) says. Without a session nothing says the hosts are full."""
    state.full = hosts is not None and no_room(hosts)
    state.deferred_since = None
    state.deferred_jobs = 0
    state.streaming = False  # this tick takes the stream's submits so far


def wakes(state: Any, now: float, jobs: int = 1) -> bool:
    """A submit's call, holding the lock, after marking the state dirty: whether to wake the tick
    now (True), or to leave its session to the next tick, DEFER_BOUND at most from the first
    submit left so (False)."""
    state.deferred_jobs += jobs
    stream, state.last_submit = now - state.last_submit < STREAM_GAP, now
    if not state.full or state.config.pools or state.deferred_jobs >= DEFER_JOBS:
        state.streaming = state.streaming or stream
        return True
    if state.deferred_since is None:
        state.deferred_since = now
    return False


def bounded(state: Any, wait: float, now: float) -> float:
    """`serve`'s sleep `wait`, no longer than a deferred submit may wait."""
    since = state.deferred_since
    if since is None:
        return wait
    return max(0.0, min(wait, since + DEFER_BOUND - now))
