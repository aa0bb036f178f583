"""The scheduler's worker process: fed with changes, it decides exactly what the core decides on
the whole snapshot (with the session cache it keeps between sessions, byte for byte); out of step or
dead, it recovers with a full resend and never a wrong answer."""

from __future__ import annotations

import os
import pickle
import random
import signal

import pytest

from tests.support.sched import host, job
from tests.support.waiting import wait_until
from xce_lite.controller.sched_worker import PendingSet, SchedulerProcess
from xce_lite.sched.core import QueuePolicy, Snapshot, schedule
from xce_lite.sched.placement import HostView

QUEUES = (QueuePolicy("normal", 30), QueuePolicy("high", 50))


@pytest.fixture
def worker():
    process = SchedulerProcess(timeout=30)
    try:
        yield process
    finally:
        process.close()


def _session(worker: SchedulerProcess, pending: PendingSet, hosts):
    worker.send(pending, Snapshot(hosts, (), QUEUES), 1_000_000)
    return worker.receive()


def test_changes_give_the_same_decisions_as_the_whole_snapshot(worker):
    rng = random.Random(7)
    pending = PendingSet()
    next_id = 1
    for _round in range(60):
        for _ in range(rng.randrange(0, 6)):
            pending.add(job(next_id, queue=rng.choice(["normal", "high"]), slots=rng.randrange(1, 4)))
            next_id += 1
        for job_id in rng.sample(list(pending), k=min(len(pending), rng.randrange(0, 3))):
            pending.discard(job_id)
        # h3 changes state now and then: the worker's session cache starts afresh
        closed = HostView("h3", rng.choice(("ok", "closed")), {"slots": 2})
        hosts = (host("h1", 4, rng.randrange(0, 5)), host("h2", 2, rng.randrange(0, 3)), closed)
        expected = schedule(Snapshot(hosts, tuple(pending.values()), QUEUES))
        assert pickle.dumps(_session(worker, pending, hosts)) == pickle.dumps(expected)


def test_a_change_the_worker_missed_is_caught_by_the_checksum_and_resent(worker):
    pending = PendingSet()
    for job_id in (1, 2, 3):
        pending.add(job(job_id))
    hosts = (host("h1", 8),)
    assert _session(worker, pending, hosts) is not None
    pending.add(job(4))
    pending.take_changes(full=False)  # lost on the way: the worker never hears of job 4
    assert _session(worker, pending, hosts) is None  # out of step: said so, decided nothing
    decisions = _session(worker, pending, hosts)  # the next session sends everything
    assert sorted(d.job_id for d in decisions.dispatches) == [1, 2, 3, 4]


def test_a_dead_worker_is_replaced(worker):
    pending = PendingSet()
    pending.add(job(1))
    hosts = (host("h1", 1),)
    assert _session(worker, pending, hosts) is not None
    pid = worker._proc.pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not worker._proc.is_alive(), 10, "the worker to die")
    decisions = _session(worker, pending, hosts)  # a new worker, sent the whole set
    assert [d.job_id for d in decisions.dispatches] == [1]
    assert worker._proc.pid != pid


def test_pending_set_reports_changes_once():
    pending = PendingSet()
    pending.add(job(1))
    pending.add(job(2))
    added, removed, checksum = pending.take_changes(full=False)
    assert [j.id for j in added] == [1, 2] and removed == () and checksum[0] == 2
    pending.discard(1)
    pending.discard(99)  # not there: no change
    added, removed, checksum = pending.take_changes(full=False)
    assert added == () and removed == (1,) and checksum[0] == 1
    assert pending.take_changes(full=False)[:2] == ((), ())
    assert [j.id for j in pending.take_changes(full=True)[0]] == [2]
