"""Ends that wait for a commit to join (start_wait.py, issue 18): an end alone waits END_WAIT at most,
and only where waiting costs nobody anything (its slot is its queued successor's, or nothing is
pending); never when anything else is committed, a dependant or a wait is on it, or a commit is retried."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

from tests.support.inproc import InProc
from xce_lite.controller import start_wait
from xce_lite.controller.invariants import check_invariants
from xce_lite.controller.start_wait import END_WAIT, StartWaits
from xce_lite.store.jobs import Finish


def _state(pending=(), behind=None, waited=()) -> SimpleNamespace:
    return SimpleNamespace(mu=threading.RLock(), unrecorded=[], unrecorded_started=[], store_starts_now=False,
                           pending=list(pending), behind=dict(behind or {}), waited=Counter(waited))


def _end(job_id: int) -> tuple[Finish, str]:
    return Finish(job_id, "RUN", "DONE", 1.0, 2.0, 0, None, 0.001, 1000, None), "finished"


class _Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def time(self) -> float:
        return self.now


def test_an_end_behind_its_queued_successor_waits_then_is_committed_within_END_WAIT():
    state, waits = _state(pending=[7], behind={2: 1}), StartWaits(_Clock())
    ends = [_end(1)]
    assert waits.waiting(ends, [], False, 10.0, state, False) == ([], [])
    assert state.unrecorded == ends and not waits.news(state)  # waiting: no tick needed for it
    assert abs(waits.sleep(1.0, SimpleNamespace(replies_due={})) - END_WAIT) < 1e-9  # serve wakes by its bound
    state.unrecorded.append(_end(3))  # anything new is news
    assert waits.news(state)
    del state.unrecorded[1:]
    taken, state.unrecorded = state.unrecorded, []
    assert waits.waiting(taken, [], False, 10.0 + END_WAIT / 2, state, False) == ([], [])  # still within
    taken, state.unrecorded = state.unrecorded, []
    assert waits.waiting(taken, [], False, 10.0 + END_WAIT * 1.01, state, False) == (ends, [])  # past the bound
    assert state.unrecorded == [] and waits.ends_since is None
    assert waits.sleep(1.0, SimpleNamespace(replies_due={})) == 1.0


def test_with_nothing_pending_an_end_waits_without_a_successor():
    state, waits = _state(), StartWaits(_Clock())
    assert waits.waiting([_end(1)], [], False, 10.0, state, False) == ([], [])
    assert [f.job_id for f, _kind in state.unrecorded] == [1]


def test_an_end_is_committed_at_once_when_waiting_could_cost_anyone_anything():
    ends = [_end(1)]
    cases = {
        "a pending job could take its slot": (_state(pending=[7]), False, False),
        "another end has no successor": (_state(pending=[7], behind={2: 1}), False, False),
        "a wait sleeps on it": (_state(behind={2: 1}, waited=[1]), False, False),
        "something else is committed": (_state(behind={2: 1}), True, False),
        "a dependant, or a commit retried": (_state(behind={2: 1}), False, True),
    }
    for why, (state, others, urgent) in cases.items():
        finishing = ends + [_end(4)] if why == "another end has no successor" else ends
        waits = StartWaits(_Clock())
        assert waits.waiting(finishing, [], others, 10.0, state, urgent) == (finishing, []), why
        assert state.unrecorded == [] and waits.ends_since is None, why


def test_starts_committed_now_take_the_waiting_ends_with_them():
    state, waits = _state(behind={2: 1}), StartWaits(_Clock())
    ends, starts = [_end(1)], [(2, 10.0 - 2 * start_wait.START_WAIT)]  # a start that waited its bound
    state.unrecorded.append(_end(5))  # came from another thread meanwhile: stays for the next tick
    assert waits.waiting(ends, starts, False, 10.0, state, False) == (ends, starts)
    assert [f.job_id for f, _kind in state.unrecorded] == [5] and state.unrecorded_started == []
    assert waits.ends_since is None and waits.news(state)


def _run_short_job(waited: bool) -> list[tuple[bool, str]]:
    """(its end waits in memory, its stored state) after each 0.01 s step of a short job's run, on a
    controller whose ends may wait (the simulator's clock turns that off: seams.end_waits)."""
    p = InProc(hosts=("h1",), slots=1)
    try:
        p.ctl.seams.end_waits = True
        p.step(0.1)
        job = p.submit(runtime=0.02)
        if waited:
            p.ctl.state.waited[job] += 1  # as a wait (`xce wait`) asleep on it
        seen = []
        for _ in range(20):
            p.step(0.01)
            check_invariants(p.ctl)
            seen.append((any(f.job_id == job for f, _kind in p.ctl.state.unrecorded), p.job(job).state))
            if seen[-1][1] == "DONE":
                break
        kinds = [kind for _t, kind, _d in p.ctl.store.events(job)]
        assert kinds == ["submitted", "dispatched", "started", "finished"]
        return seen
    finally:
        p.close()


def test_in_the_tick_an_end_with_nothing_pending_waits_END_WAIT_at_most_unless_a_wait_sleeps_on_it():
    seen = _run_short_job(waited=False)
    assert seen[-1][1] == "DONE"
    waited = [i for i, (held, _state) in enumerate(seen) if held]
    assert waited and all(seen[i][1] != "DONE" for i in waited)  # ended in memory, not stored yet
    assert len(seen) - 1 - waited[0] <= round(END_WAIT / 0.01) + 1
    seen = _run_short_job(waited=True)
    assert seen[-1][1] == "DONE" and not any(held for held, _state in seen)
