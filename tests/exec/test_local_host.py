"""LocalHost (the Host seam on this machine) and AgentChannel, on real processes and real pipes."""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading

import pytest

from tests.support.agent_local import WAIT_JOB, journal, journal_result
from tests.support.procs import proc_field
from tests.support.waiting import wait_until
from xce_lite.errors import ExecError, HostUnreachable, LaunchRejected
from xce_lite.exec.channel import AgentChannel
from xce_lite.exec.host import HostLost, JobResult, LaunchRequest, UnitFinished, UnitsLaunched
from xce_lite.exec.local import supervisor_pids


def request(tmp_path, unit: str, argv: list[str], **kw) -> LaunchRequest:
    fields = {
        "env": {"PATH": os.environ["PATH"]},
        "cwd": str(tmp_path),
        "stdout": str(tmp_path / f"{unit}.out"),
        "stderr": None,
    }
    fields.update(kw)
    return LaunchRequest(unit=unit, argv=tuple(argv), **fields)


def waiter(tmp_path, unit: str, code: int = 0) -> LaunchRequest:
    """A unit that runs until tmp_path/go-UNIT exists, then exits with `code`."""
    return request(tmp_path, unit, [sys.executable, "-c", WAIT_JOB, str(tmp_path / f"go-{unit}"), str(code)])


def next_event(events: queue.Queue, timeout: float = 20):
    return events.get(timeout=timeout)


def test_connect_probes_the_host(hosts, spool):
    host, _ = hosts()
    probe = host.probe()
    assert probe.hostname == os.uname().nodename and probe.agent_version == 3
    assert probe.cpus >= 1 and probe.mem > 0
    assert probe.extra["pid"] == host.agent_pid and probe.extra["spool"] == str(spool)


def test_launch_reports_finished_with_the_result(hosts, tmp_path):
    host, events = hosts()
    [reply] = host.launch([request(tmp_path, "u1", [sys.executable, "-c", "raise SystemExit(4)"])])
    assert reply.status == "started" and reply.error is None and reply.start_time
    event = next_event(events)
    assert isinstance(event, UnitFinished) and event.host == "local" and event.unit == "u1"
    assert isinstance(event.result, JobResult) and event.result.exit_code == 4
    [info] = host.list_units()
    assert info.unit == "u1" and info.status == "finished" and info.result == event.result
    host.forget(["u1"])
    assert host.list_units() == []


def test_refused_launch_is_a_reply_not_an_exception(hosts, tmp_path):
    host, _ = hosts()
    [reply] = host.launch([request(tmp_path, "bad", ["true"], cwd=str(tmp_path / "nowhere"))])
    assert reply.status == "refused" and "not an existing directory" in reply.error


def test_signal_with_reason_and_not_found(hosts, tmp_path):
    host, events = hosts()
    host.launch([waiter(tmp_path, "victim")])
    assert host.signal("victim", "TERM", "killed by bob")
    event = next_event(events)
    assert event.result.reason == "killed by bob" and event.result.signal == signal.SIGTERM
    assert host.signal("victim", "TERM", "again") is False
    assert host.signal("nobody", "KILL", "x") is False
    with pytest.raises(ValueError):
        host.signal("victim", "SEGV", "x")


def test_forget_of_a_running_unit_raises_and_keeps_it(hosts, tmp_path):
    host, events = hosts()
    host.launch([waiter(tmp_path, "busy")])
    with pytest.raises(ExecError, match="still running"):
        host.forget(["busy"])
    assert [u.status for u in host.list_units()] == ["running"]
    (tmp_path / "go-busy").touch()
    assert next_event(events).unit == "busy"


def test_close_leaves_jobs_running_and_a_new_host_adopts_them(hosts, spool, tmp_path):
    host, _ = hosts()
    [started] = host.launch([waiter(tmp_path, "long", 6)])
    agent = host.agent_pid
    host.close()
    assert proc_field(agent, 0) in (None, "Z")
    again, events = hosts()
    [adopted] = again.launch([waiter(tmp_path, "long", 6)])
    assert adopted.status == "running" and adopted.start_time == started.start_time
    (tmp_path / "go-long").touch()
    event = next_event(events)
    assert event.unit == "long" and event.result.exit_code == 6
    assert (tmp_path / "long.out").read_text() == ""  # ran once, silently


def test_agent_killed_reports_host_lost_once_and_requests_fail(hosts, spool, tmp_path):
    host, events = hosts()
    host.launch([waiter(tmp_path, "survivor", 2)])
    os.kill(host.agent_pid, signal.SIGKILL)
    lost = next_event(events)
    assert isinstance(lost, HostLost) and lost.host == "local" and "output ended" in lost.why
    with pytest.raises(HostUnreachable, match="reconnect"):
        host.list_units()
    assert events.empty()
    (tmp_path / "go-survivor").touch()
    wait_until(lambda: journal_result(spool, "survivor"), 10, "the job to end without agent")
    again, _ = hosts()
    [info] = again.list_units()
    assert info.status == "finished" and info.result.exit_code == 2


def test_supervisor_pids_lists_the_supervisors_that_still_run(hosts, spool, tmp_path):
    host, events = hosts()
    host.launch([waiter(tmp_path, "a"), waiter(tmp_path, "b")])
    pids = wait_until(lambda: len(supervisor_pids(spool)) == 2 and supervisor_pids(spool), 10, "two supervisors")
    assert all(proc_field(pid, 0) not in (None, "Z") for pid in pids)
    (tmp_path / "go-a").touch()
    (tmp_path / "go-b").touch()
    assert {next_event(events).unit, next_event(events).unit} == {"a", "b"}
    wait_until(lambda: supervisor_pids(spool) == [], 10, "no supervisor left")
    assert supervisor_pids(tmp_path / "no-spool") == []


def test_second_host_on_a_busy_spool_is_unreachable_with_why(hosts, spool):
    hosts()
    with pytest.raises(HostUnreachable, match="another agent"):
        hosts(lock_timeout=0.2)


def test_many_units_in_one_launch(hosts, tmp_path):
    host, events = hosts()
    replies = host.launch([request(tmp_path, f"n{i}", ["true"]) for i in range(50)])
    assert [r.status for r in replies] == ["started"] * 50
    done = {next_event(events).unit for _ in range(50)}
    assert done == {f"n{i}" for i in range(50)}


# ---------------------------------------------------------------- AgentChannel on bare pipes


class Pipes:
    """A channel wired to pipes whose other ends the test plays: `agent_in` / `agent_out`."""

    def __init__(self, timeout: float = 5.0):
        r1, w1 = os.pipe()  # channel -> agent
        r2, w2 = os.pipe()  # agent -> channel
        self.agent_in, self.agent_out = os.fdopen(r1, "rb"), os.fdopen(w2, "wb", buffering=0)
        self.events: queue.Queue = queue.Queue()
        self.channel = AgentChannel(
            os.fdopen(r2, "rb"), os.fdopen(w1, "wb"), self.events.put, "fake", timeout
        )

    def close(self) -> None:
        self.agent_out.close()
        self.channel.close()
        self.agent_in.close()


@pytest.fixture
def pipes():
    p = Pipes()
    yield p
    p.close()


def test_channel_matches_replies_by_id_across_threads(pipes):
    results: dict[str, dict] = {}
    threads = [
        threading.Thread(target=lambda op=op: results.__setitem__(op, pipes.channel.request(op)))
        for op in ("a", "b")
    ]
    for t in threads:
        t.start()
    requests = [json.loads(pipes.agent_in.readline()) for _ in range(2)]
    for req in reversed(requests):  # answer out of order
        pipes.agent_out.write(json.dumps({"id": req["id"], "ok": True, "op_was": req["op"]}).encode() + b"\n")
    for t in threads:
        t.join(5)
    assert results["a"]["op_was"] == "a" and results["b"]["op_was"] == "b"


def test_channel_error_reply_is_launch_rejected(pipes):
    def answer():
        req = json.loads(pipes.agent_in.readline())
        pipes.agent_out.write(
            json.dumps({"id": req["id"], "ok": False, "error": "no such user"}).encode() + b"\n"
        )

    threading.Thread(target=answer).start()
    with pytest.raises(LaunchRejected, match="no such user"):
        pipes.channel.request("launch", units=[])


def test_channel_request_deadline_names_what_timed_out(pipes):
    with pytest.raises(HostUnreachable, match="did not answer 'list' within 0.2 s"):
        pipes.channel.request("list", timeout=0.2)
    assert pipes.channel.lost is None  # a slow answer does not lose the channel


def test_channel_garbage_fails_pending_requests_and_reports_lost_once(pipes):
    failure: list[Exception] = []

    def ask():
        try:
            pipes.channel.request("list")
        except HostUnreachable as exc:
            failure.append(exc)

    t = threading.Thread(target=ask)
    t.start()
    pipes.agent_in.readline()
    pipes.agent_out.write(b"this is not json\n")
    t.join(5)
    assert failure and "garbage" in str(failure[0])
    lost = pipes.events.get(timeout=5)
    assert isinstance(lost, HostLost) and "garbage" in lost.why
    pipes.agent_out.close()  # EOF after garbage: no second HostLost
    with pytest.raises(HostUnreachable):
        pipes.channel.request("hello")
    pipes.channel.join(5)
    assert pipes.events.empty()


def test_channel_turns_finished_events_into_unit_finished(pipes):
    result = {
        "exit_code": 0,
        "signal": None,
        "start_time": 1.0,
        "end_time": 2.0,
        "cpu_time": 0.5,
        "max_rss": 10,
        "reason": None,
    }
    pipes.agent_out.write(json.dumps({"event": "finished", "unit": "u", "result": result}).encode() + b"\n")
    assert pipes.events.get(timeout=5) == UnitFinished(host="fake", unit="u", result=JobResult(**result))


def test_launch_nowait_replies_come_as_one_event_before_the_units_finish(tmp_path, hosts):
    host, events = hosts()
    host.launch_nowait([request(tmp_path, "fast-1", ["true"]), request(tmp_path, "bad-2", ["true"], cwd="/nope")])
    first = next_event(events)
    assert isinstance(first, UnitsLaunched)
    assert [(r.unit, r.status) for r in first.replies] == [("fast-1", "started"), ("bad-2", "refused")]
    assert "/nope" in first.replies[1].error
    finished = next_event(events)
    assert isinstance(finished, UnitFinished) and finished.unit == "fast-1" and finished.result.exit_code == 0


def test_forget_without_waiting_drops_the_unit(tmp_path, hosts, spool):
    host, events = hosts()
    host.launch([request(tmp_path, "gone-1", ["true"])])
    assert isinstance(next_event(events), UnitFinished)
    host.forget(["gone-1"], wait=False)
    wait_until(lambda: "gone-1" not in journal(spool), 10, "the unit to be forgotten in the journal")
