"""The host side of the controller's lease (exec/agent/lease.py), on real test hosts, each test on a
systemd host (units of systemd: direct ones, and supervised ones with hooks) and a plain one (the
agent's forked supervisors).

The agent is driven as the controller drives it (AgentOps over ssh): a lease is granted from the
host's own clock reading, as controller/leases.py does, and then not renewed. Post hooks append a
line to a log on the shared file system: one line per unit is the proof that they ran once.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.agent_hosts import (
    HOLD_JOB,
    PY,
    HostAgent,
    hook,
    lines,
    name,
    py,
    request,
    running,
    shared_dir,
    stop_leftovers,
)
from tests.support.agent_local import AGENT, journal
from tests.support.waiting import wait_until


@pytest.fixture
def host(kind, systemd_hosts, plain_hosts):
    return systemd_hosts[0] if kind == "systemd" else plain_hosts[0]


@pytest.fixture
def work(testhosts_root: Path) -> Path:
    return shared_dir(testhosts_root, "agent-lease")


@pytest.fixture
def agents(kind, host, work):
    """start() -> a new HostAgent on the host of this kind, over ssh, as root, on work/spool."""
    started = []

    def start() -> HostAgent:
        argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(work / "spool"), "--mode", kind]
        started.append(HostAgent(host.name, host.ssh_argv(argv), work / "agent.log"))
        return started[-1]

    yield start
    if kind == "systemd":
        stop_leftovers(host, work / "spool", None)
    for agent in started:
        agent.close()
    assert "Traceback" not in (work / "agent.log").read_text(), "the agent failed: see its log"


def grant(agent: HostAgent, seconds: float, late: float = 0.0) -> dict:
    """Grant a lease of `seconds` from the host's clock as read now (minus `late`: a grant that
    waited that long in a frozen channel); the reply (the host's clock, its lease)."""
    clock = agent._chan().request("ping")["clock"]
    return agent.grant_lease(clock - late + seconds, seconds, agent.hello.extra["boot_id"])


def hold(unit: str, work: Path, **over):
    return request(unit, py(HOLD_JOB, str(work / f"{unit}.release")), work, **over)


def wait_result(work: Path, unit: str, timeout: float = 30) -> dict:
    """The unit's result, as its journal has it (whoever recorded it: agent, supervisor, systemd)."""
    return wait_until(lambda: journal(work / "spool")[unit]["result"], timeout, f"a result for {unit}")


REASON = "lease expired: no word from the controller for 00:00:0"  # 3 or 4 s: since the grant came


def test_a_lease_that_runs_out_stops_the_units_with_post_hooks_once_and_starts_nothing_more(agents, work):
    agent = agents()
    assert agent.hello.agent_version == 3 and isinstance(agent.hello.extra["clock"], float)
    assert agent.hello.extra["lease"] is None  # never granted: nothing is enforced
    assert grant(agent, 4)["until"] > 0
    plain, hooked, log = name("plain"), name("hooked"), work / "hooks.log"
    post = (hook("post_job_exec", log, layer="job"),)
    for reply in agent.launch([hold(plain, work), hold(hooked, work, hooks=post)]):
        assert reply.status == "started", reply
    running(work / f"{plain}.release")
    running(work / f"{hooked}.release")
    for unit in (plain, hooked):
        result = agent.finished(unit, timeout=30)
        assert result.reason.startswith(REASON) and result.exit_code is None, result
    assert len(lines(log)) == 1 and lines(log)[0].startswith(f"post_job_exec job EXIT|{REASON}")  # once
    # Ran out: a launch is refused, and so is the help of a grant that arrives late
    [refused] = agent.launch([hold(name("after"), work)])
    assert refused.status == "refused" and "lease ran out" in refused.error
    assert grant(agent, 4, late=10)["until"] < agent._chan().request("ping")["clock"]
    [refused] = agent.launch([hold(name("late"), work)])
    assert refused.status == "refused"
    grant(agent, 30)  # a fresh grant: units start again
    fresh = name("fresh")
    [reply] = agent.launch([hold(fresh, work)])
    assert reply.status == "started"
    (work / f"{fresh}.release").touch()
    assert agent.finished(fresh).exit_code == 0


def test_renewed_in_time_the_units_run_on_past_the_first_lease(agents, work):
    agent = agents()
    grant(agent, 3)
    unit = name("renewed")
    [reply] = agent.launch([hold(unit, work)])
    assert reply.status == "started"
    running(work / f"{unit}.release")
    until = time.monotonic() + 7
    while time.monotonic() < until:  # renewed every second for more than twice the lease
        grant(agent, 3)
        time.sleep(1)
    assert journal(work / "spool")[unit]["result"] is None
    (work / f"{unit}.release").touch()
    assert agent.finished(unit).exit_code == 0


def test_an_agent_whose_controller_went_away_stays_stops_the_units_at_the_lease_end_then_leaves(agents, work, host):
    agent = agents()
    grant(agent, 4)
    unit = name("orphan")
    [reply] = agent.launch([hold(unit, work)])
    assert reply.status == "started"
    job_pid = running(work / f"{unit}.release")
    pid = agent.hello.extra["pid"]
    agent._channel.close(timeout=1)  # stdin EOF, as when the controller dies
    time.sleep(1)
    assert host_alive(host, pid), "the agent left while its lease held a running unit"
    assert journal(work / "spool")[unit]["result"] is None
    result = wait_result(work, unit)
    assert result["reason"].startswith(REASON)
    wait_until(lambda: not host_alive(host, pid), 30, "the orphan agent to leave once nothing runs")
    assert not host_alive(host, job_pid)


def test_a_new_agent_takes_the_spool_from_an_orphan_and_keeps_its_lease(agents, work, host):
    first = agents()
    grant(first, 6)
    unit = name("handover")
    [reply] = first.launch([hold(unit, work)])
    assert reply.status == "started"
    running(work / f"{unit}.release")
    pid = first.hello.extra["pid"]
    first._channel.close(timeout=1)
    second = agents()  # gets the spool at once (the orphan hands over), within the old lease
    assert not host_alive(host, pid)
    assert 0 < second.hello.extra["lease"] <= 6  # the lease the first agent was granted holds
    assert {u.unit: u.status for u in second.list_units()}[unit] == "running"
    assert second.finished(unit, timeout=30).reason.startswith(REASON)


def test_a_grant_replaces_a_longer_lease_an_earlier_controller_left_and_its_units_stop_at_its_end(agents, work):
    """`xce controller stop` leaves a maintenance lease (an hour by default) in the spool; a cluster
    started afresh (a new store, the same spool) knows nothing of it. Its grants rule from the
    first: were the old lease kept, a job the new controller reckons fenced would run on, and run
    twice once requeued."""
    first = agents()
    grant(first, 600)
    first._channel.close(timeout=1)  # no unit runs: it leaves
    second = agents()
    assert second.hello.extra["lease"] > 500  # the earlier lease holds until the first grant
    reply = grant(second, 4)
    assert reply["until"] - reply["clock"] <= 4, reply
    unit = name("shortened")
    [started] = second.launch([hold(unit, work)])
    assert started.status == "started", started
    running(work / f"{unit}.release")
    assert second.finished(unit, timeout=30).reason.startswith(REASON)


def test_a_new_agent_asks_again_until_the_agent_reading_a_dying_channel_hands_the_spool_over(agents, work, host):
    """A controller that reconnects while its old channel is still open on the host (sshd not yet
    aware the client went): the old agent, still under its lease, refuses the first ask; once its
    channel ends it is an orphan, and the next ask takes the spool within the new agent's lock wait
    (10 s), not the next reconnect."""
    first = agents()
    grant(first, 60)
    unit = name("asked")
    [reply] = first.launch([hold(unit, work)])
    assert reply.status == "started"
    running(work / f"{unit}.release")
    pid = first.hello.extra["pid"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(agents)
        time.sleep(2)  # a plain wait: the first ask must meet an agent that still reads its channel
        assert not second.done() and host_alive(host, pid)
        first._channel.close(timeout=1)
        agent = second.result(timeout=30)
    assert not host_alive(host, pid)
    assert {u.unit: u.status for u in agent.list_units()}[unit] == "running"
    (work / f"{unit}.release").touch()
    assert agent.finished(unit).exit_code == 0


@pytest.mark.parametrize("kind", ["plain"], indirect=True)  # a direct systemd unit has no supervisor of ours
def test_with_its_agent_killed_a_plain_supervisor_stops_its_job_at_the_lease_end(agents, work, host):
    agent = agents()
    grant(agent, 4)
    unit, log = name("alone"), work / "hooks.log"
    [reply] = agent.launch([hold(unit, work, hooks=(hook("post_job_exec", log, layer="job"),))])
    assert reply.status == "started"
    running(work / f"{unit}.release")
    subprocess.run(host.nsenter_argv(["kill", "-9", str(agent.hello.extra["pid"])]), check=True, timeout=30)
    assert wait_result(work, unit)["reason"].startswith(REASON)
    assert len(lines(log)) == 1 and lines(log)[0].startswith(f"post_job_exec job EXIT|{REASON}")


def host_alive(host, pid: int) -> bool:
    done = subprocess.run(host.nsenter_argv(["cat", f"/proc/{pid}/stat"]), capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
