"""sched/backlog.py: a session over the pending jobs by class (`schedule(..., backlog=)`) decides exactly
what the walk over every job in order decides, byte for byte: on random busy clusters with many jobs
of one class, blocked jobs, the starvation guard, budgets, and a backlog kept from one session to the
next as jobs are dispatched, added and removed and queue priorities change."""

from __future__ import annotations

import dataclasses
import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sched import budgets, busy_snapshots
from xce_lite.sched.backlog import Backlog
from xce_lite.sched.core import PendingJob, QueuePolicy, SessionCache, Snapshot, schedule


@st.composite
def crowded(draw: st.DrawFn, snapshot: Snapshot, first_id: int) -> list[PendingJob]:
    """Copies of the snapshot's jobs under new ids: classes of many jobs, some blocked, some older."""
    jobs = []
    for i, model in enumerate(draw(st.lists(st.sampled_from(snapshot.jobs), max_size=40)) if snapshot.jobs else ()):
        job_id = first_id + i
        blocked = "cannot run as configured now: gone" if draw(st.integers(0, 9)) == 0 else model.blocked
        jobs.append(dataclasses.replace(model, id=job_id, request=dataclasses.replace(model.request, id=job_id),
                                        submit_time=float(draw(st.integers(0, 100))), blocked=blocked,
                                        priority=draw(st.sampled_from((model.priority, 0, 5)))))
    return jobs


def same(snapshot: Snapshot, budget: int, backlog: Backlog, cache: SessionCache):
    plain = schedule(snapshot, budget)
    by_class = schedule(snapshot, budget, cache=cache, backlog=backlog)
    assert pickle.dumps(by_class) == pickle.dumps(plain)
    return plain


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=busy_snapshots(), budget=budgets, data=st.data())
def test_by_class_decides_exactly_what_job_by_job_does(snapshot: Snapshot, budget: int, data: st.DataObject) -> None:
    jobs = list(snapshot.jobs) + data.draw(crowded(snapshot, 1000))
    snapshot = dataclasses.replace(snapshot, jobs=tuple(jobs))
    backlog, cache = Backlog(), SessionCache()
    for job in jobs:
        backlog.add(job)
    next_id = 5000
    for _ in range(data.draw(st.integers(1, 5))):
        decisions = same(snapshot, budget, backlog, cache)
        gone = {d.job_id for d in decisions.dispatches}
        if jobs and data.draw(st.booleans()):  # killed or held meanwhile
            gone.add(data.draw(st.sampled_from(jobs)).id)
        added = data.draw(crowded(snapshot, next_id))
        next_id += 100
        jobs = [j for j in jobs if j.id not in gone] + added
        for job_id in gone:
            backlog.discard(job_id)
        for job in added:
            backlog.add(job)
        queues = snapshot.queues
        if data.draw(st.booleans()):  # a reconfig changed the queues' priorities
            queues = tuple(QueuePolicy(q.name, data.draw(st.integers(0, 3)), q.hosts, q.running_limit,
                                       q.user_running_limit) for q in queues)
        snapshot = dataclasses.replace(snapshot, jobs=tuple(jobs), queues=queues, now=snapshot.now + 10)


def test_a_large_backlog_of_one_class_waits_for_one_reason_in_order() -> None:
    """10,000 jobs of one shape on a host with room for two: two start, the rest wait, in id order."""
    from tests.support.sched import host, job, snap

    jobs = [job(i) for i in range(1, 10_001)]
    snapshot = snap([host("h1", slots=2)], jobs)
    backlog = Backlog()
    for j in jobs:
        backlog.add(j)
    decisions = same(snapshot, 1_000_000, backlog, SessionCache())
    assert [d.job_id for d in decisions.dispatches] == [1, 2]
    assert len(decisions.waiting) == 1 and decisions.waiting[0][1] == tuple(range(3, 10_001))
