"""The plain agent's zygote (exec/agent/zygote.py) under faults, on real processes: the zygote
killed -9 while jobs run, stopped while it is asked to fork, and the agent killed -9 and started
again, in sequence. Jobs go on, their results come back, the next launch works, nothing runs twice."""

from __future__ import annotations

import os
import signal
import sys
import threading


from tests.support.agent_local import WAIT_JOB, children, finished, journal, journal_result, zygote_of
from tests.support.procs import proc_field, queued_on_sockets
from tests.support.waiting import wait_until
from xce_lite.exec.host import LaunchRequest, UnitFinished


def waiter(tmp_path, unit: str, code: int = 0) -> LaunchRequest:
    """A unit that runs until tmp_path/go-UNIT exists, then exits with `code`."""
    argv = (sys.executable, "-c", WAIT_JOB, str(tmp_path / f"go-{unit}"), str(code))
    return LaunchRequest(unit=unit, argv=argv, env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                         stdout=str(tmp_path / f"{unit}.out"), stderr=None)


def test_launches_fork_supervisors_from_the_zygote_not_the_agent(hosts, spool, tmp_path):
    host, events = hosts(mode="plain")
    zygote = zygote_of(host)
    host.launch([waiter(tmp_path, "a", 3), waiter(tmp_path, "b", 4)])
    units = wait_until(lambda: all(u["pid"] for u in journal(spool).values()) and journal(spool), 10, "started")
    assert sorted(children(zygote)) == sorted(u["pid"] for u in units.values())
    assert children(host.agent_pid) == [zygote]
    (tmp_path / "go-a").touch()
    (tmp_path / "go-b").touch()
    got = finished(events, "a", "b")
    assert got["a"].result.exit_code == 3 and got["b"].result.exit_code == 4


def test_zygote_killed_then_agent_killed_then_a_new_agent_adopts(hosts, spool, tmp_path):
    host, events = hosts(mode="plain")
    zygote = zygote_of(host)
    host.launch([waiter(tmp_path, "first", 5), waiter(tmp_path, "killme")])
    wait_until(lambda: all(u["pid"] for u in journal(spool).values()), 10, "two supervisors started")
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: zygote not in children(host.agent_pid), 10, "the agent to reap the killed zygote")
    # the jobs go on, and a signal still reaches a supervisor the agent no longer hears from
    assert host.signal("killme", "TERM", "killed by the test")
    # the next launch works: a new zygote forks it
    host.launch([waiter(tmp_path, "second", 6)])
    new_zygote = zygote_of(host)
    assert new_zygote != zygote
    got = finished(events, "killme")
    assert got["killme"].result.reason == "killed by the test"
    (tmp_path / "go-first").touch()
    assert finished(events, "first")["first"].result.exit_code == 5
    # then the agent is killed -9: its zygote leaves at once (the spool's lock with it), the job runs on
    os.kill(host.agent_pid, signal.SIGKILL)
    wait_until(lambda: proc_field(new_zygote, 0) in (None, "Z"), 10, "the zygote to leave with its agent")
    again, events = hosts(mode="plain")
    [adopted] = again.launch([waiter(tmp_path, "second", 6)])
    assert adopted.status == "running"
    (tmp_path / "go-second").touch()
    assert finished(events, "second")["second"].result.exit_code == 6
    for unit in ("first", "killme", "second"):  # each ran once
        assert (tmp_path / f"{unit}.out").read_text() == ""
        assert journal_result(spool, unit) is not None


def test_zygote_dead_before_it_answered_a_fork(hosts, spool, tmp_path):
    """Stopped, then killed, with a launch written to it: the launch is answered (its unit counts as
    starting), and since no supervisor ever records its start, its result says so; nothing runs,
    and the next launch works."""
    host, events = hosts(mode="plain")
    zygote = zygote_of(host)
    os.kill(zygote, signal.SIGSTOP)
    try:
        replies = []
        sender = threading.Thread(target=lambda: replies.extend(host.launch([waiter(tmp_path, "unborn")])))
        sender.start()
        # in the zygote's socket, not only recorded: the agent looks at its zygote just before it
        # writes, and one killed before that is replaced, the launch run (the next test's case)
        wait_until(lambda: queued_on_sockets(zygote) > 0, 10, "the launch to be written to the stopped zygote")
        assert "unborn" in journal(spool)
    finally:
        os.kill(zygote, signal.SIGKILL)
    sender.join(30)
    assert [r.status for r in replies] == ["started"]
    # the agent reaps it (it waits for children only once SIGCHLD has woken it): no zombie stays
    wait_until(lambda: proc_field(zygote, 0) is None, 10, "the killed zygote to be reaped by the agent")
    result = finished(events, "unborn")["unborn"].result
    assert result.reason.startswith("supervisor lost: it never recorded its start")
    assert not (tmp_path / "unborn.out").exists()
    (tmp_path / "go-next").touch()
    [reply] = host.launch([waiter(tmp_path, "next", 7)])
    assert reply.status == "started"
    assert finished(events, "next")["next"].result.exit_code == 7


def test_a_launch_that_comes_before_the_agent_heard_its_zygote_died_goes_to_a_new_zygote(hosts, spool, tmp_path):
    """Twice in a row: the agent stopped, its zygote killed -9 (a zombie the agent has not reaped), a
    launch written to the agent, the agent let go: it reads the launch before its SIGCHLD, sees the
    zygote exited and forks another, so every unit runs (observed: a broken pipe at the dead zygote
    made the whole launch "supervisor lost: it never recorded its start" 10 s later, though none had
    reached it). The second round's zygote is the one the first launch made."""
    host, events = hosts(mode="plain")
    for round_ in (1, 2):
        zygote = zygote_of(host)
        os.kill(host.agent_pid, signal.SIGSTOP)
        try:
            os.kill(zygote, signal.SIGKILL)
            wait_until(lambda z=zygote: proc_field(z, 0) == "Z", 10, "the killed zygote to be a zombie")
            units = [f"r{round_}u{i}" for i in range(3)]
            for unit in units:
                (tmp_path / f"go-{unit}").touch()
            host.launch_nowait([waiter(tmp_path, unit, 30 + i) for i, unit in enumerate(units)])
        finally:
            os.kill(host.agent_pid, signal.SIGCONT)
        got = finished(events, *units)
        assert [(got[u].result.exit_code, got[u].result.reason) for u in units] == [(30, None), (31, None), (32, None)]
        wait_until(lambda z=zygote: proc_field(z, 0) is None, 10, "the dead zygote to be reaped by the agent")
        assert zygote_of(host) != zygote


def test_an_idle_worker_takes_a_job_and_reports_its_end_without_the_zygote_then_the_zygote_dies_mid_job(
        hosts, spool, tmp_path):
    """The agent hands a reused supervisor its job and hears its end on the worker's own socket: with
    the zygote stopped, jobs still start in the idle worker and end, each reported once. Then the
    zygote is killed -9 while the worker runs a job: the job ends once, with its own code, the worker
    leaves, and the next launch gets a new zygote and worker."""
    host, events = hosts(mode="plain")
    (tmp_path / "go-warm").touch()
    host.launch([waiter(tmp_path, "warm")])
    finished(events, "warm")
    worker = journal(spool)["warm"]["pid"]
    zygote = zygote_of(host)
    os.kill(zygote, signal.SIGSTOP)
    try:
        for unit, code in (("one", 3), ("two", 4)):
            [reply] = host.launch([waiter(tmp_path, unit, code)])
            assert reply.status == "started"
            assert wait_until(lambda unit=unit: journal(spool)[unit]["pid"], 10, f"{unit} to start") == worker
            (tmp_path / f"go-{unit}").touch()
            assert finished(events, unit)[unit].result.exit_code == code
    finally:
        os.kill(zygote, signal.SIGCONT)
    host.launch([waiter(tmp_path, "busy", 6)])
    assert wait_until(lambda: journal(spool)["busy"]["pid"], 10, "busy to start") == worker
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: proc_field(zygote, 0) is None, 10, "the killed zygote to be reaped by the agent")
    (tmp_path / "go-busy").touch()
    assert finished(events, "busy")["busy"].result.exit_code == 6
    wait_until(lambda: proc_field(worker, 0) is None, 10, "the worker to leave once its job's result is recorded")
    (tmp_path / "go-next").touch()
    host.launch([waiter(tmp_path, "next", 7)])
    assert finished(events, "next")["next"].result.exit_code == 7
    assert journal(spool)["next"]["pid"] != worker
    seen = []  # each unit's end was reported once
    while not events.empty():
        event = events.get_nowait()
        if isinstance(event, UnitFinished):
            seen.append(event.unit)
    assert seen == [], seen
