"""A watcher of the pending set (PendingSet.watch, prefilling.py's ranked index) sees a submission's jobs
entered as new (None) and keeps what it had (a job as it was before its first change) whichever side
add_all walks: the few new ids into a large watcher, or a large submission into a small one."""

from __future__ import annotations

import pytest

from tests.support.sched import job
from xce_lite.controller.pending_set import PendingSet


def _watched(new_jobs: int) -> tuple[dict, dict]:
    """The watcher after add_all of `new_jobs` jobs, and what add() one at a time leaves instead."""
    results = []
    for one_at_a_time in (False, True):
        pending = PendingSet()
        for i in range(1, 51):
            pending.add(job(i))
        watcher = pending.watch()
        old = pending.discard(7)  # the watcher keeps job 7 as it was, not None
        pending.add(job(3))  # replaced: job 3 as it was
        for i in range(60, 80):
            watcher[i] = None  # entered earlier, not pending now
        fresh = [job(i) for i in range(100, 100 + new_jobs)] + [job(65)]
        if one_at_a_time:
            for one in fresh:
                pending.add(one)
        else:
            pending.add_all(fresh)
        results.append(watcher)
        assert watcher[7] is old and watcher[3] is not None and watcher[65] is None
    return results[0], results[1]


@pytest.mark.parametrize("new_jobs", [2, 500])
def test_add_all_enters_new_ids_as_add_does_and_keeps_what_the_watcher_had(new_jobs):
    batched, single = _watched(new_jobs)
    assert batched == single
    assert all(batched[i] is None for i in range(100, 100 + new_jobs))
