"""Chains of queued successors in the controller (issue 18, `controller: prefill_depth`; prefilling.py):
a queued successor may get a successor of its own while the chain behind the running unit is
shorter than the depth; the started_early rule holds for every link; only a chain's tail is
withdrawn; a middle that leaves unstarted (killed, withdrawn, refused) passes its follower to its
own predecessor, which stays taken; a chain dropped at a lease's end never launches a follower
beside the unit before it; a restart finds a killed middle's follower behind the unit before it.
Job 1 runs on h1 (1 slot), job 2 is queued behind it; the pending jobs are 3, 4, 5."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.sched_view import Holding
from xce_lite.controller.prefill_chains import recover_chains
from xce_lite.controller.prefilling import Prefill
from xce_lite.controller.state import NEW, RUNNING, SENT, Active, ControllerState
from xce_lite.exec.host import UnitUnqueued
from xce_lite.models import DISP, RUN
from xce_lite.sched.core import Decisions, PendingJob
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.prefill import queued_reason
from xce_lite.sched.reasons import FrozenMap, HostAlloc
from xce_lite.sched.resreq import parse

G = 1024**3
HOLDS = FrozenMap({"slots": 1, "mem": G})
FULL = (HostView("h1", "ok", {"slots": 1, "mem": G}, {"slots": 0, "mem": 0}),)  # job 1 holds it all
ROOM = FULL + (HostView("h2", "ok", {"slots": 1, "mem": G}, {"slots": 1, "mem": G}),)  # and h2 is free


def pend(job_id: int, priority: int = 0) -> PendingJob:
    return PendingJob(job_id, "alice", "normal", JobRequest(job_id, 1, None, parse("")), priority)


def cluster(depth: int = 2) -> tuple[ControllerState, Prefill, list[str]]:
    config = {"cluster": "c", "hosts": [{"name": "h1", "slots": 1, "mem": "1G"}, {"name": "h2", "slots": 1,
                                                                                   "mem": "1G"}],
              "queues": [{"name": "normal", "default": True}], "controller": {"prefill_depth": depth}}
    state = ControllerState(ClusterConfig.model_validate(config), {})
    asked: list[str] = []
    state.hosts["h1"] = SimpleNamespace(withdraw_nowait=asked.append)
    units = SimpleNamespace(to_launch=[], _unit=lambda unit: (state.active.get(int(unit[1:])), 0),
                            end_job=lambda *_a: None,
                            _mark_running=lambda job, index, _when: job.status.__setitem__(index, RUNNING))
    prefill = Prefill(state, SimpleNamespace(inputs=lambda now, closing: {}), units, lambda _message: None)
    state.active[1] = Active(1, "alice", "normal", RUN, 1, Holding((HostAlloc("h1", 1, HOLDS),)), ("u1",), [RUNNING])
    queue_behind(state, prefill, 2, 1)
    state.pending.add_all([pend(i) for i in (3, 4, 5)])
    return state, prefill, asked


def queue_behind(state: ControllerState, prefill: Prefill, job_id: int, pred: int) -> Active:
    """Job `job_id` launched queued behind `pred` on h1 (as extend and its launch leave it)."""
    job = Active(job_id, "alice", "normal", DISP, 1, Holding((HostAlloc("h1", 1, HOLDS),)), (f"u{job_id}",), [SENT],
                 after=pred)
    state.active[job_id], state.behind[job_id] = job, pred
    prefill.requests[job_id] = pend(job_id)
    state.pending.discard(job_id)
    return job


def named(prefill: Prefill, state: ControllerState, closing: frozenset[int] = frozenset(),
          hosts: tuple[HostView, ...] = FULL) -> list[tuple[int, int]]:
    """(successor, predecessor) named after a session that dispatched nothing (not applied: undone),
    `closing` as the tick passes it: with what hidden() returned (and the hosts' view asks again)."""
    closing = closing | prefill.hidden(closing)
    assert prefill.hidden(closing) <= closing  # (core._hosts_now): the same links hold nothing
    waiting = (("no room", tuple(state.pending)),)
    decisions = prefill.extend(Decisions((), waiting, True), hosts, FrozenMap({}), 10.0, closing)
    out = [(d.job_id, state.behind.pop(d.job_id)) for d in decisions.dispatches]
    for job_id, _pred in out:
        prefill.requests.pop(job_id, None)
    return out


def test_a_queued_successor_gets_one_of_its_own_up_to_the_depth():
    state, prefill, _asked = cluster(depth=1)
    assert named(prefill, state) == []  # today's rule: one per running unit
    state, prefill, _asked = cluster(depth=2)
    assert named(prefill, state) == [(3, 2)]  # behind the queued job 2, never a second behind job 1
    queue_behind(state, prefill, 3, 2)
    assert named(prefill, state) == []  # 1 <- 2 <- 3: two deep
    state, prefill, _asked = cluster(depth=3)
    queue_behind(state, prefill, 3, 2)
    assert named(prefill, state) == [(4, 3)]


def test_a_chain_keeps_a_dispatchs_order_a_job_of_higher_rank_goes_ahead_tail_first():
    state, prefill, asked = cluster()
    state.pending.add(pend(4, priority=5))  # later, of higher rank than the queued job 2
    assert named(prefill, state) == []  # not behind job 2: it must go ahead of it, and job 2 takes none
    assert asked == ["u2"]  # job 2 gives way (outranked): job 4 then follows job 1
    state, prefill, asked = cluster()
    queue_behind(state, prefill, 3, 2)
    state.pending.add(pend(4, priority=5))
    assert named(prefill, state) == [] and asked == ["u3"]  # the tail first; job 2 next time


def test_started_early_holds_for_every_link():
    state, prefill, _asked = cluster()
    job3 = queue_behind(state, prefill, 3, 2)
    job3.status[0] = RUNNING  # its launch reply said started: jobs 1 and 2 ended there, unknown here yet
    # job 3 may have a chain of its own (it runs: 4 behind it, 5 behind 4); job 2 and job 1 stay taken
    assert named(prefill, state) == [(4, 3), (5, 4)]
    assert prefill.started_early == {3: 2}
    prefill.unqueued(UnitUnqueued("h1", "u2", "started", 5.0, None), 5.0)  # job 2's start arrives
    assert prefill.started_early == {3: 2, 2: 1}
    assert [pred for _job, pred in named(prefill, state)] == [3, 4]
    state.active.pop(1), state.active.pop(2)  # both ends applied
    named(prefill, state)
    assert not prefill.started_early


def test_only_a_chains_tail_is_withdrawn():
    state, prefill, asked = cluster()
    queue_behind(state, prefill, 3, 2)
    named(prefill, state, hosts=ROOM)  # h2 is free: one of the chain could go there now
    assert asked == ["u3"]  # the tail, not job 2 (its follower would have to move on)
    state, prefill, asked = cluster(depth=1)
    named(prefill, state, hosts=ROOM)
    assert asked == ["u2"]  # a chain of one: its tail is its head


def test_a_killed_middle_passes_its_follower_on_and_the_unit_before_stays_taken():
    state, prefill, _asked = cluster()
    job3 = queue_behind(state, prefill, 3, 2)
    state.active.pop(2)  # killed in h1's queue: ended unstarted, no word of its queue
    assert named(prefill, state) == [(4, 3)]  # behind the tail; nothing second behind job 1
    assert state.behind == {3: 1} and job3.after == 1
    assert prefill.hidden(frozenset()) == {3}  # it holds nothing beside job 1, which runs
    assert prefill.hidden(frozenset({1})) == set()  # job 1 ends: job 3 holds its own


def test_a_withdrawn_or_refused_middle_passes_its_follower_on():
    for status in ("withdrawn", "refused"):
        state, prefill, _asked = cluster()
        job3 = queue_behind(state, prefill, 3, 2)
        prefill.unqueued(UnitUnqueued("h1", "u2", status, None, "x"), 5.0)
        assert state.behind == {3: 1} and job3.after == 1


def test_a_chain_dropped_at_the_lease_end_never_launches_a_follower_beside_its_predecessor():
    state, prefill, _asked = cluster()
    job3 = queue_behind(state, prefill, 3, 2)
    error = "dropped from the queue: this host's lease ran out"
    prefill.unqueued(UnitUnqueued("h1", "u2", "dropped", None, error), 5.0)
    prefill.unqueued(UnitUnqueued("h1", "u3", "dropped", None, error), 5.0)
    assert prefill.units.to_launch == ["u2"]  # behind the unit that ran: launched again, as before
    assert [r.job_id for r in state.unrecorded_requeues] == [3]  # behind one launched again: PEND
    assert job3.ending and job3.status[0] == NEW and 3 not in state.behind


def test_a_restart_finds_a_killed_middles_follower_behind_the_unit_before_it():
    behind = {3: 2}
    active = {1: SimpleNamespace(after=None), 3: SimpleNamespace(after=2)}
    rows = {2: SimpleNamespace(start_time=None)}
    store = SimpleNamespace(jobs=lambda ids: [rows[i] for i in ids if i in rows],
                            events=lambda job_id: [(1.0, "dispatched", {"queued": queued_reason("h1", 1)})])
    recover_chains(behind, active, store)
    assert behind == {3: 1} and active[3].after == 1
    rows[2] = SimpleNamespace(start_time=4.0)  # it ran: what it followed has ended too
    behind = {3: 2}
    active[3].after = 2
    recover_chains(behind, active, store)
    assert behind == {3: 2}


def test_the_depth_is_one_or_more_and_eight_by_default():
    config = {"cluster": "c", "hosts": [{"name": "h1", "slots": 1, "mem": "1G"}],
              "queues": [{"name": "normal", "default": True}]}
    assert ClusterConfig.model_validate(config).controller.prefill_depth == 8
    for wrong in (0, -1, 9, "deep"):
        with pytest.raises(ValidationError):
            ClusterConfig.model_validate({**config, "controller": {"prefill_depth": wrong}})


def test_one_session_fills_a_chain_to_the_depth():
    state, prefill, _asked = cluster(depth=3)
    assert named(prefill, state) == [(3, 2), (4, 3)]  # 1 <- 2 <- 3 <- 4: three deep, in one session
    state, prefill, _asked = cluster(depth=2)
    del state.behind[2], state.active[2]  # job 1 runs with nothing behind it
    assert named(prefill, state) == [(3, 1), (4, 3)]


def test_a_later_round_keeps_a_dispatchs_order():
    state, prefill, _asked = cluster(depth=3)
    del state.behind[2], state.active[2]
    big = PendingJob(6, "alice", "normal", JobRequest(6, 2, None, parse("")), 5)  # first, fits no one slot
    state.pending.add(big)
    assert named(prefill, state) == [(3, 1)]  # behind the unit that runs; job 3 ranks after job 6: no more


def test_while_a_withdrawal_is_in_flight_a_session_names_one_link_per_chain():
    state, prefill, _asked = cluster(depth=3)
    prefill.why[9] = "job 8 ranks before it"  # asked off a queue, not answered: job 9 may pend again soon
    assert named(prefill, state) == [(3, 2)]  # no second round: job 9 may rank before job 4
    state, prefill, _asked = cluster(depth=3)
    job9 = queue_behind(state, prefill, 9, 2)
    prefill.unqueued(UnitUnqueued("h1", "u9", "withdrawn", None, None), 5.0)  # answered: PEND after this tick
    assert prefill.why == {} and [r.job_id for r in state.unrecorded_requeues] == [9]
    assert named(prefill, state) == [(3, 2)]
    state.active.pop(job9.id)  # the requeue applied: job 9 pends
    assert named(prefill, state) == [(3, 2), (4, 3)]


def test_a_link_whose_launch_reply_says_it_started_wakes_the_tick_only_when_nobody_follows_it():
    """A successor launched after its predecessor ended starts at once; its reply ("started") comes
    before any unqueued. With a job queued behind it the chain goes on without a tick (it is refilled
    when it runs short: quiet_ends.py); the chain's last link, with none behind it, may take one now."""
    state, prefill, _asked = cluster(depth=3)
    queue_behind(state, prefill, 3, 2)  # 1 runs, 2 behind it, 3 behind 2
    state.active.pop(1)  # job 1 ended (applied)
    state.active[2].status[0] = RUNNING  # job 2's launch reply: started
    state.dirty = False
    state.wake.clear()
    prefill.hidden(frozenset())
    assert 2 not in state.behind and state.behind == {3: 2}
    assert not state.dirty and not state.wake.is_set()  # job 3 follows it: no tick for this
    state.active.pop(2)  # job 2 ended too, and job 3's reply says it started: nothing follows job 3
    state.active[3].status[0] = RUNNING
    prefill.hidden(frozenset())
    assert state.behind == {} and state.dirty and state.wake.is_set()
