"""sched/prefill.py: the pure choice of each running unit's successor (issue 18): it fits inside the
unit's allocation on that host, one per unit and one unit per job, in a dispatch's order, and none
where the order or a rule cannot be kept."""

from __future__ import annotations

from dataclasses import replace

from tests.support.sched import G, job, snap
from xce_lite.sched import prefill
from xce_lite.sched.core import PendingJob, QueuePolicy, schedule
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.prefill import (
    QueuedSuccessor,
    RunningUnit,
    outranked,
    queued_reason,
    successors,
    withdrawals,
)
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


def gives_way(snapshot, queued, units, placed=frozenset()) -> list[tuple[int, int]]:
    """(queued successor, the pending job of higher rank it gives way to) after a real session."""
    return list(outranked(snapshot, schedule(snapshot), tuple(queued), tuple(units), frozenset(placed)))


def test_a_queued_successor_gives_way_to_a_pending_job_of_higher_rank_that_fits_inside_its_unit():
    behind_a = QueuedSuccessor(job(70), "h1", 1)  # 70 queued behind unit 1, every slot busy
    a = unit(1, taken=True)
    # a job submitted later to a queue of higher priority, or with a higher -sp priority: 70 gives way
    assert gives_way(snap([full_host()], [job(71, queue="high")], {"normal": 30, "high": 50}), [behind_a], [a]) \
        == [(70, 71)]
    assert gives_way(snap([full_host()], [replace(job(72), priority=5)]), [behind_a], [a]) == [(70, 72)]
    # equal rank (a later id) or lower: nothing
    assert gives_way(snap([full_host()], [job(73)]), [behind_a], [a]) == []
    assert gives_way(snap([full_host()], [job(74, queue="low")], {"normal": 30, "low": 10}), [behind_a], [a]) == []
    # of higher rank but it does not fit inside unit 1 (more memory, more slots, other rules): nothing
    high = {"normal": 30, "high": 50}
    for big in (job(75, queue="high", R="rusage[mem=6G]"), job(76, queue="high", slots=2),
                job(77, queue="high", R="select[type==arm]")):
        assert gives_way(snap([full_host()], [big], high), [behind_a], [a]) == [], big
    only_h2 = replace(snap([full_host()], [job(78, queue="high")], high),
                      queues=(QueuePolicy("normal", 30), QueuePolicy("high", 50, hosts=frozenset({"h2"}))))
    assert gives_way(only_h2, [behind_a], [a]) == []  # its queue's hosts do not name h1


def test_a_job_of_higher_rank_placed_or_named_elsewhere_displaces_nobody_and_each_takes_one_place():
    high = {"normal": 30, "high": 50}
    a, b = unit(1, taken=True), unit(2, taken=True)
    first, second = QueuedSuccessor(job(80), "h1", 1), QueuedSuccessor(job(81), "h1", 2)
    # one job of higher rank: the last-ranked successor gives way, the other keeps its place
    assert gives_way(snap([full_host()], [job(82, queue="high")], high), [first, second], [a, b]) == [(81, 82)]
    # two of them: both give way, the higher-ranked job taking the later successor's place
    both = snap([full_host()], [job(82, queue="high"), job(83, queue="high")], high)
    assert gives_way(both, [first, second], [a, b]) == [(81, 82), (80, 83)]
    # named a successor of a free unit in this session, or dispatched by it: nobody gives way to it
    assert gives_way(snap([full_host()], [job(82, queue="high")], high), [first], [a], placed={82}) == []
    free = HostView("h1", "ok", {"slots": 2, "mem": 8 * G}, {"slots": 1, "mem": 4 * G})
    assert gives_way(snap([free], [job(84, queue="high")], high), [first], [a]) == []  # 84 is dispatched
    # a held (blocked) job is no candidate; nor is any while a reservation is held
    blocked = replace(job(85, queue="high"), blocked="done(9)")
    assert gives_way(snap([full_host()], [blocked], high), [first], [a]) == []
    big = PendingJob(86, "alice", "high", JobRequest(86, 2, None, parse("")))
    reserving = replace(snap([full_host()], [big, job(87, queue="high")], high), now=100.0, reserve_after=10.0)
    assert gives_way(reserving, [first], [a]) == []  # 86 holds a reservation: successors() names nobody


def test_after_the_withdrawal_the_next_session_names_the_job_of_higher_rank_there_and_no_thrash():
    high = {"normal": 30, "high": 50}
    s = snap([full_host()], [job(91, queue="high")], high)
    assert gives_way(s, [QueuedSuccessor(job(90), "h1", 1)], [unit(1, taken=True)]) == [(90, 91)]
    # the host dropped 90: it is pending again beside 91; unit 1 is free
    after = snap([full_host()], [job(90), job(91, queue="high")], high)
    assert chosen(after, [unit(1)]) == [(91, 1, "h1")]
    # and 91 queued there, 90 pending, displaces nobody: it ranks after 91
    assert gives_way(snap([full_host()], [job(90)], high), [QueuedSuccessor(job(91, queue="high"), "h1", 1)],
                     [unit(1, taken=True)]) == []


def test_a_backlog_costs_no_more_than_the_examined_jobs():
    high = {"normal": 30, "high": 50}
    # 101 and 102 rank before 70; 101 does not fit inside unit 1 (two slots), 102 does
    s = snap([full_host()], [job(101, queue="high", slots=2), job(102, queue="high")], high)
    behind_a, a = QueuedSuccessor(job(70), "h1", 1), unit(1, taken=True)
    assert list(outranked(s, schedule(s), (behind_a,), (a,))) == [(70, 102)]
    assert list(outranked(s, schedule(s), (behind_a,), (a,), examined=1)) == []  # 102 is not looked at


def test_a_shape_is_passed_over_only_once_placement_refused_it_inside_every_free_unit():
    """10 and 11 have one shape (2 slots): 10 is refused inside unit 1 by placement (one slot) and
    behind unit 2 by its user's limit (unit 2 is another queue's: it gives back nothing), so the
    shape is not hopeless and 11 (another user) still goes behind unit 2."""
    s = replace(snap([full_host(slots=3, mem=12 * G)], [job(10, slots=2), job(11, slots=2, user="bob")]),
                queues=(QueuePolicy("normal", 30, user_running_limit=2), QueuePolicy("other", 30)),
                running=(("normal", "alice", 1), ("other", "carol", 2)))
    one, two = unit(1), unit(2, slots=2, mem=8 * G, queue="other", user="carol")
    assert chosen(s, [one, two]) == [(11, 2, "h1")]
    queued = (QueuedSuccessor(job(50), "h1", 1), QueuedSuccessor(job(51, slots=2), "h1", 2))
    assert gives_way(s, queued, (replace(one, taken=True), replace(two, taken=True))) == [(51, 11)]


def test_a_backlog_too_big_for_every_unit_is_tried_once_per_unit_not_once_per_job(monkeypatch):
    s = snap([full_host("h1"), full_host("h2")], [job(i, slots=2) for i in range(10, 110)])
    units = (unit(1, "h1"), unit(2, "h1"), unit(3, "h2"))
    tries = []
    real = prefill._Room.behind
    monkeypatch.setattr(prefill._Room, "behind", lambda room, *args: tries.append(args) or real(room, *args))
    assert chosen(s, units) == [] and len(tries) == 3  # job 10 in each unit; 11-109 are passed over
    tries.clear()
    queued = tuple(QueuedSuccessor(job(200 + u.job_id), u.host, u.job_id) for u in units)
    assert gives_way(s, queued, tuple(replace(u, taken=True) for u in units)) == [] and len(tries) == 3
