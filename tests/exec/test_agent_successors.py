"""Queued successors in the host agent alone (issue 18, prefill; exec/agent/successors.py), through
its raw protocol on real processes: a unit launched `after` a running one waits in the agent's
journal and starts when its predecessor ends, never before, never twice, never after the lease ran
out, and a kill ends it unstarted.

Each successor appends a line to a counter file when it runs, so that "exactly once" is counted.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.agent_local import journal, journal_result
from tests.support.agent_successors import counted, event, hold, runs
from tests.support.raw_agent import RawAgent, job_pid
from tests.support.waiting import wait_until

def b_behind_a_under_lease(agent: RawAgent, spool: Path, tmp: Path, seconds: float) -> str:
    """A lease of `seconds` granted, a running (held), b queued behind it; the agent's boot id."""
    boot = agent.request("hello")["boot_id"]
    clock = agent.request("ping")["clock"]
    assert agent.request("lease", until=clock + seconds, seconds=seconds, boot=boot)["ok"]
    agent.launch(hold("a", tmp))
    assert agent.launch(counted("b", tmp, after="a"))[0]["status"] == "queued"
    job_pid(spool, "a")
    return boot


def test_a_queued_successor_starts_when_its_predecessor_ends_not_before(agent, spool, tmp_path):
    [a] = agent.launch(hold("a", tmp_path, 3))
    [b] = agent.launch(counted("b", tmp_path, after="a"))
    assert a["status"] == "started" and b["status"] == "queued" and b["after"] == "a"
    job_pid(spool, "a")  # a runs ...
    listed = agent.request("list")
    assert [u["unit"] for u in listed["units"]] == ["a"]  # ... and b is no unit yet: nothing of it runs
    assert listed["queued"] == [{"unit": "b", "after": "a"}]
    assert "b" not in journal(spool) and runs(tmp_path, "b") == 0
    assert agent.launch(counted("b", tmp_path, after="a"))[0]["status"] == "queued"  # named again: adopted

    (tmp_path / "go-a").touch()
    ended = agent.finished("a")
    assert ended["exit_code"] == 3
    started = event(agent, "unqueued", "b")
    assert started["status"] == "started" and started["start_time"] >= ended["end_time"]
    kinds = [(e["event"], e["unit"]) for e in agent.events]
    assert kinds.index(("finished", "a")) < kinds.index(("unqueued", "b"))
    assert agent.finished("b")["exit_code"] == 0
    assert runs(tmp_path, "b") == 1
    assert "queued" not in agent.request("list")
    # a successor of a unit that already ended (or was never here) starts at once
    [c] = agent.launch(counted("c", tmp_path, after="a"), counted("d", tmp_path, after="nowhere"))[:1]
    assert c["status"] == "started"
    agent.finished("c"), agent.finished("d")
    assert runs(tmp_path, "c") == runs(tmp_path, "d") == 1


def test_the_queue_survives_an_agent_kill_and_its_successor_runs_once(agents, spool, tmp_path):
    first = agents()
    first.launch(hold("a", tmp_path), hold("x", tmp_path))
    first.launch(counted("b", tmp_path, after="a"), counted("y", tmp_path, after="x"))
    job_pid(spool, "a"), job_pid(spool, "x")
    first.proc.kill()  # -9 between queue and start
    first.close()

    # x ends while no agent runs; a after the next agent came
    (tmp_path / "go-x").touch()
    wait_until(lambda: journal_result(spool, "x"), 10, "x's result with no agent")
    second = agents()
    second.request("hello")  # the first turn: y, whose predecessor ended meanwhile, starts now
    assert event(second, "unqueued", "y")["status"] == "started"
    assert second.finished("y")["exit_code"] == 0
    listed = second.request("list")
    assert listed["queued"] == [{"unit": "b", "after": "a"}]  # b still waits, from the journal
    assert second.launch(counted("b", tmp_path, after="a"))[0]["status"] == "queued"  # the controller asks again

    # and a second kill -9 before a ends: the third agent still holds b
    second.proc.kill()
    second.close()
    third = agents()
    assert third.request("list")["queued"] == [{"unit": "b", "after": "a"}]
    (tmp_path / "go-a").touch()
    assert third.finished("b")["exit_code"] == 0
    assert third.launch(counted("b", tmp_path, after="a"))[0]["status"] == "finished"  # adopted: ran once
    assert third.launch(counted("y", tmp_path, after="x"))[0]["status"] == "finished"
    assert runs(tmp_path, "b") == runs(tmp_path, "y") == 1


def test_a_lapsed_lease_drops_the_queue_and_a_later_launch_runs_it_once(agent, spool, tmp_path):
    boot = b_behind_a_under_lease(agent, spool, tmp_path, 2)

    dropped = event(agent, "unqueued", "b")  # the lease runs out: a is stopped, b dropped unstarted
    assert dropped["status"] == "dropped" and "lease ran out" in dropped["error"]
    assert "lease expired" in agent.finished("a")["reason"]
    assert "queued" not in agent.request("list") and "b" not in journal(spool)
    refused = agent.launch(counted("q", tmp_path, after="zzz"))[0]  # nothing new starts or queues meanwhile
    assert refused["status"] == "refused" and "lease ran out" in refused["error"]
    assert runs(tmp_path, "b") == 0

    # the controller renews and, after host_lost_after, launches b again: it runs once
    clock = agent.request("ping")["clock"]
    assert agent.request("lease", until=clock + 30, seconds=30, boot=boot)["ok"]
    assert agent.launch(counted("b", tmp_path, after="a"))[0]["status"] == "started"  # a ended: at once
    assert agent.finished("b")["exit_code"] == 0
    assert runs(tmp_path, "b") == 1


def test_a_killed_successor_ends_unstarted_and_a_killed_predecessor_starts_its_successor(agent, spool, tmp_path):
    agent.launch(hold("a", tmp_path), hold("p", tmp_path))
    agent.launch(counted("b", tmp_path, after="a"), counted("s", tmp_path, after="p"))
    job_pid(spool, "a"), job_pid(spool, "p")
    assert agent.request("signal", unit="b", signal="STOP", reason="x")["found"] is False  # nothing to stop
    assert agent.request("signal", unit="b", signal="TERM", reason="killed by alice")["found"] is True
    killed = agent.finished("b")
    assert killed["reason"] == "killed by alice" and killed["start_time"] is None and killed["exit_code"] is None
    assert agent.request("list")["queued"] == [{"unit": "s", "after": "p"}]
    assert agent.launch(counted("b", tmp_path, after="a"))[0]["status"] == "finished"  # never again

    assert agent.request("signal", unit="p", signal="TERM", reason="killed by bob")["found"] is True
    assert agent.finished("p")["reason"] == "killed by bob"
    assert agent.finished("s")["exit_code"] == 0  # its predecessor's end, however it came, starts it
    (tmp_path / "go-a").touch()
    agent.finished("a")
    assert runs(tmp_path, "b") == 0 and runs(tmp_path, "s") == 1


def test_a_withdrawal_drops_a_queued_unit_unstarted_and_loses_to_a_start(agents, spool, tmp_path):
    first = agents()
    first.launch(hold("a", tmp_path), hold("p", tmp_path))
    first.launch(counted("b", tmp_path, after="a"), counted("s", tmp_path, after="p"))
    job_pid(spool, "a"), job_pid(spool, "p")
    assert first.request("withdraw", unit="b")["withdrawn"] is True  # still queued: dropped
    gone = event(first, "unqueued", "b")
    assert gone["status"] == "withdrawn" and gone["start_time"] is None
    assert first.request("list")["queued"] == [{"unit": "s", "after": "p"}]
    assert first.request("withdraw", unit="b")["withdrawn"] is False  # once only
    assert first.request("withdraw", unit="nowhere")["withdrawn"] is False

    # the race lost: s started (its predecessor ended) before the withdrawal came; it runs on
    (tmp_path / "go-p").touch()
    assert event(first, "unqueued", "s")["status"] == "started"
    assert first.request("withdraw", unit="s")["withdrawn"] is False
    assert first.finished("s")["exit_code"] == 0

    # an agent killed -9 after the withdrawal does not bring b back: it is dropped in the journal
    first.proc.kill()
    first.close()
    second = agents()
    assert "queued" not in second.request("list")
    (tmp_path / "go-a").touch()
    second.finished("a")
    assert runs(tmp_path, "b") == 0 and runs(tmp_path, "s") == 1


def test_a_withdrawal_that_comes_after_its_predecessor_ended_finds_it_started(agent, spool, tmp_path):
    agent.launch(hold("p", tmp_path))
    agent.launch(counted("s", tmp_path, after="p"))
    job_pid(spool, "p")
    os.kill(agent.proc.pid, signal.SIGSTOP)  # the agent has not seen p's end when the withdrawal comes
    try:
        (tmp_path / "go-p").touch()
        wait_until(lambda: journal_result(spool, "p"), 10, "p's result, written by its supervisor")
        agent.next_id += 1
        agent.proc.stdin.write(json.dumps({"id": agent.next_id, "op": "withdraw", "unit": "s"}).encode() + b"\n")
        agent.proc.stdin.flush()
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    assert agent.replies.get(timeout=20)["withdrawn"] is False  # started first: its slot is free here
    assert event(agent, "unqueued", "s")["status"] == "started"
    assert agent.finished("s")["exit_code"] == 0
    assert runs(tmp_path, "s") == 1


def test_an_orphan_agent_starts_a_successor_whose_predecessor_ended_before_it_leaves(agent, spool, tmp_path):
    """The controller died (stdin EOF) while a ran and b waited behind it: the agent stays under its
    lease. a's end, learnt in the turn where the orphan checks whether anything still runs, starts b
    before the agent leaves (it left first, and b waited in the journal for the next agent)."""
    b_behind_a_under_lease(agent, spool, tmp_path, 60)
    agent.proc.stdin.close()  # the controller is gone: an orphan, a still runs
    wait_until(lambda: b"staying to enforce it" in (spool.parent / "agent.stderr").read_bytes(), 10,
               "the agent to stay as an orphan")
    os.kill(agent.proc.pid, signal.SIGSTOP)  # its next turn learns of a's end and finds the watch due
    try:
        (tmp_path / "go-a").touch()
        wait_until(lambda: journal_result(spool, "a"), 10, "a's result, written by its supervisor")
        time.sleep(0.6)  # past the orphan's WATCH_INTERVAL (0.5 s): that turn asks whether anything runs
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    wait_until(lambda: journal_result(spool, "b"), 20, "b to run and end with no controller")
    assert runs(tmp_path, "b") == 1
    wait_until(lambda: agent.proc.poll() is not None, 20, "the orphan to leave once nothing runs")
