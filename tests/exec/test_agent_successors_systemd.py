"""Queued successors (issue 18, prefill) in the agent on a real systemd test host: behind a direct
unit (its end read by the stop script's record) and behind a supervised one, through AgentOps as
the controller speaks; the agent killed -9 while they wait, its predecessors released while no
agent runs one of them: each successor runs exactly once, when its predecessor has ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agent_local import AGENT, journal
from tests.support.agent_hosts import (
    HOLD_JOB,
    PY,
    HostAgent,
    in_host,
    name,
    py,
    request,
    running,
    shared_dir,
    stop_leftovers,
)
from tests.support.waiting import wait_until
from xce_lite.exec.host import UnitUnqueued

SUPERVISED = {"NOT.DIRECT": "1", "PATH": "/usr/bin:/bin"}  # an env name systemd refuses: a supervised unit
COUNT = "import sys\nopen(sys.argv[1], 'a').write('ran\\n')\n"


@pytest.fixture
def work(testhosts_root: Path) -> Path:
    return shared_dir(testhosts_root, "agent-successors")


@pytest.fixture
def root_agents(systemd_hosts, work):
    host, started = systemd_hosts[0], []

    def start() -> HostAgent:
        argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(work / "spool"), "--mode", "systemd",
                "--host-name", host.name]
        started.append(HostAgent(host.name, host.ssh_argv(argv), work / "agent.log"))
        return started[-1]

    yield start
    stop_leftovers(host, work / "spool", None)
    for agent in started:
        agent.close()
    assert "Traceback" not in (work / "agent.log").read_text(), "the agent failed: see its log"


def test_successors_of_direct_and_supervised_units_survive_an_agent_kill_and_run_once(root_agents, systemd_hosts,
                                                                                      work):
    first = root_agents()
    a, s, b, t = name("a"), name("s"), name("b"), name("t")
    first.launch([request(a, py(HOLD_JOB, str(work / "go-a")), work),
                  request(s, py(HOLD_JOB, str(work / "go-s")), work, env=SUPERVISED)])
    running(work / "go-a"), running(work / "go-s")
    replies = first.launch([request(b, py(COUNT, str(work / "b.count")), work, after=a),
                            request(t, py(COUNT, str(work / "t.count")), work, after=s, env=SUPERVISED)])
    assert [r.status for r in replies] == ["queued", "queued"]
    assert {u.unit: u.status for u in first.list_units()}[b] == "queued"

    (work / "go-a").touch()  # a's stop script records its end; b starts in the same turn
    assert first.finished(b).exit_code == 0
    started = first.event(lambda e: isinstance(e, UnitUnqueued) and e.unit == b, f"{b} unqueued")
    assert started.status == "started"
    in_host(systemd_hosts[0], "kill", "-9", str(first.hello.extra["pid"]))
    (work / "go-s").touch()  # s ends while no agent runs: t waits in the journal
    wait_until(lambda: journal(work / "spool")[s]["result"], 20, "s's result, written with no agent")
    assert not (work / "t.count").exists()

    second = root_agents()  # its first turn starts t
    assert second.finished(t).exit_code == 0
    assert second.launch([request(t, ["true"], work, after=s)])[0].status == "finished"  # adopted: ran once
    assert (work / "b.count").read_text() == (work / "t.count").read_text() == "ran\n"
