"""Starts that wait for a commit to join (the controller's tick, core.py).

A short job's end follows its start within milliseconds, so a start alone is not committed at once
(an fsync each) but with the next commit (its job's end, a dispatch), within START_WAIT. Nothing
depends on a start being stored: memory has the job RUN, and a restart adopts a DISP job whose unit
runs, so a crash meanwhile loses nothing. A request that needs the start stored (a suspend: it moves
RUN to USUSP) sets `state.store_starts_now`, wakes the tick, and reads the job again. Launch
replies that only say the units run do not wake the tick either (quiet_launch): while a
launch is unanswered, `serve` sleeps START_WAIT at most.
"""

from __future__ import annotations

from typing import Any

from xce_lite.exec.host import UnitsLaunched

START_WAIT = 0.05  # seconds a start alone may wait for a commit to join


class StartWaits:
    """When the starts not stored yet first waited; the tick's thread alone uses it."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.since: float | None = None

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

    def sleep(self, wait: float, units: Any) -> float:
        """`serve`'s sleep `wait`, bounded so that waiting starts and the launch replies `units` (the
        tick's Units) has due are taken in time."""
        if units.replies_due:
            wait = min(wait, START_WAIT)
        if self.since is not None:
            wait = max(0.0, min(wait, self.since + START_WAIT - self.clock.time()))
        return wait


def quiet_launch(event: object) -> bool:
    """Whether a host event needs no tick at once: a launch's replies that only say its units run (no
    refusal, no failure). Their starts go with the next commit (StartWaits.held_back); a short job's
    end wakes the tick for both; `serve` sleeps START_WAIT at most while replies are due (replies_due)."""
    return isinstance(event, UnitsLaunched) and not event.failed and event.error is None and all(
        reply.status in ("started", "running", "queued") for reply in event.replies)  # queued: prefilling.py
