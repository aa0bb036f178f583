"""A miniature of what the controller keeps for scheduling sessions (the pending set, the running jobs'
placements, the live reasons fed with the answers' changes), for tests that drive a scheduler seam
and compare every answer with what the core decides on the whole snapshot."""

from __future__ import annotations

import random

from xce_lite.controller.pending_set import PendingSet
from xce_lite.sched.core import PendingJob, QueuePolicy, Snapshot, schedule
from xce_lite.sched.placement import HostView
from xce_lite.sched.reasons import Placement

QUEUES = (QueuePolicy("normal", 30), QueuePolicy("high", 50, running_limit=3))
TOTALS = {"h1": 4, "h2": 2}
RESERVE_AFTER = 300.0


class MiniController:
    """What the controller keeps for a session: the pending set, the running jobs' placements, the
    live reasons fed with the answers' changes, and the whole answers' reasons to compare with."""

    def __init__(self, worker) -> None:
        self.worker, self.pending = worker, PendingSet()
        self.running: dict[int, tuple[PendingJob, Placement]] = {}
        self.live: dict[int, str] = {}
        self.whole: dict[int, str] = {}
        self.now = 1000.0

    def base(self) -> Snapshot:
        used = dict.fromkeys(TOTALS, 0)
        rows: dict[tuple[str, str], int] = {}
        for pending, placement in self.running.values():
            for alloc in placement.allocs:
                used[alloc.host] += alloc.tasks
            rows[(pending.queue, pending.user)] = rows.get((pending.queue, pending.user), 0) + placement.tasks
        hosts = tuple(HostView(name, "ok", {"slots": n}, {"slots": n - used[name]}) for name, n in TOTALS.items())
        return Snapshot(hosts, (), QUEUES, running=tuple((q, u, n) for (q, u), n in rows.items()), now=self.now,
                        reserve_after=RESERVE_AFTER)

    def session(self, drop_answer: bool = False, decline: float = 0.0, rng: random.Random | None = None):
        base = self.base()
        expected = schedule(Snapshot(base.hosts, tuple(self.pending.values()), base.queues, base.shared_free,
                                     base.running, base.now, base.reserve_after))
        self.worker.send(self.pending, base, 1_000_000)
        got = self.worker.receive()
        assert got is not None
        assert (got.dispatches, got.complete) == (expected.dispatches, expected.complete)
        if drop_answer:  # the controller could not take it in (a store that failed)
            self.pending.report_reasons_again()
            return
        for reason, ids in got.waiting:
            self.live.update(dict.fromkeys(ids, reason))
        for reason, ids in expected.waiting:
            self.whole.update(dict.fromkeys(ids, reason))
        assert list(self.live.items()) == list(self.whole.items())  # the same reasons, in the same order
        for d in expected.dispatches:
            if rng is not None and rng.random() < decline:  # stays pending with the controller's reason
                self.live[d.job_id] = self.whole[d.job_id] = "dispatch declined"
                continue
            pending = self.pending.discard(d.job_id)
            assert pending is not None
            self.live.pop(d.job_id, None)
            self.whole.pop(d.job_id, None)
            self.running[d.job_id] = (pending, d.placement)

    def leave(self, job_id: int) -> None:
        """Pending job `job_id` leaves the set without running here (prefill named it a successor: it
        holds nothing in the views while queued; or it was killed)."""
        assert self.pending.discard(job_id) is not None
        self.live.pop(job_id, None)
        self.whole.pop(job_id, None)
