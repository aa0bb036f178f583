"""The scheduler's worker process: fed with changes, it decides exactly what the core decides on
the whole snapshot (with the session cache it keeps between sessions, byte for byte) and answers
the pend reasons that changed, which applied to the controller's live map give every job the
reason the whole answer gives; out of step or dead, it recovers with a full resend and never a
wrong answer."""

from __future__ import annotations

import os
import random
import signal
import tracemalloc

import pytest

from tests.support.sched import host, job
from tests.support.waiting import wait_until
from xce_lite.controller import sched_worker
from xce_lite.controller.pending_set import PendingSet
from xce_lite.controller.sched_worker import InlineScheduler, SchedulerProcess
from xce_lite.sched.core import QueuePolicy, Snapshot, schedule
from xce_lite.sched.fairshare import USER, FairShare, FairShareInput, QueueShare
from xce_lite.sched.placement import HostView
from xce_lite.sched.reasons import FrozenMap

QUEUES = (QueuePolicy("normal", 30), QueuePolicy("high", 50))


@pytest.fixture
def worker():
    process = SchedulerProcess(timeout=30)
    try:
        yield process
    finally:
        process.close()


def _session(worker, pending: PendingSet, hosts, budget: int = 1_000_000):
    worker.send(pending, Snapshot(hosts, (), QUEUES), budget)
    return worker.receive()


@pytest.mark.parametrize("kind", ["process", "inline"])
def test_changes_give_the_same_decisions_and_live_reasons_as_the_whole_snapshot(kind):
    """As the controller does: a job leaving the set loses its live reason; a dispatched job stays
    pending now and then with another reason (a declined dispatch); now and then a job leaves and
    rejoins between two sessions, a session runs out of budget, the worker is killed, or the
    controller drops an answer and asks for every reason again."""
    worker = SchedulerProcess(timeout=30) if kind == "process" else InlineScheduler()
    rng = random.Random(7)
    pending = PendingSet()
    live: dict[int, str] = {}  # the controller's live map, fed with the answers' changes only
    whole: dict[int, str] = {}  # the same, fed with whole answers
    next_id = 1
    try:
        for _round in range(120):
            for _ in range(rng.randrange(0, 6)):
                pending.add(job(next_id, queue=rng.choice(["normal", "high"]), slots=rng.randrange(1, 4)))
                next_id += 1
            for job_id in rng.sample(list(pending), k=min(len(pending), rng.randrange(0, 3))):
                pending.discard(job_id)
                live.pop(job_id, None)
                whole.pop(job_id, None)
                if rng.random() < 0.3:
                    pending.add(job(job_id))  # held and released before the next session
            # h3 changes state now and then: the worker's session cache starts afresh
            closed = HostView("h3", rng.choice(("ok", "closed")), {"slots": 2})
            hosts = (host("h1", 4, rng.randrange(0, 5)), host("h2", 2, rng.randrange(0, 3)), closed)
            budget = rng.choice((1_000_000, 1_000_000, 3))
            expected = schedule(Snapshot(hosts, tuple(pending.values()), QUEUES), budget)
            if kind == "process" and rng.random() < 0.05:
                os.kill(worker._proc.pid, signal.SIGKILL)
                wait_until(lambda: not worker._proc.is_alive(), 10, "the worker to die")
            got = _session(worker, pending, hosts, budget)
            if rng.random() < 0.05:  # an answer the controller could not take in (a store that failed)
                pending.report_reasons_again()
                continue
            assert (got.dispatches, got.complete) == (expected.dispatches, expected.complete)
            for reason, ids in got.waiting:
                live.update(dict.fromkeys(ids, reason))
            for reason, ids in expected.waiting:
                whole.update(dict.fromkeys(ids, reason))
            assert list(live.items()) == list(whole.items())  # the same reasons, in the same order
            for d in expected.dispatches:
                if rng.random() < 0.5:
                    pending.discard(d.job_id)
                    live.pop(d.job_id, None)
                    whole.pop(d.job_id, None)
                else:  # declined: it stays pending with the controller's reason until the next answer
                    live[d.job_id] = whole[d.job_id] = "dispatch declined"
    finally:
        worker.close()


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


def test_an_answer_gives_only_the_reasons_that_changed(worker):
    pending = PendingSet()
    for job_id in (1, 2, 3):
        pending.add(job(job_id, slots=4))
    hosts = (host("h1", 4, 2),)
    assert sorted(i for _r, ids in _session(worker, pending, hosts).waiting for i in ids) == [1, 2, 3]
    assert _session(worker, pending, hosts).waiting == ()  # nothing changed: nothing answered
    pending.add(job(4, slots=4))
    assert [ids for _r, ids in _session(worker, pending, hosts).waiting] == [(4,)]
    pending.discard(2)
    pending.add(job(2, slots=4))  # left and came back: its reason is answered again
    assert [ids for _r, ids in _session(worker, pending, hosts).waiting] == [(2,)]
    pending.report_reasons_again()
    assert [ids for _r, ids in _session(worker, pending, hosts).waiting] == [(1, 2, 3, 4)]
    hosts = (host("h1", 4, 3),)  # another reason for all: all answered
    assert [ids for _r, ids in _session(worker, pending, hosts).waiting] == [(1, 2, 3, 4)]


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


def test_fair_share_sessions_in_the_worker_decide_as_the_core(worker):
    """The worker hands the core its jobs as a view of the set it keeps, not a tuple (sched_worker._serve):
    fair share, which orders every job itself, decides there as on the whole snapshot."""
    fair = FairShareInput((QueueShare("normal", FairShare(USER, 3600.0), FrozenMap({"alice": 36000.0})),),
                          FrozenMap({USER: FrozenMap({})}))
    pending = PendingSet()
    for job_id in range(1, 41):
        pending.add(job(job_id, user=("alice", "bob", "carol")[job_id % 3]))
    hosts = (host("h1", slots=3),)
    for _ in range(5):
        base = Snapshot(hosts, (), QUEUES, fairshare=fair)
        expected = schedule(Snapshot(hosts, tuple(pending.values()), QUEUES, fairshare=fair))
        worker.send(pending, base, 1_000_000)
        got = worker.receive()
        assert got is not None and got.dispatches == expected.dispatches and expected.dispatches
        for d in got.dispatches:
            pending.discard(d.job_id)


def test_a_whole_set_goes_in_pieces_and_the_worker_decides_as_the_core_on_it(worker, monkeypatch):
    """A whole set is sent PIECE_JOBS jobs a message (the pickler's memo of 10,000s of jobs at once
    was ~0.8 kB a job of the controller's peak RSS); the worker answers once, on the whole set, as
    the core does, and a worker killed between sessions is fed the whole set again in pieces."""
    monkeypatch.setattr(sched_worker, "PIECE_JOBS", 7)
    pending = PendingSet()
    for job_id in range(1, 50):
        pending.add(job(job_id, queue=("normal", "high")[job_id % 2]))
    hosts = (host("h1", slots=3), host("h2", slots=2))
    live: dict[int, str] = {}  # the controller's live reasons, fed with the answers' changes
    for round_ in range(3):
        expected = schedule(Snapshot(hosts, tuple(pending.values()), QUEUES))
        got = _session(worker, pending, hosts)
        assert got is not None and got.dispatches == expected.dispatches
        live.update(got.pend_reasons)
        for d in got.dispatches:
            pending.discard(d.job_id)
            live.pop(d.job_id, None)
        assert {i: live.get(i) for i in pending} == dict(expected.pend_reasons)
        for job_id in range(100 + 10 * round_, 110 + 10 * round_):  # more than a piece joins
            pending.add(job(job_id))
        if round_ == 1:
            os.kill(worker._proc.pid, signal.SIGKILL)
            wait_until(lambda: not worker._proc.is_alive(), 10, "the worker's end")


def test_sending_a_whole_set_of_5000_jobs_holds_no_pickle_memo_of_all_of_them(worker):
    """The controller's side of a whole set's send, traced: under 2 MB at its peak (in one
    message it was ~4 MB for these 5,000 small jobs, the pickler's memo of every object)."""
    pending = PendingSet()
    for job_id in range(1, 5001):
        pending.add(job(job_id))
    worker.start()
    tracemalloc.start()
    try:
        worker.send(pending, Snapshot((host("h1", slots=0),), (), QUEUES), 1_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert worker.receive() is not None
    assert peak < 2 * 1024 * 1024, peak


def test_a_worker_killed_just_before_a_send_costs_one_session_never_an_error(worker):
    """SIGKILLed, the worker may still look alive to the next send, which then writes into a broken
    pipe (a whole set's first piece does not fit in the pipe): that session answers None (the
    controller sends it again, in full), as a death seen in receive does, and the reasons held
    after the next one are the core's whole answer's. Ten times in a row."""
    pending = PendingSet()
    for job_id in range(1, 3001):
        pending.add(job(job_id, slots=8))  # more than any host has: they all wait
    hosts = (host("h1", slots=2),)
    live: dict[int, str] = {}  # the controller's live reasons, fed with the answers' changes
    for k in range(10):
        live.update(_session(worker, pending, hosts).pend_reasons)
        os.kill(worker._proc.pid, signal.SIGKILL)
        pending.add(job(5000 + k, slots=8))  # a change: the session is not skipped, it meets the dead worker
        if k % 2:
            worker.resync()  # a whole set to send (sched_switch: the worker takes over), in pieces
        got = _session(worker, pending, hosts)
        if got is None:  # the death seen: the next session sends everything
            got = _session(worker, pending, hosts)
        assert got is not None
        live.update(got.pend_reasons)
        expected = schedule(Snapshot(hosts, tuple(pending.values()), QUEUES))
        assert {i: live.get(i) for i in pending} == dict(expected.pend_reasons)
