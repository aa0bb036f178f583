"""A kill recorded but not delivered keeps its reason however the job's unit ends (kills.killed_reason):
the controller's tick in-process (tests/support/inproc.py: the real Controller, fake hosts, a fake
clock, a real store), faults in sequence, `check_invariants` after every tick."""

from __future__ import annotations

import pytest

from tests.support.inproc import LEASE_EXPIRED, InProc
from xce_lite.controller.invariants import check_invariants
from xce_lite.controller.kills import killed_reason
from xce_lite.models import JobSpec


@pytest.fixture
def inproc():
    p = InProc()  # lease 10 s, a host out of reach is lost after 40 s
    p.step(0.1)  # the hosts come up
    yield p
    p.close()


def run(p: InProc, seconds: float, killed: set[int]) -> None:
    for _ in range(int(seconds)):
        p.step(1.0)
        check_invariants(p.ctl, killed)


def kinds(p: InProc, job_id: int) -> list[str]:
    return [kind for _t, kind, _d in p.ctl.store.events(job_id)]


def cut_off_and_killed(p: InProc, runtime: float, exit_code: int = 0, retry: int | None = None) -> tuple[int, str]:
    """A job runs; its host is cut off; the job is killed (recorded, not delivered): (job, host)."""
    job_id = p.submit(runtime=runtime, exit_code=exit_code, retry=retry)
    run(p, 2, set())
    host = p.job(job_id).hosts[0][0]
    p.drop(host)
    run(p, 1, set())
    reply = p.kill(job_id)
    assert reply["ok"] and "does not answer now" in reply["message"], reply
    return job_id, host


def kill_of(p: InProc) -> str:
    return f"killed by {p.caller().user}"


def test_the_reason_puts_the_kill_first_unless_it_is_the_kill_own():
    assert killed_reason(None, "lease expired: x") == "lease expired: x"
    assert killed_reason("killed by ann", "killed by ann") == "killed by ann"
    assert killed_reason("killed by ann", "lease expired: x") == \
        "killed by ann (lease expired: x, before it confirmed the kill)"


@pytest.mark.parametrize("restart", [False, True], ids=["", "restart"])
def test_killed_while_cut_off_then_stopped_by_the_lease_ends_exit_with_the_kill_reason(inproc, restart):
    """Killed while its host is cut off; the host stays away past the lease (not long enough to be
    lost), so it stops the job itself; it answers: the job ends with the kill's reason, runs once.
    With a controller restart between the kill and the host's return, and another after."""
    p = inproc
    a, host = cut_off_and_killed(p, runtime=300)
    if restart:
        p.restart()
    run(p, 12, {a})  # the host's lease runs out: it stops the job
    assert not p.live_units()[host]
    assert p.job(a).state == "RUN"  # out of reach, not lost
    p.back(host)
    run(p, 3, {a})
    job = p.job(a)
    assert (job.state, job.attempt) == ("EXIT", 1)
    assert job.reason == f"{kill_of(p)} ({LEASE_EXPIRED}, before it confirmed the kill)", job.reason
    p.restart()
    run(p, 10, {a})
    assert p.job(a).state == "EXIT" and kinds(p, a).count("dispatched") == 1 and "requeued" not in kinds(p, a)
    assert all(not units for units in p.live_units().values())


def test_killed_while_cut_off_then_failed_on_its_own_ends_with_the_kill_reason_and_no_retry(inproc):
    p = inproc
    a, host = cut_off_and_killed(p, runtime=6, exit_code=3, retry=1)
    run(p, 5, {a})  # it fails on its host (exit 3) before the lease runs out
    p.back(host)
    run(p, 3, {a})
    job = p.job(a)
    assert (job.state, job.exit_code, job.attempt) == ("EXIT", 3, 1)
    assert job.reason == f"{kill_of(p)} (exit code 3, before it confirmed the kill)", job.reason
    run(p, 10, {a})
    assert "requeued" not in kinds(p, a)


def test_killed_while_cut_off_and_done_before_the_kill_reached_it_is_done(inproc):
    """As LSF: a job that finished before the kill reached it is DONE; nothing to blame on the kill."""
    p = inproc
    a, host = cut_off_and_killed(p, runtime=6)
    run(p, 5, {a})
    p.back(host)
    run(p, 3, {a})
    job = p.job(a)
    assert (job.state, job.exit_code, job.reason) == ("DONE", 0, None)


def test_killed_while_cut_off_then_its_unit_vanished_ends_with_the_kill_reason(inproc):
    p = inproc
    a, host = cut_off_and_killed(p, runtime=300)
    unit = p.ctl.state.active[a].units[0]
    del p.hosts[host].units[unit]  # the host comes back without it (a wiped spool)
    p.back(host)
    run(p, 3, {a})
    job = p.job(a)
    assert job.state == "EXIT"
    assert job.reason == f"{kill_of(p)} (lost: unit {unit} vanished from host {host}, before it confirmed the kill)"


def test_killed_while_its_launch_is_refused_ends_with_the_kill_reason(inproc):
    p = inproc
    a = p.submit_spec(JobSpec(argv=("no-such-program",), cwd=str(p.work), stdout=str(p.work / "out-%J")))
    p.step(1.0)  # dispatched and sent; the host's refusal is on its way
    assert p.job(a).state == "DISP"
    assert p.kill(a)["ok"]
    run(p, 2, {a})
    job = p.job(a)
    assert job.state == "EXIT"
    assert job.reason.startswith(f"{kill_of(p)} (launch refused by host "), job.reason
    assert job.reason.endswith(", before it confirmed the kill)"), job.reason


def test_a_killed_job_never_starts_a_unit_whose_launch_was_lost_across_a_restart(inproc):
    """A job on two hosts; its first host is cut off and the job killed; its other unit's launch
    never reached its host; the controller restarts (and finds that unit missing): it is not
    launched for a killed job. The first host stays away past the lease, comes back: EXIT, the kill's reason."""
    p = inproc
    a = p.submit(runtime=300, slots=3)  # hosts of 2 slots: a unit on each
    run(p, 2, set())
    job = p.ctl.state.active[a]
    first, other = job.host_of(0), job.host_of(1)
    assert first != other and p.job(a).state == "RUN"
    p.drop(first)
    run(p, 1, set())
    assert p.kill(a)["ok"]
    del p.hosts[other].units[job.units[1]]  # as if its launch never arrived
    p.restart()
    for _ in range(12):  # the lease runs out on the first host
        run(p, 1, {a})
        assert job.units[1] not in p.hosts[other].units, "a unit of a killed job was launched"
    p.back(first)
    run(p, 3, {a})
    final = p.job(a)
    assert final.state == "EXIT" and final.reason == f"{kill_of(p)} ({LEASE_EXPIRED}, before it confirmed the kill)"
    assert job.units[1] not in p.hosts[other].units
