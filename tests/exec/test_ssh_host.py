"""SshHost over real sshd on real test hosts: connecting, host keys, deploying the agent, losing the
connection, the heartbeat, ProxyJump, byte-exact jobs. The Host contract itself runs against SshHost
in test_host_contract.py; copying the agent to a host is test_agent_deploy.py.

Processes inside a test host are found through /proc (their NSpid) and stopped by PID, never by name.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import warnings
from pathlib import Path

import pytest

from tests.support.agent_hosts import ssh_target
from tests.support.procs import proc_field
from tests.support.host_contract import HostRig
from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.errors import ConfigError, HostKeyChanged, HostKeyUnknown, HostUnreachable
from xce_lite.exec.agent.util import VERSION as AGENT_VERSION
from xce_lite.exec.channel import AgentChannel
from xce_lite.exec.host import HostLost
from xce_lite.exec.ssh import SshHost, agent_copy, probe, remote_path
from xce_lite.testhosts import TestHost

@pytest.fixture
def rigs(workdir):
    """`rigs(test_host, **SshHost options)`: a HostRig on an SshHost to that test host."""
    made: list[HostRig] = []

    def make(test_host: TestHost, target=None, **options) -> HostRig:
        target = target or ssh_target(test_host, workdir)
        spool = str(workdir / f"spool-{test_host.name}")
        rig = HostRig(lambda: SshHost(target.name, target, spool, log_path=workdir / "agent.log", **options),
                      workdir)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def explicit_target(test_host: TestHost, workdir: Path, **fields):
    """A target with no ssh config: address, user and key given, no known_hosts unless given."""
    spec = {"address": test_host.ip, "port": test_host.port, "user": "root", "identity": str(test_host.key_path),
            "ssh_config": None, "known_hosts": ()}
    spec.update(fields)
    return ssh_target(test_host, workdir, **spec)


# ---------------------------------------------------------------- processes inside a test host


def machine_pid(test_host: TestHost, ns_pid: int) -> int:
    """The pid, as this machine sees it, of the process that is `ns_pid` inside the test host."""
    for pid in testhosts.namespace_pids(test_host.pid):
        try:
            nspid = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("NSpid:")).split()
        except (OSError, StopIteration):
            continue
        if int(nspid[-1]) == ns_pid:
            return pid
    raise AssertionError(f"no process {ns_pid} in {test_host.name}")


def sshd_pids(test_host: TestHost) -> set[int]:
    """The per-connection sshd processes of the test host (every sshd but its listener)."""
    return {pid for pid in testhosts.namespace_pids(test_host.pid)
            if testhosts._comm(pid) == "sshd" and proc_field(pid, 1) != str(test_host.pid)}


def connection_of(test_host: TestHost, agent_ns_pid: int) -> list[int]:
    """The sshd processes that serve the connection the agent runs under, up to the listener."""
    pids, pid = [], int(proc_field(machine_pid(test_host, agent_ns_pid), 1))
    while testhosts._comm(pid) == "sshd" and proc_field(pid, 1) != str(test_host.pid):
        pids.append(pid)
        pid = int(proc_field(pid, 1))
    assert pids, "the agent runs under no per-connection sshd"
    return pids


# ---------------------------------------------------------------- connecting


@pytest.mark.parametrize("kind", ["systemd", "plain"])
def test_probe_reaches_the_host_through_its_ssh_config(kind, request, workdir):
    test_host = request.getfixturevalue(f"{kind}_hosts")[0]
    found = probe(ssh_target(test_host, workdir), str(workdir / "spool"), log_path=workdir / "agent.log")
    assert found.hostname == test_host.name and found.agent_version == AGENT_VERSION and found.cpus >= 1
    assert found.extra["spool"] == str(workdir / "spool") and found.extra["host_name"] == test_host.name


def test_paths_under_home_resolve_on_the_host(plain_hosts, workdir):
    def under_home(path: Path) -> str:  # the hosts' root has this home too: one passwd, one file system
        return "~/" + os.path.relpath(path, Path.home())

    target = ssh_target(plain_hosts[0], workdir, agent_dir=under_home(workdir / "agents"))
    found = probe(target, under_home(workdir / "spool"))
    assert found.extra["spool"] == str(workdir / "spool") and (workdir / "spool" / "journal").exists()
    assert [p.name for p in (workdir / "agents").iterdir()] == [agent_copy()[1]]


def test_remote_paths_are_quoted_for_the_hosts_shell():
    assert remote_path("~") == '"$HOME"'
    assert remote_path("~/.xce-agent/c-h1") == '"$HOME"/.xce-agent/c-h1'
    assert remote_path("~/it's here") == '"$HOME"/\'it\'"\'"\'s here\''
    assert remote_path("/srv/x;rm -rf y") == "'/srv/x;rm -rf y'"
    assert remote_path("~user/x") == "'~user/x'"


def test_refused_connection_says_to_check_sshd(systemd_hosts, workdir):
    target = explicit_target(systemd_hosts[0], workdir, port=2222)
    with pytest.raises(HostUnreachable, match=r"connection refused on 127\.0\.0\.\d+:2222: is sshd running"):
        probe(target, str(workdir / "spool"))


def test_failed_authentication_names_the_identity_file(systemd_hosts, workdir):
    key = workdir / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    known = (str(systemd_hosts[0].known_hosts_path),)
    target = explicit_target(systemd_hosts[0], workdir, identity=str(key), known_hosts=known)
    with pytest.raises(HostUnreachable, match=f"authentication failed for root@.*check the identity file.*{key}"):
        probe(target, str(workdir / "spool"))


def test_a_missing_identity_file_is_a_config_error(systemd_hosts, workdir):
    with pytest.raises(ConfigError, match="identity file .*nope does not exist"):
        probe(ssh_target(systemd_hosts[0], workdir, identity=str(workdir / "nope")), str(workdir / "spool"))


def test_a_missing_python_says_what_to_set_and_the_log_has_the_shells_words(plain_hosts, workdir):
    target = ssh_target(plain_hosts[0], workdir, python="/no/such/python3")
    with pytest.raises(HostUnreachable, match="/no/such/python3 not found there .*set the host's `python`"):
        probe(target, str(workdir / "spool"), log_path=workdir / "agent.log")
    assert "/no/such/python3" in (workdir / "agent.log").read_text()  # the agent's stderr, drained


def test_a_server_that_never_speaks_fails_within_the_connect_timeout(workdir):
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does) and never speaks
    try:
        port = silent.getsockname()[1]
        host = TestHost("silent", "127.0.0.1", os.getpid(), False, workdir, port)
        target = explicit_target(host, workdir, identity=None, connect_timeout=0.5)
        with pytest.raises(HostUnreachable, match=rf"no SSH handshake with 127\.0\.0\.1:{port} within 0\.5 s"):
            probe(target, str(workdir / "spool"))
    finally:
        silent.close()


# ---------------------------------------------------------------- host keys


def test_an_unknown_host_key_is_refused_with_its_fingerprint(systemd_hosts, workdir):
    test_host = systemd_hosts[0]
    printed = subprocess.run(["ssh-keygen", "-l", "-f", str(test_host.dir / "hostkey.pub")], capture_output=True,
                             text=True, check=True).stdout.split()[1]
    with pytest.raises(HostKeyUnknown) as caught:
        probe(explicit_target(test_host, workdir), str(workdir / "spool"))
    assert caught.value.fingerprint == printed and printed in str(caught.value)
    assert "`xce hosts add host1 --accept-new`" in str(caught.value)
    assert not (workdir / "accepted_keys").exists()


def test_accept_new_writes_the_key_then_it_is_trusted_without_the_flag(systemd_hosts, workdir):
    test_host = systemd_hosts[0]
    target = explicit_target(test_host, workdir)
    assert probe(target, str(workdir / "spool"), accept_new=True).hostname == "host1"
    kind, b64 = (test_host.dir / "hostkey.pub").read_text().split()[:2]
    assert (workdir / "accepted_keys").read_text() == f"{test_host.ip} {kind} {b64}\n"
    assert probe(target, str(workdir / "spool")).hostname == "host1"


def test_a_changed_host_key_is_refused_even_with_accept_new(systemd_hosts, workdir):
    test_host = systemd_hosts[0]
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / "impostor")], check=True)
    kind, b64 = (workdir / "impostor.pub").read_text().split()[:2]
    known = workdir / "known_hosts"
    known.write_text(f"# mine\n{test_host.ip} {kind} {b64}\n")
    target = explicit_target(test_host, workdir, known_hosts=(str(known),))
    with pytest.raises(HostKeyChanged) as caught:
        probe(target, str(workdir / "spool"), accept_new=True)
    assert (caught.value.path, caught.value.line) == (str(known), 2) and f"{known} line 2" in str(caught.value)
    assert not (workdir / "accepted_keys").exists()


def test_hashed_known_hosts_are_honoured(systemd_hosts, workdir):
    test_host = systemd_hosts[0]
    known = workdir / "known_hosts"
    shutil.copy(test_host.known_hosts_path, known)
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert test_host.ip not in known.read_text()
    assert probe(explicit_target(test_host, workdir, known_hosts=(str(known),)), str(workdir / "spool"))


# ---------------------------------------------------------------- through a jump host


def jump_config(workdir: Path, harness: TestHost, how: str = "ProxyJump host1", extra: str = "") -> str:
    """An ssh config where host2 is reached through host1 (first values win in ssh configs)."""
    path = workdir / "ssh_config"
    path.write_text(f"{extra}Host host2\n  {how}\n\n" + harness.ssh_config_path.read_text())
    return str(path)


@pytest.mark.parametrize("how", ["ProxyJump host1", "ProxyCommand ssh -F {config} -o BatchMode=yes -W %h:%p host1"])
def test_a_jump_host_in_the_ssh_config_is_gone_through(systemd_hosts, workdir, how):
    jump, final = systemd_hosts
    config = jump_config(workdir, jump, how.format(config=jump.ssh_config_path))
    before = sshd_pids(jump)
    host = SshHost("host2", ssh_target(final, workdir, ssh_config=config), str(workdir / "spool"))
    assert host.connect(queue.Queue()).hostname == "host2"
    try:
        assert sshd_pids(jump) - before, "no connection through host1"
        assert host.list_units() == []
    finally:
        host.close()
    wait_until(lambda: sshd_pids(jump) <= before, 10, "host1's sshd to end the jump connection")


def test_the_jump_hosts_key_is_checked_too(systemd_hosts, workdir):
    jump, final = systemd_hosts
    (workdir / "empty").write_text("")
    config = jump_config(workdir, jump, extra=f"Host host1\n  UserKnownHostsFile {workdir / 'empty'}\n\n")
    with pytest.raises(HostKeyUnknown, match=r"jump host host1.*`xce hosts add host2 --accept-new`"):
        probe(ssh_target(final, workdir, ssh_config=config), str(workdir / "spool"))


# ---------------------------------------------------------------- losing the host


def test_the_connections_loss_is_host_lost_once_and_the_jobs_go_on(systemd_hosts, rigs):
    test_host = systemd_hosts[0]
    rig = rigs(test_host)
    [started] = rig.launch([rig.waiter("survivor", 3)])
    wait_until(lambda: rig.runs("survivor") == 1, 30, "the job to run")
    for pid in connection_of(test_host, rig.host.agent_pid):
        os.kill(pid, signal.SIGKILL)
    lost = rig.next_event()
    assert isinstance(lost, HostLost) and lost.host == "host1"
    with pytest.raises(HostUnreachable, match="reconnect"):
        rig.list_units()
    rig.host.connect(rig.events)
    [info] = rig.list_units()
    assert (info.unit, info.status, info.start_time) == ("survivor", "running", started.start_time)
    rig.release("survivor")
    assert rig.finished("survivor").result.exit_code == 3 and rig.runs("survivor") == 1
    assert rig.events.empty()  # nothing more: in particular no second HostLost


def test_the_heartbeat_catches_a_stopped_agent(plain_hosts, rigs):
    test_host = plain_hosts[0]
    rig = rigs(test_host, heartbeat=0.2, timeout=2.0)
    rig.launch([rig.waiter("patient", 0)])
    agent = machine_pid(test_host, rig.host.agent_pid)
    os.kill(agent, signal.SIGSTOP)
    try:
        lost = rig.next_event()
        assert isinstance(lost, HostLost) and "no reply to a heartbeat within 2 s" in lost.why
        with pytest.raises(HostUnreachable):
            rig.list_units()
    finally:
        os.kill(agent, signal.SIGCONT)
    rig.reconnect()  # the old agent sees EOF once its channel is closed, and lets go of the spool
    assert [(u.unit, u.status) for u in rig.list_units()] == [("patient", "running")]
    rig.release("patient")
    assert rig.finished("patient").result.exit_code == 0
    assert rig.events.empty()


def test_an_agent_without_ping_keeps_the_heartbeat_happy():
    """A reply to `ping` that is an error (today's agent: unknown op) proves liveness; silence does not."""
    to_agent_r, to_agent_w = os.pipe()
    from_agent_r, from_agent_w = os.pipe()
    events: queue.Queue = queue.Queue()
    channel = AgentChannel(os.fdopen(from_agent_r, "rb"), os.fdopen(to_agent_w, "wb"), events.put, "fake",
                           timeout=5, heartbeat=0.05, heartbeat_timeout=2.0)
    agent_in, agent_out = os.fdopen(to_agent_r, "rb"), os.fdopen(from_agent_w, "wb", buffering=0)
    try:
        for _ in range(3):
            ping = json.loads(agent_in.readline())
            assert ping["op"] == "ping"
            agent_out.write(json.dumps({"id": ping["id"], "ok": False, "error": "unknown op 'ping'"}).encode() + b"\n")
        assert channel.lost is None
        lost = events.get(timeout=5)  # now silent: lost once
        assert isinstance(lost, HostLost) and "heartbeat" in lost.why and channel.lost == lost.why
        with pytest.raises(HostUnreachable):
            channel.request("list")
    finally:
        agent_out.close()
        channel.close()
        agent_in.close()
    assert events.empty()


def test_a_forked_child_never_uses_the_parents_connection(plain_hosts, rigs):
    rig = rigs(plain_hosts[0])
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a multi-threaded process
        pid = os.fork()
    if pid == 0:  # the child: report what using the host did, and never return into pytest
        try:
            rig.host.list_units()
            answer = b"used the parent's connection"
        except HostUnreachable as exc:
            answer = str(exc).encode()
        rig.host.close()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        answer = r.read().decode()
    os.waitpid(pid, 0)
    assert "do not survive fork" in answer
    assert rig.list_units() == []  # the parent's connection is untouched


# ---------------------------------------------------------------- what reaches the job


def test_argv_and_env_reach_the_job_byte_exact(systemd_hosts, rigs):
    rig = rigs(systemd_hosts[0])
    args = ["with space", "it's \"quoted\"", f"$(touch {rig.workdir}/pwned)", "a;b", "x\ny", "ünïcødé ✓", "`id`",
            "*", "", "\\back", "tab\there", "\udcff"]  # the last one: byte 0xff, not UTF-8
    env = {"PATH": "/usr/bin:/bin", "WEIRD": "$(x); `y`\nz ü"}
    code = ("import os, sys\nopen(sys.argv[1], 'wb').write(b'\\0'.join(os.fsencode(a) for a in sys.argv[2:]) "
            "+ b'|' + os.environb[b'WEIRD'])")
    out = rig.workdir / "argv"
    rig.launch([rig.python("exact", code, str(out), *args, env=env)])
    assert rig.finished("exact").result.exit_code == 0
    assert out.read_bytes() == b"\0".join(os.fsencode(a) for a in args) + b"|" + os.fsencode(env["WEIRD"])
    assert not (rig.workdir / "pwned").exists()
