"""The scheduler seam runs a small session inline and a large one in the worker (sched_switch.py);
whichever side runs, the controller decides what the in-process scheduler alone decides.

Two controllers (tests/support/inproc.py: fake hosts, fake clock, real stores) take the same requests
and faults tick by tick: one with InlineScheduler alone, one with SwitchingScheduler on bounds small
enough that bursts of submissions send its sessions to a real worker process and job ends bring them
back. After every tick both hold the same jobs in the same states on the same hosts, with the same
live and stored pend reasons; in sequence: crossings both ways, hosts cut off and back, holds and
kills, the worker SIGKILLed while sessions run inline (it is started again when the set grows),
and a restart of both controllers in the middle.
"""

from __future__ import annotations

import itertools
import os
import random
import signal

from tests.support.minisched import MiniController
from tests.support.inproc import InProc
from tests.support.sched import job
from tests.support.waiting import wait_until
from xce_lite.controller.sched_switch import SwitchingScheduler
from xce_lite.sched.core import PendingJob

HOSTS = ("h1", "h2")
UP, DOWN = 4, 2


def _view(p: InProc, ids: list[int]) -> dict:
    jobs = {}
    for job_id in ids:
        job = p.job(job_id)
        jobs[job_id] = (job.state, job.hosts, job.attempt, job.pend_reason, p.live_reason(job_id))
    return {"jobs": jobs, "units": p.live_units()}


class Twins:
    """The same requests and faults to a controller with the inline scheduler alone (`ref`) and one
    with the switching seam (`sub`), compared after every tick."""

    def __init__(self) -> None:
        self.ref = InProc(hosts=HOSTS, slots=2)
        self.sub = InProc(hosts=HOSTS, slots=2, scheduler_factory=lambda: SwitchingScheduler(
            UP, DOWN, slow=None, timeout=30))
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self.sides: list[bool] = []  # the side of the sub's sessions after each tick (True: worker)

    @property
    def seam(self) -> SwitchingScheduler:
        return self.sub.ctl._scheduler

    def both(self, call):
        got = call(self.ref), call(self.sub)
        assert got[0] == got[1], got
        return got[0]

    def submit(self, runtime: float, slots: int) -> None:
        self.ids.append(self.both(lambda p: p.submit(runtime=runtime, slots=slots)))

    def step(self, dt: float) -> None:
        self.ref.step(dt)
        self.sub.step(dt)
        self.sides.append(self.seam.in_worker)
        self.sizes.append(len(self.sub.ctl.state.pending))
        assert _view(self.ref, self.ids) == _view(self.sub, self.ids)

    def pending(self) -> list[int]:
        return [i for i in self.ids if self.ref.job(i).state == "PEND"]

    def worker_pid(self) -> int | None:
        process = self.seam._process
        if process is None or process._proc is None or not process._proc.is_alive():
            return None
        return process._proc.pid

    def restart(self) -> None:
        self.sub.ctl._scheduler.close()
        self.ref.restart()
        self.sub.restart()

    def close(self) -> None:
        self.seam.close()
        self.ref.close()
        self.sub.close()


def test_sessions_on_either_side_decide_as_the_inline_scheduler_alone_through_faults():
    rng = random.Random(18)
    t = Twins()
    killed: list[int] = []  # worker pids SIGKILLed while the sessions ran inline
    try:
        t.step(0.1)
        for round_ in range(240):
            if round_ == 120:
                t.restart()
            pid = t.worker_pid()
            # once, while inline after two stays in the worker: the second takeover reused a live
            # worker out of step (the resync's test), the one after the kill starts a new one
            went = sum(1 for a, b in itertools.pairwise(t.sides) if b and not a)
            if pid is not None and not t.seam.in_worker and not killed and went >= 2 and rng.random() < 0.2:
                os.kill(pid, signal.SIGKILL)  # the next session to go there starts a new one
                wait_until(lambda: t.worker_pid() is None, 10, "the killed worker to be seen dead")
                killed.append(pid)
            if rng.random() < 0.15:  # a burst: often past UP
                for _ in range(rng.randrange(1, 7)):
                    t.submit(runtime=rng.choice([1.0, 2.0, 4.0, 8.0]), slots=rng.choice([1, 1, 2]))
            if rng.random() < 0.08:
                host = rng.choice(HOSTS)
                t.both(lambda p, host=host: p.back(host) if host in p.dropped else p.drop(host))
            pending = t.pending()
            if pending and rng.random() < 0.1:
                victim = rng.choice(pending)
                t.both(lambda p, victim=victim: p.hold(victim))
                held = victim
                t.step(rng.choice([0.5, 1.0]))
                t.both(lambda p, held=held: p.release(held))
            if pending and rng.random() < 0.05:
                victim = rng.choice(pending)
                t.both(lambda p, victim=victim: p.kill(victim) and None)
            t.step(rng.choice([0.5, 1.0, 1.0, 2.0]))
        for host in HOSTS:
            t.both(lambda p, host=host: p.back(host))
        for _ in range(400):  # drain: every job ends, on both alike
            if not t.pending() and all(t.ref.job(i).state in ("DONE", "EXIT") for i in t.ids):
                break
            t.step(1.0)
        assert all(t.sub.job(i).state in ("DONE", "EXIT") for i in t.ids), "a job was lost"
        switches = sum(a != b for a, b in itertools.pairwise(t.sides))
        assert switches >= 6, (switches, t.sizes)  # both ways, several times
        assert killed, "the worker was never killed while the sessions ran inline"
        after_kill = t.sides[len(t.sides) // 2:]
        assert any(after_kill), "the sessions never went back to a (new) worker"
    finally:
        t.close()


def test_the_side_follows_the_set_with_hysteresis_and_a_slow_inline_session_moves_the_bound():
    """Sizes up and down around the bounds: to the worker only above `up`, back only at `down`;
    an inline session that ran too long sends that size to the worker from then on. Every answer
    is the core's on the whole snapshot (MiniController checks each one)."""
    seam = SwitchingScheduler(up=6, down=3, slow=None, timeout=30, background_start=False)
    c = MiniController(seam)
    sides = []
    try:
        next_id = 1
        for target in (2, 5, 6, 7, 9, 5, 4, 3, 2, 5, 7, 0):
            while len(c.pending) < target:
                c.pending.add(job(next_id, slots=8))  # more than any host has: they all wait
                next_id += 1
            while len(c.pending) > target:
                c.pending.discard(next(iter(c.pending)))
            c.session()
            sides.append(seam.in_worker)
        assert sides == [False, False, False, True, True, True, True, False, False, False, True, False]
        assert seam._process is not None and seam.skipped == 0

        # any cost is too much
        slow = SwitchingScheduler(up=100, down=50, slow=0.0, slow_run=3, timeout=30, background_start=False)
        c = MiniController(slow)
        for job_id in range(1, 11):
            c.pending.add(job(job_id, slots=8))
        c.session()  # the first (full) session: its cost is not a small one's
        for job_id in range(11, 14):  # three in a row too slow (each with a new job: none skipped)
            assert not slow.in_worker and slow._process is None  # no worker started yet
            c.pending.add(job(job_id, slots=8))
            c.session()
        assert (slow.up, slow.down) == (12, 6)  # 13 jobs: too many inline on this "cluster"
        c.session()
        assert slow.in_worker and slow._process is not None
        slow.close()
    finally:
        seam.close()


def test_a_lowered_bound_rises_back_after_sessions_without_a_slow_one_and_waits_longer_after_a_failed_rise():
    """Slow inline sessions lower `up`; once sessions are fast again it doubles back to the bounds
    made with (it used to stay low for the controller's life, every mid-sized set in the worker),
    and a rise that proves too much again doubles the wait before the next one."""
    seam = SwitchingScheduler(up=100, down=50, slow=0.0, slow_run=3, timeout=30, background_start=False)
    seam.rise_after = 4  # sessions in a row without a slow one before a lowered bound doubles
    c = MiniController(seam)
    next_id = 1

    def session(size: int) -> None:
        nonlocal next_id
        while len(c.pending) < size:
            c.pending.add(job(next_id, slots=8))  # more than any host has: they all wait
            next_id += 1
        while len(c.pending) > size:
            c.pending.discard(next(iter(c.pending)))
        c.session()

    try:
        for size in (10, 11, 12, 13):  # a full session, then three slow ones in a row
            session(size)
        assert (seam.up, seam.down) == (12, 6)
        seam.slow = 10.0  # the machine is calm again: no session is slow now
        bounds = [(seam.up, seam.down)]
        for size in range(14, 34):  # a rise after every 4 counted (a full session after a switch is not)
            session(size)
            if (seam.up, seam.down) != bounds[-1]:
                bounds.append((seam.up, seam.down))
        assert bounds == [(12, 6), (24, 12), (48, 24), (96, 48), (100, 50)]
        session(40)  # at `down` or fewer: inline again
        session(90)  # what the made bounds keep inline stays inline
        assert not seam.in_worker and (seam.up, seam.down) == (100, 50)

        seam.slow = 0.0  # costly again at this size: three slow sessions lower the bound again
        for size in (91, 92, 93):
            session(size)
        assert (seam.up, seam.down) == (92, 46) and seam.rise_after == 8  # the rise failed: wait twice as long
        seam.slow = 10.0
        for size in range(94, 101):  # 7 sessions: no rise yet
            session(size)
        assert (seam.up, seam.down) == (92, 46)
        session(101)
        assert (seam.up, seam.down) == (100, 50)
    finally:
        seam.close()


def test_the_inline_side_lets_go_of_the_set_when_the_worker_takes_over_and_answers_in_full_when_back():
    """What the inline side indexed of the pending set is the controller's memory (~2 MB at the
    4,000-6,000 jobs a switch meets in bench/run.py's rss run): it is dropped at the switch, and
    the sessions back inline still give the core's answers on the whole snapshot."""
    seam = SwitchingScheduler(up=4, down=2, slow=None, timeout=30, background_start=False)
    c = MiniController(seam)
    try:
        for job_id in range(1, 4):
            c.pending.add(job(job_id, slots=8))  # more than any host has: they all wait
        c.session()
        assert not seam.in_worker and len(seam._inline._backlog) == 3 and len(seam._inline._sent) == 3
        for job_id in range(4, 8):
            c.pending.add(job(job_id, slots=8))
        c.session()
        assert seam.in_worker
        assert len(seam._inline._backlog) == 0 and len(seam._inline._sent) == 0
        for job_id in range(3, 8):
            c.pending.discard(job_id)
        c.session()  # 2 jobs: inline again, afresh (MiniController checks the answer and every reason)
        assert not seam.in_worker and len(seam._inline._backlog) == 2
    finally:
        seam.close()


def test_the_worker_first_starts_on_a_thread_of_its_own_and_sessions_stay_inline_until_it_is_up():
    """`send` runs under the controller's lock: the worker's first start (~0.3 s) is not made there."""
    seam = SwitchingScheduler(up=4, down=2, slow=None, timeout=30)
    c = MiniController(seam)
    try:
        for job_id in range(1, 4):
            c.pending.add(job(job_id, slots=8))
        c.session()  # 3 > down: the start begins, on its own thread
        starter = seam._starter
        assert starter is not None and not seam.in_worker
        for job_id in range(4, 8):
            c.pending.add(job(job_id, slots=8))
        c.session()  # past up; inline still, unless the worker is up already
        # (the session above may have found the start over and let go of the thread already)
        wait_until(lambda: not starter.is_alive(), 30, "the worker's start")
        c.pending.add(job(8, slots=8))
        c.session()
        assert seam.in_worker and seam._process._proc.is_alive()
    finally:
        seam.close()


def test_every_answer_is_the_whole_snapshots_through_random_crossings():
    """MiniController (tests/sched/test_sched_skip.py) checks each answer's dispatches and the live
    reasons against the core on the whole snapshot, through job ends, submissions (some long
    waiting: reservations), declined dispatches and dropped answers, while the set crosses the
    bounds both ways: a side that took over with another's memory (set, reasons, shortcut) fails."""
    rng = random.Random(7)
    seam = SwitchingScheduler(up=5, down=2, slow=None, timeout=30, background_start=False)
    c = MiniController(seam)
    next_id, sides = 1, []
    try:
        for _round in range(400):
            if rng.random() < 0.7:  # jobs end
                for job_id in rng.sample(sorted(c.running), k=min(len(c.running), rng.randrange(1, 4))):
                    del c.running[job_id]
            if rng.random() < 0.3:
                for _ in range(rng.randrange(1, 5)):
                    new = job(next_id, slots=rng.randrange(1, 4), queue=rng.choice(["normal", "high"]),
                              user=rng.choice(["alice", "bob"]), max_slots=None)
                    when = c.now - rng.choice([0.0, 0.0, 250.0, 299.0, 400.0])
                    c.pending.add(PendingJob(new.id, new.user, new.queue, new.request, submit_time=when))
                    next_id += 1
            c.now += rng.choice([0.0, 0.5, 1.0, 1.0, 30.0])
            c.session(drop_answer=rng.random() < 0.02, decline=0.1, rng=rng)
            sides.append(seam.in_worker)
        assert sum(a != b for a, b in itertools.pairwise(sides)) >= 10, sides
    finally:
        seam.close()


def test_a_reason_changed_while_the_worker_ran_is_answered_again_inline():
    """Job X's reason is A inline, B while the worker runs, A again once back inline: the inline
    side's memory says A was answered, but the controller holds B; only its resync sends A."""
    seam = SwitchingScheduler(up=5, down=2, slow=None, timeout=30, background_start=False)
    c = MiniController(seam)
    try:
        for job_id in (1, 2, 3):  # three high jobs of 1 slot run: the queue's limit of 3 is reached
            c.pending.add(job(job_id, slots=1, queue="high"))
        c.session()
        assert sorted(c.running) == [1, 2, 3]
        c.pending.add(job(10, slots=2, queue="high"))
        c.session()
        assert not seam.in_worker and "(3 in use)" in c.live[10]  # A
        for job_id in range(20, 25):  # never fit: the set grows past `up`
            c.pending.add(job(job_id, slots=8))
        del c.running[1]
        c.session()
        assert seam.in_worker and "(2 in use)" in c.live[10]  # B, answered by the worker
        for job_id in range(20, 25):
            c.pending.discard(job_id)
        c.pending.add(job(4, slots=1, queue="high"))  # runs: 3 in use again
        c.session()
        c.session()
        assert not seam.in_worker and "(3 in use)" in c.live[10]  # A again (MiniController compares all)
    finally:
        seam.close()
