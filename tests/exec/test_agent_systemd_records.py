"""Direct units whose end the agent records itself (`serve --records agent`: the host's `unit_accounting: false`): no
ExecStopPost; systemd keeps each unit loaded once over (RemainAfterExit=yes, CollectMode=inactive)
until its result is in the journal, so that a job that ends while no agent runs is still reported
with its own exit status. Real systemd test hosts, as in test_agent_systemd.py: the agent inside
host1, as root, over ssh.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

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
)
from tests.support.agent_local import AGENT, journal, recorded_result
from tests.support.waiting import wait_until


def launched(spool: Path, unit: str) -> dict:
    records = [json.loads(line) for line in (spool / "journal").read_bytes().split(b"\n") if line.strip()]
    return [r for r in records if r.get("event") == "launched" and r.get("unit") == unit][-1]


def unit_show(host, unit: str, *props: str) -> dict[str, str]:
    """systemctl show's values of the unit's `props` ({"LoadState": "not-found"} once it is gone)."""
    argv = ["systemctl", "show", *(f"--property={p}" for p in props), f"{unit}.service"]
    out = subprocess.run(host.nsenter_argv(argv), capture_output=True, text=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture
def work(testhosts_root: Path) -> Path:
    return shared_dir(testhosts_root, "agent-records")


@pytest.fixture
def agents(systemd_hosts, work):
    """start() -> a HostAgent on host1 (as root, over ssh) whose spool asks it to record direct units' ends."""
    host, started, spool = systemd_hosts[0], [], work / "spool"
    spool.mkdir(mode=0o700, exist_ok=True)

    def start() -> HostAgent:
        argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(spool), "--mode", "systemd",
                "--records", "agent", "--host-name", host.name]
        started.append(HostAgent(host.name, host.ssh_argv(argv), work / "agent.log"))
        return started[-1]

    yield start
    for agent in started:
        agent.close()
    for unit in journal(spool):  # what a failed test left: running, or kept loaded for its result
        for verb in ("kill", "reset-failed", "stop"):
            extra = ["-s", "KILL"] if verb == "kill" else []
            subprocess.run(host.nsenter_argv(["systemctl", verb, *extra, f"{unit}.service"]), capture_output=True,
                           timeout=30)
    assert "Traceback" not in (work / "agent.log").read_text(), "the agent failed: see its log"


def gone(host, unit: str) -> bool:
    return unit_show(host, unit, "LoadState").get("LoadState") == "not-found"


def test_a_direct_unit_has_no_exec_stop_post_and_its_result_comes_back(agents, systemd_hosts, work):
    agent, host, unit, zero = agents(), systemd_hosts[0], name("rec"), name("zero")
    agent.launch([request(unit, py(HOLD_JOB, str(work / "go"), "3"), work), request(zero, ["true"], work)])
    running(work / "go")
    assert launched(work / "spool", unit)["direct"]["record"] == "agent"
    shown = unit_show(host, unit, "ExecStopPost", "RemainAfterExit", "CollectMode")
    assert (shown.get("ExecStopPost", ""), shown["RemainAfterExit"], shown["CollectMode"]) == ("", "yes", "inactive")
    (work / "go").touch()
    result = agent.finished(unit)
    assert (result.exit_code, result.signal, result.reason, result.service_result) == (3, None, None, "exit-code")
    assert result.mode == "systemd" and result.end_time >= result.start_time
    ok = agent.finished(zero)
    assert (ok.exit_code, ok.signal, ok.reason, ok.service_result) == (0, None, None, "success")
    # let go once recorded: systemd forgets both (one failed, one exited), and their host directories go
    wait_until(lambda: gone(host, unit) and gone(host, zero), 20, "both units let go")
    assert not (work / "spool" / "units" / unit).exists()


def test_jobs_that_end_while_their_agent_is_killed_are_reported_with_their_own_exit_status(
    agents, systemd_hosts, work
):
    host = systemd_hosts[0]
    first, three, zero, shot, late = agents(), name("three"), name("zero"), name("shot"), name("late")
    first.launch([request(three, py(HOLD_JOB, str(work / "go-three"), "3"), work),
                  request(zero, py(HOLD_JOB, str(work / "go-zero"), "0"), work),
                  request(shot, py(HOLD_JOB, str(work / "never")), work),
                  request(late, py(HOLD_JOB, str(work / "go-late"), "4"), work)])
    pids = {release: running(work / release) for release in ("go-three", "go-zero", "never", "go-late")}
    in_host(host, "kill", "-9", str(first.hello.extra["pid"]))
    # with no agent: two end by themselves, one is killed from outside; systemd keeps their results
    (work / "go-three").touch()
    (work / "go-zero").touch()
    in_host(host, "kill", "-9", str(pids["never"]))
    for unit, state in ((three, "failed"), (zero, "active"), (shot, "failed")):
        wait_until(lambda u=unit, s=state: unit_show(host, u, "ActiveState")["ActiveState"] == s
                   and unit_show(host, u, "ExecMainExitTimestampMonotonic")["ExecMainExitTimestampMonotonic"] != "0",
                   20, f"{unit} over with no agent")
    assert all(journal(work / "spool")[u]["result"] is None for u in (three, zero, shot))  # nobody recorded them
    second = agents()
    listed = {u.unit: u for u in second.list_units()}
    assert listed[three].status == "finished" and listed[three].result.exit_code == 3
    assert listed[three].result.service_result == "exit-code" and listed[three].result.reason is None
    assert listed[zero].status == "finished"
    assert (listed[zero].result.exit_code, listed[zero].result.reason) == (0, None)
    assert (listed[shot].result.exit_code, listed[shot].result.signal) == (None, signal.SIGKILL)
    assert listed[shot].result.reason == "killed by signal SIGKILL" and listed[shot].result.service_result == "signal"
    assert listed[late].status == "running"
    wait_until(lambda: all(gone(host, u) for u in (three, zero, shot)), 20, "the recorded units let go")
    # then its controller goes away and comes back (a new agent): the same results, read from the journal
    second.close()
    (work / "go-late").touch()  # ends between the two agents
    wait_until(lambda: unit_show(host, late, "ActiveState")["ActiveState"] == "failed", 20, f"{late} over")
    third = agents()
    again = {u.unit: u for u in third.list_units()}
    assert all(again[u].result == listed[u].result for u in (three, zero, shot))
    assert again[late].status == "finished" and again[late].result.exit_code == 4
    assert [r.status for r in third.launch([request(three, ["true"], work)])] == ["finished"]  # never run twice


def test_a_killed_job_and_a_job_over_its_run_limit_say_what_happened(agents, systemd_hosts, work):
    agent, victim, slow, nap, early = agents(), name("victim"), name("slow"), name("nap"), name("early")
    agent.launch([request(victim, py(HOLD_JOB, str(work / "never")), work),
                  request(slow, ["sleep", "30"], work, run_limit=1),
                  request(nap, py(HOLD_JOB, str(work / "go-nap"), "5"), work),
                  request(early, py(HOLD_JOB, str(work / "never-early")), work)])
    assert agent.signal(early, "KILL", "killed by bob")  # systemd may not even have started it yet
    result = agent.finished(early)
    assert result.reason == "killed by bob" and result.exit_code is None
    running(work / "never")
    assert agent.signal(victim, "TERM", "killed by alice")
    result = agent.finished(victim)
    assert (result.reason, result.signal, result.service_result) == ("killed by alice", signal.SIGTERM, "success")
    result = agent.finished(slow)
    assert result.reason == "run limit 00:00:01 reached" and result.service_result == "timeout"
    assert result.signal == signal.SIGTERM
    running(work / "go-nap")  # suspended and resumed, then it ends with its own status
    assert agent.signal(nap, "STOP", "suspended by alice") and agent.signal(nap, "CONT", "resumed")
    (work / "go-nap").touch()
    result = agent.finished(nap)
    assert (result.exit_code, result.reason) == (5, None)


def test_a_kill_before_the_agent_dies_and_a_memory_limit_keep_their_reasons(agents, systemd_hosts, work):
    host = systemd_hosts[0]
    first, victim, fat = agents(), name("victim"), name("fat")
    code = "import time\nx = bytearray(200 << 20)\ntime.sleep(10)"
    first.launch([request(victim, py(HOLD_JOB, str(work / "never")), work),
                  request(fat, py(code), work, mem_limit=64 << 20)])
    running(work / "never")
    assert first.signal(victim, "KILL", "killed by bob")
    result = first.finished(victim)
    assert (result.reason, result.signal, result.exit_code) == ("killed by bob", signal.SIGKILL, None)
    in_host(host, "kill", "-9", str(first.hello.extra["pid"]))
    second = agents()
    result = second.finished(fat, timeout=60) if recorded_result(work / "spool", fat) is None else None
    listed = {u.unit: u for u in second.list_units()}
    result = result or listed[fat].result
    assert result.reason == "memory limit 64M exceeded" and result.exit_code is None
    # where systemd cannot tell an OOM kill (cgroup v1 or hybrid), the unit keeps its ExecStopPost
    cgroup = first.hello.extra["cgroup"]
    assert ("record" in launched(work / "spool", fat)["direct"]) == (cgroup == "v2")
    assert listed[victim].result.reason == "killed by bob"


def test_a_unit_systemd_forgot_while_no_agent_ran_is_lost_as_after_a_reboot(agents, systemd_hosts, work):
    # After a reboot systemd knows none of the old boot's units; here one is made to vanish likewise
    # (killed, then reset) while its agent is down: its result is "lost", never a made-up status.
    host, first, unit = systemd_hosts[0], agents(), name("gone")
    first.launch([request(unit, py(HOLD_JOB, str(work / "never")), work)])
    running(work / "never")
    in_host(host, "kill", "-9", str(first.hello.extra["pid"]))
    in_host(host, "systemctl", "kill", "-s", "KILL", f"{unit}.service")
    wait_until(lambda: unit_show(host, unit, "ActiveState")["ActiveState"] == "failed", 20, f"{unit} failed")
    in_host(host, "systemctl", "reset-failed", f"{unit}.service")
    wait_until(lambda: gone(host, unit), 20, f"{unit} forgotten by systemd")
    second = agents()
    second.list_units()  # watched from here on: reported once judged (after the start grace of another agent's)
    result = second.finished(unit, timeout=40)
    assert result.exit_code is None and result.signal is None
    assert result.reason.startswith(f"lost: systemd does not know unit {unit}, which the agent had not recorded")


def test_jobs_that_end_while_systemd_reexecutes_keep_their_exit_status_and_are_all_let_go(agents, systemd_hosts, work):
    # systemd closes the agent's connection at each re-exec: PropertiesChanged, GetAll replies and
    # releases in flight are lost with it. Faults in sequence: ends during re-execs, then the agent
    # killed, ends with no agent, a new agent, more ends during more re-execs, then the results forgotten.
    host, first = systemd_hosts[0], agents()
    units = [name(f"re{i}") for i in range(12)]
    first.launch([request(u, py(HOLD_JOB, str(work / f"go{i}"), str(i % 3)), work) for i, u in enumerate(units)])
    for i in range(12):
        running(work / f"go{i}")

    def end_during_reexec(ends: list[int]) -> None:
        reexec = subprocess.Popen(host.nsenter_argv(["systemctl", "daemon-reexec"]))
        for i in ends:
            (work / f"go{i}").touch()
        assert reexec.wait(60) == 0

    for ends in ([0, 1], [2, 3], [4, 5]):  # back to back: the next one while it asks about the last one's
        end_during_reexec(ends)
    first.finished(units[0], timeout=60)  # reconnected and recording
    in_host(host, "kill", "-9", str(first.hello.extra["pid"]))
    end_during_reexec([6])
    second = agents()
    listed = {u.unit: u for u in second.list_units()}  # those not finished are watched from here on
    for ends in ([7, 8], [9, 10], [11], []):
        end_during_reexec(ends)
    results = {u: listed[u].result if listed[u].status == "finished" else second.finished(u, timeout=60)
               for u in units}
    for i, u in enumerate(units):
        result = results[u]
        assert (result.exit_code, result.signal, result.reason) == (i % 3, None, None), u
    second.forget(units)
    wait_until(lambda: all(gone(host, u) for u in units), 30, "every recorded unit let go")
