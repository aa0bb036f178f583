"""The test-host harness (xce_lite.testhosts): real systemd hosts with sshd on loopback addresses.

Needs the fixtures of tests.support.testhosts_fixture (conftest's pytest_plugins, or
`-p tests.support.testhosts_fixture`). As root, in CI, with XCE_REQUIRE_TESTHOSTS=1 nothing here skips.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import paramiko
import pytest

from tests.support.waiting import wait_until
from xce_lite import testhosts
from xce_lite.testhosts import TestHost, TestHostError

# Also loaded here, so this module runs whether or not conftest.py loads the plugin (loading it twice is fine).
pytest_plugins = ["tests.support.testhosts_fixture"]


_clients: dict[tuple[Path, str, int], paramiko.SSHClient] = {}


@pytest.fixture(autouse=True, scope="module")
def _close_ssh_clients():
    yield
    while _clients:
        _clients.popitem()[1].close()


def connect(host: TestHost) -> paramiko.SSHClient:
    """An SSH connection with paramiko (what fabric uses), trusting only DIR's known_hosts; one per host."""
    key = (host.dir, host.name, host.pid)
    client = _clients.get(key)
    transport = client.get_transport() if client else None
    if client is None or transport is None or not transport.is_active():
        client = paramiko.SSHClient()
        client.load_host_keys(str(host.known_hosts_path))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(host.ip, port=host.port, username="root", key_filename=str(host.key_path),
                       look_for_keys=False, allow_agent=False, timeout=10)
        _clients[key] = client
    return client


def ssh_run(host: TestHost, command: str | list[str], timeout: float = 30) -> tuple[int, str, str]:
    if not isinstance(command, str):
        command = shlex.join(command)
    _, stdout, stderr = connect(host).exec_command(command, timeout=timeout)
    out, err = stdout.read().decode(), stderr.read().decode()
    return stdout.channel.recv_exit_status(), out, err


def ssh_ok(host: TestHost, command: str | list[str]) -> str:
    rc, out, err = ssh_run(host, command)
    assert rc == 0, f"{command!r} on {host.name} exited {rc}: {err}"
    return out


def shared_dir(host: TestHost) -> Path:
    """A fresh directory both the caller and the hosts see (not /tmp: that one is each host's own)."""
    d = host.dir / "shared" / uuid.uuid4().hex[:8]
    d.mkdir(parents=True)
    return d


def mounts() -> dict[str, str]:
    """The caller's mounts: mount point -> mount options and file system options.

    Mount points strictly below the temporary directory are left out: the suite runs in several
    xdist workers, and a test on another worker mounts and unmounts its own file systems there
    (tests/support/faults.py `small_tmpfs`) while a host boots here. The temporary directory itself
    (/tmp) stays in: a host's private /tmp leaking out would change it."""
    below_tmp = os.path.join(tempfile.gettempdir(), "")
    table = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields = left.split()
        if not fields[4].startswith(below_tmp):
            table[fields[4]] = f"{fields[5]} - {right}"
    return table


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


# --- reaching the hosts ------------------------------------------------------------------------------


def test_each_host_answers_ssh_with_its_own_hostname(systemd_hosts):
    assert [h.name for h in systemd_hosts] == ["host1", "host2"]
    for host in systemd_hosts:
        assert ssh_ok(host, "hostname").strip() == host.name
    assert len({h.ip for h in systemd_hosts}) == 2
    assert all(h.ip.startswith("127.") for h in systemd_hosts)


def test_openssh_reaches_a_host_through_the_written_ssh_config(systemd_hosts):
    host = systemd_hosts[1]
    r = subprocess.run(host.ssh_argv("hostname"), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "host2"


def test_hosts_have_their_own_tmp_and_machine_id_but_share_files(systemd_hosts):
    host1, host2 = systemd_hosts
    name = f"xce-private-{uuid.uuid4().hex[:8]}"
    ssh_ok(host1, f"touch /tmp/{name} /var/tmp/{name}")
    assert ssh_run(host2, f"test -e /tmp/{name} || test -e /var/tmp/{name}")[0] != 0
    assert not Path("/tmp", name).exists() and not Path("/var/tmp", name).exists()
    assert ssh_ok(host1, "cat /etc/machine-id") != ssh_ok(host2, "cat /etc/machine-id")
    shared = shared_dir(host1)
    ssh_ok(host1, f"echo from-host1 > {shared}/note")
    assert ssh_ok(host2, f"cat {shared}/note").strip() == "from-host1"


# --- systemd in a host ---------------------------------------------------------------------------------


def test_runtime_max_sec_ends_a_unit_and_exec_stop_post_sees_timeout(systemd_hosts):
    host = systemd_hosts[0]
    marker = shared_dir(host) / "result"
    ssh_ok(host, ["systemd-run", "--quiet", "--unit=xce-t-1", "-p", "RuntimeMaxSec=1",
                  "-p", f"ExecStopPost=/bin/sh -c 'echo $SERVICE_RESULT > {marker}'", "sleep", "30"])
    t0 = time.monotonic()
    assert wait_until(lambda: read(marker), timeout=20, describe="ExecStopPost's marker") == "timeout"
    assert time.monotonic() - t0 < 20  # well before sleep's 30 s


def test_memory_max_kills_a_memory_hog(systemd_hosts):
    host = systemd_hosts[1]
    marker = shared_dir(host) / "result"
    ssh_ok(host, ["systemd-run", "--quiet", "--unit=xce-t-2", "-p", "MemoryMax=32M",
                  "-p", f"ExecStopPost=/bin/sh -c 'echo $SERVICE_RESULT $EXIT_CODE $EXIT_STATUS > {marker}'",
                  "tail", "/dev/zero"])  # tail keeps all it reads, looking for a newline
    result = wait_until(lambda: read(marker), timeout=30, describe="ExecStopPost's marker").split()
    # systemd 252 on this cgroup v1 (hybrid) machine sees no OOM event: the unit ends as 'signal' KILL.
    # Where the memory controller is on cgroup v2 it reports 'oom-kill'.
    print(f"MemoryMax: SERVICE_RESULT EXIT_CODE EXIT_STATUS = {' '.join(result)}")
    assert result[0] in ("oom-kill", "signal"), result
    if result[0] == "signal":
        assert result[1:] == ["killed", "KILL"], result
    shown = ssh_ok(host, ["systemctl", "show", "-p", "Result", "--value", "xce-t-2"]).strip()
    assert shown == result[0]


def test_a_plain_host_has_no_systemd_but_runs_commands(plain_hosts):
    (host,) = plain_hosts
    assert not host.systemd
    assert ssh_ok(host, "hostname").strip() == "host1"
    assert ssh_ok(host, "cat /proc/1/comm").strip() == "sleep"
    rc, out, _ = ssh_run(host, "systemctl is-system-running")
    assert rc != 0 and out.strip() != "running"
    assert ssh_ok(host, "echo $((6 * 7))").strip() == "42"


# --- the harness itself --------------------------------------------------------------------------------


@pytest.mark.parametrize("plain", [False, True], ids=["systemd", "plain"])
def test_boot_keeps_the_callers_tmp_and_down_leaves_no_process(testhosts_root, require_testhosts, plain):
    """The regression test for the wipe: systemd-tmpfiles in a host must not touch the caller's /tmp."""
    require_testhosts(plain=plain)
    month_ago = time.time() - 40 * 86400  # old enough for the age-based cleaning of /tmp and /var/tmp too
    sentinels = [Path(d, f"xce-sentinel-{os.getpid()}-{uuid.uuid4().hex[:8]}") for d in ("/tmp", "/var/tmp")]
    for s in sentinels:
        s.write_text("keep me\n")
        os.utime(s, (month_ago, month_ago))
    d = testhosts_root / ("lifecycle-plain" if plain else "lifecycle-systemd")
    before = mounts()
    try:
        t0 = time.monotonic()
        (host,) = testhosts.up(1, d, plain=plain, die_with_caller=True)
        boot = time.monotonic() - t0
        assert all(s.exists() for s in sentinels), "booting a host removed files from the caller's /tmp"
        # systemd remounts /sys/fs/cgroup read-only: when that is the machine's own tmpfs, the machine's too
        after = mounts()
        changed = {m: (before[m], after.get(m)) for m in before if after.get(m) != before[m]}
        assert not changed, f"booting a host changed the caller's mounts: {changed}"
        rc, _, _ = ssh_run(host, f"test -e {sentinels[0]}")
        assert rc != 0, "the host sees the caller's /tmp"
        if not plain:
            assert ssh_ok(host, "systemctl is-system-running").strip() in ("running", "degraded")
            masked = ssh_ok(host, "systemctl is-enabled systemd-tmpfiles-setup.service || true").strip()
            assert masked == "masked"
        [st] = testhosts.status(d)
        assert st.alive and st.sshd
        pids = testhosts.namespace_pids(host.pid)
        assert host.pid in pids and len(pids) >= 2  # PID 1 and sshd at least
        claim = testhosts._claims_dir() / host.ip
        assert claim.exists()
        t0 = time.monotonic()
        _clients.pop((host.dir, host.name, host.pid)).close()
        testhosts.down(d)
        teardown = time.monotonic() - t0
        alive = [p for p in pids if Path(f"/proc/{p}").exists()]
        assert not alive, f"down left processes behind: {alive}"
        assert testhosts.status(d) == []
        assert not claim.exists()
        assert all(s.exists() for s in sentinels)
        print(f"{'plain' if plain else 'systemd'} host: up {boot:.2f} s, down {teardown:.2f} s")
    finally:
        testhosts.down(d)
        for s in sentinels:
            s.unlink(missing_ok=True)


def test_up_refuses_a_directory_the_hosts_have_their_own_copy_of():
    for bad in ("/tmp/xce-hosts", "/var/tmp/xce-hosts", "/run/xce-hosts", "/tmp"):
        with pytest.raises(TestHostError, match="outside /tmp"):
            testhosts.up(1, bad)
    assert not Path("/tmp/xce-hosts").exists()


def test_a_missing_sshd_is_named_with_the_command_that_installs_it(monkeypatch, tmp_path):
    monkeypatch.setattr(testhosts.base, "SSHD", "/nonexistent/sshd")
    problems = testhosts.missing_prerequisites()
    assert any("apt-get install -y openssh-server" in p for p in problems), problems
    with pytest.raises(TestHostError, match="apt-get install -y openssh-server"):
        testhosts.up(1, Path.home() / ".cache" / "xce-testhosts" / "never-made")
    assert not (Path.home() / ".cache" / "xce-testhosts" / "never-made").exists()


def test_an_address_in_use_is_refused_and_automatic_ones_avoid_it(systemd_hosts, testhosts_root):
    taken = {h.ip for h in systemd_hosts}
    d = testhosts_root / "clash"
    with pytest.raises(TestHostError, match="not free"):
        testhosts.up(1, d, first_ip=systemd_hosts[0].ip)
    assert not (d / testhosts.STATE).exists()
    ips = testhosts.claim_ips(3, d)
    try:
        assert not taken & set(ips)
        last = [int(ip.rsplit(".", 1)[1]) for ip in ips]
        assert last == list(range(last[0], last[0] + 3))
    finally:
        testhosts.release_ips(d, ips)
    assert not any((testhosts._claims_dir() / ip).exists() for ip in ips)


def test_only_loopback_addresses_are_accepted():
    with pytest.raises(TestHostError, match="loopback"):
        testhosts.claim_ips(1, Path.home() / "x", first_ip="10.0.0.5")


def test_the_command_shows_the_status_of_a_cluster(systemd_hosts):
    d = systemd_hosts[0].dir
    r = subprocess.run([sys.executable, "-m", "xce_lite.testhosts", "status", str(d)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == [f"{h.name} {h.ip} pid={h.pid} systemd up" for h in systemd_hosts]
