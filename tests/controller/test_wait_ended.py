"""`GET /jobs/wait` (wait_ended.py): a wait over n jobs that end one wake-up at a time checks O(n)
memberships, not O(n²); it returns only at an instant when none is open (a job that reopened
meanwhile, a requeue, is waited for); it returns at its deadline; while asleep it names the last
job of its list still open in `waited`, and a tick that ends none of the jobs waited on wakes no
waiter (Dispatching.apply), one that ends such a job does."""

from __future__ import annotations

from collections import Counter

from tests.support.inproc import InProc
from xce_lite.controller.wait_ended import wait_ended


class Ending:
    """A condition whose every wait ends the next open job (as a tick that ends one job notifies),
    and reopens `reopen` once, when the job `when` ends; it keeps what `waited` held at each wait."""

    def __init__(self, ids: list[int], waited: Counter[int], reopen: int | None = None,
                 when: int | None = None) -> None:
        self.open, self.order, self.waited = set(ids), list(ids), waited
        self.reopen, self.when = reopen, when
        self.checks = self.waits = 0
        self.watched: list[dict[int, int]] = []

    def is_open(self, job_id: int) -> bool:
        self.checks += 1
        return job_id in self.open

    def wait(self, _timeout: float) -> None:
        self.waits += 1
        self.watched.append(dict(self.waited))
        job_id = self.order.pop(0)
        self.open.discard(job_id)
        if job_id == self.when and self.reopen is not None:
            self.open.add(self.reopen)
            self.order.append(self.reopen)


def test_a_wait_over_jobs_ending_one_by_one_checks_each_about_twice():
    ids = list(range(1, 1001))
    waited: Counter[int] = Counter()
    cond = Ending(ids, waited)
    wait_ended(cond, ids, cond.is_open, 10.0, waited, clock=lambda: 0.0)
    assert not cond.open and cond.waits == 1000
    assert cond.checks <= 3 * len(ids) + 2 * cond.waits  # was ~n²/2 = 500,000 re-checking every id at each wake
    assert cond.watched[0] == {1000: 1} and cond.watched[-1] == {1000: 1}  # the last open one
    assert not waited  # nothing named once it returned


def test_a_job_that_reopens_after_it_was_seen_ended_is_waited_for():
    ids = list(range(1, 11))
    waited: Counter[int] = Counter()
    cond = Ending(ids, waited, reopen=2, when=10)  # job 2 ended long ago; it is requeued as the last ends
    wait_ended(cond, ids, cond.is_open, 10.0, waited, clock=lambda: 0.0)
    assert not cond.open and cond.waits == 11
    assert cond.watched[-1] == {2: 1}


def test_the_wait_ends_at_its_deadline_with_jobs_open():
    ids = [1, 2, 3]
    now = [0.0]

    class Never:
        def wait(self, timeout: float) -> None:
            now[0] += timeout

    waited: Counter[int] = Counter()
    wait_ended(Never(), ids, lambda _i: True, 5.0, waited, clock=lambda: now[0])
    assert now[0] == 5.0 and not waited


def test_a_tick_wakes_the_waits_only_when_it_ends_a_job_one_sleeps_on():
    p = InProc(hosts=("h1",), slots=1)
    try:
        p.step(0.1)  # the host comes up
        ids = [p.submit(runtime=1.0) for _ in range(3)]
        woken = []
        p.ctl.state.finished.notify_all = lambda: woken.append(p.clock.now)  # type: ignore[method-assign]
        p.ctl.state.waited[ids[-1]] = 1  # a wait sleeps until the last ends
        for _ in range(8):
            p.step(1.0)
        assert [p.job(i).state for i in ids] == ["DONE"] * 3
        assert len(woken) == 1, "the first two ends woke no wait; the last did"
    finally:
        p.close()
