"""The store-commit retry part (store_retry.StoreRetry) on a real store and a fake clock, and the
controller in-process with its store locked by another connection while a job ends."""

from __future__ import annotations

import apsw
import pytest

from tests.support.inproc import InProc
from xce_lite import errors
from xce_lite.controller.invariants import check_invariants
from xce_lite.controller.seams import FakeClock
from xce_lite.controller.store_retry import STORE_RETRY_MAX, StoreRetry
from xce_lite.store.jobs import JobStore


@pytest.fixture
def part(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    logs: list[str] = []
    yield StoreRetry(store, FakeClock(100.0), logs.append), logs
    store.close()


def test_failures_back_off_doubling_to_the_cap_and_are_logged_once_per_reason(part):
    retry, logs = part
    assert retry.due() and retry.wait() is None and retry.status(0) is None
    waits = []
    for _ in range(8):
        retry.failed(errors.StoreUnavailable("database is locked"), lambda: 3)
        waits.append(retry.wait())
        assert not retry.due()
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, STORE_RETRY_MAX, STORE_RETRY_MAX, STORE_RETRY_MAX]
    assert len(logs) == 1 and "3 report(s) wait" in logs[0]
    assert retry.store.impatient and retry.since == 100.0
    retry.failed(errors.StoreUnavailable("disk full"), lambda: 3)
    assert len(logs) == 2, "a new reason is said"
    status = retry.status(5)
    assert (status["why"], status["waiting"], status["since"]) == ("disk full", 5, 100.0)
    retry.clock.now += STORE_RETRY_MAX
    assert retry.due() and retry.wait() == 0.0
    retry.done()
    assert "after 9 failed commit(s) in 15 s" in logs[-1]
    assert retry.problem is None and retry.status(0) is None and not retry.store.impatient
    retry.failed(errors.StoreUnavailable("disk full"), lambda: 0)
    assert retry.wait() == 0.5, "a new run of failures starts from the first wait"


def test_a_store_locked_while_a_job_ends_loses_nothing_then_the_host_is_lost_then_a_restart():
    p = InProc()
    try:
        p.step(0.1)
        a = p.submit(runtime=3)
        b = p.submit(runtime=100)
        for _ in range(2):
            p.step(1.0)
        other = apsw.Connection(str(p.home.store))
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        for _ in range(2):
            p.step(1.0)  # a ends; the tick's commit fails (after the busy timeout), then backs off
            check_invariants(p.ctl)
        problem = p.ctl.faults.status()["problems"][0]
        assert problem["what"] == "store" and problem["waiting"] >= 1
        assert p.job(a).state == "RUN", "nothing of the failed commit is stored"
        assert not p.ctl.commits.due()
        other.execute("ROLLBACK")
        other.close()
        p.step(STORE_RETRY_MAX)
        check_invariants(p.ctl)
        assert p.job(a).state == "DONE" and p.ctl.faults.status()["problems"] == []
        host = p.job(b).hosts[0][0]
        p.drop(host)  # then b's host is lost: b runs elsewhere
        for _ in range(60):
            p.step(1.0)
            check_invariants(p.ctl)
        assert p.job(b).state == "RUN" and p.job(b).attempt == 2
        p.restart()  # and the next controller starts with a clean slate
        p.step(1.0)
        assert p.ctl.commits.problem is None and p.job(b).state == "RUN"
    finally:
        p.close()
