"""sched/core.py against its reference: `schedule` with the session caches decides exactly what it
decided before them (tests/support/placement_reference.py), on random busy snapshots.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.support.placement_reference import reference_place, reference_take
from tests.support.sched import budgets, busy_snapshots, check_decisions
from xce_lite.sched.core import (
    Decisions,
    Dispatch,
    PendingJob,
    QueuePolicy,
    Snapshot,
    _within_limits,
    schedule,
    take,
)
from xce_lite.sched.reasons import Refusal


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
    for examined, pending in enumerate(order):
        if examined >= budget:
            complete = False
            break
        policy = queues.get(pending.queue, no_policy)
        if holder is not None:
            reason = f"waiting behind job {holder.id}, which holds a reservation until it can start"
        else:
            reason, request = _within_limits(pending, policy, queue_used, user_used)
        if reason is None:
            shape = (pending.queue, request.min_tasks, request.max_tasks, request.resreq)
            reason = refused.get(shape)
            if reason is None:
                usable = hosts if policy.hosts is None else [h for h in hosts if h.name in policy.hosts]
                result = reference_place(request, usable, shared)
                if not isinstance(result, Refusal):
                    hosts, shared = reference_take(hosts, shared, result)
                    refused.clear()
                    queue_used[pending.queue] = queue_used.get(pending.queue, 0) + result.tasks
                    key = (pending.queue, pending.user)
                    user_used[key] = user_used.get(key, 0) + result.tasks
                    dispatches.append(Dispatch(pending.id, result))
                    continue
                reason = refused[shape] = result.summary()
            if snapshot.reserve_after > 0 and snapshot.now - pending.submit_time >= snapshot.reserve_after:
                holder = pending
                reason += "; it has waited long enough to hold a reservation: later jobs wait for it"
        waiting.setdefault(reason, []).append(pending.id)
    return Decisions(tuple(dispatches), tuple((r, tuple(ids)) for r, ids in waiting.items()), complete)


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
