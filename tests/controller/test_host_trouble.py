"""Hosts in trouble (host_trouble.HostTrouble) alone, then in the controller in-process: a host that
does not answer a kill takes no new work, through a restart, until it answers again; the kill wins."""

from __future__ import annotations

from tests.support.inproc import InProc
from xce_lite import errors
from xce_lite.controller.host_trouble import HostTrouble
from xce_lite.controller.invariants import check_invariants
from xce_lite.controller.seams import FakeClock


def run(p: InProc, seconds: int, killed: frozenset[int] | set[int] = frozenset()) -> None:
    for _ in range(seconds):
        p.step(1.0)
        check_invariants(p.ctl, killed)


def test_the_first_failure_in_a_row_is_kept_and_each_change_said_once():
    clock, logs, replans = FakeClock(10.0), [], []
    trouble = HostTrouble(clock, logs.append, replans.append)
    trouble.enter("h1", "no answer")
    clock.now = 20.0
    trouble.enter("h1", "still no answer")
    assert trouble.copy() == {"h1": ("no answer", 10.0)} and "h1" in trouble and list(trouble) == ["h1"]
    assert len(logs) == 1 and replans == [False]
    trouble.leave("h1")
    trouble.leave("h1")
    assert not trouble and len(logs) == 2 and replans == [False, True]
    trouble.enter("h2", "no answer")
    trouble.reset("h2")  # connected again: judged afresh, silently
    assert not trouble and len(logs) == 3 and replans == [False, True, False]


def _unanswered(unit: str, name: str, reason: str) -> bool:
    raise errors.HostUnreachable("the signal's reply did not come")


def test_a_host_that_does_not_answer_a_kill_takes_no_work_through_a_restart_until_it_answers():
    p = InProc()
    try:
        p.step(0.1)
        a = p.submit(runtime=200)
        run(p, 2)
        first = p.job(a).hosts[0][0]
        other = "h2" if first == "h1" else "h1"
        p.hosts[first].signal = _unanswered  # the host's channel is up, its signals get no reply
        assert p.kill(a)["ok"]
        run(p, 2, killed={a})
        assert first in p.ctl.trouble
        problems = p.ctl.faults.status()["problems"]
        assert [(x["what"], x["host"]) for x in problems] == [("host", first)]
        b, c = p.submit(runtime=200), p.submit(runtime=200)
        run(p, 2, killed={a})
        assert {p.job(b).hosts[0][0], p.job(c).hosts[0][0]} == {other}, "nothing new goes to a host in trouble"
        p.restart()  # the next controller judges the host afresh, sends the kill again: trouble again
        run(p, 2, killed={a})
        assert first in p.ctl.trouble and p.job(a).state == "RUN"
        del p.hosts[first].signal  # the host answers again once it reconnects
        p.drop(first)
        p.back(first)
        run(p, 3, killed={a})
        assert first not in p.ctl.trouble and p.ctl.faults.status()["problems"] == []
        job = p.job(a)
        assert job.state == "EXIT" and job.reason.startswith("killed by"), job.reason
        assert sum(1 for _t, kind, _d in p.ctl.store.events(a) if kind == "dispatched") == 1
    finally:
        p.close()
