"""A session that could only repeat the last answer is skipped (sched/settled.py): the worker is not
woken, and what the controller gets (no dispatch, no reason changed) is exactly what the core would
decide on the whole snapshot, through job ends, submissions, declined dispatches, time passing a
job's reservation bound, a killed worker and dropped answers, in one sequence."""

from __future__ import annotations

import os
import random
import signal

import pytest

from tests.support.minisched import RESERVE_AFTER, MiniController
from tests.support.sched import job
from tests.support.waiting import wait_until
from xce_lite.controller.sched_worker import InlineScheduler, SchedulerProcess
from xce_lite.sched.core import PendingJob

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


@pytest.mark.parametrize("kind", ["process", "inline"])
def test_sessions_skipped_while_waiting_jobs_leave_answer_what_the_whole_snapshot_decides(kind):
    """As above, with waiting jobs leaving the pending set between sessions (prefill names them
    successors, a kill), some of them holding a reservation (their wait is past RESERVE_AFTER)."""
    worker = SchedulerProcess(timeout=30) if kind == "process" else InlineScheduler()
    rng = random.Random(7)
    c = MiniController(worker)
    next_id = 1
    try:
        for _round in range(250):
            if rng.random() < 0.35:  # jobs end
                for job_id in rng.sample(sorted(c.running), k=min(len(c.running), rng.randrange(1, 3))):
                    del c.running[job_id]
            if rng.random() < 0.3:
                for _ in range(rng.randrange(1, 4)):
                    new = job(next_id, slots=rng.randrange(1, 4), queue=rng.choice(["normal", "high"]),
                              user=rng.choice(["alice", "bob"]), max_slots=None)
                    when = c.now - rng.choice([0.0, 0.0, 250.0, 299.0, 400.0])
                    c.pending.add(PendingJob(new.id, new.user, new.queue, new.request, submit_time=when))
                    next_id += 1
            if rng.random() < 0.3 and len(c.pending):  # waiting jobs leave
                for job_id in rng.sample(sorted(c.pending), k=min(len(c.pending), rng.randrange(1, 3))):
                    c.leave(job_id)
            c.now += rng.choice([0.0, 0.5, 1.0, 1.0, 30.0])
            if rng.random() < 0.03:
                _kill(worker)
            c.session(drop_answer=rng.random() < 0.03, decline=0.1, rng=rng)
        assert worker.skipped >= 20, worker.skipped
    finally:
        worker.close()


def test_a_waiting_job_leaving_wakes_the_worker_only_if_it_may_hold_a_reservation():
    """A job that waited leaves (prefill named it a successor): the others' answers stand, the worker
    is not woken; one whose wait passed reserve_after held a reservation the jobs behind it name."""
    worker = SchedulerProcess(timeout=30)
    c = MiniController(worker)
    try:
        for job_id in range(1, 7):  # 1-3 run; 4 has waited long: it holds a reservation, 5 and 6 wait behind it
            waited = RESERVE_AFTER + 5 if job_id == 4 else 0.0
            c.pending.add(PendingJob(job_id, "alice", "normal", job(job_id, slots=2).request,
                                     submit_time=c.now - waited))
        c.session()
        assert sorted(c.running) == [1, 2, 3] and sorted(c.pending) == [4, 5, 6]
        assert "reservation" in c.live[4] and "behind job 4" in c.live[6]
        pid = worker._proc.pid
        os.kill(pid, signal.SIGSTOP)  # a session sent to it would time out
        try:
            c.now += 1
            c.leave(5)
            c.session()  # the dispatches recorded and a waiting job gone: nothing to ask
            assert worker.skipped == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        c.leave(4)
        c.session()  # the holder left: asked, and job 6 waits behind nobody now
        assert worker.skipped == 1 and "behind" not in c.live[6]
        c.now += 1
        c.session()
        assert worker.skipped == 2
    finally:
        worker.close()
