"""Starts, and ends behind queued successors, that wait for a commit to join (the controller's tick, core.py).

A short job's end follows its start within milliseconds, so a start alone is not committed at once
(an fsync each) but with the next commit (its job's end, a dispatch), within START_WAIT. Nothing
depends on a start being stored: memory has the job RUN, and a restart adopts a DISP job whose unit
runs, so a crash meanwhile loses nothing. A request that needs the start stored (a suspend: it moves
RUN to USUSP) sets `state.store_starts_now`, wakes the tick, and reads the job again. Launch
replies that only say the units run do not wake the tick either (quiet_launch): while a
launch is unanswered, `serve` sleeps START_WAIT at most.

Ends wait likewise (END_WAIT), but only where waiting costs nobody anything: no job is pending to
take the slots they free, or each ending job's slot is its queued successor's already (prefilling.py:
`state.behind` names it the predecessor), so no session can place anything new there; nothing
depends on the job (no dependency gate at all), no wait sleeps on it, and the tick would commit
nothing else. With prefill on, ~40% of a 1,000-`true` run's ticks (bench/ticktime.py) stored one
such end alone, a commit and an fsync each: right before the tick that queues the next successor,
and in the run's tail, where nothing is pending any more. A crash meanwhile loses nothing: the host keeps the result
until the controller forgets the unit, which it does only after the commit (a restart records it).
While ends wait the session still sees their jobs as ending (`closing`): a wait changes no decision.
"""

from __future__ import annotations

from typing import Any

from xce_lite.exec.host import UnitsLaunched

START_WAIT = 0.05  # seconds a start alone may wait for a commit to join
END_WAIT = 0.02  # seconds an end behind a queued successor may wait for a commit to join


class StartWaits:
    """When the starts not stored yet first waited; the tick's thread alone uses it."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.since: float | None = None
        self.ends_since: float | None = None  # when the ends not stored yet first waited (ends_held_back)
        self.ends_held: set[int] = set()  # their jobs

    def wait(self, started: list[tuple[int, float]], now: float) -> bool:
        """Whether `started` (job id, start time), the only thing the tick would commit, may wait for
        the next commit: while the latest started less than START_WAIT ago by its host's clock, and
        START_WAIT at most since they first waited by ours."""
        if self.since is None:
            self.since = now
        return now - self.since < START_WAIT and now - max(t for _i, t in started) < START_WAIT

    def held_back(self, started: list[tuple[int, float]], alone: bool, now: float, state: Any) -> list:
        """`started` to commit now, or none when they may wait (`alone`: nothing else would be
        committed): then they go back first in `state.unrecorded_started`, under its lock. A failed
        commit puts them back too; they wait afresh, the store's retry bounds that."""
        if not started:
            return started
        if alone and not state.store_starts_now and self.wait(started, now):
            with state.mu:
                state.unrecorded_started[:0] = started
            return []
        self.since = None
        state.store_starts_now = False
        return started

    def ends_held_back(self, finishing: list, alone: bool, now: float, state: Any, urgent: bool) -> list:
        """`finishing` (Finish, event kind) to commit now, or none when they may wait (module
        docstring; `alone`: the tick would commit nothing else but starts; `urgent`: some job waits
        on a dependency, a failed commit is retried, or the clock is the simulator's): then they go
        back first in `state.unrecorded`, under its lock."""
        ids = {f.job_id for f, _event in finishing}
        with state.mu:
            if (alone and ids and not urgent and state.waited.keys().isdisjoint(ids)
                    and (not state.pending or ids <= set(state.behind.values()))):
                if self.ends_since is None:
                    self.ends_since = now
                if now - self.ends_since < END_WAIT:
                    state.unrecorded[:0] = finishing
                    self.ends_held = ids
                    return []
        self.ends_since, self.ends_held = None, set()
        return finishing

    def waiting(self, finishing: list, started: list, others: bool, now: float, state: Any,
                urgent: bool) -> tuple[list, list]:
        """(ends, starts) to commit now (`others`: the tick commits something else anyway); those that
        may wait go back (ends_held_back, held_back). If the starts are committed now, the ends join them."""
        ends = self.ends_held_back(finishing, not others, now, state, urgent)
        started = self.held_back(started, not (ends or others), now, state)
        if started and finishing and not ends:
            with state.mu:
                del state.unrecorded[:len(finishing)]  # put back first above; the others only append
            self.ends_since, self.ends_held = None, set()
            return finishing, started
        return ends, started

    def news(self, state: Any) -> bool:
        """Whether `state.unrecorded` holds an end that is not waiting (the tick must come again now)."""
        with state.mu:
            return any(f.job_id not in self.ends_held for f, _event in state.unrecorded)

    def sleep(self, wait: float, units: Any) -> float:
        """`serve`'s sleep `wait`, bounded so that waiting starts and ends, and the launch replies
        `units` (the tick's Units) has due, are taken in time."""
        if units.replies_due:
            wait = min(wait, START_WAIT)
        # (ends_since alone, set before the tick by quiet_ends.QuietEnds.taken, bounds nothing: no end waits)
        for since, bound in ((self.since, START_WAIT), (self.ends_since if self.ends_held else None, END_WAIT)):
            if since is not None:
                wait = max(0.0, min(wait, since + bound - self.clock.time()))
        return wait


def quiet_launch(event: object) -> bool:
    """Whether a host event needs no tick at once: a launch's replies that only say its units run (no
    refusal, no failure). Their starts go with the next commit (StartWaits.held_back); a short job's
    end wakes the tick for both; `serve` sleeps START_WAIT at most while replies are due (replies_due)."""
    return isinstance(event, UnitsLaunched) and not event.failed and event.error is None and all(
        reply.status in ("started", "running", "queued") for reply in event.replies)  # queued: prefilling.py
