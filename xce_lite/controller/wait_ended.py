"""Waiting until every job of a list has ended (`GET /jobs/wait`, `xce wait`), at a cost linear in
the list.

The waiter holds the state's lock and sleeps on `finished`, which every tick that ends jobs
notifies. Re-checking the whole list at each wake-up costs O(n) per wake-up: a wait over 1,000
jobs that end one tick at a time made ~500,000 membership checks under the tick's lock (~0.15 ms
of the controller's CPU per job in bench/cpu_per_job.py). So each wake-up checks on from the first
job still open; one found ended is looked at again only when the scan reaches the end, by one full
pass under the lock that confirms none reopened meanwhile (a requeue). The answer is the same: the
wait returns at an instant, under the lock, when no job of the list is open, or at its deadline.

Nor is the waiter woken by every tick that ends a job: it sleeps until the LAST job of its list still
open ends (`waited`, which the tick's `Dispatching.apply` reads: it notifies only when it ends a
job some wait sleeps on; a pending job killed by hand notifies always). Jobs end about in id order,
so a wait over 1,000 jobs is woken a few times instead of ~1,000 (each wake-up a lock handoff
and a switch of threads while the tick runs).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any


def wait_ended(finished: Any, ids: Sequence[int], is_open: Callable[[int], bool], deadline: float,
               waited: Counter[int], clock: Callable[[], float] = time.monotonic) -> None:
    """Block on the condition `finished` (whose lock the caller holds) until no job of `ids` is open,
    or `clock()` reaches `deadline`; while asleep the last job still open is in `waited`."""
    first, n = 0, len(ids)
    while True:
        while first < n and not is_open(ids[first]):
            first += 1
        if first == n:  # the rest ended since they were seen open: did an earlier one reopen?
            first = next((k for k, job_id in enumerate(ids) if is_open(job_id)), n)
            if first == n:
                return
        left = deadline - clock()
        if left <= 0:
            return
        last = next(ids[k] for k in range(n - 1, first - 1, -1) if is_open(ids[k]))  # ids[first] is open
        waited[last] += 1
        try:
            finished.wait(left)
        finally:
            waited[last] -= 1
            if not waited[last]:
                del waited[last]
