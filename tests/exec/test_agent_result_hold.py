"""The agent holds a turn's ends for a later turn's fdatasync while successors keep the host busy
(exec/agent/server.py `holds`): the rule, on its own (the state it reads is all it decides on); and
real processes under strace -f (as test_agent_result_sync.py): chains of quick jobs behind one
another, every result on disk before its line goes out, fewer syncs than results, and the last
ends out by the hold's own deadline, with no other input to wake the agent."""

from __future__ import annotations

import time
from types import SimpleNamespace

from tests.support.agent_successors import counted, hold, runs
from tests.support.raw_agent import job_pid, unit
from tests.support.strace_log import SYNCED, finished_text, record_write, syncs, traced
from tests.support.waiting import wait_until
from xce_lite.exec.agent.server import HOLD_QUEUED, RESULT_HOLD, Agent
from xce_lite.exec.agent.successors import Successors

END = b'{"event":"finished","unit":"a","result":{}}\n'
START = b'{"event":"unqueued","unit":"b","status":"started"}\n'


def turn(out: list[bytes], behind_b: int = HOLD_QUEUED, need_sync: bool = True, orphan: bool = False):
    """What `holds` reads of an agent: its state's lines, unsynced results and orphanhood, and how
    many successors wait behind unit b, and c (Successors.behind)."""
    state = SimpleNamespace(out=out, need_sync=need_sync, orphan=orphan, held_since=None)
    chains = {"b": behind_b, "c": HOLD_QUEUED}
    return SimpleNamespace(state=state, successors=SimpleNamespace(behind=lambda units: {u: chains[u] for u in units}))


def test_ends_wait_for_a_later_sync_only_while_successors_keep_the_host_busy():
    agent = turn([END, START])
    assert Agent.holds(agent, 0.0) and agent.state.held_since == 0.0
    assert Agent.holds(agent, RESULT_HOLD / 2)  # more ends of later turns join them
    assert not Agent.holds(agent, RESULT_HOLD)  # held no longer than RESULT_HOLD from the first
    assert not Agent.holds(turn([END, START], behind_b=HOLD_QUEUED - 1), 0.0)  # b's chain runs short
    assert not Agent.holds(turn([END, END, START]), 0.0)  # a slot left empty: the controller fills it
    # b started and ended since, and c started behind it: c's chain is the one that counts
    b_ended = b'{"event":"finished","unit":"b","result":{}}\n'
    c_started = b'{"event":"unqueued","unit":"c","status":"started"}\n'
    assert Agent.holds(turn([END, START, b_ended, c_started], behind_b=0), 0.0)
    assert not Agent.holds(turn([END, START, b'{"id":7,"ok":true}\n']), 0.0)  # a reply never waits
    assert not Agent.holds(turn([END, START, b'{"event":"lost","unit":"c"}\n']), 0.0)  # nor another event
    assert not Agent.holds(turn([START], need_sync=False), 0.0)  # nothing to sync: out at once
    assert not Agent.holds(turn([END, START], orphan=True), 0.0)  # nobody reads them
    assert not Agent.holds(turn([]), 0.0)


CHAINS, LINKS = 8, 6  # chains of quick jobs, each behind a held head: their ends interleave


def test_chains_of_ends_share_syncs_and_each_result_is_synced_before_its_line(agents, spool, tmp_path):
    log = tmp_path / "strace.log"
    agent = traced(agents, log, size=20000)  # the agent's writes whole: a turn's line carries several events
    arrived: dict[str, float] = {}
    agent.on_event = lambda e: arrived.setdefault(e["unit"], time.time()) if e["event"] == "finished" else None
    names = []
    for k in range(CHAINS):
        agent.launch(hold(f"h{k}", tmp_path))
        chain = [f"c{k}-{i}" for i in range(1, LINKS + 1)]
        for before, name in zip([f"h{k}", *chain], chain):
            assert agent.launch(unit(name, ["true"], tmp_path, after=before))[0]["status"] == "queued"
        names += chain
    for k in range(CHAINS):
        job_pid(spool, f"h{k}")
    for k in range(CHAINS):
        (tmp_path / f"go-h{k}").touch()
    results = {name: agent.finished(name) for name in names}
    assert all(r["exit_code"] == 0 for r in results.values())
    # the last ends come by the hold's own deadline, not by some later input: none was sent
    late = max(arrived[name] - results[name]["end_time"] for name in names)
    assert late < 0.3, f"an end came {late:.3f} s after the job ended"
    assert agent.close() == 0  # strace ends with its last tracee: the log is whole
    lines = log.read_text().splitlines()
    agent_pid = int(next(line for line in lines if "write(1," in line).split()[0])
    events = {}
    for name in names:
        record, _writer = record_write(lines, name)
        event = next(i for i, line in enumerate(lines) if "write(1," in line and finished_text(name) in line)
        assert syncs(lines, agent_pid, record, event) >= 1, f"{name}'s result went out before a sync"
        events[name] = event
    first = min(record_write(lines, name)[0] for name in names)
    made = sum(1 for line in lines[first:max(events.values()) + 1]
               if (m := SYNCED.match(line)) and int(m.group(1)) == agent_pid)
    assert made < len(names), f"{made} fdatasyncs for {len(names)} results: the ends did not share them"


def test_a_held_end_goes_out_by_the_holds_deadline_while_nothing_else_happens(agent, spool, tmp_path):
    """A quick job's end, followed by a successor that runs on with more than HOLD_QUEUED behind it: the
    end is held (the host is busy), and nothing else comes to wake the agent; it goes out anyway."""
    agent.launch(hold("head", tmp_path))
    agent.launch(unit("quick", ["true"], tmp_path, after="head"))
    agent.launch({**hold("long", tmp_path), "after": "quick"})
    behind = [f"q{i}" for i in range(HOLD_QUEUED + 1)]
    for before, name in zip(["long", *behind], behind):
        agent.launch(unit(name, ["true"], tmp_path, after=before))
    job_pid(spool, "head")
    (tmp_path / "go-head").touch()
    ended = agent.finished("quick", timeout=5)["end_time"]
    assert time.time() - ended < 0.3, "the held end waited for something else to wake the agent"
    job_pid(spool, "long")
    assert [e for e in agent.events if e["event"] == "finished" and e["unit"] != "head"] == [
        next(e for e in agent.events if e["event"] == "finished" and e["unit"] == "quick")]
    (tmp_path / "go-long").touch()
    assert all(agent.finished(name)["exit_code"] == 0 for name in behind)


def test_behind_counts_the_chain_behind_each_unit_asked():
    queued = {"b": {"after": "a"}, "c": {"after": "b"}, "d": {"after": "c"}, "y": {"after": "x"}, "n": {}}
    successors = Successors(SimpleNamespace(queued=queued), None, None, None)  # type: ignore[arg-type]
    assert successors.behind({"a", "b", "x", "z"}) == {"a": 3, "b": 2, "x": 1, "z": 0}


def test_an_agent_killed_while_it_holds_ends_loses_none_and_runs_none_twice(agents, spool, tmp_path):
    """Faults in a row: ends held for a sync (chains deep enough), the agent killed meanwhile, a
    second agent, and its chains' rest: every unit ends once, each job ran once, and every end the
    first agent never reported (nor synced) is there for the second to list."""
    first = agents()
    names = []
    for k in range(4):
        first.launch(hold(f"h{k}", tmp_path))
        chain = [f"c{k}-{i}" for i in range(1, 7)]
        for before, name in zip([f"h{k}", *chain], chain):
            first.launch(counted(name, tmp_path, after=before))
        names += chain
    for k in range(4):
        job_pid(spool, f"h{k}")
    for k in range(4):
        (tmp_path / f"go-h{k}").touch()
    wait_until(lambda: any(runs(tmp_path, name) for name in names), 10, "the chains to start")
    first.proc.kill()  # mid-chain: some ends held, some jobs running, the rest queued
    first.close()
    second = agents()

    def all_ended():
        units = {u["unit"]: u for u in second.request("list")["units"]}
        return all(units.get(name, {}).get("status") == "finished" for name in names) and units

    units = wait_until(all_ended, 30, "every unit of the chains to end under the second agent")
    assert all(units[name]["result"]["exit_code"] == 0 for name in names)
    assert [runs(tmp_path, name) for name in names] == [1] * len(names)
