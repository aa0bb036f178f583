"""Ends that do not wake the tick (quiet_ends.py, issue 18): a unit's end, and its queued successor's
start, wait for the next tick while at least KEEP jobs stay queued behind the one that starts; the
end that leaves fewer wakes it. The first quiet event bounds `serve`'s sleep to END_WAIT, and arms
a timer that wakes the tick then unless a tick took the events first. Never quiet: a job a wait
sleeps on, a dependency gate or a commit retried (`urgent`), an unstarted leaver, a killed or
withdrawing job. Job 1 runs on h1; 2 is queued behind it, 3 behind 2 (prefill_depth 2)."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

from xce_lite.controller import sleeping
from xce_lite.controller.quiet_ends import KEEP, KEEP_BACKLOG, QuietEnds
from xce_lite.controller.seams import FakeClock, WakingQueue
from xce_lite.controller.start_wait import END_WAIT, StartWaits
from xce_lite.exec.host import JobResult, LaunchReply, UnitFinished, UnitsLaunched, UnitUnqueued

RESULT = JobResult(0, None, 1.0, 2.0, 0.0, 0)


def _job(job_id: int) -> SimpleNamespace:
    return SimpleNamespace(units=(f"u{job_id}",), ending=False, killed=None, withdrawing=False)


def chain(jobs: int = 3, pending: int = 0) -> tuple[QuietEnds, FakeClock]:
    """What QuietEnds reads of the controller's state (state.py): job 1 runs, 2 behind it, 3 behind 2
    (`jobs` 2: nothing behind 2, so 1's end leaves none queued; more: a longer chain), and `pending`
    jobs pending with the controller."""
    state = SimpleNamespace(mu=threading.RLock(), active={i: _job(i) for i in range(1, jobs + 1)},
                            behind={i: i - 1 for i in range(2, jobs + 1)}, waited=Counter(), wake=threading.Event(),
                            pending=list(range(100, 100 + pending)))
    clock = FakeClock(10.0)
    ends = QuietEnds(state, clock)
    with state.mu:
        ends.publish(urgent=False)
    return ends, clock


def test_an_end_and_its_successors_start_are_quiet_while_a_job_stays_queued_behind():
    assert KEEP == 1
    ends, clock = chain()
    # job 1's end leaves 2 running, 3 queued behind it; job 2's end leaves none queued
    assert ends.ending == {"u1": 1} and ends.starting == {"u2": 2}
    assert ends(UnitFinished("h1", "u1", RESULT))
    assert ends.since == 10.0  # stamped by the controller's clock: the bound counts from here
    clock.now = 10.005
    assert ends(UnitUnqueued("h1", "u2", "started", 10.004))
    assert ends.since == 10.0  # the first one's stamp
    assert not ends(UnitFinished("h1", "u2", RESULT))  # then only job 3 runs, nothing behind it: tick
    for status in ("withdrawn", "refused", "dropped"):
        assert not ends(UnitUnqueued("h1", "u2", status, None, "x"))
    assert not ends(UnitFinished("h1", "u9", RESULT))  # a unit it does not know
    assert ends(UnitsLaunched("h1", (LaunchReply("u3", "queued", None),)))  # launch replies, as before


def test_with_a_backlog_the_end_that_leaves_fewer_than_keep_backlog_queued_wakes_the_tick():
    """More jobs pend than wait queued on hosts: a refill has jobs to add, and it takes a tick, so
    the end that leaves fewer than KEEP_BACKLOG queued wakes it, while the host still has some in
    hand. Without a backlog, as many queued would let the ends wait (KEEP)."""
    assert KEEP_BACKLOG == 3
    # 1 runs, 2..6 queued behind it: 1's end starts 2 with 3, 4, 5 and 6 behind it (quiet); 2's end starts
    # 3 with three behind (quiet); 3's end starts 4 with two behind, fewer than 3: it wakes the tick
    ends, _clock = chain(jobs=6, pending=6)  # 6 pend, 5 queued on the host: a backlog
    assert ends.ending == {"u1": 1, "u2": 2} and ends.starting == {"u2": 2, "u3": 3}
    assert ends(UnitFinished("h1", "u1", RESULT)) and ends(UnitFinished("h1", "u2", RESULT))
    assert not ends(UnitFinished("h1", "u3", RESULT))
    ends, _clock = chain(jobs=6, pending=5)  # no more pending than queued: no backlog, KEEP as before
    assert ends.ending == {"u1": 1, "u2": 2, "u3": 3, "u4": 4}
    assert ends(UnitFinished("h1", "u3", RESULT)) and not ends(UnitFinished("h1", "u5", RESULT))


def test_never_quiet_where_someone_needs_the_end_at_once():
    ends, _clock = chain()
    ends.state.waited[1] += 1  # `xce wait` asleep on job 1, after the tick published: read live
    assert not ends(UnitFinished("h1", "u1", RESULT)) and ends.since is None
    with ends.state.mu:
        ends.publish(urgent=False)
    assert ends.ending == {}
    with ends.state.mu:
        ends.publish(urgent=True)  # a dependency gate, a commit retried, the simulator's clock
    assert ends.ending == ends.starting == {}
    for flag in ("killed", "withdrawing", "ending"):
        ends, _clock = chain()
        setattr(ends.state.active[1], flag, "x" if flag == "killed" else True)
        with ends.state.mu:
            ends.publish(urgent=False)
        assert ends.ending == {}, flag
    ends, _clock = chain()
    ends.enabled = False  # Seams.end_waits off
    with ends.state.mu:
        ends.publish(urgent=False)
    assert ends.ending == ends.starting == {}


def test_a_quiet_end_does_not_wake_the_tick_and_the_tick_takes_its_stamp():
    ends, clock = chain()
    wake = threading.Event()
    events = WakingQueue(wake, ends)
    events.put(UnitFinished("h1", "u1", RESULT))
    assert not wake.is_set() and events.qsize() == 1
    events.put(UnitFinished("h1", "u2", RESULT))
    assert wake.is_set()
    starts = StartWaits(clock)
    clock.now = 10.01
    ends.taken(starts)
    assert ends.since is None and starts.ends_since == 10.0  # a wait of its own in the tick counts from the end
    # but the stamp alone bounds no sleep (a tick that returns early, the store's retry pending, would spin)
    assert starts.sleep(1.0, SimpleNamespace(replies_due={})) == 1.0


class _Sleeper(threading.Event):
    """`state.wake` whose wait moves the fake clock by what it waited (nothing sets it)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return False


def _state(clock: FakeClock) -> SimpleNamespace:
    return SimpleNamespace(mu=threading.RLock(), deferred_since=None, full=False, wake=_Sleeper(clock))


def test_serve_sleeps_END_WAIT_at_most_from_the_first_quiet_end():
    ends, clock = chain()
    ends(UnitFinished("h1", "u1", RESULT))
    clock.now = 10.005
    state = _state(clock)
    assert sleeping.sleep(state, clock, 30.0, False, float("inf"), ends) is True  # not a quiet tick
    assert abs(clock.now - (10.0 + END_WAIT)) < 1e-9


def test_a_timer_wakes_the_tick_END_WAIT_after_the_first_quiet_event_unless_a_tick_took_them():
    ends, clock = chain()
    wake = ends.state.wake
    assert ends(UnitFinished("h1", "u1", RESULT))
    assert not wake.wait(0.1)  # the controller's clock has not moved: within the bound
    clock.now = 10.0 + END_WAIT
    assert wake.wait(10.0)  # the timer saw the bound pass (it reads the clock again every END_WAIT at most)
    wake.clear()
    ends.taken(StartWaits(clock))  # the tick took them
    assert ends(UnitUnqueued("h1", "u2", "started", 10.5))  # a new window
    ends.taken(StartWaits(clock))  # taken within its bound: the timer does nothing
    clock.now += 1.0
    assert not wake.wait(0.1)


def test_an_end_during_a_tick_is_decided_by_the_maps_that_tick_publishes():
    ends, clock = chain(jobs=2)
    state = ends.state
    events = WakingQueue(state.wake, ends)
    assert ends.ending == {}  # by the last tick's maps job 1's end wakes the tick
    events.put(UnitFinished("h1", "u1", RESULT))
    assert state.wake.is_set()  # outside a tick: at once, as before
    state.wake.clear()
    ends.taken(StartWaits(clock))  # a tick runs (the one woken)...
    clock.now = 10.003
    events.put(UnitFinished("h1", "u1", RESULT))  # ...when the end comes: not decided yet
    assert not state.wake.is_set() and ends.since is None
    state.active[3] = _job(3)  # the tick names job 3 behind job 2: job 1's end leaves 3 queued
    state.behind[3] = 2
    clock.now = 10.004
    with state.mu:
        ends.publish(urgent=False)
    assert ends.ending == {"u1": 1}
    assert not state.wake.is_set()  # quiet by the new maps: it waits for the next tick...
    assert ends.since == 10.003  # ...END_WAIT from when it came at most
    # after the tick's publish, an event that no map makes quiet wakes at once again
    events.put(UnitFinished("h1", "u3", RESULT))
    assert state.wake.is_set()


def test_an_end_deferred_during_a_tick_wakes_it_at_publish_when_the_new_maps_do_not_make_it_quiet():
    for urgent in (False, True):
        ends, clock = chain(jobs=2)
        state = ends.state
        ends.taken(StartWaits(clock))
        assert ends(UnitFinished("h1", "u1", RESULT))  # deferred
        assert not ends(UnitUnqueued("h1", "u2", "withdrawn", None, "x"))  # never quiet: at once, as before
        state.wake.clear()
        with state.mu:
            ends.publish(urgent)  # no link named (or urgent: no map at all): the end wakes the tick
        assert state.wake.is_set() and ends.since is None, urgent


def test_a_tick_that_fails_before_its_publish_leaves_no_end_undecided():
    ends, clock = chain(jobs=2)
    ends.taken(StartWaits(clock))
    assert ends(UnitFinished("h1", "u1", RESULT))
    assert not ends.state.wake.is_set()
    ends.abandon()  # serve's "tick skipped"
    assert ends.state.wake.is_set()
    ends.state.wake.clear()
    assert not ends(UnitFinished("h1", "u1", RESULT)) and not ends.state.wake.is_set()  # no tick runs: not deferred


def test_no_end_is_deferred_where_quiet_ends_are_off():
    ends, clock = chain(jobs=2)
    ends.enabled = False  # Seams.end_waits off (the simulator)
    ends.taken(StartWaits(clock))
    assert not ends(UnitFinished("h1", "u1", RESULT))
