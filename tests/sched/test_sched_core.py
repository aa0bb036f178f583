"""sched/core.py: the pure scheduler.

Builders `host(...)`, `job(...)` and `snap(...)` (tests/support/sched.py) make snapshots;
`check_decisions` there is the invariant check every test runs on what `schedule` returns (tako's
`sanity_check`).
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.sched import QUEUES, budgets, check_decisions, host, job, snap
from xce_lite.sched.core import (
    HOST_OK,
    Decisions,
    PendingJob,
    QueuePolicy,
    Snapshot,
    schedule,
)
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.reasons import Refusal

# ---- helpers ----------------------------------------------------------------------------------


def run(snapshot: Snapshot, budget: int = 1_000_000) -> Decisions:
    decisions = schedule(snapshot, budget=budget)
    check_decisions(snapshot, decisions)
    return decisions


def placed(decisions: Decisions) -> dict[int, str]:
    return {d.job_id: d.hosts[0][0] for d in decisions.dispatches}


def reasons(decisions: Decisions) -> dict[int, str]:
    return dict(decisions.pend_reasons)


# ---- table tests ------------------------------------------------------------------------------


def test_higher_priority_queue_goes_first_whatever_the_job_id() -> None:
    decisions = run(snap([host("h1", slots=2)],
                         [job(1, slots=2, queue="low"), job(2, slots=2, queue="high")],
                         {"low": 10, "high": 50}))
    assert placed(decisions) == {2: "h1"}
    assert set(reasons(decisions)) == {1}


def test_same_priority_goes_in_submit_order() -> None:
    decisions = run(snap([host("h1", slots=2)], [job(3), job(1), job(2)]))
    assert placed(decisions) == {1: "h1", 2: "h1"}
    assert set(reasons(decisions)) == {3}


def test_dispatches_come_out_in_priority_then_submit_order() -> None:
    decisions = run(snap([host("h1", slots=10)],
                         [job(4, queue="low"), job(3, queue="high"), job(2, queue="low"), job(1, queue="high")],
                         {"low": 1, "high": 2}))
    assert [d.job_id for d in decisions.dispatches] == [1, 3, 2, 4]


def test_hosts_are_taken_in_name_order_each_filled_as_far_as_it_goes() -> None:
    decisions = run(snap([host("full", slots=4, used=4), host("small", slots=1), host("big", slots=8)],
                         [job(1, slots=2), job(2, slots=7)]))
    assert placed(decisions) == {1: "big", 2: "big"}
    assert decisions.dispatches[0].hosts == (("big", 2),)
    assert decisions.dispatches[1].hosts == (("big", 6), ("small", 1))  # a job may span hosts


def test_used_slots_are_not_free() -> None:
    decisions = run(snap([host("h1", slots=4, used=3)], [job(1, slots=2)]))
    assert placed(decisions) == {}
    assert reasons(decisions) == {1: "needs at least 2 tasks, at most 1 fit"}


def test_job_bigger_than_the_open_hosts_says_so() -> None:
    decisions = run(snap([host("h1", slots=4), host("h2", slots=8), host("huge", slots=64, state="closed")],
                         [job(1, slots=16)]))
    assert placed(decisions) == {}
    assert reasons(decisions) == {1: "needs at least 16 tasks, at most 12 fit; huge: closed"}


def test_smaller_jobs_start_past_one_that_does_not_fit() -> None:
    # no reservation yet: a big job waiting does not hold back a small one behind it
    decisions = run(snap([host("h1", slots=4, used=2)], [job(1, slots=4), job(2, slots=2)]))
    assert placed(decisions) == {2: "h1"}
    assert reasons(decisions)[1] == "needs at least 4 tasks, at most 2 fit"


@pytest.mark.parametrize("state", ["closed", "unreachable"])
def test_hosts_not_ok_get_nothing(state: str) -> None:
    decisions = run(snap([host("off", slots=64, state=state), host("on", slots=2)],
                         [job(i) for i in range(1, 6)]))
    assert placed(decisions) == {1: "on", 2: "on"}
    assert set(reasons(decisions)) == {3, 4, 5}


@pytest.mark.parametrize("hosts", [[], [host("a", state="closed"), host("b", state="unreachable")]])
def test_no_open_host_is_a_reason_for_every_job(hosts: list[HostView]) -> None:
    decisions = run(snap(hosts, [job(1), job(2, slots=3)]))
    assert decisions.dispatches == ()
    expected = "a: closed; b: unreachable" if hosts else "no hosts"
    assert reasons(decisions) == {1: expected, 2: expected}
    assert decisions.complete


def test_nothing_pending_is_complete_and_empty() -> None:
    assert run(snap([host("h1")], [])) == Decisions(dispatches=(), waiting=(), complete=True)


def test_budget_exhaustion_says_incomplete_and_decides_only_what_it_examined() -> None:
    jobs = [job(5, queue="low"), job(4, slots=99), job(3), job(2), job(1)]
    decisions = run(snap([host("h1", slots=10)], jobs, {"normal": 30, "low": 10}), budget=3)
    assert decisions.complete is False
    # examined in priority, then id, order: 1, 2, 3; jobs 4 and 5 keep their previous reasons
    assert placed(decisions) == {1: "h1", 2: "h1", 3: "h1"}
    assert reasons(decisions) == {}


@pytest.mark.parametrize(("budget", "complete"), [(0, False), (1, False), (2, True), (3, True)])
def test_budget_boundary(budget: int, complete: bool) -> None:
    decisions = run(snap([host("h1")], [job(1), job(2)]), budget=budget)
    assert decisions.complete is complete
    assert len(decisions.dispatches) == min(budget, 2)


def test_every_job_not_dispatched_has_exactly_one_reason() -> None:
    jobs = [job(1, slots=3), job(2, slots=3), job(3, slots=100), job(4, slots=1), job(5, slots=2)]
    decisions = run(snap([host("h1", slots=4), host("h2", slots=2, used=1)], jobs))
    assert placed(decisions) == {1: "h1", 4: "h1"}
    waiting = [job_id for job_id, _ in decisions.pend_reasons]
    assert sorted(waiting) == [2, 3, 5]


def test_snapshot_and_decisions_cross_a_process_pool() -> None:
    snapshot = snap([host("h1", slots=3), host("h2", slots=1, state="closed")],
                    [job(1, slots=2), job(2, slots=2, queue="high"), job(3)], {"normal": 30, "high": 90})
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        remote = pool.submit(schedule, snapshot, 1000).result(timeout=60)
    assert remote == schedule(snapshot, 1000)


def test_a_task_range_starts_with_what_fits_now() -> None:
    """The XCE bug: a 2..5 task job pended while 2 slots were free."""
    decisions = run(snap([host("h1", slots=4, used=2)], [job(1, slots=2, max_slots=5)]))
    assert decisions.dispatches[0].hosts == (("h1", 2),)


def test_a_cache_hit_gives_the_full_reason_of_the_attempt_that_proved_it() -> None:
    """The XCE bug: jobs answered from the session cache came back with an empty reason."""
    same = [job(i, slots=2, R="rusage[mem=8G]") for i in (1, 2, 3)]
    h1 = HostView("h1", "ok", {"slots": 4, "mem": 4 * 2**30})
    decisions = run(snap([h1], same))
    assert set(reasons(decisions).values()) == {"h1: mem needed 8G, free 4G"}
    assert len(decisions.waiting) == 1 and decisions.waiting[0][1] == (1, 2, 3)


def test_a_dispatch_makes_the_next_job_of_the_same_shape_look_again() -> None:
    jobs = [job(1, slots=2), job(2, slots=2), job(3, slots=2)]
    decisions = run(snap([host("h1", slots=4)], jobs))
    assert placed(decisions) == {1: "h1", 2: "h1"}
    assert reasons(decisions) == {3: "h1: slots needed 1, free 0"}


# ---- properties -------------------------------------------------------------------------------


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    names = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), unique=True, max_size=6))
    hosts = []
    for name in names:
        slots = draw(st.integers(1, 16))
        hosts.append(host(name, slots=slots, used=draw(st.integers(0, slots)),
                          state=draw(st.sampled_from((HOST_OK, HOST_OK, "closed", "unreachable")))))
    ids = draw(st.lists(st.integers(1, 10_000), unique=True, max_size=40))
    jobs = [job(i, slots=draw(st.integers(1, 20)), queue=draw(st.sampled_from(QUEUES)),
                user=draw(st.sampled_from(("alice", "bob")))) for i in ids]
    priority = draw(st.dictionaries(st.sampled_from(QUEUES[:3]), st.integers(0, 100)))
    return snap(hosts, jobs, priority)


@given(snapshot=snapshots(), budget=budgets)
def test_never_over_allocates_and_only_uses_ok_hosts(snapshot: Snapshot, budget: int) -> None:
    run(snapshot, budget)  # check_decisions holds the assertions


@given(snapshot=snapshots(), budget=budgets)
def test_budget_decides_completeness(snapshot: Snapshot, budget: int) -> None:
    decisions = run(snapshot, budget)
    assert decisions.complete == (len(snapshot.jobs) <= budget)
    examined = len(decisions.dispatches) + len(decisions.pend_reasons)
    assert examined == min(budget, len(snapshot.jobs))


@given(snapshot=snapshots(), budget=budgets)
def test_same_snapshot_same_decisions_byte_for_byte(snapshot: Snapshot, budget: int) -> None:
    first = schedule(snapshot, budget)
    assert schedule(snapshot, budget) == first
    copy = pickle.loads(pickle.dumps(snapshot))
    assert copy == snapshot
    again = schedule(copy, budget)
    assert again == first
    assert pickle.dumps(again) == pickle.dumps(first)
    assert pickle.loads(pickle.dumps(first)) == first


@given(snapshot=snapshots())
def test_a_waiting_job_could_not_fit_anywhere_once_the_others_are_placed(snapshot: Snapshot) -> None:
    # free slots only shrink during a session, so a job that did not fit when examined still does not
    decisions = run(snapshot)
    free = {h.name: (h.free["slots"] if h.state == HOST_OK else 0) for h in snapshot.hosts}
    for d in decisions.dispatches:
        for name, tasks in d.hosts:
            free[name] -= tasks
    slots = {j.id: j.request.min_tasks for j in snapshot.jobs}
    for job_id, _ in decisions.pend_reasons:  # tasks may spread over hosts: the total must be short
        assert sum(free.values()) < slots[job_id], f"job {job_id} waits beside room for it"


@given(snapshot=snapshots())
def test_priority_order_is_respected_among_dispatched_jobs(snapshot: Snapshot) -> None:
    priority = {q.name: q.priority for q in snapshot.queues}
    queue = {j.id: j.queue for j in snapshot.jobs}
    keys = [(-priority.get(queue[d.job_id], 0), d.job_id) for d in run(snapshot).dispatches]
    assert keys == sorted(keys)


# ---- queues as policy, job priority, the starvation guard ---------------------------------------


def test_job_priority_orders_jobs_within_a_queue() -> None:
    low, high = job(1), PendingJob(2, "alice", "normal", JobRequest(2, 1), priority=50)
    decisions = run(snap([host("h1", slots=1)], [low, high]))
    assert placed(decisions) == {2: "h1"}


def test_queue_running_limit_holds_jobs_and_cuts_task_ranges() -> None:
    queues = (QueuePolicy("normal", 30, running_limit=3),)
    jobs = [job(1, slots=1, max_slots=8), job(2, slots=2), job(3, slots=1)]
    decisions = run(Snapshot((host("h1", slots=16),), tuple(jobs), queues, running=(("normal", "bob", 1),)))
    assert decisions.dispatches[0].hosts == (("h1", 2),)  # 3 - 1 in use: the range is cut to 2
    assert reasons(decisions)[2] == "queue normal: its running limit of 3 slots is reached (3 in use)"
    assert 3 in reasons(decisions)


def test_user_running_limit_is_per_user() -> None:
    queues = (QueuePolicy("normal", 30, user_running_limit=1),)
    jobs = [job(1, user="alice"), job(2, user="alice"), job(3, user="bob")]
    decisions = run(Snapshot((host("h1", slots=8),), tuple(jobs), queues))
    assert set(placed(decisions)) == {1, 3}
    assert reasons(decisions)[2].startswith("user alice: the running limit of 1 slots per user")


def test_a_queue_uses_only_its_hosts() -> None:
    queues = (QueuePolicy("gpu", 30, hosts=frozenset({"g1"})),)
    decisions = run(Snapshot((host("a1", slots=8), host("g1", slots=1)), (job(1, queue="gpu"), job(2, queue="gpu")),
                             queues))
    assert placed(decisions) == {1: "g1"}
    assert "a1" not in reasons(decisions)[2]


def test_a_large_job_does_not_starve_behind_a_stream_of_small_ones() -> None:
    """Without the guard the big job waits forever: every slot that frees goes to the next small
    job. With it, once the big job has waited `reserve_after`, small jobs wait and it starts."""
    def run_stream(reserve_after: float) -> int | None:
        running: list[int] = [100, 101, 102, 103]  # small jobs holding the 4 slots
        next_small, now = 104, 0.0
        big = PendingJob(1, "alice", "normal", JobRequest(1, 4), submit_time=0.0)
        for _step in range(50):
            running.pop(0)  # one small job ends every step
            now += 60.0
            smalls = [PendingJob(i, "bob", "normal", JobRequest(i, 1), submit_time=now)
                      for i in range(next_small, next_small + 3)]
            h = host("h1", slots=4, used=len(running))
            decisions = run(Snapshot((h,), (big, *smalls), (QueuePolicy("normal"),),
                                     now=now, reserve_after=reserve_after))
            started = {d.job_id for d in decisions.dispatches}
            if 1 in started:
                return _step
            running.extend(sorted(started))
            next_small += 3 if started else 0
        return None

    assert run_stream(reserve_after=0) is None  # starves
    started_at = run_stream(reserve_after=600)
    assert started_at is not None and started_at <= 15


def test_the_reservation_reason_names_the_holder() -> None:
    big = PendingJob(1, "alice", "normal", JobRequest(1, 4), submit_time=0.0)
    small = PendingJob(2, "bob", "normal", JobRequest(2, 1), submit_time=1000.0)
    decisions = run(Snapshot((host("h1", slots=4, used=2),), (big, small), (QueuePolicy("normal"),),
                             now=1000.0, reserve_after=600.0))
    assert decisions.dispatches == ()
    assert "hold a reservation" in reasons(decisions)[1]
    assert reasons(decisions)[2] == "waiting behind job 1, which holds a reservation until it can start"


# ---- observing (the simulator's trace) ---------------------------------------------------------


def test_observing_reports_every_examined_job_and_changes_no_decision():
    hosts = [host("h1", slots=4), host("h2", slots=2, state="closed")]
    queues = (QueuePolicy("normal", 30), QueuePolicy("capped", 20, running_limit=1))
    jobs = (job(1, slots=3), job(2, slots=4), job(3, slots=4), job(4, queue="capped", slots=2))
    snapshot = Snapshot(hosts=tuple(hosts), jobs=jobs, queues=queues)
    seen = []
    observed = schedule(snapshot, observe=seen.append)
    assert pickle.dumps(observed) == pickle.dumps(schedule(snapshot))
    assert [(e.job_id, e.kind) for e in seen] == [(1, "dispatched"), (2, "refused"), (3, "known_unsat"),
                                                  (4, "limited")]
    assert seen[0].outcome.hosts == (("h1", 3),)
    refusal = seen[1].outcome
    assert isinstance(refusal, Refusal) and refusal.details() == (
        "needs at least 4 tasks, at most 1 fit", "h1: can take 1 task", "h2: closed")
    assert seen[2].proved_by == 2 and seen[2].outcome is None and seen[2].reason == seen[1].reason
    assert seen[3].reason.startswith("queue capped: its running limit of 1 slots")


def test_a_dispatch_ends_what_a_refusal_proved_for_the_observer_too():
    jobs = (job(1, slots=5), job(2, slots=1), job(3, slots=5))
    seen = []
    schedule(snap([host("h1", slots=4)], list(jobs)), observe=seen.append)
    assert [(e.job_id, e.kind, e.proved_by) for e in seen] == [(1, "refused", None), (2, "dispatched", None),
                                                              (3, "refused", None)]
