"""The trust promises (issue 13) with prefill on (issue 18), where jobs are actually queued as
successors behind running ones: a controller killed -9 while successors wait, a host lost (its
lease runs out first: its jobs stop, its queue is dropped) and back, a kill of a queued successor
while its host is out of reach, across a restart. Each job appends its attempt to a file: nothing
runs twice, nothing is lost, a killed job never runs. Prefill is on by default.
"""

from __future__ import annotations

import os

from tests.support.agent_local import journal_result
from tests.support.cluster import Cluster, HostOutage, hosts_of, running_cluster
from tests.support.prefill import held, pending, queued, quick, runs
from tests.support.trust import history
from tests.support.waiting import wait_until

PREFILL_HOSTS = """\
cluster: tr{pid}
hosts:
  - {{name: a, slots: 1, mem: 1G, tags: [ha]}}
  - {{name: b, slots: 1, mem: 1G, tags: [hb]}}
queues:
  - {{name: normal, default: true}}
controller:
  tick: 1s
  grace: 1s
  host_lost_after: 12s
  lease: 10s
  lease_margin: 1s
"""


def prefill_hosts():
    return running_cluster(config=PREFILL_HOSTS.format(pid=os.getpid()))


def lose_and_requeue(c: Cluster, host: str, *jobs: int) -> None:
    """Within a HostOutage of `host`: wait until it is lost and `jobs` are PEND again."""
    wait_until(lambda: hosts_of(c)[host]["state"] == "unreach", 30, f"host {host} to show unreach")
    wait_until(lambda: hosts_of(c)[host].get("lost") is True, 90, f"host {host} to be declared lost")
    wait_until(lambda: all(pending(c, j) for j in jobs), 30, f"jobs {jobs} requeued")


def test_successors_through_a_controller_kill9_then_a_host_lost_and_back_each_job_runs_once():
    with prefill_hosts() as c:
        p1, p2 = held(c, "p1", "-R", "select[ha]"), held(c, "p2", "-R", "select[hb]")
        c.wait_state(p1, {"RUN"}), c.wait_state(p2, {"RUN"})
        s1, s2 = quick(c, "s1", "-R", "select[ha]"), quick(c, "s2", "-R", "select[hb]")
        queued(c, s1, "a", p1), queued(c, s2, "b", p2)  # successors, one on each host

        c.kill9_controller()  # while both wait; b's predecessor ends with no controller
        (c.work / "go-p2").touch()
        wait_until(lambda: runs(c, "s2") == ["1"], 30, "s2 to start on b with no controller")
        c.start()  # within the lease: nothing was stopped
        c.wait_state(s2, {"DONE"}), c.wait_state(p2, {"DONE"})
        queued(c, s1, "a", p1)  # recovered as it was

        with HostOutage(c, "a"):  # a's lease runs out: p1 stops, s1 is dropped unstarted; a is lost
            lose_and_requeue(c, "a", p1, s1)
        wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
        c.wait_state(p1, {"RUN"}, timeout=60)
        queued(c, s1, "a", p1)  # queued again, behind p1's second attempt
        (c.work / "go-p1").touch()
        c.wait_state(s1, {"DONE"}, timeout=60), c.wait_state(p1, {"DONE"})
        assert runs(c, "p1") == ["1", "2"]  # the lease stopped the first copy; the requeued one ran
        assert (runs(c, "s1"), runs(c, "p2"), runs(c, "s2")) == (["2"], ["1"], ["1"])
        assert history(c, s1).count("started") == 1  # (s2 started and ended with no controller: DISP -> DONE)
        assert c.job(s2)["start_time"] >= c.job(p2)["end_time"]  # its start, from its result


def test_a_queued_successor_killed_while_its_host_is_out_of_reach_then_restart_then_lost_never_runs():
    with prefill_hosts() as c:
        p1 = held(c, "p1", "-R", "select[ha]")
        c.wait_state(p1, {"RUN"})
        s1 = quick(c, "s1", "-R", "select[ha]")
        queued(c, s1, "a", p1)
        with HostOutage(c, "a"):
            wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
            assert c.xce("kill", str(s1)).returncode == 0
            c.kill9_controller()  # the kill must survive the restart
            c.start()
            final = c.wait_state(s1, {"EXIT"}, timeout=90)  # once a is lost: kill wins over the requeue
            assert final["reason"].startswith("killed by"), final["reason"]
            wait_until(lambda: pending(c, p1), 60, "p1 requeued")
        wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
        c.wait_state(p1, {"RUN"}, timeout=60)
        (c.work / "go-p1").touch()
        c.wait_state(p1, {"DONE"})
        c.ok("hosts")  # one more round trip: nothing starts s1
        assert runs(c, "s1") == [] and runs(c, "p1") == ["1", "2"]
        assert c.job(s1)["state"] == "EXIT" and "requeued" not in history(c, s1)
        assert "started" not in history(c, s1)


LEASE_ONLY = PREFILL_HOSTS.replace("host_lost_after: 12s", "host_lost_after: 10m").replace("lease: 10s", "lease: 4s")


def test_a_lease_that_runs_out_while_a_successor_waits_drops_it_unstarted_and_it_runs_once_after():
    """Host a out of reach past its lease, never long enough to be lost: its job stops itself, the
    next agent drops the queue (lease ran out), the controller launches the successor again once
    it renewed the lease, and requeues the stopped job; each runs once more at most."""
    with running_cluster(config=LEASE_ONLY.format(pid=os.getpid())) as c:
        p1 = held(c, "p1", "-R", "select[ha]")
        c.wait_state(p1, {"RUN"})
        s1 = quick(c, "s1", "-R", "select[ha]")
        queued(c, s1, "a", p1)
        unit = c.job(p1)["unit"]
        with HostOutage(c, "a"):
            wait_until(lambda: hosts_of(c)["a"]["state"] == "unreach", 30, "host a to show unreach")
            result = wait_until(lambda: journal_result(c.home / "spool" / "a", unit), 60,
                                "p1 to stop itself when a's lease runs out")
            assert "lease" in result["reason"], result
            assert c.job(s1)["queued_behind"] == p1 and runs(c, "s1") == []  # out of reach, not lost: still queued
        wait_until(lambda: hosts_of(c)["a"]["state"] == "ok", 60, "host a to come back")
        c.wait_state(s1, {"DONE"}, timeout=60)
        c.wait_state(p1, {"RUN"}, timeout=60)  # requeued after its lease stopped it: attempt 2
        (c.work / "go-p1").touch()
        c.wait_state(p1, {"DONE"})
        assert runs(c, "s1") == ["1"] and runs(c, "p1") == ["1", "2"]
        assert "requeued" in history(c, p1) and "requeued" not in history(c, s1)
