"""controller/prefilling.py keeps the pending jobs in a dispatch's order from tick to tick
(sched/prefill_rank.py, issue 18): a successor is named from that order as the plain sort of the
whole pending set would name it, through adds, replacements, removals, new queue priorities, ticks
without a session (their changes kept) and ticks where prefill was off (past what a sync sorts
anyway, their changes dropped: everything is sorted again)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.sched_view import Holding
from xce_lite.controller.prefilling import Prefill
from xce_lite.controller.state import RUNNING, Active, ControllerState
from xce_lite.models import RUN
from xce_lite.sched.core import Decisions, PendingJob, QueuePolicy, Snapshot
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.prefill import RunningUnit, successors
from xce_lite.sched.prefill_rank import REBUILD
from xce_lite.sched.reasons import FrozenMap, HostAlloc
from xce_lite.sched.resreq import parse

G = 1024**3
CONFIG = {"cluster": "c", "hosts": [{"name": "h1", "slots": 1, "mem": "1G"}],
          "queues": [{"name": "normal", "default": True}],
          "controller": {"prefill_depth": 1}}  # one round of naming: what successors() names behind job 1
HOLDS = FrozenMap({"slots": 1, "mem": G})
HOSTS = (HostView("h1", "ok", {"slots": 1, "mem": G}, {"slots": 0, "mem": 0}),)  # job 1 holds it all


def pend(job_id: int, priority: int = 0, slots: int = 1) -> PendingJob:
    return PendingJob(job_id, "alice", "normal", JobRequest(job_id, slots, None, parse("")), priority)


def named(prefill: Prefill, state: ControllerState) -> list[tuple[int, int]]:
    """(successor, predecessor) that extend names now, after a session that dispatched nothing and
    checked against the plain path: successors() on a snapshot of every pending job."""
    waiting = (("no room", tuple(state.pending)),)
    decisions = prefill.extend(Decisions((), waiting, True), HOSTS, FrozenMap({}), 10.0, set())
    extra = [(d.job_id, state.behind[d.job_id]) for d in decisions.dispatches]
    plain = successors(Snapshot(HOSTS, tuple(state.pending.values()), state.queue_policies),
                       Decisions((), waiting, True), (RunningUnit(1, "h1", "normal", "alice", HOLDS),))
    assert extra == [(s.job_id, s.after) for s in plain]
    state.behind.clear()  # not applied: the next call names one again
    return extra


def test_the_kept_order_names_what_a_sort_of_every_pending_job_would_through_each_change():
    state = ControllerState(ClusterConfig.model_validate(CONFIG), {})
    prefill = Prefill(state, SimpleNamespace(inputs=lambda now, closing: {}), SimpleNamespace(to_launch=[]),
                      lambda _message: None)
    state.active[1] = Active(1, "alice", "normal", RUN, 1, Holding((HostAlloc("h1", 1, HOLDS),)), ("u1",), [RUNNING])
    state.pending.add_all([pend(i) for i in range(20, 120)])
    assert named(prefill, state) == [(20, 1)]
    state.pending.discard(20)
    state.pending.add(pend(30, priority=5))  # replaced: -sp 5 ranks first
    state.pending.add(pend(25, slots=2))  # does not fit inside job 1's slot
    assert named(prefill, state) == [(30, 1)]
    state.pending.add(pend(30, priority=0))
    assert named(prefill, state) == [(21, 1)]
    state.pending.add(pend(5))
    state.pending.discard(21)
    assert prefill.extend(None, None, None, 10.0, set()) is None  # a tick without a session ...
    assert len(prefill.changed) == 2  # ... keeps what changed for the next: a few bisects, no sort
    prefill.enabled = False  # ticks without prefill: past what a sync would sort anyway ...
    state.pending.add_all([pend(i) for i in range(1_000, 1_000 + REBUILD + 20)])
    assert prefill.extend(None, HOSTS, FrozenMap({}), 10.0, set()) is None
    assert not prefill.changed  # ... what changed is dropped (it would grow with every job) ...
    prefill.enabled = True  # ... and the order sorted again
    assert named(prefill, state) == [(5, 1)]
    state.pending.add(PendingJob(200, "alice", "high", JobRequest(200, 1, None, parse(""))))
    assert named(prefill, state) == [(5, 1)]  # an unknown queue: priority 0, ranks by id
    state.queue_policies = (*state.queue_policies, QueuePolicy("high", 90))
    assert named(prefill, state) == [(200, 1)]  # new priorities: the order is sorted again
    state.pending.add(replace(pend(6), queue="high"))
    assert named(prefill, state) == [(6, 1)]


def test_a_tick_reads_the_jobs_that_changed_not_the_whole_pending_set(monkeypatch):
    """At 10,000 pending a sort of them all at each tick was most of the tick (bench/ticktime.py):
    once sorted, a tick with a few changes passes over none of the pending jobs."""
    state = ControllerState(ClusterConfig.model_validate(CONFIG), {})
    prefill = Prefill(state, SimpleNamespace(inputs=lambda now, closing: {}), SimpleNamespace(to_launch=[]),
                      lambda _message: None)
    state.active[1] = Active(1, "alice", "normal", RUN, 1, Holding((HostAlloc("h1", 1, HOLDS),)), ("u1",), [RUNNING])
    state.pending.add_all([pend(i, slots=2) for i in range(20, 2_020)])  # none fits inside job 1
    assert named(prefill, state) == []
    monkeypatch.setattr(state.pending, "values", lambda: (_ for _ in ()).throw(AssertionError("a pass over all")))
    state.pending.add(pend(10))  # ranks first
    state.pending.discard(20)
    prefill.extend(None, None, None, 10.0, set())  # a tick without a session between: nothing sorted
    waiting = (("no room", tuple(state.pending)),)
    decisions = prefill.extend(Decisions((), waiting, True), HOSTS, FrozenMap({}), 10.0, set())
    assert [(d.job_id, state.behind[d.job_id]) for d in decisions.dispatches] == [(10, 1)]
