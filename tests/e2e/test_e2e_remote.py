"""End to end over SSH: the real controller, real sshd and real systemd test hosts.

The test hosts share this machine's file system except /tmp: jobs run in a directory under the
session's `testhosts_root`. Tests that break a host (stop its sshd, kill its namespace) boot hosts
of their own; the others share the session's two systemd hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, hosts_of, hosts_ok
from tests.support.remote import close, remote_config, sshd_pids, started_cluster, two_hosts_of_their_own
from tests.support.waiting import wait_until
from xce_lite import testhosts


@pytest.fixture
def rcluster(systemd_hosts, testhosts_root):
    c = started_cluster(remote_config(systemd_hosts), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        yield c
    finally:
        close(c)


AWKWARD = ["with space", "'single'", '"double"', "$(touch /pwned)", "a;b", "line1\nline2", "é☃", "`id`", "$HOME",
           "%n %% {}", "-n", ""]


def test_arguments_reach_a_remote_job_byte_exact(rcluster: Cluster):
    out = rcluster.work / "argv.json"
    job_id = rcluster.submit(sys.executable, "-c", f"import json,sys; json.dump(sys.argv[1:], open({str(out)!r}, 'w'))",
                             *AWKWARD)
    assert rcluster.xce("wait", str(job_id)).returncode == 0
    assert json.loads(out.read_text()) == AWKWARD
    assert not Path("/pwned").exists()
    job = rcluster.job(job_id)
    assert job["hosts"][0][0] in ("host1", "host2")


def test_hosts_show_how_they_run_jobs(rcluster: Cluster):
    listing = rcluster.ok("hosts", "-l")
    assert "HOST host1  (ssh, ok" in listing and "agent v" in listing
    assert hosts_of(rcluster)["host2"]["agent"]["hostname"] == "host2"


def test_kill_9_of_the_controller_adopts_every_remote_unit_and_launches_none_twice(rcluster: Cluster):
    ledger = rcluster.work / "ledger"
    ids = [rcluster.submit("sh", "-c", f'echo "$XCE_JOBID $(hostname)" >> {ledger}; sleep 3; exit $((XCE_JOBID % 2))')
           for _ in range(4)]
    wait_until(lambda: all(rcluster.job(i)["state"] == "RUN" for i in ids), 60, "all four jobs running")
    rcluster.kill9_controller()
    rcluster.start()
    waited = rcluster.xce("wait", *map(str, ids), timeout=120)
    assert waited.returncode in (0, 1), waited.stderr
    lines = ledger.read_text().splitlines()
    assert sorted(int(line.split()[0]) for line in lines) == sorted(ids)  # each ran exactly once
    for job_id in ids:
        job = rcluster.job(job_id)
        assert (job["state"], job["exit_code"]) == (("DONE", 0) if job_id % 2 == 0 else ("EXIT", 1))
        assert job["attempt"] == 1


# ---- hosts of their own, to break ------------------------------------------------------------------


@pytest.fixture
def own_hosts(require_testhosts, testhosts_root):
    """Two plain hosts, a1 and b1, each in a directory of its own (so one can be killed alone)."""
    require_testhosts(plain=True)
    with two_hosts_of_their_own(testhosts_root, "own", plain=True) as booted:
        yield booted


def test_sshd_stopped_for_a_while_the_job_goes_on_and_its_result_arrives_after(own_hosts, testhosts_root):
    a, b = own_hosts
    c = started_cluster(remote_config([a, b], keepalive="1s"), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        marker = c.work / "ended"
        job_id = c.submit("sh", "-c", f"sleep 3; touch {marker}; exit 5")
        host = c.wait_state(job_id, {"RUN"}, timeout=60)["hosts"][0][0]
        victim = a if host == a.name else b
        for pid in sshd_pids(victim):  # the listener and the controller's session: the host is cut off
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: hosts_of(c)[victim.name]["state"] == "unreach", 60, f"{victim.name} to show unreach")
        wait_until(marker.exists, 60, "the job to end while its host is cut off")
        assert c.job(job_id)["state"] == "RUN"  # nobody could tell the controller yet
        subprocess.run(victim.nsenter_argv(testhosts._sshd_argv(victim.dir, victim.ip)), check=True, timeout=30)
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)
        assert (final["exit_code"], final["attempt"]) == (5, 1)
        assert hosts_of(c)[victim.name]["state"] == "ok"
    finally:
        close(c)


def test_a_host_whose_namespace_dies_is_lost_and_its_job_runs_elsewhere(own_hosts, testhosts_root):
    a, b = own_hosts
    c = started_cluster(remote_config([a, b], lost_after="7s", keepalive="1s", lease="5s", margin="1s"),
                        testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        log = c.work / "ran-on"
        job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT $(hostname)" >> {log}; sleep 2')
        host = c.wait_state(job_id, {"RUN"}, timeout=60)["hosts"][0][0]
        victim, survivor = (a, b) if host == a.name else (b, a)
        testhosts.down(victim.dir)  # the whole host, its jobs with it
        wait_until(lambda: c.job(job_id)["attempt"] == 2, 60, "the job to be requeued as attempt 2")
        final = c.wait_state(job_id, {"DONE"}, timeout=60)
        assert final["hosts"] == [[survivor.name, 1]]
        assert hosts_of(c)[victim.name]["lost"] is True
        assert log.read_text().split() == ["1", victim.name, "2", survivor.name]
    finally:
        close(c)


def test_a_ptile_job_lands_on_two_hosts_and_each_sees_its_share(rcluster: Cluster):
    report = ('mkdir -p {out}; {{ echo "host=$(hostname) ntasks=$XCE_HOST_NTASKS index=$XCE_HOST_TASK_INDEX '
              'hosts=$XCE_HOSTS slots=$XCE_SLOTS dir=$XCE_JOB_HOST_DIR"; cat "$XCE_HOSTFILE"; }} > {out}/$(hostname)')
    out = rcluster.work / "shares"
    job_id = rcluster.submit("sh", "-c", report.format(out=out), options=("-n", "4", "-R", "span[ptile=2]"))
    assert rcluster.xce("wait", str(job_id)).returncode == 0
    job = rcluster.job(job_id)
    assert sorted(job["hosts"]) == [["host1", 2], ["host2", 2]]
    first = job["hosts"][0][0]
    lines = (out / first).read_text().splitlines()
    assert lines[0].startswith(f"host={first} ntasks=2 index=0 hosts={first} ")
    assert "slots=4 dir=" in lines[0]
    ips = {h: hosts_of(rcluster)[h]["agent"]["hostname"] for h in ("host1", "host2")}
    assert len(lines) == 3 and all(line.endswith(" slots=2") for line in lines[1:]) and ips
    # only the first host runs the command; the other holds the allocation (its unit ran, and ended)
    assert sorted(p.name for p in out.iterdir()) == [first]


def test_a_multi_host_job_runs_xce_launch_tasks_on_every_host(rcluster: Cluster):
    out = rcluster.work / "tasks"
    out.mkdir()
    task = f'echo "$(hostname) $XCE_TASK_INDEX" > {out}/task-$XCE_TASK_INDEX'
    job_id = rcluster.submit("xce", "launch", "--", "sh", "-c", task, options=("-n", "4", "-R", "span[ptile=2]"))
    waited = rcluster.xce("wait", str(job_id))
    assert waited.returncode == 0, waited.stdout + (rcluster.work / f"xce-{job_id}.out").read_text()
    seen = sorted((out / f"task-{i}").read_text().split()[0] for i in range(4))
    assert seen == ["host1", "host1", "host2", "host2"]


def test_run_and_memory_limits_on_systemd_hosts_end_the_job_with_their_reason(rcluster: Cluster):
    slow = rcluster.submit("sleep", "60", options=("-W", "2s"))
    hog = rcluster.submit(sys.executable, "-c", "x = bytearray(600 * 2**20); import time; time.sleep(60)",
                          options=("-M", "100M"))
    ended = {i: rcluster.wait_state(i, {"EXIT", "DONE"}, timeout=90) for i in (slow, hog)}
    assert ended[slow]["state"] == "EXIT" and ended[slow]["reason"] == "run limit 00:00:02 reached"
    assert ended[hog]["state"] == "EXIT" and ended[hog]["reason"] == "memory limit 100M exceeded"


def test_peek_reads_the_output_on_the_jobs_host_through_its_agent(rcluster: Cluster):
    # /tmp is private to each test host: only the host's agent can read a file there
    job_id = rcluster.submit("sh", "-c", "echo from-the-host; sleep 60", options=("-o", "/tmp/peek-%J.out"))
    rcluster.wait_state(job_id, {"RUN"})
    assert not Path(f"/tmp/peek-{job_id}.out").exists()
    wait_until(lambda: rcluster.ok("peek", str(job_id)) == "from-the-host\n", 30, "peek through the agent")


LOCAL_ONLY = """\
cluster: add{pid}
hosts:
  - {{name: here, slots: 1, mem: 1G}}
{more}queues:
  - {{name: normal}}
ssh: {{config: /nonexistent, known_hosts: [], reconnect_max: 60s}}
"""


def test_hosts_add_probes_refuses_an_unknown_key_then_adds_the_host_live(plain_hosts, testhosts_root):
    host = plain_hosts[0]
    c = started_cluster(LOCAL_ONLY.format(pid=os.getpid(), more=""), testhosts_root)
    try:
        before = (c.home / "xce.yaml").read_bytes()
        args = ("hosts", "add", "remote1", "--address", host.ip, "--user", "root", "--identity", str(host.key_path))
        refused = c.xce(*args)
        assert refused.returncode == 2
        assert "SHA256:" in refused.stderr and "--accept-new" in refused.stderr
        assert (c.home / "xce.yaml").read_bytes() == before  # nothing written
        added = c.xce(*args, "--accept-new", "--slots", "2")
        assert added.returncode == 0, added.stderr
        assert "Host remote1 answers: agent: jobs run under the plain supervisor" in added.stdout
        assert "with slots 2, mem " in added.stdout and "connecting to it now" in added.stdout
        text = (c.home / "xce.yaml").read_text()
        assert "name: remote1" in text and "type: ssh" in text and f"address: {host.ip}" in text
        assert host.ip in (c.home / "known_hosts").read_text()
        wait_until(lambda: hosts_of(c).get("remote1", {}).get("state") == "ok", 60, "the new host to be connected")
        job_id = c.submit("hostname", options=("-R", "select[type==ssh]"))
        assert c.xce("wait", str(job_id)).returncode == 0
        assert (c.work / f"xce-{job_id}.out").read_text().strip() == host.name
        again = c.xce(*args)
        assert again.returncode == 2 and "already in" in again.stderr
    finally:
        close(c)


def test_a_configured_host_with_an_unknown_key_waits_until_hosts_add_accepts_it(plain_hosts, testhosts_root):
    host = plain_hosts[0]
    entry = f"  - {{name: remote1, type: ssh, address: '{host.ip}', user: root, identity: '{host.key_path}', " \
            "slots: 1, mem: 1G}\n"
    c = started_cluster(LOCAL_ONLY.format(pid=os.getpid(), more=entry), testhosts_root)
    try:
        wait_until(lambda: "not known" in (c.home / "controller.log").read_text(), 30, "the key refusal in the log")
        assert hosts_of(c)["remote1"]["state"] == "unreach"
        trusted = c.xce("hosts", "add", "remote1", "--accept-new")
        assert trusted.returncode == 0, trusted.stderr
        assert "its host key is trusted now" in trusted.stdout
        wait_until(lambda: hosts_of(c)["remote1"]["state"] == "ok", 30, "remote1 to be reached at once, not in 60 s")
    finally:
        close(c)


def gateway_pids(c: Cluster) -> list[int]:
    """The controller's live SSH gateway processes (a killed one not yet reaped is left out)."""
    import psutil

    found = []
    for child in psutil.Process(c.controller_pid).children():
        try:
            if "xce_lite.exec.sshgate" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:  # a zombie, or gone meanwhile
            pass
    return found


def test_ssh_lives_in_the_gateway_and_a_killed_gateway_is_replaced(rcluster: Cluster):
    maps = Path(f"/proc/{rcluster.controller_pid}/maps").read_text()
    assert "cryptography" not in maps and "_cffi_backend" not in maps  # paramiko's crypto is not loaded here
    [gateway] = gateway_pids(rcluster)
    assert "cryptography" in Path(f"/proc/{gateway}/maps").read_text()
    job_id = rcluster.submit("sh", "-c", "sleep 2; exit 4")
    rcluster.wait_state(job_id, {"RUN"})
    os.kill(gateway, signal.SIGKILL)
    wait_until(lambda: gateway_pids(rcluster) and gateway_pids(rcluster) != [gateway], 60, "a new gateway")
    hosts_ok(rcluster, "both hosts back")
    final = rcluster.wait_state(job_id, {"EXIT"}, timeout=60)
    assert (final["exit_code"], final["attempt"]) == (4, 1)  # the job went on, and its result came back
