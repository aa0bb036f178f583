"""Builders for the scheduler's tests (sched/core.py on snapshots): `host(...)`, `job(...)` and
`snap(...)`, random busy snapshots over every rule the session caches cover, and
`check_decisions`, the invariant check run on whatever `schedule` returns (tako's `sanity_check`):
no job dispatched twice or both dispatched and pending, no host over-allocated or not ok.
"""

from __future__ import annotations

from hypothesis import strategies as st

from xce_lite.sched.core import HOST_OK, Decisions, PendingJob, QueuePolicy, Snapshot
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.reasons import FrozenMap
from xce_lite.sched.resreq import parse

G = 1024**3


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


QUEUES = ("high", "normal", "low", "unlisted")
budgets = st.one_of(st.just(1_000_000), st.integers(0, 45))

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
