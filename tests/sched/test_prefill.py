"""sched/prefill.py: the pure choice of each running unit's successor (issue 18): it fits inside the
unit's allocation on that host, one per unit and one unit per job, in a dispatch's order, and none
where the order or a rule cannot be kept."""

from __future__ import annotations

from dataclasses import replace

from tests.support.sched import G, job, snap
from xce_lite.sched.core import PendingJob, QueuePolicy, schedule
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.prefill import QueuedSuccessor, RunningUnit, queued_reason, successors, withdrawals
from xce_lite.sched.reasons import FrozenMap
from xce_lite.sched.resreq import parse


def full_host(name: str = "h1", slots: int = 2, mem: int = 8 * G, attrs: dict | None = None) -> HostView:
    """A host whose every slot and byte is taken by running units."""
    total = {"slots": slots, "mem": mem}
    return HostView(name, "ok", total, {"slots": 0, "mem": 0}, attrs=attrs or {})


def unit(job_id: int, host: str = "h1", slots: int = 1, mem: int = 4 * G, queue: str = "normal",
         user: str = "alice", taken: bool = False) -> RunningUnit:
    return RunningUnit(job_id, host, queue, user, FrozenMap({"slots": slots, "mem": mem}), taken=taken)


def chosen(snapshot, running) -> list[tuple[int, int, str]]:
    """(successor, predecessor, host) for what successors() names after a real session."""
    decisions = schedule(snapshot)
    return [(s.job_id, s.after, s.host) for s in successors(snapshot, decisions, tuple(running))]


def test_a_successor_fits_inside_its_predecessors_allocation_and_only_there():
    s = snap([full_host()], [job(10, R="rusage[mem=6G]"), job(11, slots=2), job(12, R="rusage[mem=3G]")])
    # 10 asks more memory than one unit holds, 11 more slots: neither fits inside a unit
    assert chosen(s, [unit(1), unit(2)]) == [(12, 1, "h1")]
    found = successors(s, schedule(s), (unit(1, slots=2, mem=8 * G),))
    assert [x.job_id for x in found] == [10]  # a unit that holds both slots and all memory takes 10 first
    assert found[0].placement.allocs[0].reserved["mem"] == 6 * G
    assert found[0].reason == queued_reason("h1", 1) == "queued on h1 behind job 1"


def test_one_successor_per_unit_one_unit_per_job_in_dispatch_order():
    jobs = [job(20), job(21, queue="high"), job(22), replace(job(23), priority=5)]
    s = snap([full_host()], jobs, {"normal": 30, "high": 50})
    # high queue first, then -sp, then id: 21, 23, 20, 22; two free units, one already taken
    assert chosen(s, [unit(1), unit(2), unit(3, taken=True)]) == [(21, 1, "h1"), (23, 2, "h1")]
    assert chosen(s, [unit(3, taken=True)]) == []


def test_select_rules_queue_hosts_and_limits_hold_as_for_a_dispatch():
    hosts = [full_host("h1", attrs={"type": "x86"}), full_host("h2", attrs={"type": "arm"})]
    arm = job(30, R="select[type==arm]")
    s = snap(hosts, [arm])
    assert chosen(s, [unit(1, "h1"), unit(2, "h2")]) == [(30, 2, "h2")]
    only_h1 = replace(s, queues=(QueuePolicy("normal", 30, hosts=frozenset({"h1"})),))
    assert chosen(only_h1, [unit(1, "h1"), unit(2, "h2")]) == []
    # a queue at its running limit: a unit of the same queue gives its slot back, another's does not
    limited = replace(snap([full_host()], [job(31)]), queues=(QueuePolicy("normal", 30, running_limit=1),
                                                               QueuePolicy("other", 30)),
                      running=(("normal", "alice", 1), ("other", "bob", 1)))
    assert chosen(limited, [unit(1, queue="other", user="bob")]) == []
    assert chosen(limited, [unit(2, queue="normal")]) == [(31, 2, "h1")]


def test_none_where_a_rule_is_not_modelled_or_the_host_takes_nothing():
    s = snap([full_host()], [job(40)])
    assert chosen(replace(s, hosts=(replace(full_host(), state="closed"),)), [unit(1)]) == []
    reserving = replace(snap([full_host()], [PendingJob(41, "alice", "normal", JobRequest(41, 2, None, parse("")))]),
                        now=100.0, reserve_after=10.0)
    assert chosen(reserving, [unit(1)]) == []  # job 41 holds a reservation: nobody jumps ahead of it
    dispatched_now = snap([HostView("h1", "ok", {"slots": 2, "mem": 8 * G}, {"slots": 1, "mem": 4 * G})],
                          [job(42), job(43)])
    assert chosen(dispatched_now, [unit(1)]) == [(43, 1, "h1")]  # 42 took the free slot: 43 follows unit 1


def withdrawn(snapshot, queued) -> list[tuple[int, str]]:
    """(successor, the host a dispatch would place it on) for what withdrawals() names after a real session."""
    return [(job_id, p.allocs[0].host) for job_id, p in withdrawals(snapshot, schedule(snapshot), tuple(queued))]


def test_a_queued_successor_is_withdrawn_only_where_a_dispatch_could_place_it_now():
    waiting = [QueuedSuccessor(job(50), "h1", 1), QueuedSuccessor(job(51), "h1", 2)]
    # every slot busy (the one-host case prefill is for): nothing is free, nobody is withdrawn
    assert withdrawn(snap([full_host("h1"), full_host("h2")], []), waiting) == []
    # one slot frees on h2: the first successor in dispatch order takes it, the other stays queued
    freed = HostView("h2", "ok", {"slots": 2, "mem": 8 * G}, {"slots": 1, "mem": 4 * G})
    assert withdrawn(snap([full_host("h1"), freed], []), waiting) == [(50, "h2")]
    # a free slot of its own host counts the same
    own = HostView("h1", "ok", {"slots": 2, "mem": 8 * G}, {"slots": 1, "mem": 4 * G})
    assert withdrawn(snap([own], []), waiting[:1]) == [(50, "h1")]
    # the session's own dispatches come first: a pending job took the free slot
    assert withdrawn(snap([full_host("h1"), freed], [job(52)]), waiting) == []
    # it must fit as a dispatch: its select rules and its queue's hosts hold
    arm = QueuedSuccessor(job(53, R="select[type==arm]"), "h1", 1)
    assert withdrawn(snap([full_host("h1"), freed], []), [arm]) == []
    only_h1 = replace(snap([full_host("h1"), freed], []), queues=(QueuePolicy("normal", 30, hosts=frozenset({"h1"})),))
    assert withdrawn(only_h1, waiting) == []
    # a closed host's room is nobody's
    assert withdrawn(snap([full_host("h1"), replace(freed, state="closed")], []), waiting) == []


def test_no_withdrawal_while_a_reservation_is_held_or_after_an_incomplete_session():
    freed = HostView("h2", "ok", {"slots": 2, "mem": 8 * G}, {"slots": 1, "mem": 4 * G})
    waiting = [QueuedSuccessor(job(60), "h1", 1)]
    big = PendingJob(61, "alice", "normal", JobRequest(61, 2, None, parse("")))
    reserving = replace(snap([full_host("h1"), freed], [big]), now=100.0, reserve_after=10.0)
    assert withdrawn(reserving, waiting) == []  # job 61 holds h2's free slot for itself
    s = snap([full_host("h1"), freed], [])
    assert withdrawals(s, None, tuple(waiting))[0][0] == 60  # no session ran (nothing pending): still named
    incomplete = replace(schedule(s), complete=False)
    assert withdrawals(s, incomplete, tuple(waiting)) == ()
