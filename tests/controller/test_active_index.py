"""controller/active.ActiveJobs, the active jobs' index: through random adds, removes, jobs replaced in
place, holdings changed (rehold), units changing status, jobs closing and units draining, what a
session reads of it (host views, running tasks per queue and user, shared counters) always equals
the computation from scratch over the active jobs, in their order, as the tick made it before; so do
the host views of both caches (config/sched_view.HostsNow, controller/host_views.HostViews)."""

from __future__ import annotations

import random

import pytest

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.sched_view import Holding, HostsNow, host_totals, hosts_now, shared_free
from xce_lite.controller.active import ActiveJobs
from xce_lite.controller.host_views import HostViews
from xce_lite.controller.unitwork import ENDED, NEW, RUNNING, SENT, Active, Draining
from xce_lite.sched.reasons import FrozenMap, HostAlloc

HOSTS = [f"h{i}" for i in range(7)]


def config() -> ClusterConfig:
    return ClusterConfig.model_validate({
        "cluster": "c", "queues": [{"name": "normal", "default": True}, {"name": "short"}],
        "shared": {"lic": 40},
        "hosts": [{"name": h, "slots": 64, "mem": "64G", "gpus": 4} for h in HOSTS[:6]]})  # h6: removed from config


def holding(rng: random.Random) -> Holding:
    hosts = rng.sample(HOSTS, rng.randint(1, 3))
    allocs = tuple(HostAlloc(h, n, FrozenMap({"slots": n, "mem": rng.choice((0, 2**30, 1.5 * 2**30))}),
                             (rng.randrange(4),) if rng.random() < 0.2 else ())
                   for h in hosts for n in [rng.randint(1, 4)])
    shared = FrozenMap({"lic": rng.choice((1, 2, 0.5))}) if rng.random() < 0.3 else FrozenMap()
    return Holding(allocs, shared)


def fresh_allocs(jobs: dict, closing: set[int], draining: dict) -> dict[str, tuple]:
    """The tick's computation before the index (unitwork._holdings), grouped by host."""
    held = []
    for job in jobs.values():
        if job.id not in closing:
            held.append(job.holding)
        else:
            held.append(Holding(tuple(a for i, a in enumerate(job.holding.allocs) if job.status[i] in (SENT, RUNNING))))
    held.extend(Holding((d.alloc,)) for d in draining.values())
    out: dict[str, list] = {}
    for h in held:
        for a in h.allocs:
            out.setdefault(a.host, []).append(a)
    return {host: tuple(allocs) for host, allocs in out.items()}


def still_runs(job: Active, index: int) -> bool:
    return job.status[index] in (SENT, RUNNING)


@pytest.mark.parametrize("views", [HostsNow, HostViews])  # config/sched_view's cache, the controller's
def test_the_index_equals_the_computation_from_scratch_through_random_changes(views):
    rng = random.Random(18)
    cfg = config()
    totals = host_totals(cfg)
    states = {h.name: "ok" for h in totals}
    jobs = ActiveJobs()
    draining: dict[str, Draining] = {}
    cache = views()
    next_id = 1
    for round_ in range(3000):
        action = rng.random()
        if action < 0.35:  # a dispatch
            h = holding(rng)
            units = tuple(f"u{next_id}-{i}" for i in range(len(h.allocs)))
            jobs[next_id] = Active(next_id, rng.choice(("ann", "bob", "cy")), rng.choice(("normal", "short")), "DISP",
                                   1, h, units, [NEW] * len(units))
            next_id += 1
        elif action < 0.55 and jobs:  # an end: popped, or deleted; some units drain
            job_id = rng.choice(list(jobs))
            job = jobs.pop(job_id) if rng.random() < 0.8 else jobs[job_id]
            if job_id in jobs:
                del jobs[job_id]
            for i, unit in enumerate(job.units):
                if job.status[i] == RUNNING and rng.random() < 0.5:
                    draining[unit] = Draining(job_id, job.holding.allocs[i])
        elif action < 0.62 and draining:
            del draining[rng.choice(list(draining))]
        elif action < 0.78 and jobs:  # a unit changes status (what `closing` filters on)
            job = jobs[rng.choice(list(jobs))]
            i = rng.randrange(len(job.status))
            job.status[i] = rng.choice((NEW, SENT, RUNNING, ENDED))
        elif action < 0.83 and jobs:  # a resize
            job = jobs[rng.choice(list(jobs))]
            jobs.rehold(job.id, holding(rng))
            job.units = tuple(f"u{job.id}-r{round_}-{i}" for i in range(len(job.holding.allocs)))
            job.status = [RUNNING] * len(job.units)
        elif action < 0.86 and jobs:  # the same id set again: it keeps its place in the order
            job_id = rng.choice(list(jobs))
            old = jobs[job_id]
            h = holding(rng)
            units = tuple(f"u{job_id}-r{round_}-{i}" for i in range(len(h.allocs)))
            jobs[job_id] = Active(job_id, old.user, rng.choice(("normal", "short")), "RUN", 2, h, units,
                                  [RUNNING] * len(units))
        elif action < 0.88 and jobs and rng.random() < 0.3:
            jobs.clear()
        elif action < 0.92:
            states[rng.choice(HOSTS)] = rng.choice(("ok", "unreachable", "closed"))
        elif action < 0.93:
            totals = host_totals(cfg)  # a reconfig: new totals, every host anew
        closing = {j for j in jobs if rng.random() < 0.1}
        pairs = [(d.job_id, d.alloc) for d in draining.values()]
        got = jobs.allocs_by_host(closing, still_runs, pairs)
        assert got == fresh_allocs(jobs, closing, draining), round_
        assert jobs.problems() == [], round_
        # what the session gets: host views, running tasks summed per (queue, user), shared counters
        held = [Holding(a) for a in fresh_allocs(jobs, closing, draining).values()]
        assert cache.of(totals, states, got) == hosts_now(totals, states, held), round_
        per_key: dict = {}
        for job in jobs.values():
            per_key[(job.queue, job.user)] = per_key.get((job.queue, job.user), 0) + job.holding.tasks
        assert {(q, u): n for q, u, n in jobs.running()} == per_key, round_
        assert all(n > 0 for _q, _u, n in jobs.running())
        open_key: dict = {}  # jobs ending in this tick hold nothing in its session
        for job in jobs.values():
            if job.id not in closing and job.holding.tasks:
                open_key[(job.queue, job.user)] = open_key.get((job.queue, job.user), 0) + job.holding.tasks
        assert {(q, u): n for q, u, n in jobs.running(closing)} == open_key, round_
        assert jobs.shared_free(cfg.shared, closing) == \
            shared_free(cfg, [j.holding for j in jobs.values() if j.id not in closing]), round_
    assert next_id > 500


def test_a_host_nothing_changed_on_keeps_its_tuple_and_its_view():
    totals = host_totals(config())
    states = {h.name: "ok" for h in totals}
    jobs = ActiveJobs()
    for job_id, host in ((1, "h0"), (2, "h1"), (3, "h0")):
        alloc = HostAlloc(host, 2, FrozenMap({"slots": 2}))
        jobs[job_id] = Active(job_id, "ann", "normal", "RUN", 1, Holding((alloc,)), (f"u{job_id}",), [RUNNING])
    cache = HostsNow()
    first_allocs = jobs.allocs_by_host()
    first = cache.of(totals, states, first_allocs)
    del jobs[2]
    second_allocs = jobs.allocs_by_host()
    assert second_allocs["h0"] is first_allocs["h0"] and "h1" not in second_allocs
    second = cache.of(totals, states, second_allocs)
    assert second[0] is first[0] and second[1] is not first[1] and second[1].free["slots"] == 64
    assert jobs.running() == (("normal", "ann", 4),)


def test_a_holding_changed_behind_the_index_is_a_broken_invariant():
    jobs = ActiveJobs()
    alloc = HostAlloc("h0", 2, FrozenMap({"slots": 2}))
    jobs[1] = Active(1, "ann", "normal", "RUN", 1, Holding((alloc,)), ("u1",), [RUNNING])
    jobs[1].holding = Holding((HostAlloc("h1", 2, FrozenMap({"slots": 2})),))
    assert any("without rehold" in p for p in jobs.problems())
