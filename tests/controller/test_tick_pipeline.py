"""The tick's path from a result to the next launch (issue 18): on a host's channel a freed slot's
launch goes before the forgets of the units that ended; a start alone waits (START_WAIT at most) for
a commit to join, so a short job's start and end share one commit, and a long job's start is stored
within that wait, through faults in sequence; launch replies that only say the units run do not wake
the tick (they are counted due, which bounds `serve`'s sleep)."""

from __future__ import annotations

import threading
import time

from tests.support.inproc import InProc
from xce_lite.controller import start_wait
from xce_lite.controller.invariants import check_invariants
from xce_lite.controller.unitwork import quiet_launch
from xce_lite.exec.host import LaunchReply, UnitsLaunched
from xce_lite.exec.link import HostDown


def _first_running(p: InProc, first: int, second: int) -> None:
    p.step(0.1)
    for _ in range(3):
        p.step(0.5)
        if p.job(first).state == "RUN":
            break
    assert (p.job(first).state, p.job(second).state) == ("RUN", "PEND")


def test_a_freed_slots_launch_goes_before_the_forget_of_the_unit_that_ended():
    p = InProc(hosts=("h1",), slots=1)
    try:
        first, second = p.submit(runtime=2), p.submit(runtime=2)
        _first_running(p, first, second)
        host = p.ctl.state.hosts["h1"]
        order: list[str] = []
        real_launch, real_forget = host.launch_nowait, host.forget
        host.launch_nowait = lambda requests: order.append("launch") or real_launch(requests)
        host.forget = lambda units, wait=True: order.append("forget") or real_forget(units, wait)
        for _ in range(8):
            order.clear()
            p.step(0.5)
            if p.job(second).state != "PEND":
                break
        assert p.job(first).state == "DONE"
        assert order == ["launch", "forget"]
    finally:
        p.close()


def _counting_transactions(p: InProc) -> list[int]:
    transactions: list[int] = []
    real_write = p.ctl.store._write
    p.ctl.store._write = lambda: transactions.append(1) or real_write()
    return transactions


def test_a_start_alone_waits_for_its_short_jobs_end_and_both_share_one_commit():
    p = InProc(hosts=("h1",), slots=1)
    try:
        p.step(0.1)
        job = p.submit(runtime=0.02)
        transactions = _counting_transactions(p)
        states = []
        for _ in range(12):
            p.step(0.01)
            check_invariants(p.ctl)
            states.append(p.job(job).state)
            if states[-1] == "DONE":
                break
        assert states[-1] == "DONE" and "RUN" not in states  # never stored RUN alone
        kinds = [kind for _t, kind, _d in p.ctl.store.events(job)]
        assert kinds == ["submitted", "dispatched", "started", "finished"]
        assert len(transactions) == 2  # the dispatch; then the start with the end (three before)
    finally:
        p.close()


def test_a_long_jobs_start_is_stored_within_the_wait_and_faults_in_sequence_lose_nothing():
    p = InProc(hosts=("h1", "h2"), slots=1)
    try:
        p.step(0.1)
        long_job, other = p.submit(runtime=30), p.submit(runtime=30)
        seen = []
        for _ in range(12):
            p.step(0.01)
            check_invariants(p.ctl)
            seen.append((p.job(long_job).state, p.ctl.state.active[long_job].state
                         if long_job in p.ctl.state.active else None))
            if seen[-1][0] == "RUN":
                break
        assert seen[-1][0] == "RUN"
        # stored RUN no later than START_WAIT after memory had it RUN (steps of 0.01 s)
        first_run = next(i for i, (_stored, live) in enumerate(seen) if live == "RUN")
        assert len(seen) - 1 - first_run <= round(start_wait.START_WAIT / 0.01) + 1
        # faults in sequence: the first host lost, a restart with the other's start maybe waiting, back
        p.drop("h1")
        p.step(0.01)
        p.restart()
        for _ in range(3):
            p.step(0.01)
            check_invariants(p.ctl)
        p.back("h1")
        for _ in range(100):
            p.step(1.0)
            check_invariants(p.ctl)
            if {p.job(long_job).state, p.job(other).state} == {"DONE"}:
                break
        assert (p.job(long_job).state, p.job(other).state) == ("DONE", "DONE")
        for job in (long_job, other):
            kinds = [kind for _t, kind, _d in p.ctl.store.events(job)]
            assert kinds.count("finished") == 1 and kinds.count("started") >= 1
    finally:
        p.close()


def test_launch_replies_that_only_say_units_run_do_not_wake_the_tick_and_are_counted_due():
    p = InProc(hosts=("h1",), slots=1)
    try:
        p.step(0.1)
        job = p.submit(runtime=30)
        wake, units = p.ctl.state.wake, p.ctl.units
        real_put = p.ctl._events.put
        woke: list[tuple[str, bool]] = []

        def put(item, *args, **kw):  # the fake host's replies, through the real queue
            wake.clear()
            real_put(item, *args, **kw)
            woke.append((type(item).__name__, wake.is_set()))

        p.ctl._events.put = put
        for _ in range(4):
            p.step(0.2)
            if woke:
                break
        assert woke == [("UnitsLaunched", False)]  # started: no wake
        assert units.replies_due == {"h1": 1}  # serve sleeps START_WAIT at most meanwhile
        p.step(0.2)
        assert units.replies_due == {} and p.job(job).state == "RUN"
        # a refusal or a failure wakes it at once
        for event in (UnitsLaunched("h1", (LaunchReply("u", "refused", None, "no"),)),
                      UnitsLaunched("h1", (), ("u",), "channel lost")):
            assert not quiet_launch(event)
        assert quiet_launch(UnitsLaunched("h1", (LaunchReply("u", "running", 1.0),)))
    finally:
        p.close()


def test_a_host_lost_forgets_only_its_own_launches_due():
    """Launches due on a healthy host keep serve's short sleep when another host is lost (or fails
    to reconnect, again and again): each host's unanswered launches are counted apart."""
    p = InProc(hosts=("h1", "h2"), slots=1)
    try:
        units = p.ctl.units
        units.replies_due.update(h1=2, h2=1)
        with p.ctl.state.mu:
            for _ in range(2):
                units._host_down(HostDown("h2", "connection refused", p.ctl.state.generation.get("h2", 0)), 0.0)
        assert units.replies_due == {"h1": 2}
        units._answered("h1")
        units._answered("h1")
        assert units.replies_due == {}
    finally:
        p.close()



def test_a_suspend_while_a_start_waits_for_its_commit_has_it_stored_and_suspends_the_job():
    """`xce stop` in the moment a job runs but its start waits to share a commit (store: DISP) is
    not refused as "not running": the start is stored at once (no clock moves here: only the
    request's wake-up can store it) and the job is suspended."""
    p = InProc(hosts=("h1",), slots=1)
    try:
        p.step(0.1)
        job = p.submit(runtime=30)
        for _ in range(20):
            p.step(0.01)
            if p.ctl.state.unrecorded_started:
                break
        assert p.job(job).state == "DISP" and [i for i, _t in p.ctl.state.unrecorded_started] == [job]
        done = threading.Event()

        def tick_while_asked() -> None:  # the tick's thread, its clock standing still
            while not done.is_set():
                if p.ctl.state.wake.is_set():
                    p.step(0.0)
                time.sleep(0.001)

        ticker = threading.Thread(target=tick_while_asked)
        ticker.start()
        try:
            reply = p.ctl.actions.api_suspend(p.caller(), {}, {"ids": [str(job)]})["results"][0]
        finally:
            done.set()
            ticker.join()
        assert reply["ok"], reply
        assert p.job(job).state == "USUSP"
        kinds = [kind for _t, kind, _d in p.ctl.store.events(job)]
        assert kinds[-2:] == ["started", "suspended"]
    finally:
        p.close()
