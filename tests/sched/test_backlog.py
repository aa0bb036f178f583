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
from xce_lite.sched.sent_reasons import SentReasons


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


def _told_step(snapshot: Snapshot, budget: int, sides: list) -> tuple:
    """One session on both sides, answered as the scheduler seams answer (sched_worker.py): the
    dispatched jobs forgotten, then the changed reasons. Both answers must be the same, byte for byte."""
    answers = []
    for backlog, cache, sent, told in sides:
        decisions = schedule(snapshot, budget, cache=cache, backlog=backlog, told=sent.tails if told else None)
        sent.forget(d.job_id for d in decisions.dispatches)
        answers.append((decisions.dispatches, sent.delta(decisions.waiting), decisions.complete))
    assert pickle.dumps(answers[0]) == pickle.dumps(answers[1])
    return answers[0]


def _between(sides: list, gone: set[int], added: list[PendingJob], asked: list[int], resend: bool) -> None:
    """What the scheduler seams do between sessions (sched_worker._apply_changes): jobs gone and
    added forgotten and re-indexed, reasons asked again, a full resend."""
    for backlog, _cache, sent, _told in sides:
        sent.forget(gone)
        sent.forget(j.id for j in added)
        for job_id in gone:
            backlog.discard(job_id)
        for j in added:
            backlog.add(j)
        if asked:
            sent.ask_again(asked)
        if resend:
            sent.clear()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=busy_snapshots(), budget=budgets, data=st.data())
def test_a_session_that_leaves_out_told_tails_answers_what_the_whole_answer_does(
        snapshot: Snapshot, budget: int, data: st.DataObject) -> None:
    """`told=` (backlog.py, Told tails): the changed reasons are the same with told tails left out as
    from the whole answer, through dispatches, jobs added and removed (within a told tail too),
    reasons asked again, full resends and re-ranked queues."""
    jobs = list(snapshot.jobs) + data.draw(crowded(snapshot, 1000))
    snapshot = dataclasses.replace(snapshot, jobs=tuple(jobs))
    sides = [(Backlog(), SessionCache(), SentReasons(), told) for told in (False, True)]
    for backlog, *_ in sides:
        for job in jobs:
            backlog.add(job)
    next_id = 5000
    for _ in range(data.draw(st.integers(1, 8))):
        dispatches, _waiting, _complete = _told_step(snapshot, budget, sides)
        gone = {d.job_id for d in dispatches}
        if jobs and data.draw(st.booleans()):  # killed or held meanwhile
            gone.add(data.draw(st.sampled_from(jobs)).id)
        added = data.draw(crowded(snapshot, next_id)) if data.draw(st.booleans()) else []
        if jobs and data.draw(st.integers(0, 3)) == 0:  # requeued: gone, and back under its old id
            added.append(data.draw(st.sampled_from(jobs)))
        next_id += 100
        asked = data.draw(st.lists(st.sampled_from(jobs), max_size=3)) if jobs and data.draw(st.booleans()) else []
        resend = data.draw(st.integers(0, 5)) == 0
        jobs = list({j.id: j for j in [j for j in jobs if j.id not in gone] + added}.values())
        _between(sides, gone, added, [j.id for j in asked], resend)
        queues = snapshot.queues
        if data.draw(st.booleans()):  # a reconfig changed the queues' priorities
            queues = tuple(QueuePolicy(q.name, data.draw(st.integers(0, 3)), q.hosts, q.running_limit,
                                       q.user_running_limit) for q in queues)
        snapshot = dataclasses.replace(snapshot, jobs=tuple(sorted(jobs, key=lambda j: j.id)), queues=queues,
                                       now=snapshot.now + 10)


def test_a_steady_session_over_a_told_backlog_answers_only_what_changed() -> None:
    """10,000 jobs of one class behind two slots: once their reason is told, a session after two
    ends (two dispatches) and two new jobs names in `waiting` the job examined (the first that
    waits) and the two new ones, not the 10,000 told already."""
    from tests.support.sched import host, job, snap

    jobs = [job(i) for i in range(1, 10_001)]
    backlog, sent = Backlog(), SentReasons()
    for j in jobs:
        backlog.add(j)
    first = schedule(snap([host("h1", slots=2)], jobs), cache=SessionCache(), backlog=backlog, told=sent.tails)
    sent.delta(first.waiting)
    assert [d.job_id for d in first.dispatches] == [1, 2] and len(first.waiting[0][1]) == 9_998
    for job_id in (1, 2):
        backlog.discard(job_id)
    jobs = jobs[2:] + [job(10_001), job(10_002)]
    for j in jobs[-2:]:
        backlog.add(j)
    sent.forget((10_001, 10_002))
    then = schedule(snap([host("h1", slots=2)], jobs), cache=SessionCache(), backlog=backlog, told=sent.tails)
    assert [d.job_id for d in then.dispatches] == [3, 4]
    assert [ids for _reason, ids in then.waiting] == [(5, 10_001, 10_002)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_told_tails_of_a_few_large_classes_through_a_drain(data: st.DataObject) -> None:
    """As above, on what makes told tails: a few large classes behind a host of a few slots, whose
    free slots change from session to session (so a class's reason changes and comes back), jobs
    added before, inside and after a told tail, killed inside it, requeued, asked again, resent."""
    from tests.support.sched import host, job

    def new_job(job_id: int) -> PendingJob:
        made = job(job_id, slots=data.draw(st.integers(1, 3)), user=data.draw(st.sampled_from(("alice", "bob"))))
        return dataclasses.replace(made, priority=data.draw(st.sampled_from((0, 0, 5))))

    jobs = {i: new_job(i) for i in range(1, data.draw(st.integers(1, 40)))}
    sides = [(Backlog(), SessionCache(), SentReasons(), told) for told in (False, True)]
    for backlog, *_ in sides:
        for j in jobs.values():
            backlog.add(j)
    next_id = 100
    for _ in range(data.draw(st.integers(1, 12))):
        hosts = (host("h1", slots=3, used=data.draw(st.integers(0, 3))),)
        snapshot = Snapshot(hosts, tuple(jobs.values()), (QueuePolicy("normal", 30),))
        dispatches, _waiting, _complete = _told_step(snapshot, 1_000_000, sides)
        killed = data.draw(st.lists(st.sampled_from(sorted(jobs)), max_size=2)) if jobs else []
        gone = {d.job_id for d in dispatches} | set(killed)
        added = [new_job(next_id + i) for i in range(data.draw(st.integers(0, 4)))]
        added += data.draw(st.lists(st.sampled_from([jobs[i] for i in sorted(gone)]), max_size=1)) if gone else []
        next_id += 10
        asked = data.draw(st.lists(st.sampled_from(sorted(jobs)), max_size=2)) \
            if jobs and data.draw(st.booleans()) else []
        resend = data.draw(st.integers(0, 7)) == 0
        for job_id in gone:
            del jobs[job_id]
        jobs.update((j.id, j) for j in added)
        _between(sides, gone, added, asked, resend)
