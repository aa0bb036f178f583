"""A one-POST submit runs no scheduling session of its own while no slot is free (submit_wake.py,
issue 18), yet never delays a dispatch: a slot freeing, or a free slot at the submit, wakes the tick
at once; a deferred job has its pend reason within DEFER_BOUND (serve sleeps no longer); a restart
in the middle loses nothing. The real controller runs in-process (tests/support/inproc.py: real
store, fake hosts and clock; `wants_tick` is what wakes `serve`), then as its own process on a
real local host (tests/support/cluster.py), sessions counted by its metrics."""

from __future__ import annotations

import json
import os
import re

from tests.support.cluster import Cluster
from tests.support.inproc import InProc
from tests.support.waiting import wait_until
from xce_lite.api.client import Client
from xce_lite.controller import submit_wake
from xce_lite.controller.submit_wake import DEFER_BOUND
from xce_lite.home.paths import Home


def _sessions(p: InProc) -> int:
    return p.ctl.metrics.snapshot()["histograms"]["session"]["count"]


def _settle(p: InProc) -> None:
    """Ticks until the controller asks for none (launch replies, starts stored)."""
    for _ in range(50):
        p.step(0.06)
        if not p.wants_tick:
            return
    raise AssertionError("the controller kept asking for ticks")


def _full(p: InProc, runtime: float = 1000.0) -> tuple[list[int], int]:
    """Both slots (two hosts of one) held by jobs of `runtime`, and one job pending beside them, so
    that the last session saw no free slot."""
    running = [p.submit(runtime=runtime) for _ in range(2)]
    _settle(p)
    waiting = p.submit(runtime=1.0)
    _settle(p)
    assert [p.job(i).state for i in running] == ["RUN", "RUN"] and p.job(waiting).state == "PEND"
    return running, waiting


def _submit_quietly(p: InProc, n: int) -> list[int]:
    """`n` one-POST submits, each checked not to wake the tick."""
    ids = []
    for _ in range(n):
        p.ctl.state.wake.clear()
        ids.append(p.submit(runtime=1.0))
        assert not p.wants_tick, "a submit with every slot full woke the tick"
    return ids


def test_with_every_slot_full_submits_run_no_session_each_and_have_their_reason_within_the_bound():
    p = InProc(hosts=("h1", "h2"), slots=1)
    try:
        _full(p)
        before = _sessions(p)
        ids = _submit_quietly(p, 20)
        assert _sessions(p) == before
        assert all(p.live_reason(i) is None for i in ids)  # not scheduled yet
        # serve sleeps no longer than the bound from the first deferred submit, whatever its tick
        assert submit_wake.bounded(p.ctl.state, 1.0, p.clock.now) <= DEFER_BOUND
        p.step(DEFER_BOUND)
        assert _sessions(p) == before + 1  # one session for all of them
        assert all(p.live_reason(i) for i in ids), [p.live_reason(i) for i in ids]
        assert submit_wake.bounded(p.ctl.state, 1.0, p.clock.now) == 1.0  # nothing deferred now
        assert all(p.job(i).state == "PEND" for i in ids)
    finally:
        p.close()


def test_a_slot_freeing_dispatches_deferred_submits_at_once_and_a_free_slot_wakes_a_submit():
    p = InProc(hosts=("h1", "h2"), slots=1)
    try:
        running, waiting = _full(p, runtime=5.0)
        ids = _submit_quietly(p, 5)
        p.cluster.advance(p.clock.now + 5.0)  # both running jobs end on their hosts
        assert p.wants_tick  # their ends wake the tick: the deferral does not hold it back
        p.advance(p.cluster.now)
        assert [p.job(i).state for i in running] == ["DONE", "DONE"]
        assert p.job(waiting).state in ("DISP", "RUN") and p.job(ids[0]).state in ("DISP", "RUN")
        _settle(p)
        # the same, the pending set emptied first: then no session said the hosts were full
        p.kill(ids[1])
        p.kill(ids[2])
        p.kill(ids[3])
        p.kill(ids[4])
        _settle(p)
        p.cluster.advance(p.clock.now + 1.0)  # `waiting` and ids[0] end: both slots free
        p.advance(p.cluster.now)
        _settle(p)
        p.ctl.state.wake.clear()
        late = p.submit(runtime=1.0)
        assert p.wants_tick  # a slot is free: this submit wakes the tick
        p.step(0.01)
        assert p.job(late).state in ("DISP", "RUN")
    finally:
        p.close()


def test_a_restart_in_the_middle_of_deferred_submits_loses_nothing():
    p = InProc(hosts=("h1", "h2"), slots=1)
    try:
        running, _waiting = _full(p, runtime=30.0)
        first = _submit_quietly(p, 5)
        p.restart()  # as after a crash: the deferred jobs are in the store, PEND
        assert all(p.job(i).state == "PEND" for i in first)
        _settle(p)
        assert all(p.live_reason(i) for i in first)
        second = _submit_quietly(p, 5)  # the first session after the load saw the hosts full again
        p.step(DEFER_BOUND)
        assert all(p.live_reason(i) for i in second)
        p.kill(running[0])  # a slot frees: the oldest pending job takes it
        _settle(p)
        assert p.job(_waiting).state in ("DISP", "RUN")
        assert all(p.job(i).state == "PEND" for i in first + second)
    finally:
        p.close()


def _metric(c: Cluster, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", c.ok("metrics"), re.M)
    assert found is not None, f"{name} not in `xce metrics`"
    return float(found.group(1))


def _reasoned(c: Cluster, ids: list[int]) -> bool:
    """Whether every job of `ids` is listed pending with a pend reason (a queued successor, prefill's
    DISP behind a running job, keeps the reason its session gave it: it waits too)."""
    listed = {j["id"]: j for j in json.loads(c.ok("jobs", "--json"))["jobs"]}
    return all(i in listed and (listed[i]["state"] == "PEND" or listed[i]["queued_behind"] is not None)
               and listed[i]["pend_reason"] for i in ids)


def _done(c: Cluster, ids: list[int]) -> bool:
    listed = {j["id"]: j["state"] for j in json.loads(c.ok("jobs", "--json", "-a"))["jobs"]}
    return all(listed.get(i) == "DONE" for i in ids)


def test_a_real_controller_defers_one_post_sessions_while_full_across_a_kill_9():
    c = Cluster(slots=2)
    try:
        c.start()
        holders = [c.submit("sleep", "300") for _ in range(2)]
        for job_id in holders:
            c.wait_state(job_id, {"RUN"})
        extra = c.submit("true")  # pends: the session that placed it saw no free slot
        wait_until(lambda: c.job(extra)["pend_reason"], 30, "the first pending job's reason")
        spec = {"argv": ["true"], "cwd": str(c.work)}
        count = "xce_scheduler_session_duration_seconds_count"

        def posts(n: int) -> list[int]:
            client = Client(Home(c.home).socket)
            try:
                return [client.submit({"jobs": [spec]})["ids"][0] for _ in range(n)]
            finally:
                client.close()

        before = _metric(c, count)
        first = posts(40)
        sessions = _metric(c, count) - before  # the bound and the tick period still run some
        assert sessions <= 20, f"{sessions:g} sessions for 40 one-POST submits with every slot full"
        wait_until(lambda: _reasoned(c, first), 30, "every job's pend reason")
        c.kill9_controller()
        c.start()
        second = posts(10)
        wait_until(lambda: _reasoned(c, first + second), 30, "every job's pend reason after the restart")
        c.ok("kill", str(holders[0]))  # a slot frees: the pending jobs run through it, none lost
        wait_until(lambda: _done(c, [extra, *first, *second]), 120, "every deferred job to run")
    finally:
        c.close()


def test_a_submit_deferred_while_the_controller_sleeps_a_long_tick_has_its_reason_within_the_bound():
    """`serve` asleep for a 60 s tick when a submit is deferred: it is not woken (that is the
    point), so it sleeps in steps of DEFER_BOUND while every slot is taken, and the job's session
    comes within that bound, not at the next tick."""
    c = Cluster(config=f"""\
        cluster: t{os.getpid()}w
        hosts:
          - {{name: local, slots: 2, mem: 1G}}
        queues:
          - {{name: normal, default: true}}
        controller: {{tick: 60s, grace: 2s}}
        """)
    try:
        c.start()
        holders = [c.submit("sleep", "300") for _ in range(2)]
        for job_id in holders:
            c.wait_state(job_id, {"RUN"})
        extra = c.submit("true")  # wakes the tick (its hosts had free slots): its session finds none
        wait_until(lambda: c.job(extra)["pend_reason"], 30, "the first pending job's reason")
        deferred = c.submit("true")  # left to the sleeping tick
        wait_until(lambda: c.job(deferred)["pend_reason"], 20, "the deferred job's reason (the tick is 60 s)")
    finally:
        c.close()


def test_a_stream_of_submits_shares_a_tick_and_a_lone_submit_wakes_it_at_once():
    """A submit that wakes the tick within STREAM_GAP of the one before is a stream's: the woken
    tick first waits GATHER (sleeping.py), so the next submits share its session; a lone one wakes
    it with no wait, and a tick that takes the submits ends the stream's mark."""
    import math
    import threading
    import time
    from types import SimpleNamespace

    from xce_lite.controller import sleeping
    from xce_lite.controller.seams import FakeClock

    state = SimpleNamespace(mu=threading.RLock(), wake=threading.Event(), full=False, config=SimpleNamespace(pools=()),
                            deferred_jobs=0, deferred_since=None, last_submit=-math.inf, streaming=False)
    clock = FakeClock(10.0)
    assert submit_wake.wakes(state, 10.0) and not state.streaming  # the first: a lone submit
    assert submit_wake.wakes(state, 10.0 + submit_wake.STREAM_GAP / 2) and state.streaming
    state.wake.set()
    began = time.monotonic()
    assert sleeping.sleep(state, clock, 60.0, True, math.inf)
    assert time.monotonic() - began >= submit_wake.GATHER and not state.streaming
    assert submit_wake.wakes(state, 10.5) and not state.streaming  # long after the last: lone again
    assert submit_wake.wakes(state, 10.5 + submit_wake.STREAM_GAP / 2) and state.streaming
    submit_wake.taken(state, None)  # a tick took them (woken by anything): no gathering for the next wake
    assert not state.streaming
    state.full = True  # no slot free: a stream's submits are deferred, not woken (DEFER_BOUND), as before
    assert not submit_wake.wakes(state, 10.6) and not submit_wake.wakes(state, 10.601) and not state.streaming
