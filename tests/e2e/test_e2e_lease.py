"""End to end: at most one live copy of a job across partitions, fenced by the hosts' lease.

The real controller, real sshd and real test hosts (systemd and plain). Every copy of the test job
appends `start ATTEMPT HOST TIME` to a log on the shared file system, and its post hook (-Ep, run
however the copy ended) `post ATTEMPT HOST TIME`; the test hosts share this machine's kernel, so
one clock stamps every line. The promise: each attempt starts once and its post hook runs once,
and an attempt starts only after the previous one's post hook ran (its copy had ended).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, HostOutage, hosts_of, hosts_ok
from tests.support.procs import zombie
from tests.support.remote import close, remote_config, sshd_pids, started_cluster, two_hosts_of_their_own
from tests.support.waiting import wait_until
from xce_lite import testhosts

LEASE = "lease expired: no word from the controller for 00:00:"  # then the seconds since the last grant


def fenced_config(hosts, maintenance: str = "1h", names: tuple[str, ...] = (), lease: int = 6) -> str:
    """A lease of `lease` s, lost 4 s after it; `names`: the hosts' names in the cluster, if not their own."""
    text = remote_config(hosts, lost_after=f"{lease + 4}s", keepalive="1s", lease=f"{lease}s", margin="2s",
                         more=f"  maintenance_lease: {maintenance}\n")
    # a cluster name of its own: a new spool on each host, without the lease an earlier test left
    text = text.replace(f"cluster: rm{os.getpid()}", f"cluster: ls{uuid.uuid4().hex[:8]}")
    for host, name in zip(hosts, names):
        text = text.replace(f"{{name: {host.name}, type: ssh, address: '{host.ip}'",
                            f"{{name: {name}, type: ssh, address: '{host.ip}'")
    return text


def submit_logged(c: Cluster, log: Path, release: Path | None = None) -> int:
    """A job that logs its start, then runs until `release` exists (or for ever), and logs its end
    from its post hook."""
    stamp = f'"$XCE_ATTEMPT $(hostname) $(date +%s.%N)" >> {log}'
    wait = f"while [ ! -e {release} ]; do sleep 0.1; done" if release else "sleep 600"
    return c.submit("sh", "-c", f"echo start {stamp}; {wait}", options=("-Ep", f"echo post {stamp}"))


def entries(log: Path) -> list[tuple[str, int, str, float]]:
    """(kind, attempt, host, time) per line of the log, in order."""
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        kind, attempt, host, stamp = line.split()
        out.append((kind, int(attempt), host, float(stamp)))
    return out


def assert_one_copy_at_a_time(log: Path, attempts: int) -> None:
    """Each attempt started once and its post hook ran once; each started after the one before ended."""
    seen = entries(log)
    for n in range(1, attempts + 1):
        assert [e[0] for e in seen if e[1] == n] == ["start", "post"], seen
    times = {(kind, n): t for kind, n, _host, t in seen}
    for n in range(2, attempts + 1):
        assert times[("post", n - 1)] < times[("start", n)], f"attempt {n} started before {n - 1} ended: {seen}"


class Partition:
    """The host cut off: every sshd of its namespace (the listener, the controller's session) stopped."""

    def __init__(self, host: testhosts.TestHost):
        self.pids = sshd_pids(host)

    def __enter__(self) -> Partition:
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture(params=["systemd", "plain"])
def own_pair(request, require_testhosts, testhosts_root):
    """Two hosts of the param's kind, a1 and b1, each in a directory of its own (so one can be cut off)."""
    plain = request.param == "plain"
    require_testhosts(plain=plain)
    with two_hosts_of_their_own(testhosts_root, "lease", plain=plain) as booted:
        yield booted


def test_two_partitions_in_a_row_each_host_stops_its_copy_before_the_job_runs_elsewhere(own_pair, testhosts_root):
    c = started_cluster(fenced_config(own_pair), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        log = c.work / "copies"
        job_id = submit_logged(c, log)
        by_name = {h.name: h for h in own_pair}
        for attempt in (1, 2):
            job = wait_until(lambda a=attempt: (j := c.job(job_id))["attempt"] == a and j["state"] == "RUN" and j,
                             120, f"attempt {attempt} to run")
            victim = by_name[job["hosts"][0][0]]
            other = next(h for h in own_pair if h is not victim)
            wait_until(lambda h=other: hosts_of(c)[h.name]["state"] == "ok", 60, f"{other.name} up")
            with Partition(victim):
                wait_until(lambda a=attempt: ("post", a) in {(e[0], e[1]) for e in entries(log)}, 60,
                           f"host {victim.name} to stop attempt {attempt} by itself when its lease ran out")
                assert c.job(job_id)["attempt"] == attempt  # the controller has not requeued it yet
                wait_until(lambda a=attempt: c.job(job_id)["attempt"] == a + 1, 120, f"attempt {attempt + 1}")
                assert hosts_of(c)[victim.name]["lost"] is True
            wait_until(lambda h=victim: hosts_of(c)[h.name]["state"] == "ok", 120, f"{victim.name} back")
        c.wait_state(job_id, {"RUN"}, timeout=60)
        assert_one_copy_at_a_time(log, 2)
        history = c.ok("jobs", "-l", str(job_id))  # what the user sees: each requeue and why
        assert history.count(": host ") >= 2 and history.count("requeued: host ") == 2, history
        assert [e[:2] for e in entries(log)] == [("start", 1), ("post", 1), ("start", 2), ("post", 2), ("start", 3)]
        c.ok("kill", str(job_id))
        c.wait_state(job_id, {"EXIT"}, timeout=60)
        assert_one_copy_at_a_time(log, 3)
    finally:
        close(c)


# ---- the controller away: restarts, planned stops, a long absence (shared hosts: nothing breaks) ----


@pytest.fixture
def mixed(systemd_hosts, plain_hosts, testhosts_root):
    """A controller with a systemd host and a plain host, a lease of 12 s (a restart on this loaded
    machine may take 5 s); (cluster, its hosts)."""
    hosts = [systemd_hosts[0], plain_hosts[0]]
    c = started_cluster(fenced_config(hosts, maintenance="60s", names=("sd", "plain"), lease=12), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        yield c, hosts
    finally:
        close(c)


def jobs_on_both(c: Cluster, log: Path, release: Path) -> list[int]:
    ids = [submit_logged(c, log, release) for _ in range(4)]  # two slots per host: all four run at once
    wait_until(lambda: all(c.job(i)["state"] == "RUN" for i in ids), 60, "the four jobs running")
    assert {c.job(i)["hosts"][0][0] for i in ids} == {"sd", "plain"}
    return ids


def diag(c: Cluster) -> str:
    """What to read when a test fails: the controller's log and the jobs."""
    return (c.home / "controller.log").read_text()[-4000:] + c.xce("jobs", "-l", "-u", "all", "-a").stdout[-4000:]


def counts(log: Path) -> tuple[int, int]:
    kinds = [e[0] for e in entries(log)]
    return kinds.count("start"), kinds.count("post")


def test_a_controller_killed_and_restarted_within_the_lease_kills_nothing(mixed):
    c, _hosts = mixed
    log, release = c.work / "copies", c.work / "release"
    ids = jobs_on_both(c, log, release)
    c.kill9_controller()
    c.start()
    hosts_ok(c, "both hosts back")
    time.sleep(14)  # longer than the lease: only renewals keep the jobs alive now
    assert counts(log) == (4, 0), diag(c)
    release.touch()
    for i in ids:
        job = c.wait_state(i, {"DONE", "EXIT"}, timeout=60)
        assert (job["state"], job["attempt"], job["reason"]) == ("DONE", 1, None)


def test_a_controller_down_longer_than_the_lease_has_its_jobs_stopped_with_the_reason(mixed):
    c, _hosts = mixed
    log, release = c.work / "copies", c.work / "release"
    ids = jobs_on_both(c, log, release)
    c.kill9_controller()
    wait_until(lambda: counts(log) == (4, 4), 60,
               "every host to stop its jobs when the lease ran out")
    c.start()  # the hosts' results say why they stopped: each job runs again, as after a host loss
    wait_until(lambda: all((j := c.job(i))["attempt"] == 2 and j["state"] == "RUN" for i in ids), 60,
               "every job to run again as its second attempt")
    assert counts(log) == (8, 4)  # the second copies started after the first ones' post hooks
    release.touch()
    for i in ids:
        job = c.wait_state(i, {"DONE", "EXIT"}, timeout=60)
        assert (job["state"], job["attempt"], job["reason"]) == ("DONE", 2, None), job
    assert LEASE in c.ok("jobs", "-l", str(ids[0]))  # its history says why it was requeued
    assert counts(log) == (8, 8)  # each attempt ran once, its post hook once


def test_a_planned_stop_grants_a_maintenance_lease_and_the_jobs_outlive_a_longer_absence(mixed):
    c, _hosts = mixed
    log, release = c.work / "copies", c.work / "release"
    ids = jobs_on_both(c, log, release)
    c.ok("controller", "stop")
    time.sleep(25)  # twice the normal lease, well within the maintenance lease (60 s)
    assert counts(log) == (4, 0)
    c.start()
    hosts_ok(c, "both hosts back")
    release.touch()
    for i in ids:
        job = c.wait_state(i, {"DONE", "EXIT"}, timeout=60)
        assert (job["state"], job["attempt"], job["reason"]) == ("DONE", 1, None)


@pytest.mark.parametrize("own_pair", ["plain"], indirect=True)
def test_a_restart_declares_a_host_lost_only_once_the_lease_it_last_granted_has_run_out(own_pair, testhosts_root):
    c = started_cluster(fenced_config(own_pair, maintenance="25s"), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        log = c.work / "copies"
        job_id = submit_logged(c, log)
        victim = next(h for h in own_pair if h.name == c.wait_state(job_id, {"RUN"}, timeout=60)["hosts"][0][0])
        c.ok("controller", "stop")  # its hosts hold a maintenance lease of 25 s from here
        stopped = time.monotonic()
        with Partition(victim):
            c.start()  # the victim cannot answer; host_lost_after (10 s) passes long before the lease ends
            lost = wait_until(lambda: hosts_of(c)[victim.name]["lost"] and time.monotonic(), 120,
                              f"{victim.name} to be declared lost")
            assert lost - stopped >= 25, "declared lost while the lease it was granted could still hold"
            wait_until(lambda: c.job(job_id)["attempt"] == 2 and c.job(job_id)["state"] == "RUN", 60,
                       "the job to run again on the other host")
            assert_one_copy_at_a_time(log, 1)
            assert entries(log)[2][:2] == ("start", 2)  # after the first copy's post hook
    finally:
        close(c)


def test_after_a_planned_stop_and_start_a_host_cut_off_is_lost_in_seconds_not_at_the_end_of_the_hour(
        own_pair, testhosts_root):
    c = started_cluster(fenced_config(own_pair, maintenance="1h"), testhosts_root)
    try:
        hosts_ok(c, "both hosts up")
        log = c.work / "copies"
        job_id = submit_logged(c, log)
        victim = next(h for h in own_pair if h.name == c.wait_state(job_id, {"RUN"}, timeout=60)["hosts"][0][0])
        c.ok("controller", "stop")  # every host holds an hour-long maintenance lease from here
        time.sleep(8)  # away longer than the normal lease (6 s): every supervisor has read the hour
        c.start()
        hosts_ok(c, "both hosts back")
        wait_until(lambda: lowered(c, victim.name), 60, f"{victim.name} to confirm a grant of the new controller")
        with Partition(victim):
            wait_until(lambda: ("post", 1) in {(e[0], e[1]) for e in entries(log)}, 60,
                       f"host {victim.name} to stop the copy when the new controller's short lease ran out")
            wait_until(lambda: (j := c.job(job_id))["attempt"] == 2 and j["state"] == "RUN", 60,
                       "the job to run again on the other host within seconds, not an hour")
            assert hosts_of(c)[victim.name]["lost"] is True
        wait_until(lambda: hosts_of(c)[victim.name]["state"] == "ok", 120, f"{victim.name} back")
        c.ok("kill", str(job_id))
        c.wait_state(job_id, {"EXIT"}, timeout=60)
        assert_one_copy_at_a_time(log, 2)
    finally:
        close(c)


def lowered(c: Cluster, host: str) -> bool:
    """Whether the controller's log says `host` obeys its own lease now (its reckoning came down)."""
    return f"host {host} obeys this controller's lease now" in (c.home / "controller.log").read_text()


PAIR = """\
cluster: lr{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G}}
  - {{name: b, slots: 1, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller: {{tick: 1s, grace: 1s, host_lost_after: 9s, lease: 5s, lease_margin: 2s, maintenance_lease: 1h}}
"""


def test_a_stop_start_then_crash_then_an_agent_killed_only_its_supervisor_stops_the_copy_before_the_requeue():
    """The agent (which holds the lease in memory) killed and kept away, so only the supervisor that
    read the hour-long maintenance lease can stop its copy: it must obey the new controller's short
    grant, or the job, requeued within seconds, runs twice. A crash of the controller in between:
    the next one knows from the store that the hour no longer binds."""
    c = Cluster(config=PAIR.format(pid=os.getpid()))
    try:
        c.start()
        log = c.work / "copies"
        job_id = submit_logged(c, log)
        victim = c.wait_state(job_id, {"RUN"})["hosts"][0][0]
        c.ok("controller", "stop")  # the maintenance lease: an hour
        time.sleep(7)  # away longer than the normal lease (5 s): the supervisor has read the hour
        c.start()
        hosts_ok(c, "both hosts back")
        wait_until(lambda: lowered(c, victim), 60, f"{victim} to confirm a grant of the new controller")
        c.kill9_controller()
        with HostOutage(c, victim):  # its agent killed, its spool held: no agent there from now
            c.start()
            wait_until(lambda: counts(log) == (1, 1), 60, f"the supervisor on {victim} to stop the copy")
            job = wait_until(lambda: (j := c.job(job_id))["attempt"] == 2 and j["state"] == "RUN" and j, 60,
                             "the job to run again on the other host within seconds, not an hour")
            assert job["hosts"][0][0] != victim and hosts_of(c)[victim]["lost"] is True
        wait_until(lambda: hosts_of(c)[victim]["state"] == "ok", 60, f"{victim} back")
        c.ok("kill", str(job_id))
        c.wait_state(job_id, {"EXIT"}, timeout=60)
        assert_one_copy_at_a_time(log, 2)
    finally:
        c.close()


LOCAL = """\
cluster: ll{pid}
hosts:
  - {{name: here, slots: 2, mem: 1G}}
queues:
  - {{name: normal, default: true}}
controller: {{tick: 1s, grace: 1s, host_lost_after: 9s, lease: 5s, lease_margin: 2s, maintenance_lease: 1h}}
"""


def test_on_a_local_host_the_agent_outlives_its_killed_controller_to_stop_the_jobs_at_the_lease_end(tmp_path):
    c = Cluster(config=LOCAL.format(pid=os.getpid()))
    try:
        c.start()
        log = c.work / "copies"
        job_id = submit_logged(c, log)
        c.wait_state(job_id, {"RUN"})
        agent = int((c.home / "spool" / "here" / ".lock").read_text())
        c.kill9_controller()
        assert counts(log) == (1, 0) and not zombie(agent)  # it stays: its lease holds a running job
        wait_until(lambda: counts(log) == (1, 1), 60, "the agent to stop the job when the lease ran out")
        wait_until(lambda: not Path(f"/proc/{agent}").exists() or zombie(agent), 30, "the orphan agent to leave")
        c.start()
        wait_until(lambda: (j := c.job(job_id))["attempt"] == 2 and j["state"] == "RUN", 60,
                   "the job to run again: its host stopped it for want of the controller, not for itself")
        assert LEASE in c.ok("jobs", "-l", str(job_id))
        assert_one_copy_at_a_time(log, 1)
    finally:
        c.close()

