"""Pend reasons held back by the once-a-second bound (dispatching.reasons_to_store) are stored by
the next tick nothing woke, and `serve` sleeps no longer than dispatching.QUIET while some are: a
backlog's reasons are written while the controller is idle, not in the tick that next has work (a
kill freeing the slots, whose delivery waited ~50 ms behind 10,000 reasons: bench/README.md,
branch backlog3). A woken tick within the second still holds them back, as before. The real
controller in-process (tests/support/inproc.py: real store, fake hosts and clock)."""

from __future__ import annotations

import threading
import time

from tests.support.inproc import InProc
from xce_lite.controller import submit_wake
from xce_lite.controller.dispatching import QUIET
from xce_lite.controller.seams import RealClock


def _sleep_beside(ctl, action, deferrable: bool) -> tuple[bool, float]:
    """`serve`'s sleep of 30 s asked while `action` runs on a timer 10 ms in: (its answer, seconds)."""
    timer = threading.Timer(0.01, action)
    timer.start()
    t0 = time.monotonic()
    try:
        return ctl._sleep(30.0, deferrable=deferrable), time.monotonic() - t0
    finally:
        timer.cancel()


def _stored(p: InProc, ids: list[int]) -> list[str | None]:
    return [p.job(i).pend_reason for i in ids]


def test_reasons_held_back_within_the_second_are_stored_by_the_next_quiet_tick_only():
    p = InProc(hosts=("h1",), slots=1)
    try:
        holder = p.submit(runtime=1000.0)
        for _ in range(5):  # dispatched, launched, started: the one slot is taken
            p.step(0.3)
        assert p.job(holder).state == "RUN"
        first = p.submit(runtime=1.0)
        p.step(1.5)  # a second after the last store of reasons: this tick stores them
        assert all(_stored(p, [first])), "a tick a second after the last store stores the reasons"
        assert p.ctl.dispatching.quiet_wait() == float("inf")

        later = [p.submit(runtime=1.0) for _ in range(3)]
        p.step(0.2)  # woken by the submits, within the second: the session's reasons wait in memory
        live = [p.ctl.state.reasons.get(i) for i in later]
        assert all(live), "the session gave each new job its reason"
        assert _stored(p, later) == [None] * 3, "a busy tick within the second stores no reasons"
        assert p.ctl.dispatching.quiet_wait() == QUIET

        p.clock.now += 0.1
        p.ctl.tick(p.clock.now)  # woken again (quiet=False), still within the second: held back still
        assert _stored(p, later) == [None] * 3
        p.clock.now += 0.1
        p.ctl.tick(p.clock.now, quiet=True)  # nothing woke this one: what was held back is stored
        assert _stored(p, later) == live
        assert p.ctl.dispatching.quiet_wait() == float("inf"), "nothing held back any more"
    finally:
        p.close()


def test_serve_sleeps_no_longer_than_quiet_while_reasons_are_held_back_and_says_whether_it_was_woken():
    p = InProc(hosts=("h1",), slots=1)
    try:
        ctl = p.ctl
        ctl._clock = RealClock()  # serve's sleep reads the real clock; the fake one never moves by itself
        ctl.dispatching.held_back = True
        ctl.state.wake.clear()
        t0 = time.monotonic()
        assert ctl._sleep(30.0, deferrable=False) is False, "a sleep that ran out was not woken"
        assert time.monotonic() - t0 < 15.0, "reasons held back: serve sleeps QUIET, not the 30 s asked"

        ctl.dispatching.held_back = False
        woken, took = _sleep_beside(ctl, ctl.state.wake.set, deferrable=False)
        assert woken is True and took < 15.0, "a sleep cut short by the wake was woken"
    finally:
        p.close()


def test_a_submit_deferred_during_the_quiet_wait_keeps_its_bound_and_the_next_tick_is_not_quiet():
    """One-POST submits into a full cluster do not wake the tick (submit_wake.py): without this rule
    every sleep ended after QUIET and stored the reasons (one_post.py --backlog 10000: the main
    thread's CPU per POST 0.065 -> 0.13 ms). A deferred submit ends the sleep at its own bound, and
    that tick keeps the reasons held back."""
    p = InProc(hosts=("h1",), slots=1)
    try:
        ctl = p.ctl
        ctl._clock = RealClock()
        ctl.dispatching.held_back = True
        ctl.state.full = True  # the last session saw no free slot: a submit is deferred, not woken
        ctl.state.wake.clear()

        def submit() -> None:
            with ctl.state.mu:
                assert submit_wake.wakes(ctl.state, ctl._clock.time()) is False

        woken, took = _sleep_beside(ctl, submit, deferrable=True)
        assert woken is True, "a submit waits for its session: the next tick is not quiet"
        assert took >= submit_wake.DEFER_BOUND, "the sleep ran on to the submit's bound"
    finally:
        p.close()
