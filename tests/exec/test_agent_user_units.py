"""The host agent inside a real systemd test host as a non-root user: alice, made inside the host
only, with a lingering systemd user manager. Her jobs run in user units with their limits and kill
reasons, and outlive their agent; system mode is refused to her, saying why.

The agent runs inside the host (nsenter + setpriv as alice), its pipes wrapped in an AgentChannel,
and the tests speak to it through AgentOps, as the controller does. Her directories are made per
test under her home, which this machine sees too (`alice.files`).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.agent_local import AGENT
from tests.support.agent_hosts import HOLD_JOB, PY, HostAgent, name, py, request, running, stop_leftovers
from xce_lite import testhosts
from xce_lite.errors import HostUnreachable


@pytest.fixture(scope="module")
def alice(systemd_hosts, testhosts_root) -> testhosts.HostUser:
    """alice, a non-root user of host2 whose systemd user manager lingers."""
    return testhosts.add_lingering_user(systemd_hosts[1], "alice", testhosts_root / "users")


@pytest.fixture
def user_agents(alice):
    """start() -> (a HostAgent serving in user mode as alice on host2, her directory for this test:
    the path the host sees, and the same directory as this machine sees it)."""
    sub = uuid.uuid4().hex[:8]
    seen, here = f"{alice.home}/{sub}", alice.files / sub
    here.mkdir()
    os.chown(here, alice.uid, alice.uid)
    started = []

    agent = alice.copy_in(AGENT)  # the source tree may lie where she cannot read (a clone in /root)

    def start(mode: str = "user") -> tuple[HostAgent, str, Path]:
        argv = [PY, "-S", "-E", agent, "serve", "--spool", f"{seen}/spool", "--mode", mode]
        started.append(HostAgent(alice.host.name, alice.argv(argv), here / "agent.log", run_as=alice))
        return started[-1], seen, here

    yield start
    stop_leftovers(alice.host, here / "spool", alice)
    for agent in started:
        agent.close()
    assert "Traceback" not in (here / "agent.log").read_text(), "the agent failed: see its log"


# ---------------------------------------------------------------- user units (alice, lingering)


def test_hello_as_a_lingering_user_says_user_units_and_who_enforces_memory(user_agents):
    agent, _seen, _here = user_agents()
    x = agent.hello.extra
    assert x["mode"] == "user" and x["modes"]["user"]["ok"] and (x["user"], x["uid"]) == ("alice", 2001)
    assert not x["modes"]["systemd"]["ok"] and "need root" in x["modes"]["systemd"]["why"]
    if x["cgroup"] != "v2":  # this machine: cgroup v1 hybrid, no memory controller for user managers
        assert x["modes"]["user"]["memory"] == "supervisor" and "RSS watch" in x["modes"]["user"]["memory_why"]


def test_a_lingering_user_runs_a_copy_of_a_file_that_lies_where_she_cannot_read(alice, testhosts_root):
    closed = testhosts_root / f"closed-{uuid.uuid4().hex[:8]}"  # as a checkout in /root (0700)
    closed.mkdir(mode=0o700)
    (closed / "hello.py").write_text("print('hello from a copy')\n")
    denied = subprocess.run(alice.argv(["cat", str(closed / "hello.py")]), capture_output=True, text=True, timeout=30)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    copy = alice.copy_in(closed / "hello.py")
    ran = subprocess.run(alice.argv([PY, copy]), capture_output=True, text=True, timeout=30)
    assert ran.stdout == "hello from a copy\n", ran.stderr


def test_system_mode_as_a_user_is_fatal_and_says_why(user_agents):
    with pytest.raises(HostUnreachable, match="mode systemd.*system units need root"):
        user_agents(mode="systemd")


def test_a_job_runs_in_a_user_unit_with_its_limits_and_kill_reason(user_agents, alice):
    agent, seen, here = user_agents()
    ok, slow, fat, victim = name("ok"), name("slow"), name("fat"), name("victim")
    agent.launch([
        request(ok, py("print(open('/proc/self/cgroup').read())"), seen),
        request(slow, ["sleep", "30"], seen, run_limit=1),
        request(fat, py("import time\nx = bytearray(200 << 20)\ntime.sleep(10)"), seen, mem_limit=64 << 20),
        request(victim, py(HOLD_JOB, f"{seen}/never"), seen),
    ])
    result = agent.finished(ok)
    assert (result.exit_code, result.service_result, result.mode) == (0, "success", "user")
    assert f"/user@{alice.uid}.service/app.slice/{ok}.service\n" in (here / f"{ok}.out").read_text()
    result = agent.finished(slow)
    assert result.reason == "run limit 00:00:01 reached" and result.service_result == "timeout"
    result = agent.finished(fat)  # on cgroup v1 the supervisor's RSS watch enforces it
    assert result.reason == "memory limit 64M exceeded"
    running(here / "never")
    assert agent.signal(victim, "TERM", "killed by alice")
    assert agent.finished(victim).reason == "killed by alice"


def test_user_units_outlive_their_agent_and_are_adopted(user_agents):
    first, seen, here = user_agents()
    unit = name("long")
    first.launch([request(unit, py(HOLD_JOB, f"{seen}/go", "6"), seen)])
    running(here / "go")
    first.close()  # the connection dropped: the agent exits, its unit runs on
    second, _seen, _here = user_agents()
    assert second.launch([request(unit, ["true"], seen)])[0].status == "running"
    (here / "go").touch()
    assert second.finished(unit).exit_code == 6
