"""`GET /jobs/wait` (wait_ended.py): a wait over n jobs that end one wake-up at a time checks O(n)
memberships, not O(n²); it returns only at an instant when none is open (a job that reopened
meanwhile, a requeue, is waited for); and it returns at its deadline."""

from __future__ import annotations

from xce_lite.controller.wait_ended import wait_ended


class Ending:
    """A condition whose every wait ends the next open job (as a tick that ends one job notifies),
    and reopens `reopen` once, when the job `when` ends."""

    def __init__(self, ids: list[int], reopen: int | None = None, when: int | None = None) -> None:
        self.open, self.order = set(ids), list(ids)
        self.reopen, self.when = reopen, when
        self.checks = self.waits = 0

    def is_open(self, job_id: int) -> bool:
        self.checks += 1
        return job_id in self.open

    def wait(self, _timeout: float) -> None:
        self.waits += 1
        job_id = self.order.pop(0)
        self.open.discard(job_id)
        if job_id == self.when and self.reopen is not None:
            self.open.add(self.reopen)
            self.order.append(self.reopen)


def test_a_wait_over_jobs_ending_one_by_one_checks_each_about_twice():
    ids = list(range(1, 1001))
    cond = Ending(ids)
    wait_ended(cond, ids, cond.is_open, deadline=10.0, clock=lambda: 0.0)
    assert not cond.open and cond.waits == 1000
    assert cond.checks <= 2 * len(ids) + cond.waits  # was ~n²/2 = 500,000 re-checking every id at each wake


def test_a_job_that_reopens_after_it_was_seen_ended_is_waited_for():
    ids = list(range(1, 11))
    cond = Ending(ids, reopen=2, when=10)  # job 2 ended long ago; it is requeued as the last ends
    wait_ended(cond, ids, cond.is_open, deadline=10.0, clock=lambda: 0.0)
    assert not cond.open and cond.waits == 11


def test_the_wait_ends_at_its_deadline_with_jobs_open():
    ids = [1, 2, 3]
    now = [0.0]

    class Never:
        def wait(self, timeout: float) -> None:
            now[0] += timeout

    wait_ended(Never(), ids, lambda _i: True, deadline=5.0, clock=lambda: now[0])
    assert now[0] == 5.0
