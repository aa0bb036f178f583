"""A successor's launch reply may reach the controller before its predecessor's end does (the host
started it at once: the end was known there first). Until that end arrives the predecessor is still
active, and it must stay taken: a second successor named behind it would be started at once by its
host, beside the first, on the same slot (a run at load 80 saw a 2-slot host start 28 jobs at once,
each generation of successors doubling the next). Prefill.hidden and Prefill.unqueued keep it taken
(prefilling.py's started_early) until its end is known."""

from __future__ import annotations

from types import SimpleNamespace

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.sched_view import Holding
from xce_lite.controller.core import _still_runs
from xce_lite.controller.prefilling import Prefill
from xce_lite.controller.state import RUNNING, SENT, Active, ControllerState
from xce_lite.exec.host import UnitUnqueued
from xce_lite.models import DISP, RUN
from xce_lite.sched.core import Decisions, PendingJob
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.reasons import FrozenMap, HostAlloc
from xce_lite.sched.resreq import parse

G = 1024**3
# one deep (a queued job gets no successor of its own): test_prefill_chains.py holds every link of a chain
CONFIG = {"cluster": "c", "hosts": [{"name": "h1", "slots": 1, "mem": "1G"}],
          "queues": [{"name": "normal", "default": True}], "controller": {"prefill_depth": 1}}
HOLDS = FrozenMap({"slots": 1, "mem": G})
HOSTS = (HostView("h1", "ok", {"slots": 1, "mem": G}, {"slots": 0, "mem": 0}),)  # job 1 holds it all


def _cluster() -> tuple[ControllerState, Prefill, Active, Active]:
    state = ControllerState(ClusterConfig.model_validate(CONFIG), {})
    units = SimpleNamespace(to_launch=[], _unit=lambda unit: (state.active.get(int(unit[1:])), 0),
                            _mark_running=lambda job, index, _when: job.status.__setitem__(index, RUNNING))
    prefill = Prefill(state, SimpleNamespace(inputs=lambda now, closing: {}), units, lambda _message: None)
    pred = Active(1, "alice", "normal", RUN, 1, Holding((HostAlloc("h1", 1, HOLDS),)), ("u1",), [RUNNING])
    succ = Active(2, "alice", "normal", DISP, 1, Holding((HostAlloc("h1", 1, HOLDS),)), ("u2",), [SENT], after=1)
    state.active[1], state.active[2], state.behind[2] = pred, succ, 1
    state.pending.add_all([PendingJob(i, "alice", "normal", JobRequest(i, 1, None, parse(""))) for i in (3, 4)])
    return state, prefill, pred, succ


def _named(prefill: Prefill, state: ControllerState, closing: frozenset[int] = frozenset()) -> list[tuple[int, int]]:
    waiting = (("no room", tuple(state.pending)),)
    decisions = prefill.extend(Decisions((), waiting, True), HOSTS, FrozenMap({}), 10.0, closing)
    return [(d.job_id, state.behind[d.job_id]) for d in decisions.dispatches]


def test_a_successor_started_before_its_predecessors_end_is_known_keeps_the_predecessor_taken():
    state, prefill, pred, succ = _cluster()
    assert prefill.hidden(frozenset()) == {2} and _named(prefill, state) == []  # job 1 has its successor
    succ.status[0] = RUNNING  # its launch reply ("started") came; job 1's end has not
    prefill.hidden(frozenset())
    assert 2 not in state.behind and succ.after is None
    assert _named(prefill, state) == [(3, 2)]  # job 2 runs: it may have one; job 1 gets none
    del state.behind[3]  # (not applied)
    pred.ending = True  # job 1's end arrives
    prefill.hidden(frozenset({1}))
    assert _named(prefill, state, frozenset({1})) == [(3, 2)] and not prefill.started_early


def test_an_unqueued_start_before_the_predecessors_end_keeps_it_taken_too():
    state, prefill, _pred, _succ = _cluster()
    prefill.unqueued(UnitUnqueued("h1", "u2", "started", 5.0, None), 5.0)
    assert 2 not in state.behind
    assert all(after != 1 for _job, after in _named(prefill, state))
    assert prefill.started_early == {2: 1}
    state.active.pop(1)  # ended and applied: forgotten
    _named(prefill, state)
    assert not prefill.started_early


def test_a_successor_started_before_its_predecessors_end_is_known_holds_nothing_until_that_end():
    """The host started job 2 in the slot job 1 left; job 1, active here until its end arrives, holds
    that slot in the views: job 2 holds nothing meanwhile (else the slot counts twice: a host view's
    free slots went to -1), then its own allocation from the tick that learns job 1's end."""
    state, prefill, pred, succ = _cluster()
    assert prefill.hidden(frozenset()) == {2} and succ.queued
    succ.status[0] = RUNNING  # its launch reply ("started") came; job 1's end has not
    assert prefill.hidden(frozenset()) == {2} and succ.queued and prefill.started_early == {2: 1}
    assert len(state.active.allocs_by_host({2}, _still_runs)["h1"]) == 1  # job 1's: the slot counts once
    pred.ending = True  # job 1's end arrives: job 2 holds its own now
    assert prefill.hidden(frozenset({1})) == set() and not succ.queued
    _named(prefill, state, frozenset({1}))
    assert not prefill.started_early and not succ.queued
