"""sched/core.py: the pure scheduler.

Builders `host(...)`, `job(...)` and `snap(...)` make snapshots; `check_decisions` is the invariant
check every test runs on what `schedule` returns (tako's `sanity_check`).
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_lite.sched.core import HOST_OK, Decisions, HostState, PendingJob, Snapshot, schedule

# ---- builders ---------------------------------------------------------------------------------


def host(name: str, slots: int = 4, used: int = 0, state: str = HOST_OK) -> HostState:
    return HostState(name=name, slots=slots, used=used, state=state)


def job(id: int, slots: int = 1, queue: str = "normal", user: str = "alice") -> PendingJob:
    return PendingJob(id=id, user=user, queue=queue, slots=slots)


def snap(hosts: list[HostState], jobs: list[PendingJob], priority: dict[str, int] | None = None) -> Snapshot:
    return Snapshot(hosts=tuple(hosts), jobs=tuple(jobs),
                    queue_priority=tuple(sorted((priority or {"normal": 30}).items())))


def check_decisions(snapshot: Snapshot, decisions: Decisions) -> None:
    """Invariants that hold for any snapshot, whatever the policy."""
    hosts = {h.name: h for h in snapshot.hosts}
    jobs = {j.id: j for j in snapshot.jobs}
    dispatched = [d.job_id for d in decisions.dispatches]
    waiting = [job_id for job_id, _ in decisions.pend_reasons]
    assert len(set(dispatched)) == len(dispatched), "a job dispatched twice"
    assert len(set(waiting)) == len(waiting), "a job with two pend reasons"
    assert not set(dispatched) & set(waiting), "a job both dispatched and pending"
    assert set(dispatched) | set(waiting) <= set(jobs), "a decision about a job not in the snapshot"
    if decisions.complete:
        assert set(dispatched) | set(waiting) == set(jobs), "a job neither dispatched nor given a reason"
    assert all(isinstance(reason, str) and reason for _, reason in decisions.pend_reasons)
    taken = {name: 0 for name in hosts}
    for d in decisions.dispatches:
        assert sum(tasks for _, tasks in d.hosts) == jobs[d.job_id].slots
        for name, tasks in d.hosts:
            assert tasks >= 1
            assert hosts[name].state == HOST_OK, f"job {d.job_id} put on {hosts[name].state} host {name}"
            taken[name] += tasks
    for name, count in taken.items():
        if count:
            assert hosts[name].used + count <= hosts[name].slots, f"host {name} over-allocated"


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


def test_job_goes_to_the_first_host_in_snapshot_order_with_room() -> None:
    decisions = run(snap([host("full", slots=4, used=4), host("small", slots=1), host("big", slots=8)],
                         [job(1, slots=2), job(2, slots=1)]))
    assert placed(decisions) == {1: "big", 2: "small"}
    assert decisions.dispatches[0].hosts == (("big", 2),)


def test_used_slots_are_not_free() -> None:
    decisions = run(snap([host("h1", slots=4, used=3)], [job(1, slots=2)]))
    assert placed(decisions) == {}
    assert reasons(decisions) == {1: "not enough free slots: needs 2, at most 1 free on any host"}


def test_job_bigger_than_any_open_host_says_so() -> None:
    decisions = run(snap([host("h1", slots=4), host("h2", slots=8), host("huge", slots=64, state="closed")],
                         [job(1, slots=16)]))
    assert placed(decisions) == {}
    assert reasons(decisions) == {1: "needs 16 slots on one host; the largest open host has 8"}


def test_smaller_jobs_start_past_one_that_does_not_fit() -> None:
    # no reservation yet: a big job waiting does not hold back a small one behind it
    decisions = run(snap([host("h1", slots=4, used=2)], [job(1, slots=4), job(2, slots=2)]))
    assert placed(decisions) == {2: "h1"}
    assert "needs 4" in reasons(decisions)[1]


@pytest.mark.parametrize("state", ["closed", "unreachable"])
def test_hosts_not_ok_get_nothing(state: str) -> None:
    decisions = run(snap([host("off", slots=64, state=state), host("on", slots=2)],
                         [job(i) for i in range(1, 6)]))
    assert placed(decisions) == {1: "on", 2: "on"}
    assert set(reasons(decisions)) == {3, 4, 5}


@pytest.mark.parametrize("hosts", [[], [host("a", state="closed"), host("b", state="unreachable")]])
def test_no_open_host_is_a_reason_for_every_job(hosts: list[HostState]) -> None:
    decisions = run(snap(hosts, [job(1), job(2, slots=3)]))
    assert decisions.dispatches == ()
    assert reasons(decisions) == {1: "no host is open: every host is closed or unreachable",
                                  2: "no host is open: every host is closed or unreachable"}
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


# ---- properties -------------------------------------------------------------------------------

QUEUES = ("high", "normal", "low", "unlisted")


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


budgets = st.one_of(st.just(1_000_000), st.integers(0, 45))


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
    free = {h.name: (h.slots - h.used if h.state == HOST_OK else 0) for h in snapshot.hosts}
    for d in decisions.dispatches:
        for name, tasks in d.hosts:
            free[name] -= tasks
    slots = {j.id: j.slots for j in snapshot.jobs}
    for job_id, _ in decisions.pend_reasons:
        assert all(room < slots[job_id] for room in free.values()), f"job {job_id} waits beside room for it"


@given(snapshot=snapshots())
def test_priority_order_is_respected_among_dispatched_jobs(snapshot: Snapshot) -> None:
    priority = dict(snapshot.queue_priority)
    queue = {j.id: j.queue for j in snapshot.jobs}
    keys = [(-priority.get(queue[d.job_id], 0), d.job_id) for d in run(snapshot).dispatches]
    assert keys == sorted(keys)
