"""sched/core.py: the pure scheduler.

Builders `host(...)`, `job(...)` and `snap(...)` make snapshots; `check_decisions` is the invariant
check every test runs on what `schedule` returns (tako's `sanity_check`).
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sched.test_placement import reference_place, reference_take
from xce_lite.sched.core import (
    HOST_OK,
    Decisions,
    Dispatch,
    PendingJob,
    QueuePolicy,
    Snapshot,
    _within_limits,
    schedule,
    take,
)
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.reasons import FrozenMap, Refusal
from xce_lite.sched.resreq import parse

G = 1024**3

# ---- builders ---------------------------------------------------------------------------------


def host(name: str, slots: int = 4, used: int = 0, state: str = HOST_OK) -> HostView:
    return HostView(name=name, state=state, total={"slots": slots}, free={"slots": slots - used})


def job(id: int, slots: int = 1, queue: str = "normal", user: str = "alice", max_slots: int | None = None,
        R: str = "") -> PendingJob:
    return PendingJob(id=id, user=user, queue=queue, request=JobRequest(id, slots, max_slots, parse(R)))


def snap(hosts: list[HostView], jobs: list[PendingJob], priority: dict[str, int] | None = None) -> Snapshot:
    queues = tuple(QueuePolicy(name, prio) for name, prio in sorted((priority or {"normal": 30}).items()))
    return Snapshot(hosts=tuple(hosts), jobs=tuple(jobs), queues=queues)


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
        request = jobs[d.job_id].request
        assert request.min_tasks <= sum(tasks for _, tasks in d.hosts) <= request.max_tasks
        for name, tasks in d.hosts:
            assert tasks >= 1
            assert hosts[name].state == HOST_OK, f"job {d.job_id} put on {hosts[name].state} host {name}"
            taken[name] += tasks
    for name, count in taken.items():
        if count:
            assert count <= hosts[name].free["slots"], f"host {name} over-allocated"


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


# ---- the session against the reference: schedule() as it was, with the unoptimised place ---------
#
# `reference_schedule` is `schedule` before the session caches (commit 4cef351): every search is a
# full `reference_place` over the queue's hosts, a dispatch rebuilds the host list (`reference_take`),
# and the refusal cache is keyed by queue. The optimised schedule must decide exactly the same.


def reference_schedule(snapshot: Snapshot, budget: int = 1_000_000) -> Decisions:
    queues = {q.name: q for q in snapshot.queues}
    no_policy = QueuePolicy("", priority=0)

    def rank(job: PendingJob) -> tuple:
        return (-queues.get(job.queue, no_policy).priority, -job.priority, job.id)

    order = sorted(snapshot.jobs, key=rank)
    hosts = list(snapshot.hosts)
    shared = snapshot.shared_free
    queue_used: dict[str, int] = {}
    user_used: dict[tuple[str, str], int] = {}
    for queue, user, slots in snapshot.running:
        queue_used[queue] = queue_used.get(queue, 0) + slots
        user_used[(queue, user)] = user_used.get((queue, user), 0) + slots
    refused: dict[tuple, str] = {}
    dispatches: list[Dispatch] = []
    waiting: dict[str, list[int]] = {}
    holder: PendingJob | None = None
    complete = True
    for examined, job in enumerate(order):
        if examined >= budget:
            complete = False
            break
        policy = queues.get(job.queue, no_policy)
        if holder is not None:
            reason = f"waiting behind job {holder.id}, which holds a reservation until it can start"
        else:
            reason, request = _within_limits(job, policy, queue_used, user_used)
        if reason is None:
            shape = (job.queue, request.min_tasks, request.max_tasks, request.resreq)
            reason = refused.get(shape)
            if reason is None:
                usable = hosts if policy.hosts is None else [h for h in hosts if h.name in policy.hosts]
                result = reference_place(request, usable, shared)
                if not isinstance(result, Refusal):
                    hosts, shared = reference_take(hosts, shared, result)
                    refused.clear()
                    queue_used[job.queue] = queue_used.get(job.queue, 0) + result.tasks
                    user_used[(job.queue, job.user)] = user_used.get((job.queue, job.user), 0) + result.tasks
                    dispatches.append(Dispatch(job.id, result))
                    continue
                reason = refused[shape] = result.summary()
            if snapshot.reserve_after > 0 and snapshot.now - job.submit_time >= snapshot.reserve_after:
                holder = job
                reason += "; it has waited long enough to hold a reservation: later jobs wait for it"
        waiting.setdefault(reason, []).append(job.id)
    return Decisions(tuple(dispatches), tuple((r, tuple(ids)) for r, ids in waiting.items()), complete)


# Requests as users write them, over the resources `busy_cluster` has: every rule the session caches.
REQUESTS = ("", "", "rusage[mem=2G]", "select[avx] rusage[mem=1G]", "select[!avx]", 'select[model=="B"]',
            "order[-mem] rusage[mem=3G]", "order[slots]", "order[-slots] select[gpus>0]",
            "rusage[gpus=1:mem=1G]", "span[ptile=2]", "span[ptile=3] rusage[mem=1G]", "span[hosts=1]",
            "span[block=2]", "span[maxhosts=2]", "same[model] rusage[mem=1G]", "same[model] span[ptile=2]",
            "rusage[mem=2G/host] span[ptile=2]", "rusage[mem=1G/job]", "rusage[lic=1/job]",
            "rusage[lic=1/host]", "rusage[lic=1]", "select[defined(scratch)] rusage[scratch=2/host]",
            "order[-scratch] same[model]")


@st.composite
def busy_snapshots(draw: st.DrawFn) -> Snapshot:
    """Up to 10 hosts with slots, memory, GPUs, a scratch resource on some, a model on most (so
    same[model] leaves some out), tags; up to 60 jobs over 3 queues that share hosts or not, with
    running limits, running usage and (sometimes) the starvation guard."""
    hosts = []
    for i in range(draw(st.integers(0, 10))):
        slots, mem, gpus = draw(st.integers(0, 8)), draw(st.integers(0, 8)), draw(st.sampled_from((0, 0, 2, 4)))
        total = {"slots": slots, "mem": mem * G, "gpus": gpus}
        if draw(st.booleans()):
            total["scratch"] = draw(st.integers(0, 10))
        free = {k: v - min(v, draw(st.one_of(st.just(0), st.integers(0, v)))) for k, v in total.items()}
        gpu_free = tuple(range(gpus - free["gpus"], gpus))
        attrs = {"model": m} if (m := draw(st.sampled_from(("A", "B", None)))) else {}
        hosts.append(HostView(f"h{i}", draw(st.sampled_from((HOST_OK,) * 6 + ("closed",))), total, free,
                              gpu_free, attrs, frozenset(draw(st.sets(st.sampled_from(("avx", "fast")))))))
    names = [h.name for h in hosts]
    some_hosts = st.one_of(st.none(), st.frozensets(st.sampled_from(names)) if names else st.none())
    queues = tuple(QueuePolicy(name, draw(st.integers(0, 3)), draw(some_hosts),
                               draw(st.one_of(st.none(), st.integers(0, 20))),
                               draw(st.one_of(st.none(), st.integers(0, 10))))
                   for name in ("high", "normal", "low"))
    jobs = []
    for i in range(1, draw(st.integers(0, 60)) + 1):
        low = draw(st.integers(1, 6))
        request = JobRequest(i, low, low + draw(st.sampled_from((0, 0, 1, 4))), parse(draw(st.sampled_from(REQUESTS))))
        jobs.append(PendingJob(i, draw(st.sampled_from(("alice", "bob"))), draw(st.sampled_from(QUEUES)), request,
                               draw(st.sampled_from((0, 0, 5))), float(draw(st.integers(0, 100)))))
    running = tuple((draw(st.sampled_from(QUEUES)), draw(st.sampled_from(("alice", "bob"))), draw(st.integers(0, 8)))
                    for _ in range(draw(st.integers(0, 3))))
    shared = FrozenMap({"lic": draw(st.integers(0, 6))})
    return Snapshot(tuple(hosts), tuple(jobs), queues, shared, running, 100.0, draw(st.sampled_from((0.0, 50.0))))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=busy_snapshots(), budget=budgets)
def test_schedule_decides_what_the_reference_decides(snapshot: Snapshot, budget: int) -> None:
    decisions = schedule(snapshot, budget)
    assert decisions == reference_schedule(snapshot, budget)
    check_decisions(snapshot, decisions)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=busy_snapshots())
def test_take_leaves_what_the_reference_leaves(snapshot: Snapshot) -> None:
    hosts, shared = list(snapshot.hosts), snapshot.shared_free
    expected_hosts, expected_shared = hosts, shared
    for d in schedule(snapshot).dispatches:
        hosts, shared = take(hosts, shared, d.placement)
        expected_hosts, expected_shared = reference_take(expected_hosts, expected_shared, d.placement)
        assert hosts == expected_hosts and shared == expected_shared


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
