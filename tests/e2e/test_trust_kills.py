"""Kill wins, hosts that freeze, and copies the controller gave up on (issue 13).

A killed job is never requeued, retried or run again, whatever its host does afterwards; a host
that does not answer a signal is in trouble alone, and the kill lands when it answers; a result of
a copy the controller gave up on never counts. Provoked for real, in sequence: hosts out of reach
(their agent killed, their spool held), sshd frozen with SIGSTOP on real systemd and plain test
hosts, hosts declared lost, controller restarts (kill -9).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal

import pytest

from tests.support.cluster import Cluster, HostOutage, hosts_of, hosts_ok
from tests.support.remote import sshd_pids, started_cluster
from tests.support.trust import history, runs, status
from tests.support.waiting import wait_until
from xce_lite import testhosts


# ---- kill wins -------------------------------------------------------------------------------------


def test_kill_while_the_host_is_out_of_reach_then_lost_then_back_ends_exit_and_never_runs_again(two_hosts: Cluster):
    c = two_hosts
    log = c.work / "attempts"
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap "exit 0" TERM; sleep 120 & wait',
                      options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "does not answer now" in killed.stdout, killed
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # once a is declared lost
        assert final["reason"].startswith("killed by") and "lost" in final["reason"], final["reason"]
        assert hosts_of(c)["a"]["lost"] is True
        assert "requeued" not in history(c, job_id)
        assert not c.supervisor_pids()  # the copy on a stopped itself when a's lease ran out, before a was lost
    wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
    wait_until(lambda: not c.supervisor_pids(), 60, "the copy on a to be stopped once a answers")
    assert runs(log) == ["1"]
    final = c.job(job_id)
    assert (final["state"], final["attempt"]) == ("EXIT", 1) and final["reason"].startswith("killed by")
    assert "requeued" not in history(c, job_id)


def test_kill_then_controller_restart_then_host_lost_ends_exit_with_the_kill_reason(two_hosts: Cluster):
    c = two_hosts
    log = c.work / "attempts"
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap "exit 0" TERM; sleep 120 & wait',
                      options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        assert c.xce("kill", str(job_id)).returncode == 0
        c.kill9_controller()  # before the host is declared lost: the kill must survive the restart
        c.start()
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)
        assert final["reason"].startswith("killed by") and "lost" in final["reason"], final["reason"]
        assert "requeued" not in history(c, job_id)
    wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
    wait_until(lambda: not c.supervisor_pids(), 60, "the copy on a to be stopped once a answers")
    assert runs(log) == ["1"]
    assert c.job(job_id)["state"] == "EXIT" and c.job(job_id)["attempt"] == 1


@pytest.mark.parametrize("two_hosts", ["5m"], indirect=True)
def test_kill_while_the_host_is_out_of_reach_is_delivered_when_it_answers(two_hosts: Cluster):
    c = two_hosts
    job_id = c.submit("sh", "-c", "trap 'exit 0' TERM; sleep 120 & wait", options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        assert c.xce("kill", str(job_id)).returncode == 0
        c.kill9_controller()
        c.start()
        assert c.job(job_id)["state"] == "RUN"
    final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # the recorded kill reached a when it answered
    assert final["reason"].startswith("killed by") and final["attempt"] == 1
    assert not c.supervisor_pids()
    assert "requeued" not in history(c, job_id)


@pytest.mark.parametrize("two_hosts", ["5m"], indirect=True)
@pytest.mark.parametrize("restart", [False, True], ids=["", "restart"])
def test_kill_not_delivered_before_the_lease_stopped_the_job_ends_it_with_the_kill_reason(two_hosts: Cluster,
                                                                                         restart: bool):
    """Killed while its host is out of reach; the host stays away past the lease (not long enough
    to be lost), so the job's copy stops itself with "lease expired"; the host answers with that
    result: the job ends EXIT with the kill's reason (how it ended after it), once, never requeued.
    With a controller restart between the kill and the host's return: the recorded kill survives it."""
    c = two_hosts
    log, stopped = c.work / "attempts", c.work / "stopped"
    # markers by the shell itself, not a forked `touch`: see the frozen host's test below
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap ": > {stopped}; exit 0" TERM; '
                                  "sleep 300 & wait", options=("-R", "select[ha]"))
    c.wait_state(job_id, {"RUN"})
    with HostOutage(c, "a"):
        wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "does not answer now" in killed.stdout, killed
        if restart:
            c.kill9_controller()
            c.start()
        wait_until(stopped.exists, 90, "the copy on a to stop itself when its lease runs out")
        assert c.job(job_id)["state"] == "RUN"  # out of reach, not lost: the controller cannot know yet
    final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # a answers with its result: lease expired
    assert final["reason"].startswith(f"killed by {pwd.getpwuid(os.getuid()).pw_name} (lease expired"), final["reason"]
    assert "before it confirmed the kill" in final["reason"], final["reason"]
    assert final["attempt"] == 1 and runs(log) == ["1"]
    assert "requeued" not in history(c, job_id) and history(c, job_id).count("finished") == 1
    c.ok("hosts")  # one more round trip: nothing starts it again
    assert c.job(job_id)["state"] == "EXIT" and runs(log) == ["1"] and not c.supervisor_pids()


# ---- a host that freezes ----------------------------------------------------------------------------


def frozen_host_config(host: testhosts.TestHost, keepalive: str = "10m", lost_after: str = "10m",
                       lease: str = "3m") -> str:
    """The ssh host `host` (tag `far`) and a local host (tag `near`); by default heartbeats too rare
    to notice a freeze, so that the host operation itself meets it. Lost after `lost_after`, which
    must exceed `lease` + 2 s."""
    return (f"cluster: fz{os.getpid()}\nhosts:\n"
            f"  - {{name: {host.name}, type: ssh, address: '{host.ip}', user: root, identity: '{host.key_path}', "
            f"slots: 2, mem: 1G, tags: [far]}}\n"
            f"  - {{name: near, slots: 1, mem: 1G, tags: [near]}}\n"
            f"queues:\n  - {{name: normal, default: true}}\n"
            f"ssh:\n  config: /nonexistent\n  known_hosts: {json.dumps([str(host.known_hosts_path)])}\n"
            f"  keepalive: {keepalive}\n  reconnect_max: 2s\n"
            f"controller:\n  tick: 1s\n  grace: 1s\n  host_lost_after: {lost_after}\n"
            f"  lease: {lease}\n  lease_margin: 2s\n")


@pytest.mark.parametrize("kind", ["systemd", "plain"])
def test_kill_on_a_host_whose_sshd_is_frozen_troubles_that_host_alone_and_lands_when_it_thaws(
        kind, request, testhosts_root):
    host = request.getfixturevalue(f"{kind}_hosts")[0]
    c = started_cluster(frozen_host_config(host), testhosts_root, [host])
    frozen: list[int] = []
    try:
        hosts_ok(c, "both hosts up")
        pid = c.controller_pid
        job_id = c.submit("sleep", "300", options=("-R", "select[far]"))
        c.wait_state(job_id, {"RUN"}, timeout=60)
        frozen = sshd_pids(host)
        for p in frozen:  # the listener and the controller's session: the host neither answers nor drops
            os.kill(p, signal.SIGSTOP)
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "is being terminated" in killed.stdout, killed
        assert c.xce("wait", str(c.submit("true", options=("-R", "select[near]")))).returncode == 0  # work goes on
        listing = wait_until(lambda: (text := c.ok("hosts", "-l")) and "in trouble" in text and text, 90,
                             f"{host.name} to show in trouble")
        assert "did not answer 'signal'" in listing
        problems = status(c)["problems"]
        assert [p["host"] for p in problems if p["what"] == "host"] == [host.name]
        assert hosts_of(c)["near"]["trouble"] is None
        assert c.job(job_id)["state"] == "RUN" and c.controller_pid == pid
        for p in frozen:
            os.kill(p, signal.SIGCONT)
        frozen = []
        final = c.wait_state(job_id, {"EXIT"}, timeout=90)
        assert final["reason"].startswith("killed by"), final
        wait_until(lambda: hosts_of(c)[host.name]["trouble"] is None, 60, f"{host.name} out of trouble")
        assert c.controller_pid == pid and "requeued" not in history(c, job_id)
    except BaseException:
        c.keep_report()  # before the thaw: the host's side as the test saw it
        raise
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        with contextlib.suppress(Exception):
            c.xce("kill", *[str(j["id"]) for j in json.loads(c.ok("jobs", "--json"))["jobs"]])
        c.close()


@pytest.mark.parametrize("kind", ["systemd", "plain"])
def test_kill_while_a_frozen_host_is_out_of_reach_then_lost_then_thawed_never_runs_the_job_again(
        kind, request, testhosts_root):
    host = request.getfixturevalue(f"{kind}_hosts")[0]
    c = started_cluster(frozen_host_config(host, keepalive="1s", lost_after="12s", lease="8s"), testhosts_root, [host])
    frozen: list[int] = []
    try:
        hosts_ok(c, "both hosts up")
        log, stopped = c.work / "attempts", c.work / "stopped"
        # The marker is made by the shell itself (a redirection), not by a `touch` it forks: a
        # direct systemd unit is stopped with TERM to every process of its cgroup, and systemd sweeps
        # the cgroup again until it finds no process it has not signalled, so a child that the
        # trap forks meanwhile is TERMed too: on a busy box (systemd held off the CPU in the middle
        # of its sweep) `touch` died before it made the file, now and then (bench/stop_sweep.py)
        job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; trap ": > {stopped}; exit 0" TERM; '
                                      "sleep 300 & wait", options=("-R", "select[far]"))
        c.wait_state(job_id, {"RUN"}, timeout=60)
        frozen = sshd_pids(host)
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        wait_until(lambda: hosts_of(c)[host.name]["state"] == "unreach", 90, f"{host.name} to show unreach")
        killed = c.xce("kill", str(job_id))
        assert killed.returncode == 0 and "does not answer now" in killed.stdout, killed
        final = c.wait_state(job_id, {"EXIT"}, timeout=60)  # once the host is declared lost
        assert final["reason"].startswith("killed by") and "lost" in final["reason"], final["reason"]
        # declared lost only once the lease surely ran out: the host stopped the copy by itself,
        # even with a longer lease left in its spool by an earlier test's controller (same spool)
        wait_until(stopped.exists, 10, "the copy on the frozen host stopped by its lease")
        for p in frozen:
            os.kill(p, signal.SIGCONT)
        frozen = []
        wait_until(lambda: hosts_of(c)[host.name]["state"] == "ok", 90, f"{host.name} to answer again")
        final = c.job(job_id)
        assert (final["state"], final["attempt"]) == ("EXIT", 1) and final["reason"].startswith("killed by")
        assert runs(log) == ["1"] and "requeued" not in history(c, job_id)
    except BaseException:
        c.keep_report()  # before the thaw: the host's side as the test saw it
        raise
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        c.close()


# ---- copies the controller gave up on ---------------------------------------------------------------


def test_the_result_of_a_copy_given_up_on_never_counts_across_a_restart(two_hosts: Cluster):
    """Host lost, job requeued and done elsewhere; the first copy ends (exit 7: stopped by its
    host when the lease ran out) while its host is away; the controller restarts; the host comes
    back with that result: it is forgotten."""
    c = two_hosts
    log, go = c.work / "attempts", c.work / "go"
    job_id = c.submit("sh", "-c", f'echo "$XCE_ATTEMPT" >> {log}; '
                                  f'if [ "$XCE_ATTEMPT" = 1 ]; then trap ": > {c.work}/ended1; exit 7" TERM; '
                                  f'while [ ! -e {go} ]; do sleep 0.1; done; : > {c.work}/ended1; exit 7; fi')
    first = c.wait_state(job_id, {"RUN"})["hosts"][0][0]
    with HostOutage(c, first):
        done = c.wait_state(job_id, {"DONE"}, timeout=60)  # lost, requeued, run on the other host
        assert done["attempt"] == 2 and done["hosts"][0][0] != first
        go.touch()
        wait_until((c.work / "ended1").exists, 30, "the first copy to end while its host is away")
        c.kill9_controller()
        c.start()
    wait_until(lambda: hosts_of(c)[first]["state"] == "ok", 60, f"host {first} to come back")
    wait_until(lambda: not c.supervisor_pids(), 60, "no copy left running")
    c.ok("hosts")  # one more round trip: the host's listing is reconciled by now
    final = c.job(job_id)
    assert (final["state"], final["exit_code"], final["attempt"]) == ("DONE", 0, 2)
    assert runs(log) == ["1", "2"]
    assert history(c, job_id).count("finished") == 1
