"""The pool's allocation policy (sched/pools.py), by tables: state + demand + now -> decisions."""

from __future__ import annotations

import pytest

from xce_lite.sched.pools import Allocation, Demand, PoolShape, decide, time_left_term

POOL = PoolShape(max_allocations=2, slots_per_allocation=4, time_limit=3600, idle_timeout=600)
NOW = 10_000.0


def running(job_id: str, busy=False, idle_since=NOW, left=3000.0, free=0) -> Allocation:
    return Allocation(job_id, "running", NOW + left if left is not None else None, busy, idle_since, free)


def pending(job_id: str) -> Allocation:
    return Allocation(job_id, "pending")


def d(slots=1, w=None, job_id=1) -> Demand:
    return Demand(job_id, slots, w)


@pytest.mark.parametrize("allocations, demand, submit, released, case", [
    ([], [], 0, [], "nothing waits: nothing to do"),
    ([], [d()], 1, [], "one job waits: one allocation"),
    ([], [d(4), d(4), d(4)], 2, [], "backlog of three allocations' worth: capped at max_allocations"),
    ([], [d(2), d(2)], 1, [], "two jobs fit one allocation's slots"),
    ([pending("7")], [d(2), d(2)], 0, [], "a pending allocation will bring those slots"),
    ([pending("7")], [d(4), d(4)], 1, [], "one more for the rest of the backlog"),
    ([pending("7"), pending("8")], [d(4)] * 5, 0, [], "never more than max_allocations, pending ones count"),
    ([running("7", busy=True, free=2)], [d(2)], 0, [], "free slots on a running allocation take the job"),
    ([], [d(5)], 0, [], "a job wider than an allocation is no demand"),
    ([], [d(1, w=7200)], 0, [], "a job longer than the time limit is no demand"),
    ([running("7", idle_since=NOW - 600)], [], 0, ["7"], "idle for idle_timeout: released"),
    ([running("7", idle_since=NOW - 599)], [], 0, [], "idle, not yet for idle_timeout: kept"),
    ([running("7", busy=True, idle_since=NOW - 5000)], [], 0, [], "a busy allocation is never idle"),
    ([running("7", idle_since=NOW - 5000, free=4)], [d(1, w=100)], 0, [],
     "a waiting job fits: kept, whatever the clock"),
    ([running("7", left=50, free=4)], [d(1, w=100)], 1, ["7"],
     "draining: its time left is too short for the waiting job; released and replaced"),
    ([running("7", left=50, free=4)], [d(1, w=100), d(1)], 0, [], "a job with no -W may still go there"),
    ([running("7", left=50, busy=True)], [d(1, w=100)], 1, [], "a busy draining allocation ends by itself"),
    ([running("7", left=None, idle_since=NOW - 10, free=4)], [d(1, w=3000)], 0, [], "no time limit: never draining"),
])
def test_decide(allocations, demand, submit, released, case) -> None:
    got = decide(POOL, allocations, demand, NOW)
    assert (got.submit, [j for j, _ in got.release]) == (submit, released), case


def test_release_says_why() -> None:
    [(_, idle)] = decide(POOL, [running("7", idle_since=NOW - 700)], [], NOW).release
    assert idle == "idle for 11m40s (idle_timeout 10m00s)"
    [(_, drain)] = decide(POOL, [running("7", left=50, free=4)], [d(1, w=100)], NOW).release
    assert drain == "draining: its 50s left are too short for the 1 waiting job(s)"


def test_no_sbatch_during_a_failed_ones_back_off() -> None:
    assert decide(POOL, [], [d()], NOW, retry_at=NOW + 1).submit == 0
    assert decide(POOL, [], [d()], NOW, retry_at=NOW).submit == 1


def test_time_left_term() -> None:
    assert time_left_term(99.5) == "select[type!=slurm || time_left>=100]"
