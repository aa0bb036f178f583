"""sched/core.py `SessionCache` and session.py `Session.renew`: a cache carried from one session to the
next never changes a decision. A warm cache (after random host changes between sessions) must give
exactly what a cold call on the same snapshot gives: the decisions byte for byte, and what an
observer is told.
"""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sched import QUEUES, REQUESTS, G, budgets, busy_snapshots, host, job, snap
from xce_lite.sched.core import Decisions, Examined, PendingJob, QueuePolicy, SessionCache, Snapshot, schedule, take
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.reasons import FrozenMap
from xce_lite.sched.resreq import parse


def observed(snapshot: Snapshot, budget: int, cache: SessionCache | None) -> tuple[Decisions, list[Examined]]:
    seen: list[Examined] = []
    return schedule(snapshot, budget, seen.append, cache), seen


def assert_warm_is_cold(snapshot: Snapshot, budget: int, cache: SessionCache) -> Decisions:
    warm, warm_seen = observed(snapshot, budget, cache)
    cold, cold_seen = observed(snapshot, budget, None)
    assert pickle.dumps(warm) == pickle.dumps(cold)
    assert warm_seen == cold_seen
    assert pickle.dumps(schedule(snapshot, budget, cache=cache)) == pickle.dumps(cold)  # again, unobserved
    return cold


def other_free(view: HostView, rng: random.Random) -> HostView:
    """`view` with other free amounts, anywhere from nothing to its totals (jobs ended, others started)."""
    free = {name: rng.randint(0, int(amount)) for name, amount in view.total.items()}
    gpus = int(view.total.get("gpus", 0))
    gpu_free = tuple(sorted(rng.sample(range(gpus), rng.randint(0, gpus))))
    if "gpus" in free:
        free["gpus"] = len(gpu_free)
    return dataclasses.replace(view, free=free, gpu_free=gpu_free)


def after(snapshot: Snapshot, decisions: Decisions) -> tuple[list[HostView], FrozenMap, list[PendingJob]]:
    """The hosts, shared counters and pending jobs once `decisions` are carried out."""
    hosts, shared = list(snapshot.hosts), snapshot.shared_free
    for d in decisions.dispatches:
        hosts, shared = take(hosts, shared, d.placement)
    gone = {d.job_id for d in decisions.dispatches}
    return hosts, shared, [j for j in snapshot.jobs if j.id not in gone]


@st.composite
def next_snapshot(draw: st.DrawFn, snapshot: Snapshot, decisions: Decisions) -> Snapshot:
    """What the controller sends next: the dispatched jobs gone and their placements taken out of
    what is free; then some hosts with other free amounts, some with a new but equal view, the
    shared counters moved, new jobs, the hosts in another order; rarely a host that changes what it is
    (state, attributes) or leaves, after which the cache must start afresh."""
    hosts, shared, jobs = after(snapshot, decisions)
    for i, view in enumerate(hosts):
        change = draw(st.sampled_from(("same",) * 6 + ("free", "free", "equal", "what")))
        if change == "free":
            hosts[i] = other_free(view, draw(st.randoms(use_true_random=False)))
        elif change == "equal":
            hosts[i] = dataclasses.replace(view, free=dict(view.free), attrs=dict(view.attrs))
        elif change == "what":
            hosts[i] = dataclasses.replace(view, state=draw(st.sampled_from(("ok", "closed"))),
                                           attrs={"model": draw(st.sampled_from(("A", "B")))})
    if hosts and draw(st.integers(0, 9)) == 0:
        del hosts[draw(st.integers(0, len(hosts) - 1))]
    if draw(st.integers(0, 4)) == 0:
        hosts.reverse()  # the same hosts in another order
    if draw(st.booleans()):
        shared = FrozenMap({"lic": draw(st.integers(0, 6))})
    first = max((j.id for j in snapshot.jobs), default=0) + 1
    for i in range(first, first + draw(st.integers(0, 5))):
        low = draw(st.integers(1, 6))
        request = JobRequest(i, low, low + draw(st.sampled_from((0, 1, 4))), parse(draw(st.sampled_from(REQUESTS))))
        jobs.append(PendingJob(i, draw(st.sampled_from(("alice", "bob"))), draw(st.sampled_from(QUEUES)), request))
    return dataclasses.replace(snapshot, hosts=tuple(hosts), jobs=tuple(jobs), shared_free=shared,
                               now=snapshot.now + 10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=busy_snapshots(), budget=budgets, data=st.data())
def test_a_warm_cache_decides_exactly_what_a_cold_one_does(snapshot: Snapshot, budget: int,
                                                           data: st.DataObject) -> None:
    cache = SessionCache()
    for _ in range(data.draw(st.integers(1, 6))):
        decisions = assert_warm_is_cold(snapshot, budget, cache)
        snapshot = data.draw(next_snapshot(snapshot, decisions))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=busy_snapshots(), data=st.data())
def test_a_session_that_did_not_end_leaves_the_cache_to_start_afresh(snapshot: Snapshot, data: st.DataObject) -> None:
    cache = SessionCache()
    decisions = assert_warm_is_cold(snapshot, 1_000_000, cache)
    snapshot = data.draw(next_snapshot(snapshot, decisions))
    stop_at = data.draw(st.integers(0, max(len(snapshot.jobs) - 1, 0)))

    def fail(examined: Examined) -> None:
        if examined.job_id == snapshot.jobs[stop_at].id:
            raise RuntimeError("the observer failed mid-session")

    if snapshot.jobs:
        with pytest.raises(RuntimeError, match="mid-session"):
            schedule(snapshot, observe=fail, cache=cache)
    assert_warm_is_cold(snapshot, 1_000_000, cache)


def test_a_host_with_room_again_takes_the_job_that_waited_for_it() -> None:
    cache = SessionCache()
    first = snap([host("h1", slots=4)], [job(1, slots=4), job(2, slots=4)])
    decisions = schedule(first, cache=cache)
    assert [d.job_id for d in decisions.dispatches] == [1]
    assert dict(decisions.pend_reasons) == {2: "h1: slots needed 1, free 0"}
    again = schedule(snap([host("h1", slots=4)], [job(2, slots=4)]), cache=cache)  # job 1 ended
    assert [(d.job_id, d.hosts) for d in again.dispatches] == [(2, (("h1", 4),))]


def test_a_host_that_changed_state_is_read_afresh() -> None:
    cache = SessionCache()
    jobs = [job(1, slots=2)]
    assert schedule(snap([host("h1", state="closed"), host("h2")], jobs), cache=cache).dispatches[0].hosts == \
        (("h2", 2),)
    decisions = schedule(snap([host("h1"), host("h2")], jobs), cache=cache)
    assert decisions.dispatches[0].hosts == (("h1", 2),)


def seeded_cluster(rng: random.Random, hosts: int, jobs: int) -> Snapshot:
    """A bigger cluster than hypothesis draws: `hosts` hosts, half of them partly used, some GPUs and
    models, `jobs` jobs over every request of test_sched_core's REQUESTS."""
    views = []
    for i in range(hosts):
        total = {"slots": rng.choice((4, 8, 16)), "mem": rng.choice((8, 32)) * G, "gpus": rng.choice((0, 0, 4))}
        if i % 3 == 0:
            total["scratch"] = 10
        view = HostView(f"h{i:03}", "closed" if i % 17 == 5 else "ok", total, None, tuple(range(total["gpus"])),
                        {"model": rng.choice("AB")}, frozenset({"avx"} if i % 2 else ()))
        views.append(other_free(view, rng) if i % 2 else view)
    requests = [JobRequest(i, low, low + rng.choice((0, 1, 4)), parse(rng.choice(REQUESTS)))
                for i in range(1, jobs + 1) for low in [rng.randint(1, 6)]]
    pending = tuple(PendingJob(r.id, rng.choice(("alice", "bob")), rng.choice(QUEUES), r) for r in requests)
    some = frozenset(v.name for v in views[::2])
    queues = (QueuePolicy("high", 3, some), QueuePolicy("normal", 2), QueuePolicy("low", 1, some, running_limit=40))
    return Snapshot(tuple(views), pending, queues, FrozenMap({"lic": 4}), (), 100.0)


def test_a_bigger_cluster_decides_alike_warm_and_cold_over_many_sessions() -> None:
    """60 hosts, 400 jobs, 12 sessions: each the last one's dispatches taken out, then a tenth of the
    hosts with other free amounts (some full, some empty again) and 20 new jobs."""
    rng = random.Random(20240603)
    snapshot, cache = seeded_cluster(rng, 60, 400), SessionCache()
    dispatched = 0
    for _ in range(12):
        decisions = assert_warm_is_cold(snapshot, 1_000_000, cache)
        dispatched += len(decisions.dispatches)
        hosts, shared, jobs = after(snapshot, decisions)
        for i in rng.sample(range(len(hosts)), 6):
            hosts[i] = other_free(hosts[i], rng)
        first = max(j.id for j in snapshot.jobs) + 1
        jobs += [dataclasses.replace(j, id=j.id + first, request=dataclasses.replace(j.request, id=j.id + first))
                 for j in seeded_cluster(rng, 0, 20).jobs]
        snapshot = dataclasses.replace(snapshot, hosts=tuple(hosts), shared_free=shared, jobs=tuple(jobs))
    assert dispatched > 100  # the sessions did place jobs: hosts were taken from and given back
