"""The controller's tick in-process (tests/support/inproc.py): the real Controller on fake hosts, a
fake clock and a real store, `check_invariants` after every tick; faults in sequence."""

from __future__ import annotations

import pytest

from tests.support.inproc import InProc
from xce_lite.controller.invariants import InvariantBroken, check_invariants


@pytest.fixture
def inproc():
    p = InProc()
    p.step(0.1)  # the hosts come up
    yield p
    p.close()


def run(p: InProc, seconds: float, killed: set[int] = frozenset()) -> None:
    """Tick once a second for `seconds`, checking the invariants after each tick."""
    for _ in range(int(seconds)):
        p.step(1.0)
        check_invariants(p.ctl, killed)


def dispatches(p: InProc, job_id: int) -> int:
    return sum(1 for _t, kind, _d in p.ctl.store.events(job_id) if kind == "dispatched")


def test_a_job_runs_to_done_and_its_result_is_forgotten(inproc):
    a = inproc.submit(runtime=5)
    run(inproc, 8)
    job = inproc.job(a)
    assert (job.state, job.exit_code) == ("DONE", 0)
    assert all(not units for units in inproc.live_units().values())
    assert all(not h.units for h in inproc.hosts.values()), "stored results are forgotten by their hosts"


def test_a_failed_attempt_is_retried_then_ends_exit(inproc):
    a = inproc.submit(runtime=2, exit_code=3, retry=1)
    run(inproc, 10)
    job = inproc.job(a)
    assert (job.state, job.exit_code, job.attempt, job.retries) == ("EXIT", 3, 2, 1)


def test_slots_are_never_over_given(inproc):
    ids = [inproc.submit(runtime=3) for _ in range(9)]  # 2 hosts x 2 slots
    for _ in range(20):
        inproc.step(1.0)
        check_invariants(inproc.ctl)
        assert all(len(units) <= 2 for units in inproc.live_units().values())
    assert {inproc.job(i).state for i in ids} == {"DONE"}


def test_lost_host_requeues_then_back_then_restart(inproc):
    """Faults in sequence: the job's host is cut off (it stops the job when its lease runs out), it
    is declared lost and the job runs elsewhere; the host comes back; the controller restarts."""
    a = inproc.submit(runtime=100)
    run(inproc, 2)
    first = inproc.job(a).hosts[0][0]
    other = "h2" if first == "h1" else "h1"
    inproc.drop(first)
    run(inproc, 50)  # host_lost_after 40 s
    job = inproc.job(a)
    assert (job.state, job.attempt, job.hosts[0][0]) == ("RUN", 2, other)
    inproc.back(first)
    run(inproc, 3)
    inproc.restart()
    run(inproc, 110)
    job = inproc.job(a)
    assert (job.state, job.attempt, dispatches(inproc, a)) == ("DONE", 2, 2)


def test_killed_then_host_lost_is_never_requeued(inproc):
    """Kill wins: the kill cannot reach the job's host (cut off), the host is lost, the job ends
    EXIT with the kill's reason and never runs again, also after the host is back and a restart."""
    a = inproc.submit(runtime=200)
    run(inproc, 2)
    first = inproc.job(a).hosts[0][0]
    inproc.drop(first)
    run(inproc, 1)
    assert inproc.kill(a)["ok"]
    run(inproc, 50, killed={a})
    job = inproc.job(a)
    assert job.state == "EXIT" and job.reason.startswith("killed by"), job.reason
    inproc.back(first)
    inproc.restart()
    run(inproc, 10, killed={a})
    assert dispatches(inproc, a) == 1
    assert all(not units for units in inproc.live_units().values())


def test_held_job_waits_and_runs_once_released(inproc):
    a = inproc.submit(runtime=2, hold=True)
    run(inproc, 3)
    assert inproc.job(a).state == "PSUSP"
    inproc.release(a)
    run(inproc, 5)
    assert inproc.job(a).state == "DONE"


def test_check_invariants_names_a_job_both_pending_and_active(inproc):
    a = inproc.submit(runtime=50)
    run(inproc, 2)
    inproc.ctl.state.held[a] = "someone"  # a broken view, made by hand
    with pytest.raises(InvariantBroken, match=f"job {a} is both held and active"):
        check_invariants(inproc.ctl)


def test_a_job_on_two_hosts_ends_with_its_first_unit_and_its_other_unit_is_stopped(inproc):
    a = inproc.submit(runtime=4, slots=3)  # 2 slots per host: 2 + 1
    run(inproc, 2)
    job = inproc.job(a)
    assert job.state == "RUN" and sorted(n for _h, n in job.hosts) == [1, 2]
    assert sum(len(units) for units in inproc.live_units().values()) == 2
    run(inproc, 5)
    assert inproc.job(a).state == "DONE"
    assert all(not units for units in inproc.live_units().values()), "the other host's unit is stopped"


def test_a_job_on_two_hosts_loses_one_is_requeued_and_runs_once_both_are_back(inproc):
    a = inproc.submit(runtime=30, slots=3)
    run(inproc, 2)
    first = inproc.job(a).hosts[0][0]
    inproc.drop(first)
    run(inproc, 50)  # lost: requeued; no host can take 3 tasks now
    job = inproc.job(a)
    assert (job.state, job.attempt) == ("PEND", 1)
    assert all(not units for units in inproc.live_units().values()), "the other host's unit is stopped"
    inproc.back(first)
    run(inproc, 40)
    job = inproc.job(a)
    assert (job.state, job.attempt) == ("DONE", 2)


def test_a_dependent_job_waits_at_the_gate_until_its_dependency_is_done(inproc):
    a = inproc.submit(runtime=5, name="first")
    b = inproc.submit(runtime=2, depend="done(first)")
    run(inproc, 3)
    assert (inproc.job(a).state, inproc.job(b).state) == ("RUN", "PEND")
    run(inproc, 8)
    assert (inproc.job(a).state, inproc.job(b).state) == ("DONE", "DONE")
