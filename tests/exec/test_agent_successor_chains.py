"""Chains of queued successors in the host agent (issue 18, prefill two deep; exec/agent/successors.py):
a unit launched `after` a QUEUED unit waits behind it, starts only once it has started and ended,
and a middle link that leaves the queue unstarted (killed, withdrawn) passes its follower to the
unit before it: the follower never starts beside the unit still running. A restarted agent (after
a kill -9, after a compaction) replays the same chain. Each unit counts its runs (test_agent_successors).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.agent_local import journal_result
from tests.support.agent_successors import counted, event, hold, runs
from tests.support.raw_agent import RawAgent, job_pid
from tests.support.waiting import wait_until
from xce_lite.exec.agent.successors import chain_order


def held(name: str, tmp: Path, after: str) -> dict:
    """A successor of `after` that, once started, runs until tmp/go-NAME exists."""
    return {**hold(name, tmp), "after": after}


def started(agent: RawAgent, name: str) -> bool:
    return any(e["event"] == "unqueued" and e["unit"] == name for e in agent.events)


def test_a_chain_starts_one_link_at_a_time(agent, spool, tmp_path):
    agent.launch(hold("a", tmp_path))
    [b] = agent.launch(held("b", tmp_path, after="a"))
    [c] = agent.launch(counted("c", tmp_path, after="b"))  # behind a unit that is itself queued
    assert b["status"] == c["status"] == "queued" and c["after"] == "b"
    assert agent.request("list")["queued"] == [{"unit": "b", "after": "a"}, {"unit": "c", "after": "b"}]
    assert agent.launch(counted("c", tmp_path, after="b"))[0]["status"] == "queued"  # adopted again

    job_pid(spool, "a")
    (tmp_path / "go-a").touch()
    agent.finished("a")
    assert event(agent, "unqueued", "b")["status"] == "started"
    job_pid(spool, "b")  # b runs; c still waits behind it, started by nothing
    assert agent.request("list")["queued"] == [{"unit": "c", "after": "b"}]
    assert not started(agent, "c") and runs(tmp_path, "c") == 0
    (tmp_path / "go-b").touch()
    ended = agent.finished("b")
    assert event(agent, "unqueued", "c")["start_time"] >= ended["end_time"]
    assert agent.finished("c")["exit_code"] == 0 and runs(tmp_path, "c") == 1


def test_a_killed_middle_passes_its_follower_to_the_unit_before_it(agents, spool, tmp_path):
    first = agents()
    first.launch(hold("a", tmp_path))
    first.launch(counted("b", tmp_path, after="a"))
    first.launch(counted("c", tmp_path, after="b"))
    job_pid(spool, "a")
    assert first.request("signal", unit="b", signal="TERM", reason="killed by alice")["found"] is True
    assert first.finished("b")["start_time"] is None  # the middle ends unstarted ...
    assert first.request("list")["queued"] == [{"unit": "c", "after": "b"}]  # ... c waits on, behind a
    # a launch that crossed the kill on the wire (named behind b before the kill landed) waits too
    assert first.launch(counted("d", tmp_path, after="b"))[0]["status"] == "queued"
    assert not started(first, "c") and not started(first, "d")

    first.proc.kill()  # -9: the next agent replays the same chain from the journal
    first.close()
    second = agents()
    assert second.request("list")["queued"] == [{"unit": "c", "after": "b"}, {"unit": "d", "after": "b"}]
    assert second.launch(counted("e", tmp_path, after="b"))[0]["status"] == "queued"
    assert not started(second, "c")
    (tmp_path / "go-a").touch()
    second.finished("a")
    for name in "cde":
        assert second.finished(name)["exit_code"] == 0
    assert [runs(tmp_path, n) for n in "bcde"] == [0, 1, 1, 1]
    # a's end: nothing is left for a leaver to point to, so it is forgotten; a late follower starts at once
    assert second.launch(counted("f", tmp_path, after="b"))[0]["status"] == "started"
    second.finished("f")


def test_a_withdrawn_middle_and_a_compacted_journal_keep_the_chain(agents, spool, tmp_path):
    first = agents("--journal-limit", "3000")
    first.launch(hold("a", tmp_path))
    first.launch(counted("b", tmp_path, after="a"), counted("c", tmp_path, after="b"))
    job_pid(spool, "a")
    assert first.request("withdraw", unit="b")["withdrawn"] is True
    for batch in range(6):  # past the journal's limit: compacted, the leaver b kept in it
        names = [f"x{batch}-{i}" for i in range(10)]
        first.launch(*(counted(name, tmp_path, after="gone") for name in names))
        for name in names:
            first.finished(name)
        assert all(u["ok"] for u in first.request("forget", units=names)["units"])
    assert not started(first, "c")
    text = (spool / "journal").read_text()
    assert '"x0-0"' not in text and '"reason":"left"' in text.replace(" ", "")  # compacted: b is its leaver
    first.proc.kill()
    first.close()
    second = agents("--journal-limit", "3000")
    assert second.request("list")["queued"] == [{"unit": "c", "after": "b"}]
    time.sleep(0.3)  # a few turns: c must still wait behind a
    assert not started(second, "c") and runs(tmp_path, "c") == 0
    # b launched again behind a (the controller's relaunch after a drop): c is behind b again
    assert second.launch(counted("b", tmp_path, after="a"))[0]["status"] == "queued"
    (tmp_path / "go-a").touch()
    second.finished("a")
    assert second.finished("b")["exit_code"] == 0 and second.finished("c")["exit_code"] == 0
    assert runs(tmp_path, "b") == runs(tmp_path, "c") == 1


def test_one_request_with_a_chain_in_any_order_queues_it_as_a_chain(agent, spool, tmp_path):
    agent.launch(hold("a", tmp_path))
    replies = agent.launch(counted("c", tmp_path, after="b"), counted("b", tmp_path, after="a"))
    assert [r["status"] for r in replies] == ["queued", "queued"] and [r["unit"] for r in replies] == ["c", "b"]
    assert agent.request("list")["queued"] == [{"unit": "b", "after": "a"}, {"unit": "c", "after": "b"}]
    (tmp_path / "go-a").touch()
    agent.finished("a"), agent.finished("b"), agent.finished("c")
    wait_until(lambda: journal_result(spool, "c"), 10, "c's result")
    assert runs(tmp_path, "b") == runs(tmp_path, "c") == 1


def test_chain_order_puts_each_unit_after_its_predecessor():
    units = [{"unit": "d", "after": "c"}, {"unit": "x"}, {"unit": "c", "after": "b"}, {"unit": "b", "after": "a"},
             "junk", {"unit": "e", "after": ["bad"]}]
    assert chain_order(units) == [3, 2, 0, 1, 4, 5]
    assert chain_order([{"unit": "a"}, {"unit": "b", "after": "a"}]) == [0, 1]
    assert chain_order([{"unit": "a", "after": "b"}, {"unit": "b", "after": "a"}]) == [1, 0]  # a loop: each once
