"""Hypothesis properties of the placement engine on small random clusters: every invariant kept and
deterministic, a brute-force oracle for "the most tasks that fit", why_never agrees with place, place
agrees with the reference, and a session answers what place answers."""

from __future__ import annotations

import itertools
import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.placement_reference import reference_place, reference_take
from tests.support.placement import host
from tests.support.sched import G
from xce_lite.sched import resreq as rr
from xce_lite.sched import session as sessions
from xce_lite.sched.placement import HostView, JobRequest, Placement, Session, place, why_never
from xce_lite.sched.reasons import NoTaskCount, Refusal

# ---------------------------------------------------------------- properties

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPANS = ["", "span[ptile=1]", "span[ptile=2]", "span[ptile=3]", "span[hosts=1]", "span[block=2]",
         "span[block=3]", "span[maxhosts=1]", "span[maxhosts=2]", "span[ptile=2:maxhosts=2]",
         "span[block=2:maxhosts=2]"]
SELECTS = ["", 'select[type=="A"]', "select[avx]", "select[mem>=4G]", "select[!fast]",
           'select[gpus>0 || type=="B"]']


def some(top: int) -> st.SearchStrategy[int]:
    """0 half the time, else 1..top: most hosts are idle and most jobs ask for little."""
    return st.one_of(st.just(0), st.integers(1, top))


@st.composite
def clusters(draw, most: int = 4, types: tuple[str, ...] = ("A", "B")) -> tuple[list[HostView], dict[str, int]]:
    """Up to `most` hosts; each has a `type` drawn from `types` ("" in it: no type)."""
    hosts = []
    for i in range(draw(st.integers(0, most))):
        slots, mem, gpus, scratch = (draw(st.integers(low, top)) for low, top in ((0, 4), (0, 8), (0, 3), (0, 6)))
        used = {"slots": min(slots, draw(some(4))), "mem": min(mem, draw(some(8))) * G,
                "scratch": min(scratch, draw(some(6)))}
        gpu_used = tuple(sorted(draw(st.sets(st.integers(0, gpus - 1), max_size=gpus)))) if gpus else ()
        hosts.append(host(f"h{i}", slots, mem * G, gpus, state=draw(st.sampled_from(["ok"] * 5 + ["closed"])),
                          tags=tuple(sorted(draw(st.sets(st.sampled_from(["avx", "fast"]))))), used=used,
                          gpu_used=gpu_used, res={"scratch": scratch},
                          **({"type": t} if (t := draw(st.sampled_from(types))) else {})))
    return hosts, {"lic": draw(st.integers(0, 6))}


@st.composite
def jobs(draw) -> JobRequest:
    terms = []
    for name, top, unit in (("mem", 4, "G"), ("gpus", 2, ""), ("scratch", 3, ""), ("lic", 2, "")):
        amount = draw(st.one_of(st.just(0), st.just(0), some(top)))
        if amount:
            terms.append(f"{name}={amount}{unit}/{draw(st.sampled_from(['task', 'task', 'host', 'job']))}")
    text = " ".join([draw(st.sampled_from(["", "", *SELECTS])),
                     draw(st.sampled_from(["", "order[-mem]", "order[slots]"])),
                     f"rusage[{', '.join(terms)}]" if terms else "", draw(st.sampled_from(["", "", *SPANS])),
                     draw(st.sampled_from(["", "", "same[type]"]))])
    low = draw(st.integers(1, 6))
    return JobRequest(draw(st.integers(1, 10**6)), low, low + draw(st.integers(0, 6)), rr.parse(text))


def demand(job: JobRequest, shared: set[str]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(per_task, per_host, per_job) by resource, computed apart from the engine."""
    on_hosts: dict[str, list[int]] = {"slots": [1, 0, 0]}
    on_cluster: dict[str, list[int]] = {}
    for t in job.resreq.rusage:
        into = on_cluster if t.name in shared else on_hosts
        into.setdefault(t.name, [0, 0, 0])[("task", "host", "job").index(t.per)] += \
            rr.amount_in_base_units(t, rr.default_unit(t.name))
    return on_hosts, on_cluster


def static(h: HostView) -> dict[str, object]:
    return {**{"max" + k: v for k, v in h.total.items()}, **dict.fromkeys(h.tags, True), **h.attrs, **h.total}


def check_placement(job: JobRequest, hosts: list[HostView], shared: dict[str, int], result: Placement) -> None:
    """Every invariant a placement must keep (tako's sanity_check, for one job)."""
    by_name = {h.name: h for h in hosts}
    on_hosts, on_cluster = demand(job, set(shared))
    r, span = job.resreq, job.resreq.span
    names = [a.host for a in result.allocs]
    assert len(set(names)) == len(names) and all(a.tasks >= 1 for a in result.allocs)
    assert job.min_tasks <= result.tasks <= job.max_tasks
    for position, a in enumerate(result.allocs):
        h = by_name[a.host]
        assert h.state == "ok" and rr.evaluate(r.select, static(h))
        expected = {name: t * a.tasks + hh + (j if position == 0 else 0) for name, (t, hh, j) in on_hosts.items()}
        assert a.reserved == {k: v for k, v in expected.items() if v}
        assert all(amount <= h.free.get(name, 0) for name, amount in a.reserved.items())
        assert a.gpus == h.gpu_free[:a.reserved.get("gpus", 0)] and len(a.gpus) == a.reserved.get("gpus", 0)
    for name, (t, hh, j) in on_cluster.items():
        used = t * result.tasks + hh * len(names) + j
        assert result.shared.get(name, 0) == used <= shared[name]
    if r.same:
        assert len({tuple(static(by_name[n])[a] for a in r.same) for n in names}) == 1
    if span and span.ptile:
        tasks = [a.tasks for a in result.allocs]
        assert all(t == span.ptile for t in tasks[:-1]) and 1 <= tasks[-1] <= span.ptile
    if span and span.block:
        assert all(a.tasks % span.block == 0 for a in result.allocs)
    if span and (span.one_host or span.max_hosts):
        assert len(names) <= (1 if span.one_host else span.max_hosts)


def brute_force_most(job: JobRequest, hosts: list[HostView], shared: dict[str, int]) -> int | None:
    """The most tasks any valid placement holds (None: none reaches the minimum), by trying every
    task count on every host and every choice of first host."""
    r, span = job.resreq, job.resreq.span
    on_hosts, on_cluster = demand(job, set(shared))
    open_hosts = [h for h in hosts if h.state == "ok" and rr.evaluate(r.select, static(h))
                  and all(a in static(h) for a in r.same)]
    groups: dict[tuple[object, ...], list[HostView]] = {}
    for h in open_hosts:
        groups.setdefault(tuple(static(h)[a] for a in r.same), []).append(h)
    best = None
    for members in groups.values():
        ranges = [range(min(h.free["slots"], job.max_tasks) + 1) for h in members]
        for counts in itertools.product(*ranges):
            total = sum(counts)
            if not job.min_tasks <= total <= job.max_tasks or (best is not None and total <= best):
                continue
            used = [(h, c) for h, c in zip(members, counts) if c]
            if span and span.block and any(c % span.block for _, c in used):
                continue
            if span and (span.one_host or span.max_hosts) and len(used) > (1 if span.one_host else span.max_hosts):
                continue
            if span and span.ptile and (any(c > span.ptile for _, c in used)
                                        or sum(c < span.ptile for _, c in used) > 1):
                continue
            if any(t * total + hh * len(used) + j > shared[name] for name, (t, hh, j) in on_cluster.items()):
                continue
            for first in range(len(used)):
                if span and span.ptile and used[first][1] < span.ptile and len(used) > 1:
                    continue
                if all(t * c + hh + (j if i == first else 0) <= h.free.get(name, 0)
                       for i, (h, c) in enumerate(used) for name, (t, hh, j) in on_hosts.items()):
                    best = total
                    break
    return best


@PROPERTY
@given(clusters(), jobs())
def test_placements_keep_every_invariant_and_are_deterministic(cluster, job):
    hosts, shared = cluster
    result = place(job, hosts, shared)
    assert place(job, hosts[::-1], dict(reversed(shared.items()))) == result
    again = pickle.loads(pickle.dumps(result))
    assert again == result and hash(again) == hash(result)
    if isinstance(result, Placement):
        check_placement(job, hosts, shared, result)
    else:
        assert result.summary()
        refused, room = {h.host for h in result.hosts}, {name for name, _ in result.capacity}
        if not any(isinstance(r, NoTaskCount) for r in result.job_reasons):  # no count at all: hosts moot
            assert refused.isdisjoint(room) and refused | room == {h.name for h in hosts}
        assert all(h.state == "ok" for h in hosts if h.name in room)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), jobs())
def test_the_most_tasks_that_fit_are_placed(cluster, job):
    hosts, shared = cluster
    result = place(job, hosts, shared)
    most = brute_force_most(job, hosts, shared)
    if most is None:
        assert isinstance(result, Refusal)
    else:
        assert isinstance(result, Placement) and result.tasks == most


@PROPERTY
@given(clusters(), jobs())
def test_why_never_agrees_with_place(cluster, job):
    hosts, shared = cluster
    reason = why_never(job, hosts, shared)
    known = set(shared).union(*(static(h) for h in hosts))
    names = rr.names(job.resreq)
    if isinstance(place(job, hosts, shared), Placement) and names <= known:
        assert reason is None
    if reason is None:
        assert isinstance(place(job, [h.emptied() for h in hosts], shared), Placement)



@PROPERTY
@given(clusters(), jobs())
def test_place_gives_what_the_reference_gives(cluster, job):
    hosts, shared = cluster
    assert place(job, hosts, shared) == reference_place(job, hosts, shared)


@PROPERTY
@given(clusters(most=8, types=("A", "B", "")), st.lists(jobs(), min_size=1, max_size=4), st.data())
def test_a_session_answers_what_place_answers_on_what_is_left(cluster, requests, data):
    """Jobs placed one after another in one Session, each placement taken: every answer is what the
    unoptimised place gives on the hosts and counters left, on any host subset. Requests repeat, so
    shapes are met again after other jobs took from their hosts."""
    check_session(cluster, requests, data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(most=8, types=("A", "B", "")), st.lists(jobs(), min_size=1, max_size=4), st.data())
def test_a_session_that_drops_shapes_answers_alike(cluster, requests, data):
    """With room for one shape only, shapes are dropped and rebuilt as things then stand."""
    kept = sessions.MAX_SHAPES
    sessions.MAX_SHAPES = 1
    try:
        check_session(cluster, requests, data)
    finally:
        sessions.MAX_SHAPES = kept


def check_session(cluster, requests, data):
    hosts, shared = cluster
    names = [h.name for h in hosts]
    session = Session(hosts, shared)
    for _ in range(data.draw(st.integers(1, 16))):
        job = data.draw(st.sampled_from(requests))
        allowed = data.draw(st.one_of(st.none(), st.frozensets(st.sampled_from(names)))) if names else None
        usable = [h for h in hosts if allowed is None or h.name in allowed]
        result = session.place(job, allowed)
        assert result == reference_place(job, usable, shared)
        if isinstance(result, Placement):
            session.take(result)
            hosts, shared = reference_take(hosts, shared, result)
