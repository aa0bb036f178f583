"""A session that could only repeat the last answer is skipped (sched/settled.py): the worker is not
woken, and what the controller gets (no dispatch, no reason changed) is exactly what the core would
decide on the whole snapshot, through job ends, submissions, declined dispatches, time passing a
job's reservation bound, a killed worker and dropped answers, in one sequence."""

from __future__ import annotations

import os
import random
import signal

import pytest

from tests.support.sched import job
from tests.support.waiting import wait_until
from xce_lite.controller.pending_set import PendingSet
from xce_lite.controller.sched_worker import InlineScheduler, SchedulerProcess
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


def _kill(worker) -> None:
    if isinstance(worker, SchedulerProcess) and worker._proc is not None:
        os.kill(worker._proc.pid, signal.SIGKILL)
        wait_until(lambda: not worker._proc.is_alive(), 10, "the worker to die")


@pytest.mark.parametrize("kind", ["process", "inline"])
def test_skipped_sessions_answer_what_the_whole_snapshot_decides(kind):
    worker = SchedulerProcess(timeout=30) if kind == "process" else InlineScheduler()
    rng = random.Random(11)
    c = MiniController(worker)
    next_id = 1
    try:
        for _round in range(250):
            if rng.random() < 0.35:  # jobs end
                for job_id in rng.sample(sorted(c.running), k=min(len(c.running), rng.randrange(1, 3))):
                    del c.running[job_id]
            if rng.random() < 0.3:  # submissions, some of them waiting for long already
                for _ in range(rng.randrange(1, 4)):
                    new = job(next_id, slots=rng.randrange(1, 4), queue=rng.choice(["normal", "high"]),
                              user=rng.choice(["alice", "bob"]), max_slots=None)
                    when = c.now - rng.choice([0.0, 0.0, 250.0, 299.0, 400.0])
                    c.pending.add(PendingJob(new.id, new.user, new.queue, new.request, submit_time=when))
                    next_id += 1
            c.now += rng.choice([0.0, 0.5, 1.0, 1.0, 30.0])  # a wait may pass RESERVE_AFTER
            if rng.random() < 0.03:
                _kill(worker)
            c.session(drop_answer=rng.random() < 0.03, decline=0.1, rng=rng)
        assert worker.skipped >= 8, worker.skipped  # 11 with this seed: never woken for those
    finally:
        worker.close()


def test_the_worker_is_not_woken_for_a_session_that_would_repeat_the_last(tmp_path):
    worker = SchedulerProcess(timeout=30)
    c = MiniController(worker)
    try:
        for job_id in range(1, 6):
            c.pending.add(job(job_id, slots=2))
        c.session()
        assert sorted(c.running) == [1, 2, 3] and worker.skipped == 0  # 2 + 2 + 2 slots of 6
        pid = worker._proc.pid
        os.kill(pid, signal.SIGSTOP)  # a session sent to it would time out
        try:
            c.now += 1
            c.session()  # the dispatches recorded, nothing else: nothing to ask
            c.now += 1
            c.session()
            assert worker.skipped == 2
        finally:
            os.kill(pid, signal.SIGCONT)
        del c.running[1]  # a job ends: the worker decides again
        c.session()
        assert sorted(c.running) == [2, 3, 4] and worker.skipped == 2
        c.pending.add(PendingJob(9, "alice", "normal", job(9).request, submit_time=c.now - RESERVE_AFTER + 0.5))
        c.session()  # a new job: asked, its reason answered
        assert c.live[9] == c.whole[9]
        c.now += 1  # job 9's wait passes reserve_after: it holds a reservation now, and says so
        c.session()
        assert worker.skipped == 2 and "reservation" in c.live[9]
        c.now += 1
        c.session()
        assert worker.skipped == 3
    finally:
        worker.close()
