"""sched/prefill_memo.py (issue 18, branch ctlcpu3): placements inside a unit and the units' views,
kept from one prefill call to the next, give exactly the plain calls' answers (each with its own
job id), and spare the placement where an equal request meets an equal view again."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.prefill_history import histories, synced, units_on
from tests.support.sched import G, QUEUES, job, snap
from xce_lite.sched import prefill_memo
from xce_lite.sched.core import schedule
from xce_lite.sched.placement import HostView, JobRequest, place
from xce_lite.sched.prefill import QueuedSuccessor, RunningUnit, _inside, outranked, successors
from xce_lite.sched.prefill_memo import PlaceMemo
from xce_lite.sched.reasons import FrozenMap, Placement, Refusal
from xce_lite.sched.resreq import parse


def full_host(slots: int = 2) -> HostView:
    return HostView("h1", "ok", {"slots": slots, "mem": 8 * G}, {"slots": 0, "mem": 0})


def unit(job_id: int, slots: int = 1) -> RunningUnit:
    return RunningUnit(job_id, "h1", "normal", "alice", FrozenMap({"slots": slots, "mem": 4 * G}))


def test_a_placement_is_the_plain_one_with_its_own_job_id_and_the_second_costs_no_placement():
    memo, host, rusage = PlaceMemo(), full_host(), parse("rusage[mem=1G]")
    view = memo.inside(host, unit(1), _inside)
    assert view == _inside(host, unit(1))
    assert memo.inside(full_host(), unit(2), _inside) is view  # equal host and holding: the same view
    first = memo.place(JobRequest(10, 1, 1, rusage), view)
    assert first == place(JobRequest(10, 1, 1, rusage), (view,)) and isinstance(first, Placement)
    with mock.patch.object(prefill_memo, "place", side_effect=AssertionError("placed again")):
        again = memo.place(JobRequest(11, 1, 1, rusage), view)
    assert again == place(JobRequest(11, 1, 1, rusage), (view,)) and again.job_id == 11
    # another -R object, task range or view is another question
    for request, on in ((JobRequest(12, 1, 1, parse("rusage[mem=1G]")), view), (JobRequest(12, 1, 2, rusage), view),
                        (JobRequest(12, 1, 1, rusage), memo.inside(host, unit(3, slots=2), _inside))):
        assert memo.place(request, on) == place(request, (on,))


def test_a_refusal_is_the_plain_one_and_is_not_kept():
    memo, host = PlaceMemo(), full_host()
    view = memo.inside(host, unit(1), _inside)
    too_big = JobRequest(10, 2, 2, parse(""))
    for job_id in (10, 11):
        request = replace(too_big, id=job_id)
        refused = memo.place(request, view)
        assert isinstance(refused, Refusal) and refused == place(request, (view,))
    assert memo.inside(None, unit(1), _inside) is None  # a host the snapshot does not know


def test_the_maps_are_bounded(monkeypatch):
    monkeypatch.setattr(prefill_memo, "KEPT", 3)
    memo, rusage = PlaceMemo(), parse("")
    views = [memo.inside(full_host(slots), unit(1), _inside) for slots in (2, 3, 4, 5)]
    assert len(memo._views) <= 3
    for i, view in enumerate(views):
        memo.place(JobRequest(10 + i, 1, 1, rusage), view)
    assert len(memo._placed) <= 3


def test_an_array_behind_two_units_is_placed_once():
    """As a 1,000-element array asks: jobs of one request object, after each other, behind the units."""
    rusage = parse("")
    jobs = [replace(job(10 + i), request=JobRequest(10 + i, 1, 1, rusage)) for i in range(6)]
    memo, placed = PlaceMemo(), []
    real = prefill_memo.place
    with mock.patch.object(prefill_memo, "place", side_effect=lambda *a: placed.append(1) or real(*a)):
        for first in (0, 2, 4):  # three sessions, each naming two successors
            s = snap([full_host()], jobs[first:])
            named = successors(s, schedule(s), (unit(1), unit(2)), memo=memo)
            assert named == successors(s, schedule(s), (unit(1), unit(2)))
            assert [n.job_id for n in named] == [10 + first, 11 + first]
    assert len(placed) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), st.lists(histories(), min_size=1, max_size=3))
def test_with_a_memo_kept_across_calls_the_answers_are_the_plain_ones(data, runs):
    memo = PlaceMemo()
    for snapshot, steps in runs:
        priority = {q.name: q.priority for q in snapshot.queues}
        decisions = schedule(snapshot)
        running = data.draw(units_on(snapshot))
        for _ in range(2):  # the second time, everything it can comes from the memo
            assert successors(snapshot, decisions, running, memo=memo) == successors(snapshot, decisions, running)
            bare = replace(snapshot, jobs=())
            ranked = synced(steps, snapshot.jobs, priority)
            assert successors(bare, decisions, running, ranked=ranked, memo=memo) == \
                successors(snapshot, decisions, running)
        queued = tuple(QueuedSuccessor(job(2_000 + i, slots=data.draw(st.integers(1, 3)),
                                           queue=data.draw(st.sampled_from(QUEUES))), u.host, u.job_id)
                       for i, u in enumerate(running))
        predecessors = tuple(replace(u, taken=True) for u in running)
        assert outranked(snapshot, decisions, queued, predecessors, memo=memo) == \
            outranked(snapshot, decisions, queued, predecessors)
